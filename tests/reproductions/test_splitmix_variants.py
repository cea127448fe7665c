"""splitmix_budgets / splitmix_contact (Figs. C.4-C.5): each distribution's runs get its
budgets (groups or the log-normal bins), the baseline switches to HeteroFL for log-normal
budgets, contact rates set the cohort, and the claims follow the numbers."""
from __future__ import annotations

import torch

from fedveil.algorithms.budgets import client_budgets
from fedveil.config import validate
from fedveil.reproduce import ReproductionContext
from fedveil.runtime.simulation import Simulation
from fedveil_reproductions import splitmix_variants as sb
from fedveil_reproductions.splitmix_study import WIDTHS

torch.set_num_threads(1)


def test_each_distribution_sets_its_budgets(tmp_path, mnist_data_root):
    study = sb.variant_study("budgets", quick=True)
    study.base.rows_per_domain, study.base.test_rows_per_domain, study.base.size = 40, 20, 8
    ctx = ReproductionContext(out_dir=tmp_path, quick=True, data_root=mnist_data_root)
    config = validate(sb.job_config(ctx, study, "8-1-1-1", "baseline", 0))
    assert config.algorithm.name == "sheterofl"
    sim = Simulation.from_config(config)
    # 10 clients in 4 equal groups of ascending budgets: 3 at x0.125, the other 7 at x1
    assert sim.algorithm.budgets == [0.125] * 3 + [1.0] * 7
    lognormal = validate(sb.job_config(ctx, study, "ln0.5_0.4", "baseline", 0))
    assert lognormal.algorithm.name == "heterofl"
    assert client_budgets(lognormal.algorithm, 10, [0.125 * (i + 1) for i in range(8)]) == \
        Simulation.from_config(lognormal).algorithm.budgets
    assert sb.widest(study, "8-4-8d3-2") == 0.5 and sb.widest(study, "ln0.5_0.4") == 1.0
    contact = sb.variant_study("contact", quick=True)
    contact.base = study.base
    assert validate(sb.job_config(ctx, contact, "2", "split_mix", 0)).federation.clients_per_round == 2
    assert validate(sb.job_config(ctx, contact, "all", "split_mix", 0)).federation.clients_per_round == 10


def test_the_claim_follows_the_numbers():
    study = sb.VariantStudy("budgets", settings=["8-4-2-1"])
    results = {("8-4-2-1", "split_mix"): {w: [0.8, 0.81, 0.82] for w in WIDTHS},
               ("8-4-2-1", "baseline"): {w: [0.6, 0.61, 0.62] for w in WIDTHS}}
    rows = {r.metric: r for r in sb.rows_of(results, study)}
    assert rows["Split-Mix >= sheterofl at x1 (the widest budget)"].verdict == "holds"
    results[("8-4-2-1", "split_mix")][1.0] = [0.3, 0.31, 0.32]
    rows = {r.metric: r for r in sb.rows_of(results, study)}
    assert rows["Split-Mix >= sheterofl at x1 (the widest budget)"].verdict == "does not hold"


def test_the_contact_claim_compares_the_fewest_and_the_most_clients():
    study = sb.VariantStudy("contact", settings=["2", "all"])
    results = {(c, m): {w: [0.5, 0.51] for w in WIDTHS} for c in ("2", "all") for m in ("split_mix", "baseline")}
    results[("all", "split_mix")][1.0] = [0.8, 0.81]
    rows = {r.metric: r for r in sb.rows_of(results, study)}
    assert rows["Split-Mix x1: fewer clients per round, lower accuracy"].verdict == "holds"


def test_the_figure_has_one_panel_per_setting(tmp_path):
    study = sb.variant_study("budgets", quick=True)
    results = {(s, m): {w: [0.5, 0.6] for w in WIDTHS} for s in study.settings for m in ("split_mix", "baseline")}
    sb.plot(study, results, tmp_path / "fig.png")
    assert (tmp_path / "fig.png").stat().st_size > 0
