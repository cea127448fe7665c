"""Closed-form per-example gradients, clipping and the DP-SGD step of the logistic model (spec 002 §1.2, §4.5)."""
from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from fedveil.pets.focal import focal_loss
from fedveil.pets.logreg import TrainConfig, clipped_sum, per_example_grads, private_step, train, uniform_batches
from fedveil.privacy.dp_sgd import clip_factors


def data(b=16, d=7, scale=1.0, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(b, d, generator=g, dtype=torch.float64) * scale
    y = (torch.rand(b, generator=g) < 0.4).double()
    theta = torch.randn(d + 1, generator=g, dtype=torch.float64) * 0.3
    centre = torch.randn(d + 1, generator=g, dtype=torch.float64) * 0.3
    return x, y, theta, centre


def test_per_example_grads_equal_autograd_with_the_mrmtl_term():
    x, y, theta, centre = data()
    cfg, lam = TrainConfig(), 0.05
    ours = per_example_grads(theta, x, y, cfg, prox=lam * (theta - centre))
    for i in range(len(x)):
        leaf = theta.clone().requires_grad_(True)
        objective = focal_loss(x[i] @ leaf[:-1] + leaf[-1], y[i], cfg.gamma, cfg.alpha) + lam / 2 * (leaf - centre).square().sum()
        (auto,) = torch.autograd.grad(objective, leaf)
        torch.testing.assert_close(ours[i], auto)


@pytest.mark.parametrize("with_prox", [False, True])
def test_closed_form_clipped_sum_equals_materialised_clipping(with_prox):
    x, y, theta, centre = data(scale=30.0)  # large inputs: most examples get clipped
    cfg = TrainConfig(clip=1.5)
    prox = 0.3 * (theta - centre) if with_prox else None
    grads = per_example_grads(theta, x, y, cfg, prox)
    factors, norms = clip_factors({"theta": grads}, cfg.clip)
    total, our_norms = clipped_sum(theta, x, y, cfg, prox)
    torch.testing.assert_close(our_norms, norms)
    torch.testing.assert_close(total, factors @ grads)
    assert (factors < 1).sum() >= len(x) // 2


def test_clipping_bound_holds():
    x, y, theta, _ = data(b=64, scale=100.0, seed=3)
    cfg = TrainConfig(clip=0.7)
    grads = per_example_grads(theta, x, y, cfg)
    factors, norms = clip_factors({"theta": grads}, cfg.clip)
    clipped = (factors[:, None] * grads).norm(dim=1)
    assert (clipped <= cfg.clip * (1 + 1e-12)).all()
    small = norms <= cfg.clip
    torch.testing.assert_close(clipped[small], norms[small])  # under the bound: untouched


def test_noiseless_step_by_hand():
    """theta = 0, x = (3, 4), y = 1: dFL/dz = 0.75 (2 * 1/2 * 1/4 * ln 1/2 - 1/8) = -0.22372;
    g = dz (3, 4, 1) has norm 0.22372 * sqrt(26) = 1.1407 > C = 0.5, so the step is lr * C * (3, 4, 1) / sqrt(26)."""
    cfg = TrainConfig(clip=0.5, lr=0.2, noise_multiplier=0.0)
    theta = torch.zeros(3, dtype=torch.float64)
    x, y = torch.tensor([[3.0, 4.0]], dtype=torch.float64), torch.tensor([1.0], dtype=torch.float64)
    _, norms = clipped_sum(theta, x, y, cfg)
    assert norms.item() == pytest.approx(0.75 * (0.25 * math.log(2) + 0.125) * math.sqrt(26), rel=1e-12)
    new = private_step(theta, x, y, cfg, torch.Generator().manual_seed(0))
    torch.testing.assert_close(new, 0.2 * 0.5 * torch.tensor([3.0, 4.0, 1.0], dtype=torch.float64) / math.sqrt(26))


def test_noise_has_std_clip_times_sigma_on_the_sum():
    d, b = 20_000, 4
    cfg = TrainConfig(clip=1.5, lr=1.0, noise_multiplier=2.0)
    x, y = torch.zeros(b, d, dtype=torch.float64), torch.zeros(b, dtype=torch.float64)
    theta = torch.zeros(d + 1, dtype=torch.float64)
    clean = private_step(theta, x, y, TrainConfig(clip=1.5, lr=1.0, noise_multiplier=0.0), torch.Generator().manual_seed(0))
    noisy = private_step(theta, x, y, cfg, torch.Generator().manual_seed(0))
    noise_on_sum = (clean - noisy) * b  # theta - lr * (sum + noise) / b
    assert noise_on_sum.std().item() == pytest.approx(1.5 * 2.0, rel=0.03)


def test_bad_config():
    with pytest.raises(ValueError, match="batch_size must be an integer >= 1"):
        TrainConfig(batch_size=0)
    with pytest.raises(ValueError, match="clip must be a number > 0"):
        TrainConfig(clip=0.0)


class FakeSilo:
    """The minimum of SiloFeatures that train() uses: fixed examples, labels ignoring the window."""

    def __init__(self, x, y):
        self.x, self.y = x, y
        self.num_nodes = len(x)
        self.layout = SimpleNamespace(dim=x.shape[1])

    def examples(self, idx, start):
        return self.x[idx]

    def labels(self, idx, start):
        return self.y[idx]


def test_uniform_batches_are_independent_draws_without_replacement():
    """n = 20, b = 5. Each batch holds 5 distinct rows. The number rho of rows {0, 1, 2} (a node's
    S = 3 examples) in a batch is Hypergeometric(20, 3, 5), the rho of Theorem 2.4.4:
    P(rho = k) = C(3, k) C(17, 5 - k) / C(20, 5) = (6188, 7140, 2040, 136) / 15504.
    Two consecutive batches share 5 * 5 / 20 = 1.25 rows on average (0 within a shuffled epoch)."""
    steps = 20_000
    batches = torch.stack(list(uniform_batches(20, 5, steps, torch.Generator().manual_seed(0))))
    assert batches.shape == (steps, 5) and batches.min() >= 0 and batches.max() <= 19
    ordered = batches.sort(dim=1).values
    assert (ordered[:, 1:] > ordered[:, :-1]).all()
    rho = torch.isin(batches, torch.tensor([0, 1, 2])).sum(dim=1)
    freq = torch.bincount(rho, minlength=4).double() / steps
    torch.testing.assert_close(freq, torch.tensor([6188, 7140, 2040, 136], dtype=torch.float64) / 15504, atol=0.015, rtol=0)
    shared = (batches[1:, :, None] == batches[:-1, None, :]).any(dim=2).sum(dim=1).double()
    assert shared.mean().item() == pytest.approx(1.25, abs=0.05)
    with pytest.raises(ValueError, match="batch_size"):
        next(uniform_batches(4, 5, 1, torch.Generator()))


def test_train_draws_every_step_independently():
    """One epoch is n // b = 10 steps of 10 distinct rows out of n = 100; a shuffled epoch would
    visit every row exactly once, independent draws leave some out and repeat others."""
    seen = []

    class Recording(FakeSilo):
        def examples(self, idx, start):
            seen.append(idx)
            return super().examples(idx, start)

    x, y = np.zeros((100, 3), dtype=np.float32), np.zeros(100, dtype=np.float32)
    cfg = TrainConfig(batch_size=10, noise_multiplier=0.0)
    train(torch.zeros(4), Recording(x, y), cfg, epochs=1, rng=np.random.default_rng(0), generator=torch.Generator().manual_seed(0))
    assert len(seen) == 10 and all(len(np.unique(idx)) == 10 for idx in seen)
    assert len(np.unique(np.concatenate(seen))) < 100


def test_train_takes_n_over_batch_steps_per_epoch_and_learns_a_separable_rule():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(1000, 5)).astype(np.float32)
    y = (x[:, 0] > 1.0).astype(np.float32)
    cfg = TrainConfig(batch_size=64, lr=1.0, noise_multiplier=0.0)
    theta, log = train(torch.zeros(6), FakeSilo(x, y), cfg, epochs=3, rng=rng, generator=torch.Generator().manual_seed(0))
    assert log.steps == 3 * (1000 // 64)
    assert theta[0] > 0.5 and theta[0] > 5 * theta[1:5].abs().max()  # the weight of the informative feature dominates
    unchanged, log0 = train(torch.zeros(6), FakeSilo(x, y), cfg, epochs=0, rng=rng, generator=torch.Generator())
    assert log0.steps == 0 and not unchanged.any()
    with pytest.raises(ValueError, match="theta must have shape"):
        train(torch.zeros(4), FakeSilo(x, y), cfg, epochs=1, rng=rng, generator=torch.Generator())
