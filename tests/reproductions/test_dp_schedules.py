"""The dp_schedules reproduction on a tiny synthetic MNIST stand-in (IDX files in tmp_path)."""
from __future__ import annotations

import gzip
import math
import statistics
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from fedveil.privacy.schedules import uniform_sigmas
from fedveil.privacy.zcdp import rho_from_epsilon_delta
from fedveil.reproduce import REPRODUCTIONS, ReproductionContext, write_results
from fedveil_reproductions.dp_schedules import (
    StudyConfig,
    Task,
    claim_verdict,
    gd_dynamic_sigmas,
    load_mnist_file,
    make_model,
    make_task,
    train_eval,
    train_noiseless,
)

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "data"))
from mnist_idx_files import idx  # noqa: E402  (tests/data helper: tiny IDX files)


def write_fake_mnist(directory, n=160, seed=0, noise=40.0):
    """Class-dependent blobs (pixel noise sd ``noise``) so the tiny task is learnable; the
    real subset-pair IDX layout."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 10, n).astype(np.uint8)
    labels[: n // 4] = 3
    labels[n // 4 : n // 2] = 5
    centres = rng.integers(0, 256, (10, 28, 28))
    images = np.clip(centres[labels] + rng.normal(0, noise, (n, 28, 28)), 0, 255).astype(np.uint8)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "images-idx3-ubyte.gz").write_bytes(gzip.compress(idx(images)))
    (directory / "labels-idx1-ubyte.gz").write_bytes(gzip.compress(idx(labels)))
    return images, labels


TINY = StudyConfig(
    sizes_35=[30, 60], size_10=60, seeds=[0, 1], tune_seeds=[100], T_grid=[5, 10], gamma_grid=[0.9, 0.99],
    hidden=16, pca_dim=10,
)


def test_registered():
    assert "dp_schedules" in REPRODUCTIONS


def test_task_preprocessing(tmp_path):
    images, labels = write_fake_mnist(tmp_path / "mnist-10k")
    x, y = load_mnist_file(tmp_path / "mnist-10k")
    assert x.shape == (160, 784) and np.array_equal(y, labels)
    task = make_task(x, y, [3, 5], 30, TINY, "t")
    assert task.x.shape == (30, 10) and task.num_classes == 2
    assert len(task.x_test) == (np.isin(labels, [3, 5]).sum() - 30)
    assert torch.allclose(task.x.mean(0), torch.zeros(10), atol=1e-4)
    assert task.x.norm(dim=1).max().item() == pytest.approx(10.0, rel=1e-5)


def test_run_spends_budget(tmp_path):
    write_fake_mnist(tmp_path / "d")
    x, y = load_mnist_file(tmp_path / "d")
    task = make_task(x, y, None, 60, TINY, "t")
    R = 2 * rho_from_epsilon_delta(4.0, 1e-8)
    out = train_eval(task, uniform_sigmas(R, 10), TINY, seed=0)
    assert out["epsilon"] == pytest.approx(4.0, rel=1e-6) and out["steps"] == 10
    with pytest.raises(ValueError, match="more than the budget R .* pays for 5"):
        train_eval(task, uniform_sigmas(2 * R, 10), TINY, seed=0)


def test_private_runs_draw_their_noise_from_the_seed(tmp_path):
    write_fake_mnist(tmp_path / "d")
    x, y = load_mnist_file(tmp_path / "d")
    task = make_task(x, y, [3, 5], 30, TINY, "t")
    R = 2 * rho_from_epsilon_delta(4.0, 1e-8)
    runs = [train_eval(task, uniform_sigmas(R, 5), TINY, seed) for seed in (0, 0, 1)]
    assert runs[0] == runs[1] and runs[0]["loss"] != runs[2]["loss"]


def _autograd_gd(model, x, y, steps, lr, clip):
    """Plain full-batch GD with explicit per-example clipping, one autograd call per example."""
    params = {k: v.detach().clone().requires_grad_(True) for k, v in model.named_parameters()}
    for _ in range(steps):
        total = {k: torch.zeros_like(v) for k, v in params.items()}
        for i in range(len(x)):
            out = torch.func.functional_call(model, params, (x[i : i + 1],))
            grads = torch.autograd.grad(nn.functional.cross_entropy(out, y[i : i + 1]), list(params.values()))
            norm = math.sqrt(sum(float(g.pow(2).sum()) for g in grads))
            factor = min(1.0, clip / norm)
            for k, g in zip(params, grads):
                total[k] += factor * g
        params = {k: (v - lr * total[k] / len(x)).detach().requires_grad_(True) for k, v in params.items()}
    return {k: v.detach() for k, v in params.items()}


def test_noiseless_run_is_per_example_clipped_gd():
    """train_noiseless (the library's DP-GD at sigma_t = 0) equals a per-example-clipped GD loop
    written with autograd, from the same init."""
    torch.manual_seed(1)
    x = torch.randn(20, 6) * 2
    y = torch.randint(0, 3, (20,))
    cfg = StudyConfig(hidden=9, lr=0.5, clip=3.0)
    model = make_model(6, 9, 3, seed=3)
    # clipping is active for some examples but not all (else the test would not check it)
    norms = []
    for i in range(len(x)):
        model.zero_grad()
        nn.functional.cross_entropy(model(x[i : i + 1]), y[i : i + 1]).backward()
        norms.append(math.sqrt(sum(float(p.grad.pow(2).sum()) for p in model.parameters())))
    assert min(norms) < cfg.clip < max(norms)
    ref = _autograd_gd(model, x, y, steps=3, lr=cfg.lr, clip=cfg.clip)
    with torch.no_grad():
        expected = nn.functional.cross_entropy(torch.func.functional_call(model, ref, (x,)), y).item()
    out = train_noiseless(Task("t", x, y, x, y, 3), 3, cfg, seed=3)
    assert out["loss"] == pytest.approx(expected, rel=1e-6) and out["steps"] == 3 and out["epsilon"] == math.inf


def test_noiseless_run_below_private_runs(tmp_path):
    write_fake_mnist(tmp_path / "d")
    x, y = load_mnist_file(tmp_path / "d")
    task = make_task(x, y, [3, 5], 60, TINY, "t")
    R = 2 * rho_from_epsilon_delta(4.0, 1e-8)
    for seed in (0, 1):
        base = train_noiseless(task, 10, TINY, seed)
        assert base["steps"] == 10 and base["epsilon"] == math.inf
        uni = train_eval(task, uniform_sigmas(R, 10), TINY, seed)
        dyn = train_eval(task, gd_dynamic_sigmas(R, 10, 0.9), TINY, seed)
        assert base["loss"] <= uni["loss"] and base["loss"] <= dyn["loss"]
        # same init and steps without noise -> deterministic, and different from the private runs
        assert train_noiseless(task, 10, TINY, seed)["loss"] == base["loss"] != uni["loss"]


def _verdict_by_hand(sweep):
    """The claim rule of the notes, recomputed independently from per-seed numbers."""
    sweep = sorted(sweep, key=lambda r: r["n_train"])

    def sig(values):
        m, se = statistics.fmean(values), statistics.stdev(values) / math.sqrt(len(values))
        return "exp lower" if m > 2 * se else ("uni lower" if m < -2 * se else "not resolved")

    status = [sig(r["excess_gap"]) for r in sweep]
    trend = sig([b - a for a, b in zip(sweep[0]["excess_gap"], sweep[-1]["excess_gap"])])
    if status.count("exp lower") == len(sweep) and trend == "exp lower":
        return "claim reproduced"
    if "exp lower" in status and "uni lower" not in status:
        return "claim partly reproduced"
    return "claim NOT reproduced"


def test_claim_verdict_rule():
    def row(n, gaps):
        return {"n_train": n, "excess_gap": gaps, "excess_gap_mean": statistics.fmean(gaps),
                "excess_gap_se": statistics.stdev(gaps) / math.sqrt(len(gaps))}

    growing = [row(100, [0.01, 0.012, 0.011, 0.009]), row(200, [0.03, 0.032, 0.031, 0.029])]
    assert claim_verdict(growing)["verdict"] == "claim reproduced" == _verdict_by_hand(growing)
    assert claim_verdict(growing)["trend"] == "grows"
    assert claim_verdict(growing[::-1])["verdict"] == "claim reproduced"  # sorted by N inside
    shrinking = [row(100, [0.03, 0.032, 0.031, 0.029]), row(200, [0.01, 0.012, 0.011, 0.009])]
    v = claim_verdict(shrinking)
    assert v["trend"] == "shrinks" and v["verdict"] == "claim partly reproduced" == _verdict_by_hand(shrinking)
    assert v["trend_change"] == pytest.approx(-0.02)
    flat = [row(100, [0.03, 0.032, 0.031, 0.029]), row(200, [0.03, 0.031, 0.032, 0.029])]
    v = claim_verdict(flat)
    assert v["verdict"] == "claim partly reproduced" == _verdict_by_hand(flat) and v["trend"] == "no resolved change"
    noisy = [row(100, [0.03, -0.02, 0.01, -0.01]), row(200, [0.03, 0.032, 0.031, 0.029])]
    v = claim_verdict(noisy)
    assert v["unresolved"] == [100] and v["verdict"] == "claim partly reproduced"
    losing = [row(100, [-0.03, -0.032, -0.031, -0.029]), row(200, [0.03, 0.032, 0.031, 0.029])]
    assert claim_verdict(losing)["verdict"] == "claim NOT reproduced" == _verdict_by_hand(losing)


def test_tiny_experiment_end_to_end(tmp_path):
    write_fake_mnist(tmp_path / "data" / "mnist-10k")
    ctx = ReproductionContext(out_dir=tmp_path / "out", quick=True, data_root=tmp_path / "data")
    from fedveil_reproductions import dp_schedules

    results = dp_schedules.run_study(ctx.data_dir("mnist-10k"), TINY, log=lambda *_: None)
    report = dp_schedules.report(ctx, TINY, results)
    assert report.figures == ["dp_schedules.png"] and (ctx.out_dir / "dp_schedules.png").stat().st_size > 0
    # three rows (loss, excess loss, accuracy) per task + the trend row
    assert len(report.rows) == 3 * 3 + 1
    results = report.extra["results"]
    x, y = load_mnist_file(tmp_path / "data" / "mnist-10k")
    for r in results:
        assert r["uniform_T"] in TINY.T_grid and r["dynamic_gamma"] in TINY.gamma_grid
        assert len(r["uniform_loss"]) == len(r["dynamic_acc"]) == 2
        assert all(0 <= a <= 1 for a in r["uniform_acc"] + r["dynamic_acc"])
        # excess bookkeeping: private − noiseless at the schedule's own T, per seed
        for name in ("uniform", "dynamic"):
            base = r["noiseless"][str(r[f"{name}_T"])]["loss"]
            assert r[f"{name}_excess"] == pytest.approx([l - b for l, b in zip(r[f"{name}_loss"], base)], abs=1e-12)
            assert r[f"{name}_excess_mean"] == pytest.approx(statistics.fmean(r[f"{name}_excess"]))
        diffs = [u - d for u, d in zip(r["uniform_excess"], r["dynamic_excess"])]
        assert r["excess_gap"] == pytest.approx(diffs)
        assert r["excess_gap_se"] == pytest.approx(statistics.stdev(diffs) / math.sqrt(len(diffs)))
        if r["uniform_T"] == r["dynamic_T"]:  # same T: excess gap = absolute gap
            assert r["excess_gap"] == pytest.approx(r["loss_gap"], abs=1e-6)
    # the noiseless reference recomputed from scratch for one task and seed
    r = next(r for r in results if r["task"] == "MNIST35, N=30")
    task = make_task(x, y, [3, 5], 30, TINY, "again")
    again = train_noiseless(task, r["uniform_T"], TINY, TINY.seeds[1])
    assert r["uniform_noiseless_loss"][1] == pytest.approx(again["loss"], abs=1e-7)
    # the claim verdict recomputed from the per-seed numbers
    sweep = [r for r in results if r["digits"] == "3,5"]
    assert report.extra["claim"]["verdict"] == _verdict_by_hand(sweep)
    assert report.rows[-1].verdict.startswith(_verdict_by_hand(sweep) + " (on excess training loss)")
    assert any("NOT differentially private" in n for n in report.scale_notes)
    assert any(n.startswith("diagnosis:") for n in report.scale_notes)
    md, js = write_results(report, ctx.out_dir, quick=True)
    assert "MNIST35, N=60" in md.read_text() and "excess" in md.read_text() and js.exists()
