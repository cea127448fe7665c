"""The FADE Adult reproduction: its quick path end to end on tiny files in the UCI Adult
format, and its claim verdicts on fixed numbers."""
from __future__ import annotations

import json

import numpy as np
import pytest

from fedveil.reproduce import REPRODUCTIONS, ReproductionContext, write_results
from fedveil_reproductions.fade_adult import (
    WEAK,
    AdultStudy,
    adult_study,
    claim_rows,
    diagnostic_rows,
    female_weight,
    plan,
    run_config,
)

WORKCLASSES = ["Private", "Self-emp-not-inc", "State-gov"]
EDUCATION = [("HS-grad", 9), ("Bachelors", 13), ("Masters", 14)]
OCCUPATIONS = ["Adm-clerical", "Exec-managerial", "Craft-repair"]


def adult_rows(n: int, seed: int, test: bool) -> list[str]:
    """``n`` complete rows in the UCI format; every (sex, income) pair appears, the label
    follows education and hours so a model has something to learn."""
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(n):
        sex = "Female" if i % 3 == 0 else "Male"
        high = (i // 3) % 2 == 1 if i < 12 else bool(rng.random() < 0.35)
        edu, years = EDUCATION[2 if high else int(rng.integers(0, 2))]
        hours = int(rng.integers(45, 60) if high else rng.integers(20, 41))
        relation = ("Wife" if sex == "Female" else "Husband") if high else "Not-in-family"
        marital = "Married-civ-spouse" if high else "Never-married"
        label = (">50K" if high else "<=50K") + ("." if test else "")
        rows.append(
            f"{int(rng.integers(20, 65))}, {WORKCLASSES[i % 3]}, {int(rng.integers(50_000, 300_000))}, {edu}, {years}, "
            f"{marital}, {OCCUPATIONS[i % 3]}, {relation}, White, {sex}, 0, 0, {hours}, United-States, {label}"
        )
    return rows


@pytest.fixture
def data_root(tmp_path):
    folder = tmp_path / "data" / "adult"
    folder.mkdir(parents=True)
    (folder / "adult.data").write_text("\n".join(adult_rows(90, 0, test=False)) + "\n")
    (folder / "adult.test").write_text("|1x3 Cross validator\n" + "\n".join(adult_rows(36, 1, test=True)) + "\n")
    return tmp_path / "data"


@pytest.fixture
def no_run_plots(monkeypatch):
    """Each run's own PNGs take ~1 s; the study's two figures are still drawn."""
    import fedveil.runtime.simulation as simulation

    monkeypatch.setattr(simulation, "write_report", lambda path: [])


def test_run_config_follows_the_paper_protocol(tmp_path):
    ctx = ReproductionContext(out_dir=tmp_path, quick=False, data_root=tmp_path)
    config = run_config(ctx, AdultStudy(), "squared", 7, 2)
    assert config["data"]["num_clients"] == 8
    assert config["data"]["partition"] == {"name": "domain", "key": "sex", "clients_per_domain": [1, 7]}
    assert config["federation"]["clients_per_round"] == 2
    assert config["client"] == {"steps": 1, "batch_size": 64, "lr": 0.1, "lr_schedule": "dann"}
    assert config["algorithm"] == {"name": "fade", "group_key": "sex", "beta": 0.5, "adversarial_loss": "squared"}
    assert run_config(ctx, AdultStudy(), "none", 7, 2)["algorithm"]["lam"] == 0.0
    quick, full = adult_study(quick=True), adult_study()
    assert quick.methods == full.methods == ["none", "vanilla", "squared"] and len(full.seeds) >= 3
    assert min(full.male_users) == 1 and max(full.male_users) > max(quick.male_users) > 1


@pytest.mark.usefixtures("no_run_plots")
def test_quick_path_end_to_end_on_tiny_adult_files(tmp_path, data_root, monkeypatch):
    """``fedveil reproduce fade_adult --quick`` as the registry runs it, with fewer rounds."""
    import fedveil_reproductions.fade_adult as module

    small = AdultStudy(male_users=[1, 3], seeds=[0, 1], rounds=6, eval_every=3)
    monkeypatch.setattr(module, "adult_study", lambda quick: small)
    ctx = ReproductionContext(out_dir=tmp_path / "out", quick=True, data_root=data_root)
    report = REPRODUCTIONS.get("fade_adult")(ctx)
    md, js = write_results(report, ctx.out_dir, quick=True)
    for figure in report.figures:
        assert (ctx.out_dir / figure).stat().st_size > 10_000
    text = md.read_text()
    assert "Quick mode" in text and "curve only (Fig. 3.3a)" in text
    numbers = json.loads(js.read_text())["extra"]
    per_seed = numbers["metrics"]
    assert set(per_seed) == {"none", "vanilla", "squared", WEAK} and set(per_seed["none"]) == {"1", "3"}
    assert set(per_seed[WEAK]) == {"1", "3"}  # the ablation runs at the fewest and the most male users
    for by_m in per_seed.values():
        for seeds in by_m.values():
            assert len(seeds) == 2
            for scores in seeds:
                assert 0 <= scores["accuracy"] <= 1 and 0 <= scores["eo"] <= 2 and 0 <= scores["dp"] <= 1
    assert len(numbers["eo_curves"]["squared_m3_seed1"]) == 2  # rounds 3 and 6
    metrics = [r.metric for r in report.rows]
    assert sum(m.endswith(": ΔEO") for m in metrics) == 8  # (3 methods + the ablation) x 2 male-user counts
    claims = [m.split(" ")[0] for m in metrics if m.startswith("(") or m.startswith("must")]
    assert claims == ["(i)", "(ii)", "(iii)", "(iv)", "must-show:", "(iii)"]  # the last: (iii) in demographic parity
    assert sum(m.startswith(f"ablation: {WEAK}") for m in metrics) == 2
    weight = next(r for r in report.rows if r.metric.startswith("female user's expected weight"))
    assert weight.measured.startswith("0.333 -> 0.300")  # 30 / 90 rows; 2/4 * 30 / (30 + 20)
    # one female user of every female row, the rest split evenly among the male users
    partition = json.loads((ctx.runs_dir / "none_m3_seed0" / "partition.json").read_text())
    assert partition["train_sizes"] == [30, 20, 20, 20] and partition["pooled_test_size"] == 36
    assert [r.name for r in plan(ctx)] == [
        f"{m}_m{males}_seed{seed}" for m, males in [("none", 1), ("vanilla", 1), ("squared", 1), ("none", 3),
                                                    ("vanilla", 3), ("squared", 3), (WEAK, 1), (WEAK, 3)]
        for seed in (0, 1)
    ]
    trained = {p: p.stat().st_mtime_ns for p in ctx.runs_dir.glob("*/metrics.jsonl")}
    again = REPRODUCTIONS.get("fade_adult")(ctx)  # finished runs are re-scored, not retrained
    assert again.rows == report.rows and again.extra["metrics"] == report.extra["metrics"]
    assert {p: p.stat().st_mtime_ns for p in ctx.runs_dir.glob("*/metrics.jsonl")} == trained


def test_female_weight_in_a_round_of_two():
    assert female_weight([30, 60]) == pytest.approx(30 / 90)  # both users every round
    assert female_weight([30, 20, 20, 20]) == pytest.approx(2 / 4 * 30 / 50)
    assert female_weight([10, 10, 30]) == pytest.approx(2 / 3 * (10 / 20 + 10 / 40) / 2)


def test_ablation_verdicts():
    study = AdultStudy(male_users=[1, 15], seeds=[0, 1])

    def two(eo_a, eo_b):
        return [{"eo": eo_a, "accuracy": 0.85, "dp": 0.1}, {"eo": eo_b, "accuracy": 0.85, "dp": 0.1}]

    results = {"squared": {1: two(0.10, 0.12), 15: two(0.10, 0.12)}, WEAK: {1: two(0.105, 0.115), 15: two(0.05, 0.06)}}
    rows = [r for r in diagnostic_rows(results, study, None) if r.metric.startswith("ablation")]
    assert [r.verdict for r in rows] == ["matches squared (within seed noise)", f"{WEAK} fairer than squared"]
    assert rows[1].measured == "0.0550 / 0.1000 / 0.8500 vs 0.1100 / 0.1000 / 0.8500"


def fake(eo: dict[str, list[float]], acc: dict[str, list[float]], males=(1, 15)) -> dict:
    """Results with one seed: ``eo[method][i]`` at ``males[i]`` male users."""
    return {
        method: {m: [{"eo": eo[method][i], "accuracy": acc[method][i], "dp": 0.1}] for i, m in enumerate(males)}
        for method in eo
    }


def test_claim_verdicts_on_fixed_numbers():
    study = AdultStudy(male_users=[1, 15], seeds=[0])
    results = fake(
        eo={"none": [0.10, 0.30], "vanilla": [0.05, 0.20], "squared": [0.08, 0.12]},
        acc={"none": [0.85, 0.85], "vanilla": [0.845, 0.84], "squared": [0.84, 0.835]},
    )
    rows = {r.metric[:4]: r for r in claim_rows(results, study)}
    one_seed = "holds (one seed: noise not estimated)"
    assert rows["(i) "].verdict == one_seed and "0.1000 -> 0.3000 (change +0.2000" in rows["(i) "].measured
    assert rows["(ii)"].verdict == one_seed and rows["(iii"].verdict == one_seed
    assert rows["(iv)"].verdict == "holds" and "+1.50 points (squared, 15 male users)" in rows["(iv)"].measured
    assert rows["must"].verdict == one_seed and "accuracy drop +1.50 points" in rows["must"].measured

    costly = fake(
        eo={"none": [0.30, 0.20], "vanilla": [0.05, 0.10], "squared": [0.04, 0.15]},
        acc={"none": [0.85, 0.85], "vanilla": [0.84, 0.84], "squared": [0.84, 0.82]},
    )
    rows = {r.metric[:4]: r for r in claim_rows(costly, study)}
    assert rows["(i) "].verdict == "does not hold"
    assert rows["(ii)"].verdict == "does not hold" and rows["(iii"].verdict == "does not hold"
    assert rows["(iv)"].verdict == "does not hold"
    assert rows["must"].verdict.startswith("does not hold (accuracy drop 3.00")


def test_differences_within_seed_noise_are_called_so():
    study = AdultStudy(male_users=[1, 15], seeds=[0, 1])
    two = {
        "none": {1: [{"eo": 0.1, "accuracy": 0.85, "dp": 0.1}, {"eo": 0.3, "accuracy": 0.85, "dp": 0.1}],
                 15: [{"eo": 0.15, "accuracy": 0.85, "dp": 0.1}, {"eo": 0.35, "accuracy": 0.85, "dp": 0.1}]},
    }
    (row,) = claim_rows(two, study)  # only "none": claims (ii)-(iv) and the must-show need other methods
    assert row.verdict == "holds, within seed noise (< 2 s.e.)"  # +0.05, s.e. of the difference sqrt(0.1^2 + 0.1^2) = 0.14
    clear = {"none": {1: two["none"][1], 15: [{**r, "eo": r["eo"] + 0.5} for r in two["none"][15]]}}
    assert claim_rows(clear, study)[0].verdict == "holds"  # +0.5 > 2 s.e.
