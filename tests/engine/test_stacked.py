"""Stacked forward and book-keeping DP gradients against per-client references."""
from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.func import vmap

from fedveil.engine import StackedModel, UnsupportedModelError, stack_params
from fedveil.privacy.dp_sgd import ExampleDP, clip_per_example, per_example_grads
from fedveil.training.private_stacked import check_private_stacking, private_stacked_gradients


class TokenModel(nn.Module):
    """Embedding -> Linear over a sequence -> LayerNorm -> GroupNorm on channels -> Linear."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(11, 6)
        self.mix = nn.Linear(6, 8)
        self.norm = nn.LayerNorm(8)
        self.group = nn.GroupNorm(2, 4)
        self.head = nn.Linear(5 * 8, 3)

    def forward(self, x):
        h = torch.relu(self.norm(self.mix(self.embed(x))))  # (N, 5, 8)
        h = self.group(h.reshape(h.shape[0], 4, 10)).reshape(h.shape[0], -1)
        return self.head(h)


class ConvModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(2, 3, 3, stride=2, padding=1)
        self.conv2 = nn.Conv2d(3, 4, 2, bias=False, dilation=2)
        self.fc = nn.Linear(4 * 2 * 2, 3)

    def forward(self, x):
        return self.fc(torch.flatten(torch.relu(self.conv2(torch.relu(self.conv(x)))), 1))


def make_models(cls, k):
    models = []
    for seed in range(k):
        torch.manual_seed(seed)
        models.append(cls())
    return models


def inputs(cls, n):
    gen = torch.Generator().manual_seed(7)
    if cls is TokenModel:
        return torch.randint(0, 11, (n, 5), generator=gen)
    return torch.randn(n, 2, 8, 8, generator=gen)


@pytest.mark.parametrize("cls", [TokenModel, ConvModel])
def test_stacked_forward_equals_each_model(cls):
    k, b = 3, 4
    models = make_models(cls, k)
    stacked = StackedModel(models[0])
    params = stack_params([dict(m.named_parameters()) for m in models], stacked.names)
    x = inputs(cls, k * b)
    out = stacked(params, x, k)
    for c in range(k):
        torch.testing.assert_close(out[c * b : (c + 1) * b], models[c](x[c * b : (c + 1) * b]), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("cls", [TokenModel, ConvModel])
def test_book_keeping_clipped_sum_equals_materialised_per_example_gradients(cls):
    """Noise-free DP gradients: the book-keeping rule per layer vs vmap per-example grads,
    clipped and summed per client (fedveil.privacy.dp_sgd, the serial path)."""
    k, b, clip = 3, 5, 0.05  # small clip: most examples are clipped
    models = make_models(cls, k)
    stacked = StackedModel(models[0])
    check_private_stacking(models[0])
    natural = stack_params([{n: p.detach() for n, p in m.named_parameters()} for m in models], stacked.names)
    params = natural
    x = inputs(cls, k * b)
    y = torch.randint(0, 3, (k * b,), generator=torch.Generator().manual_seed(1))
    mask = torch.ones(k, b)
    mask[1, 3:] = 0  # client 1 has 3 real rows, 2 padding rows
    loss = nn.functional.cross_entropy
    per_example_loss = vmap(lambda o, t: loss(o.unsqueeze(0), t.unsqueeze(0)))
    dps = [ExampleDP(clip, 0.0, "shuffle", b) for _ in range(k)]
    gens = [torch.Generator().manual_seed(c) for c in range(k)]
    got, loss_sums = private_stacked_gradients(stacked, models[0], params, x, y, mask, per_example_loss, dps, gens)
    for c in range(k):
        rows = int(mask[c].sum())
        sl = slice(c * b, c * b + rows)
        own = {n: v[c] for n, v in natural.items()}
        grads, losses = per_example_grads(models[0], own, x[sl], y[sl], loss)
        clipped, norms = clip_per_example(grads, clip)
        assert (norms > clip).any()
        for name in stacked.names:
            want = clipped[name].sum(0) / b
            torch.testing.assert_close(got[name][c], want, rtol=1e-4, atol=1e-7)
        assert float(loss_sums[c]) == pytest.approx(float(losses.sum()), rel=1e-5)


@pytest.mark.parametrize("cls", [TokenModel, ConvModel])
def test_clipped_term_joins_each_per_example_gradient_before_clipping(cls):
    """MR-MTL's lambda (w - w_bar) inside the clip: book-keeping with the cross terms
    <g_i, r> vs vmap per-example gradients with ``extra_grad`` (the serial path)."""
    k, b, clip, lam = 3, 4, 0.08, 0.7
    models = make_models(cls, k)
    stacked = StackedModel(models[0])
    params = stack_params([{n: p.detach() for n, p in m.named_parameters()} for m in models], stacked.names)
    anchor = {n: torch.randn(v.shape[1:], generator=torch.Generator().manual_seed(3)) for n, v in params.items()}
    term = {n: lam * (v - anchor[n]) for n, v in params.items()}  # (K, *shape)
    x = inputs(cls, k * b)
    y = torch.randint(0, 3, (k * b,), generator=torch.Generator().manual_seed(1))
    mask = torch.ones(k, b)
    mask[2, 1:] = 0
    loss = nn.functional.cross_entropy
    per_example_loss = vmap(lambda o, t: loss(o.unsqueeze(0), t.unsqueeze(0)))
    dps = [ExampleDP(clip, 0.0, "shuffle", b) for _ in range(k)]
    gens = [torch.Generator().manual_seed(c) for c in range(k)]
    got, _ = private_stacked_gradients(stacked, models[0], params, x, y, mask, per_example_loss, dps, gens, term=term)
    for c in range(k):
        rows = int(mask[c].sum())
        sl = slice(c * b, c * b + rows)
        own = {n: v[c] for n, v in params.items()}
        grads, _ = per_example_grads(models[0], own, x[sl], y[sl], loss, lambda p: {n: lam * (p[n] - anchor[n]) for n in p})
        clipped, norms = clip_per_example(grads, clip)
        assert (norms > clip).any()
        for name in stacked.names:
            torch.testing.assert_close(got[name][c], clipped[name].sum(0) / b, rtol=1e-4, atol=1e-7)


def test_noise_is_drawn_from_each_clients_generator_in_parameter_order():
    models = make_models(ConvModel, 2)
    stacked = StackedModel(models[0])
    natural = stack_params([{n: p.detach() for n, p in m.named_parameters()} for m in models], stacked.names)
    params = natural
    x, y, mask = inputs(ConvModel, 4), torch.zeros(4, dtype=torch.long), torch.zeros(2, 2)  # empty batches
    per_example_loss = vmap(lambda o, t: nn.functional.cross_entropy(o.unsqueeze(0), t.unsqueeze(0)))
    dps = [ExampleDP(2.0, 1.5, "poisson", 4), ExampleDP(1.0, 3.0, "poisson", 8)]
    got, _ = private_stacked_gradients(
        stacked, models[0], params, x, y, mask, per_example_loss, dps, [torch.Generator().manual_seed(s) for s in (5, 6)]
    )
    for c, (dp, seed) in enumerate(zip(dps, (5, 6))):
        gen = torch.Generator().manual_seed(seed)
        for name in stacked.names:
            want = dp.clip * dp.noise_multiplier * torch.randn(natural[name].shape[1:], generator=gen) / dp.batch_size
            torch.testing.assert_close(got[name][c], want)


def test_unsupported_layers_are_named():
    with pytest.raises(UnsupportedModelError, match="layer '1' \\(InstanceNorm1d\\)"):
        StackedModel(nn.Sequential(nn.Linear(3, 4), nn.InstanceNorm1d(4, affine=True)))
    with pytest.raises(UnsupportedModelError, match="grouped Conv2d"):
        check_private_stacking(nn.Sequential(nn.Conv2d(4, 4, 3, groups=2)))

    class ReadsWeight(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(3, 3)

        def forward(self, x):
            return x @ self.lin.weight

    with pytest.raises(UnsupportedModelError, match="reads parameter 'lin.weight'"):
        StackedModel(ReadsWeight())


def test_conv_layout_is_timed_once_per_power_of_two_of_the_batch(monkeypatch):
    from fedveil.engine import stacked

    timed = []
    monkeypatch.setattr(stacked, "_conv_choice", {})
    monkeypatch.setattr(stacked, "_time_conv", lambda mode, m, shape, k: timed.append((mode, shape)) or 1.0)
    conv = nn.Conv2d(1, 4, 3)
    for rows_per_client in (33, 40, 64, 47):  # Poisson batch sizes: 33, 40, 47 share a bucket, 64 starts the next
        stacked.conv_mode(conv, (3 * rows_per_client, 1, 10, 10), 3)
    assert [shape[0] // 3 for _, shape in timed] == [33, 33, 64, 64]  # both modes, two buckets
    stacked.conv_mode(conv, (3 * 40, 1, 12, 12), 3)  # another image size is timed anew
    assert len(timed) == 6
