"""The code the ECOS reproductions share (Hong, dissertation ch. 5): the methods and their
names, the synthetic Digits domains with ECOS's Digits settings, the candidate feature
extractors, the run records' per-seed means and cells, the claim rows, the paper's epsilon
convention and the phi diagnostic's rows."""
from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import numpy as np

from fedveil.data import DATASETS
from fedveil.data.loaders.digit_domains import DOMAINS
from fedveil.data.source import DataSource
from fedveil.ecos.coverage import coverage_release
from fedveil.ecos.pipeline import ECOSSettings
from fedveil.privacy.ledger import PrivacyLedger
from fedveil.reproduce import ReproductionContext, ResultRow
from fedveil.reproduce import verdicts as st

Record = dict[str, Any]  # one run's numbers
BASE_METHODS = ("ecos", "k_center", "random")  # the selection methods the papers' tables compare
MATCHED = "random_matched"  # the control: Random at ECOS's count
LABELS = {"ecos": "ECOS", "k_center": "K-Center", "random": "Random", MATCHED: "Random (ECOS's count)"}

DOMAIN_NAMES = tuple(DOMAINS)  # the synthetic Digits domains
NUM_CLASSES = 10  # digits
HOG_OPTIONS = {"cells": 4, "bins": 9, "block": 1}
#: The extractors a phi diagnostic compares (name: (phi, options)).
DIAGNOSTIC_EXTRACTORS = {
    "pixels": ("pixels", {"pool": 2}),
    "hog": ("hog", HOG_OPTIONS),
    "hog_color": ("hog_color", HOG_OPTIONS),
}


def check_study(study: Any, names: dict[str, tuple[list, tuple]], num_domains: int,
                other_R: tuple[str, int | None] | None = None) -> None:
    """The checks every ECOS study makes before any work: its ``paper_budgets`` pair one to one
    with its ``budgets``; every name of each ``names`` entry (``kind: (given, known)``, e.g.
    ``"methods": (study.methods, BASE_METHODS)``) and every client domain (below
    ``num_domains``) is known; ``other_R`` (field name, value) is None or a positive R other
    than the study's; each diagnostic extractor exists."""
    if len(study.paper_budgets) != len(study.budgets):
        raise ValueError(f"paper_budgets {study.paper_budgets} must pair with budgets {study.budgets} one to one.")
    unknown = [n for given, known in names.values() for n in given if n not in known]
    unknown += [d for d in study.domains if d not in range(num_domains)]
    if unknown:
        kinds = ", ".join(f"{kind} {known}" for kind, (_, known) in names.items())
        raise ValueError(f"unknown {', '.join(names)} or client domains {unknown}; {kinds}, domains 0..{num_domains - 1}.")
    if other_R is not None:
        field_name, value = other_R
        if value is not None and (value < 1 or value == study.ecos.R):
            raise ValueError(f"{field_name} {value} must be a positive R other than the study's {study.ecos.R}.")
    for extractor, options in study.diagnostic_extractors.values():
        dataclasses.replace(study.ecos, extractor=extractor, extractor_options=options)  # refuses unknown phi


def default_ecos() -> ECOSSettings:
    """B.3-B.4's Digits choice (R = 100, s = 1, sigma 25, gamma 0.8, PLD at delta 1e-5), with
    ``hog_color`` features (picked by ``ecos_digits``' phi diagnostic) and line 9's cluster-size cap."""
    return ECOSSettings(extractor="hog_color", extractor_options=HOG_OPTIONS, cap="cluster_size")


def load_domains(ctx: ReproductionContext, study: Any) -> DataSource:
    """The five digit domains from the MNIST rows under ``ctx.data_root`` (no download);
    ``study`` has ``rows_per_domain``, ``test_rows_per_domain`` and ``size``."""
    return DATASETS.get("digit_domains_synthetic")(
        ctx.data_dir("mnist-10k", "mnist"), download=False, seed=0, rows_per_domain=study.rows_per_domain,
        test_rows_per_domain=study.test_rows_per_domain, size=study.size,
    )


def id_share(domain: np.ndarray, chosen: np.ndarray, client_domain: int) -> float:
    """The share of the ``chosen`` pool rows that come from the client's domain (0 for none)."""
    return float(np.mean(domain[chosen] == client_domain)) if chosen.size else 0.0


