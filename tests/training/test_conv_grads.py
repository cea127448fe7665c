"""Conv2d per-example gradients as convolutions, and the stacked DP rule's three paths.

References are computed here from scratch: per-example gradients of the plain layer or
model by ``torch.func.vmap(grad(...))``, clipped by their global L2 norm and summed per
client (spec 002 §1.2's definition, as `private_gradient`'s generic path computes it).
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, grad, vmap

from fedveil.engine import StackedModel, UnsupportedModelError, stack_params
from fedveil.privacy.dp_sgd import ExampleDP
from fedveil.training import conv_grads, private_stacked
from fedveil.training.conv_grads import client_weight_grads, conv_padding, example_weight_grads
from fedveil.training.private_stacked import check_private_stacking, private_stacked_gradients

LAYERS = [
    nn.Conv2d(3, 4, 3, stride=2, padding=1),
    nn.Conv2d(2, 5, (3, 2), dilation=(1, 2), bias=False),
    nn.Conv2d(2, 3, 3, padding="same"),
    nn.Conv2d(2, 3, 3, padding="valid", stride=(2, 1)),
]


def _layer_grads(m: nn.Conv2d, x: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """vmap reference: example i's d<conv(x_i), g_i>/dW, flattened to (N, C_out, rest)."""
    def dot(w, xi, gi):
        return (F.conv2d(xi.unsqueeze(0), w, None, m.stride, m.padding, m.dilation) * gi.unsqueeze(0)).sum()
    return vmap(grad(dot), in_dims=(None, 0, 0))(m.weight.detach(), x, g).reshape(len(x), m.out_channels, -1)


@pytest.mark.parametrize("m", LAYERS, ids=range(len(LAYERS)))
def test_example_and_client_weight_gradients_equal_vmap_in_float64(monkeypatch, m):
    monkeypatch.setattr(conv_grads, "EXAMPLES_PER_CALL", 4)  # 6 examples: calls of 4 and 2
    m = m.double()
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(6, m.in_channels, 7, 8, generator=gen, dtype=torch.float64)
    out_shape = F.conv2d(x, m.weight, None, m.stride, m.padding, m.dilation).shape
    g = torch.randn(out_shape, generator=gen, dtype=torch.float64)
    want = _layer_grads(m, x, g)
    torch.testing.assert_close(example_weight_grads(m, x, g), want, rtol=1e-12, atol=1e-12)
    per_client = client_weight_grads(m, x, g, 3)  # clients own rows 0-1, 2-3, 4-5
    for c in range(3):
        torch.testing.assert_close(per_client[c], want[2 * c : 2 * c + 2].sum(0).reshape(m.weight.shape), rtol=1e-12, atol=1e-12)


def test_uneven_same_padding_is_refused_with_the_layer_name():
    assert conv_padding(nn.Conv2d(1, 1, 5, padding="same", dilation=2)) == (4, 4)
    model = nn.Sequential(nn.Conv2d(1, 2, 3), nn.Conv2d(2, 2, 2, padding="same"))
    with pytest.raises(UnsupportedModelError, match="layer '1'.*padding='same'"):
        check_private_stacking(model)


class Net(nn.Module):
    """A conv on many positions (per-example gradients), a conv called twice, and a wide
    conv on 2x2 positions, whose ghost norms cost less: every path of the rule."""

    def __init__(self) -> None:
        super().__init__()
        self.first = nn.Conv2d(2, 4, 3, padding=1)
        self.again = nn.Conv2d(4, 4, 3, padding="same", bias=False)
        self.wide = nn.Conv2d(4, 24, 3, stride=2)  # 2x2 positions: 2 * (36 + 24) < 36 * 24
        self.head = nn.Linear(24 * 2 * 2, 3)

    def forward(self, x):
        h = torch.tanh(self.again(torch.tanh(self.again(torch.tanh(self.first(x))))))
        return self.head(torch.flatten(torch.tanh(self.wide(h)), 1))


