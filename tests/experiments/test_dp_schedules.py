"""The dp_schedules reproduction on a tiny synthetic MNIST stand-in (IDX files in tmp_path)."""
from __future__ import annotations

import sys
from pathlib import Path
import gzip

import numpy as np
import pytest
import torch
from torch import nn

from fedveil.experiments import EXPERIMENTS, ExperimentContext, write_results
from fedveil.experiments.dp_schedules import (
    StudyConfig,
    fast_pgd,
    load_mnist_file,
    make_model,
    make_task,
    run_experiment,
    train_eval,
)
from fedveil.privacy.dp_gd import DPGDParams, train_dp_gd
from fedveil.privacy.schedules import PredefinedSchedule, uniform_sigmas
from fedveil.privacy.zcdp import rho_from_epsilon_delta

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "data"))
from mnist_idx_files import idx  # noqa: E402  (tests/data helper: tiny IDX files)


def write_fake_mnist(directory, n=160, seed=0):
    """Class-dependent blobs so the tiny task is learnable; the real subset-pair IDX layout."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 10, n).astype(np.uint8)
    labels[: n // 4] = 3
    labels[n // 4 : n // 2] = 5
    centres = rng.integers(0, 256, (10, 28, 28))
    images = np.clip(centres[labels] + rng.normal(0, 40, (n, 28, 28)), 0, 255).astype(np.uint8)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "images-idx3-ubyte.gz").write_bytes(gzip.compress(idx(images)))
    (directory / "labels-idx1-ubyte.gz").write_bytes(gzip.compress(idx(labels)))
    return images, labels


TINY = StudyConfig(
    sizes_35=[30, 60], size_10=60, seeds=[0, 1], tune_seeds=[100], T_grid=[5, 10], gamma_grid=[0.9, 0.99],
    hidden=16, pca_dim=10,
)


def test_registered():
    assert "dp_schedules" in EXPERIMENTS


def test_fast_pgd_matches_train_dp_gd():
    """Closed-form clipping gives the same noiseless update as the generic per-example trainer."""
    torch.manual_seed(0)
    x = torch.randn(25, 7)
    x = x / x.norm(dim=1, keepdim=True) * 5
    y = torch.randint(0, 3, (25,))
    model = make_model(7, 12, 3, seed=0)
    ref = train_dp_gd(
        model, x, y, nn.functional.cross_entropy, PredefinedSchedule((0.0,) * 4),
        DPGDParams(lr=0.1, clip_norm=0.5), torch.Generator().manual_seed(0),
    )
    fast = fast_pgd(model, x, y, np.zeros(4), 0.1, 0.5, torch.Generator().manual_seed(0))
    for k, v in fast.items():
        assert torch.allclose(v, ref.params[k], atol=1e-6), k


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
    with pytest.raises(ValueError, match="budget"):
        train_eval(task, uniform_sigmas(2 * R, 10), TINY, seed=0)


def test_tiny_experiment_end_to_end(tmp_path):
    write_fake_mnist(tmp_path / "data" / "mnist-10k")
    ctx = ExperimentContext(out_dir=tmp_path / "out", quick=True, data_root=tmp_path / "data")
    report = run_experiment(ctx, TINY, log=lambda *_: None)
    assert report.figures == ["dp_schedules.png"] and (ctx.out_dir / "dp_schedules.png").stat().st_size > 0
    # two rows (loss, accuracy) per task + the trend row
    assert len(report.rows) == 2 * 3 + 1
    results = report.extra["results"]
    for r in results:
        assert r["uniform_T"] in TINY.T_grid and r["dynamic_gamma"] in TINY.gamma_grid
        assert len(r["uniform_loss"]) == len(r["dynamic_acc"]) == 2
        assert all(0 <= a <= 1 for a in r["uniform_acc"] + r["dynamic_acc"])
    assert any("NOT differentially private" in n for n in report.scale_notes)
    md, js = write_results(report, ctx.out_dir, quick=True)
    assert "MNIST35, N=60" in md.read_text() and js.exists()