def matching(records: list[Record], **keys: Any) -> list[Record]:
    """The records whose every ``key`` has the given value."""
    return [r for r in records if all(r[k] == v for k, v in keys.items())]


def seed_means(records: list[Record], key: str, **keys: Any) -> list[float]:
    """Per seed, the mean of ``key`` over the client domains of the matching records."""
    chosen = matching(records, **keys)
    seeds = sorted({r["seed"] for r in chosen})
    return [st.mean([r[key] for r in chosen if r["seed"] == s]) for s in seeds]


def accuracy_cell(runs: list[Record], domains: list[int]) -> str:
    """Accuracy % mean±std over seeds per client domain, then the average over domains."""
    cells = []
    for d in domains:
        values = [100 * r["accuracy"] for r in runs if r["domain"] == d]
        cells.append(f"{st.mean(values):.1f}±{st.std(values):.1f}")
    return " / ".join(cells + [f"{100 * st.mean(seed_means(runs, 'accuracy')):.1f}"])


def claim_row(setting: str, claim: str, low: list[float], high: list[float], paper: Any,
              verdict: Callable[[float, float], str]) -> ResultRow:
    """The row of a claim that ``high`` is above (or at least) ``low``, per-seed values shown
    in %, higher side first."""
    diff, se = st.difference(low, high)
    measured = f"{100 * st.mean(high):.2f} vs {100 * st.mean(low):.2f} (diff {100 * diff:+.2f} ± {100 * se:.2f} s.e.)"
    return ResultRow(setting, claim, measured, paper, verdict(diff, se))


def stage_seconds(runs: list[Record], key: str) -> str:
    """The mean of the runs' ``cost[key]`` seconds ("n/a" for no runs)."""
    return f"{st.mean([r['cost'][key] for r in runs]):.3f}" if runs else "n/a"


def paper_convention_epsilon(settings: ECOSSettings) -> float:
    """The ECOS upload's epsilon with the paper's sensitivity 2 (B.4)."""
    release = coverage_release(settings.sigma, settings.sample_rate, sensitivity=2.0)
    return PrivacyLedger(settings.accountant).epsilon_of([release], settings.delta)


def extractor_choice_rows(setting: str, domain_names: list[str], study: Any, diagnostic: list[Record],
                          paper: str) -> list[ResultRow]:
    """A phi diagnostic's in-distribution shares per extractor and budget (per client domain
    and their mean), and whether the study's phi has the highest mean share.  ``study`` has
    ``ecos``, ``domains``, ``budgets`` and ``diagnostic_extractors``; ``diagnostic`` records
    carry ``extractor``, ``domain``, ``budget``, ``id_share`` and ``pool_id_share``."""
    if not diagnostic:
        return []
    e, names = study.ecos, " / ".join(domain_names)
    pool_share = st.mean([r["pool_id_share"] for r in diagnostic])
    rows, means = [], {}
    for name, (extractor, options) in study.diagnostic_extractors.items():
        for budget in study.budgets:
            runs = matching(diagnostic, extractor=name, budget=budget)
            cells = [f"{100 * r['id_share']:.1f}" for d in study.domains for r in runs if r["domain"] == d]
            mean = st.mean([r["id_share"] for r in runs])
            means.setdefault(name, []).append(mean)
            rows.append(ResultRow(setting, f"{name} ({extractor} {options}): in-distribution share % at B={budget}, "
                                           f"{names} / Avg (pool: {100 * pool_share:.1f}%)",
                                  " / ".join(cells + [f"{100 * mean:.1f}"]), paper))
    chosen = [n for n, (x, o) in study.diagnostic_extractors.items() if (x, o) == (e.extractor, e.extractor_options)]
    best = max(means, key=lambda n: st.mean(means[n]))
    measured = "; ".join(f"{n}: {100 * st.mean(v):.1f}%" for n, v in means.items())
    verdict = ("holds" if chosen and st.mean(means[chosen[0]]) >= st.mean(means[best]) else
               f"does not hold (best: {best})")
    rows.append(ResultRow(setting, f"the study's phi ({e.extractor} {e.extractor_options}) has the highest mean share",
                          measured, "the experimenter's choice (no pretrained phi offline)", verdict))
    return rows
