"""Stacked DP-SGD clips the per-example gradient a model actually has, whatever its shape.

Each expected value is computed here from scratch: per-example gradients by
``torch.func.vmap(grad(...))`` of the plain (unstacked) model, clipped to ``C`` by their
global L2 norm, summed and divided by the batch size. Cases: a Linear layer, a Conv2d
layer, an Embedding and a LayerNorm each *called twice* in one forward (the released
per-example gradient is the sum over the calls, whose norm can reach ``sqrt(2)`` times the
root of the calls' summed squares), and a batch with examples on both sides of the clip
(those below it must pass unscaled).
"""
from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, grad, vmap

from fedveil.engine import StackedModel, UnsupportedModelError, stack_params
from fedveil.privacy.dp_sgd import ExampleDP
from fedveil.training.private_stacked import private_stacked_gradients


class PlainMLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc, self.head = nn.Linear(6, 5), nn.Linear(5, 3)

    def forward(self, x):
        return self.head(torch.tanh(self.fc(x)))


class ReusedLinear(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.block, self.head = nn.Linear(6, 6), nn.Linear(6, 3)

    def forward(self, x):
        return self.head(self.block(torch.tanh(self.block(x))))


class ReusedConv(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv, self.head = nn.Conv2d(2, 2, 3, padding=1), nn.Linear(2 * 5 * 5, 3)

    def forward(self, x):
        return self.head(torch.flatten(self.conv(torch.tanh(self.conv(x))), 1))


class ReusedEmbeddingAndNorm(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb, self.norm, self.head = nn.Embedding(7, 4), nn.LayerNorm(4), nn.Linear(4, 3)

    def forward(self, x):
        h = self.emb(x) + self.emb(torch.remainder(x + 1, 7))  # two lookups of one table
        h = self.norm(torch.tanh(self.norm(h)))  # one LayerNorm twice
        return self.head(h.mean(1))


def _inputs(model: nn.Module, rows: int, gen: torch.Generator) -> torch.Tensor:
    if isinstance(model, ReusedEmbeddingAndNorm):
        return torch.randint(0, 7, (rows, 5), generator=gen)
    shape = (2, 5, 5) if isinstance(model, ReusedConv) else (6,)
    scale = torch.tensor([30.0 if i % 2 else 0.01 for i in range(rows)])  # above and below the clip
    return torch.randn(rows, *shape, generator=gen) * scale.view(-1, *([1] * len(shape)))


def _per_example(model: nn.Module, params: dict, x: torch.Tensor, y: torch.Tensor):
    """Per-example gradients of the plain model and their global L2 norms."""

    def loss(p, xi, yi):
        return F.cross_entropy(functional_call(model, p, (xi.unsqueeze(0),)), yi.unsqueeze(0))

    per = vmap(grad(loss), in_dims=(None, 0, 0))(params, x, y)
    return per, torch.sqrt(sum(g.flatten(1).square().sum(1) for g in per.values()))


def _expected(per: dict, norms: torch.Tensor, clip: float, batch: int) -> dict:
    """Sum of the per-example gradients clipped to ``clip``, over the batch size."""
    factors = (clip / (norms + 1e-15)).clamp(max=1.0)
    return {k: torch.tensordot(factors, g, dims=1) / batch for k, g in per.items()}


@pytest.mark.parametrize("cls", [PlainMLP, ReusedLinear, ReusedConv, ReusedEmbeddingAndNorm])
def test_reused_layer_is_clipped_by_the_norm_of_its_summed_gradient(cls):
    torch.manual_seed(0)
    model, k, batch = cls(), 2, 4
    gen = torch.Generator().manual_seed(1)
    param_sets = []
    for _ in range(k):
        param_sets.append({n: p.detach() + 0.3 * torch.randn(p.shape, generator=gen) for n, p in model.named_parameters()})
    x, y = _inputs(model, k * batch, gen), torch.randint(0, 3, (k * batch,), generator=gen)
    per = [_per_example(model, param_sets[c], x[c * batch : (c + 1) * batch], y[c * batch : (c + 1) * batch])
           for c in range(k)]
    clip = float(torch.cat([norms for _, norms in per]).median())
    stacked = StackedModel(model)
    w = stack_params(param_sets, stacked.names)
    per_example_loss = vmap(lambda out, t: F.cross_entropy(out.unsqueeze(0), t.unsqueeze(0)))
    dps = [ExampleDP(clip, 0.0, "poisson", batch) for _ in range(k)]  # no noise: the clipped sum alone
    grads, _ = private_stacked_gradients(
        stacked, model, w, x, y, torch.ones(k, batch), per_example_loss, dps, [torch.Generator() for _ in range(k)]
    )
    norms = torch.cat([n for _, n in per])
    assert (norms > clip * 1.01).any() and (norms < clip * 0.99).any()  # both sides of the clip
    for c in range(k):
        want = _expected(*per[c], clip, batch)
        for name in want:
            torch.testing.assert_close(grads[name][c], want[name], rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("cls", [ReusedLinear, ReusedConv, ReusedEmbeddingAndNorm])
def test_every_released_per_example_contribution_has_norm_at_most_the_clip(cls):
    """One example per client, no noise: what is released is the clipped gradient itself."""
    torch.manual_seed(3)
    model, k = cls(), 6
    gen = torch.Generator().manual_seed(4)
    x = _inputs(model, k, gen)
    y = torch.randint(0, 3, (k,), generator=gen)
    stacked = StackedModel(model)
    params = {n: p.detach() for n, p in model.named_parameters()}
    _, norms = _per_example(model, params, x, y)
    clip = 0.5 * float(norms.min())  # every example is clipped
    w = stack_params([params] * k, stacked.names)
    per_example_loss = vmap(lambda out, t: F.cross_entropy(out.unsqueeze(0), t.unsqueeze(0)))
    dps = [ExampleDP(clip, 0.0, "poisson", 1) for _ in range(k)]
    grads, _ = private_stacked_gradients(
        stacked, model, w, x, y, torch.ones(k, 1), per_example_loss, dps, [torch.Generator() for _ in range(k)]
    )
    released = torch.sqrt(sum(g.flatten(1).square().sum(1) for g in grads.values()))
    assert (released <= clip * (1 + 1e-5)).all(), released / clip
    torch.testing.assert_close(released, torch.full_like(released, clip), rtol=1e-5, atol=0)


class TiedWeights(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb, self.out = nn.Embedding(7, 4), nn.Linear(4, 7, bias=False)
        self.out.weight = self.emb.weight  # tied input and output embeddings

    def forward(self, x):
        return self.out(self.emb(x).mean(1))


def test_tied_weights_are_refused_by_the_stacked_engine_in_one_line():
    with pytest.raises(UnsupportedModelError, match=r"'out.weight' is the same tensor as 'emb.weight' \(tied weights\)"):
        StackedModel(TiedWeights())


def test_vectorized_executor_trains_tied_weights_client_by_client(tmp_path):
    """The fallback is the serial trainer, whose per-example gradients are exact."""
    from fedveil.runtime.vectorized import VectorizedExecutor
    from fedveil.config import ClientConfig
    from fedveil.training.local import LocalTrainer, task_loss

    trainer = LocalTrainer(TiedWeights(), task_loss("classification"), ClientConfig(steps=1, batch_size=2), 1)
    executor = VectorizedExecutor()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert executor._stacked_model(trainer.model, private=True) is None
    assert len(caught) == 1 and "tied weights" in str(caught[0].message)
