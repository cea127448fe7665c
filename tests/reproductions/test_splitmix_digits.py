"""splitmix_digits (Table 4.1, Digits): the study runs end to end on tiny MNIST files, the
cost table matches hand-counted parameters and MACs, and the claims' verdicts follow the numbers."""
from __future__ import annotations

import torch

from fedveil.reproduce import ReproductionContext, run_plan
from fedveil_reproductions import splitmix_digits as sm
from fedveil_reproductions.splitmix_study import (
    WIDTHS,
    SplitMixStudy,
    costs,
    study_plan,
)

torch.set_num_threads(1)


def test_the_study_trains_every_method_and_scores_every_width(tmp_path, mnist_data_root):
    study = SplitMixStudy(seeds=[0], clients_per_domain=1, rows_per_domain=20, test_rows_per_domain=10, size=8,
                          rounds=2)
    ctx = ReproductionContext(out_dir=tmp_path / "out", quick=True, data_root=mnist_data_root)
    run_plan(study_plan(ctx, study), ctx.runs_dir, progress=False)
    report = sm.study_report(ctx, study)
    accuracy = report.extra["accuracy"]
    assert set(accuracy) == {"split_mix", "heterofl", "sheterofl", "fedavg"}
    for method, by_width in accuracy.items():
        assert set(by_width) == {"0.125", "0.25", "0.5", "1"}
        assert all(len(v) == 1 and 0.0 <= v[0] <= 1.0 for v in by_width.values())
    assert (ctx.out_dir / "accuracy_vs_width.png").stat().st_size > 0
    # 5 domains x 1 client x (split_mix, heterofl, sheterofl, fedavg at 4 widths) = 7 runs
    assert len(list((ctx.out_dir / "runs").iterdir())) == 7


def test_costs_at_28x28_are_the_hand_counted_table_4_1_numbers():
    cost = costs((3, 28, 28))
    base_params, base_macs = 224_194, 1_158_528  # the x0.125 digits CNN (tests/models)
    assert cost["fedavg"][1.0] == {"params": 14_219_210, "macs": 47_767_552, "train_macs": 47_767_552, "upload": 14_219_210}
    assert cost["split_mix"][1.0]["params"] == 8 * base_params == 1_793_552
    assert cost["split_mix"][0.25] == {"params": 2 * base_params, "macs": 2 * base_macs, "train_macs": 2 * base_macs,
                                       "upload": 2 * base_params}
    # SHeteroFL's x0.25 client runs the x0.125 and the x0.25 sub-models on each batch
    assert cost["sheterofl"][0.25]["train_macs"] == base_macs + 3_692_032
    assert cost["heterofl"][0.5]["upload"] == 3_559_402


def test_claims_follow_the_numbers():
    high, low = [0.9, 0.91, 0.92], [0.5, 0.52, 0.51]
    results = {m: {w: list(high) for w in WIDTHS} for m in ("split_mix", "fedavg")}
    results["heterofl"] = {w: list(low) for w in WIDTHS}
    results["sheterofl"] = {w: list(low) for w in WIDTHS}
    results["split_mix"][0.125] = [0.8, 0.81, 0.82]
    rows = {r.metric: r for r in sm.claim_rows(results, costs((3, 28, 28)))}
    assert rows["(a) Split-Mix above HeteroFL at the smallest widths"].verdict == "holds"
    assert rows["(b) Split-Mix x1 >= SHeteroFL x1"].verdict == "holds"
    assert rows["(c) Split-Mix accuracy grows with width"].verdict == "holds"
    gap = rows["(d) Split-Mix x1 vs individual FedAvg x1: accuracy gap; parameters and MACs (3x28x28)"]
    # 1,793,552 / 14,219,210 = 12.6%; 9,268,224 / 47,767,552 = 19.4%
    assert gap.measured == "+0.00 points; 12.6% params, 19.4% MACs"
    results["split_mix"][1.0] = [0.4, 0.41, 0.42]
    rows = {r.metric: r for r in sm.claim_rows(results, costs((3, 28, 28)))}
    assert rows["(b) Split-Mix x1 >= SHeteroFL x1"].verdict == "does not hold"