def _clipped_reference(model, params, x, y, clip, batch, anchor, lam):
    def loss(p, xi, yi):
        return F.cross_entropy(functional_call(model, p, (xi.unsqueeze(0),)), yi.unsqueeze(0))
    per = vmap(grad(loss), in_dims=(None, 0, 0))(params, x, y)
    per = {n: g + lam * (params[n] - anchor[n]) for n, g in per.items()}  # the term inside the clip
    norms = torch.sqrt(sum(g.flatten(1).square().sum(1) for g in per.values()))
    factors = (clip / (norms + 1e-15)).clamp(max=1.0)
    return {n: torch.tensordot(factors, g, dims=1) / batch for n, g in per.items()}, norms


@pytest.mark.parametrize("limit", [private_stacked.MATERIALISE_LIMIT, 0], ids=["kept", "chunked"])
@pytest.mark.parametrize("lam", [0.0, 0.6], ids=["plain", "term"])
def test_stacked_rule_equals_vmap_on_every_conv_path(monkeypatch, limit, lam):
    monkeypatch.setattr(private_stacked, "MATERIALISE_LIMIT", limit)
    monkeypatch.setattr(private_stacked, "CHUNK", 3)  # chunks that cross client boundaries
    torch.manual_seed(0)
    model, k, batch = Net().double(), 3, 4
    gen = torch.Generator().manual_seed(1)
    sets = [{n: p.detach() + 0.2 * torch.randn(p.shape, generator=gen, dtype=torch.float64)
             for n, p in model.named_parameters()} for _ in range(k)]
    anchor = {n: torch.randn(p.shape, generator=gen, dtype=torch.float64) for n, p in model.named_parameters()}
    x = torch.randn(k * batch, 2, 6, 6, generator=gen, dtype=torch.float64)
    y = torch.randint(0, 3, (k * batch,), generator=gen)
    stacked = StackedModel(model)
    w = stack_params(sets, stacked.names)
    term = {n: lam * (v - anchor[n]) for n, v in w.items()} if lam else None
    refs = [_clipped_reference(model, sets[c], x[c * batch : (c + 1) * batch], y[c * batch : (c + 1) * batch],
                               1.0, batch, anchor, lam) for c in range(k)]
    clip = float(torch.cat([norms for _, norms in refs]).median())
    refs = [_clipped_reference(model, sets[c], x[c * batch : (c + 1) * batch], y[c * batch : (c + 1) * batch],
                               clip, batch, anchor, lam) for c in range(k)]
    per_example_loss = vmap(lambda out, t: F.cross_entropy(out.unsqueeze(0), t.unsqueeze(0)))
    dps = [ExampleDP(clip, 0.0, "shuffle", batch) for _ in range(k)]
    got, _ = private_stacked_gradients(stacked, model, w, x, y, torch.ones(k, batch), per_example_loss, dps,
                                       [torch.Generator() for _ in range(k)], term=term)
    for c, (want, _) in enumerate(refs):
        for name in want:
            torch.testing.assert_close(got[name][c], want[name], rtol=1e-10, atol=1e-12)


def test_rule_picks_ghost_norms_only_where_they_cost_less(monkeypatch):
    picked = []
    monkeypatch.setattr(private_stacked, "_conv2d_ghost", lambda m, s, g: picked.append(("ghost", m)) or None)
    monkeypatch.setattr(private_stacked, "_conv2d_direct", lambda m, s, g: picked.append(("direct", m)) or None)
    model = Net()
    x = torch.randn(2, 4, 6, 6)
    private_stacked._conv2d(model.again, [x], [torch.randn(2, 4, 6, 6)])  # 36 positions * 40 > 36 * 4
    private_stacked._conv2d(model.wide, [x], [torch.randn(2, 24, 2, 2)])  # 4 positions * 60 < 36 * 24
    assert picked == [("direct", model.again), ("ghost", model.wide)]
