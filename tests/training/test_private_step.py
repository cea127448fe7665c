"""A client's private step by the stacked rules with one client equals the vmap reference.

The reference is :func:`fedveil.privacy.dp_sgd.private_gradient` called on the same
arguments, which forms every per-example gradient by ``torch.func.vmap`` (a linear stack
aside); noise is drawn from two generators seeded alike, so equal gradients mean equal
clipped sums and equal noise streams.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from fedveil.engine.grad_terms import AffineGradTerm
from fedveil.privacy.dp_sgd import ExampleDP, private_gradient
from fedveil.training import private_step
from fedveil.training.private_step import book_keeping_model, client_private_gradient
from fedveil.training.request import Batch, TaskLoss


def conv_net() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(2, 4, 3, padding=1), nn.GroupNorm(2, 4), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(4, 6, 3), nn.Tanh(), nn.Flatten(), nn.Linear(6, 3),
    )


def _setup(rows: int, seed: int = 0):
    torch.manual_seed(seed)
    model = conv_net().double()
    gen = torch.Generator().manual_seed(seed + 1)
    w = {n: p.detach() + 0.3 * torch.randn(p.shape, generator=gen, dtype=torch.float64) for n, p in model.named_parameters()}
    x = torch.randn(rows, 2, 6, 6, generator=gen, dtype=torch.float64) * torch.linspace(0.01, 20, rows).view(-1, 1, 1, 1).double()
    y = torch.randint(0, 3, (rows,), generator=gen)
    return model, w, Batch(x, y, {})


@pytest.mark.parametrize("public", [0, 3], ids=["all-private", "mixed"])
@pytest.mark.parametrize("lam", [0.0, 0.5], ids=["plain", "clipped-term"])
def test_book_keeping_step_equals_vmap_private_gradient(public, lam):
    model, w, batch = _setup(8)
    objective = TaskLoss(F.cross_entropy)
    dp = ExampleDP(clip=0.7, noise_multiplier=0.9, sampling="shuffle", batch_size=8 - public)
    anchor = {n: torch.randn(v.shape, generator=torch.Generator().manual_seed(5), dtype=torch.float64) for n, v in w.items()}
    hook = AffineGradTerm(scale=lam, offset={n: -lam * a for n, a in anchor.items()}, clipped=True) if lam else None
    extra = hook.value if hook is not None else None
    private_rows = 8 - public
    assert book_keeping_model(model) is not None
    got = client_private_gradient(model, w, batch, objective, dp, torch.Generator().manual_seed(9), 8.0, private_rows, extra, {})
    want = private_gradient(model, w, batch.x, batch, objective.mean, clip=0.7, noise_multiplier=0.9, denominator=8.0,
                            generator=torch.Generator().manual_seed(9), extra_grad=extra, private_rows=private_rows)
    assert got.size == want.size == 8
    assert got.loss == pytest.approx(want.loss, rel=1e-12)
    for name in w:
        torch.testing.assert_close(got.grad[name], want.grad[name], rtol=1e-10, atol=1e-12)


def test_linear_stacks_unsupported_models_and_empty_batches_keep_private_gradient(monkeypatch):
    calls = []
    monkeypatch.setattr(private_step, "private_stacked_gradients", lambda *a, **k: calls.append("stacked"))
    objective, dp = TaskLoss(F.cross_entropy), ExampleDP(1.0, 1.0, "poisson", 4)
    mlp = nn.Sequential(nn.Flatten(), nn.Linear(8, 3))
    grouped = nn.Sequential(nn.Conv2d(2, 2, 3, groups=2), nn.Flatten(), nn.Linear(32, 3))
    x = torch.randn(4, 2, 6, 6)
    cases = [(mlp, x[:, :, :2, :2], 4), (grouped, x, 4), (conv_net(), x[:0], 0)]
    for model, xs, n in cases:
        w = {k: v.detach() for k, v in model.named_parameters()}
        out = client_private_gradient(model, w, Batch(xs, torch.zeros(n, dtype=torch.long), {}), objective, dp,
                                      torch.Generator().manual_seed(0), 4.0, n, None, {})
        assert set(out.grad) == set(w) and out.size == n
    assert calls == [] and book_keeping_model(grouped) is None
