"""DP-SGD step (spec 002 §1.2): per-example gradients, clipping, noise, denominator, samplers,
and rejection of layers that couple the examples of a batch."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from fedveil.models import MODELS, build_model
from fedveil.privacy import dp_sgd
from fedveil.privacy.dp_sgd import (
    add_gaussian_noise,
    check_model_for_dp,
    clip_factors,
    clip_per_example,
    linear_stack,
    per_example_grads,
    poisson_batches,
    private_gradient,
    shuffled_batches,
)


def params_of(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.named_parameters()}


def single_grad(model, params, xi, yi, loss_fn=F.cross_entropy):
    leaves = {k: v.clone().requires_grad_(True) for k, v in params.items()}
    loss = loss_fn(torch.func.functional_call(model, leaves, (xi[None],)), yi[None])
    return dict(zip(leaves, torch.autograd.grad(loss, list(leaves.values()))))


ZOO = {  # name -> (input_shape, num_classes, options, make_x)
    "mlp": ((1, 6, 6), 5, {"hidden": (16, 8)}, lambda n: torch.randn(n, 1, 6, 6)),
    "lenet": ((1, 8, 8), 5, {"width": 0.25}, lambda n: torch.randn(n, 1, 8, 8)),
    "resnet": ((3, 8, 8), 5, {"depth": 1, "width": 0.5}, lambda n: torch.randn(n, 3, 8, 8)),
    "char_lstm": ((6,), 5, {"hidden": 8, "layers": 2}, lambda n: torch.randint(0, 5, (n, 6))),
}


@pytest.mark.parametrize("name", sorted(ZOO))
def test_per_example_grads_equal_a_loop_of_single_example_grads(name):
    torch.manual_seed(0)
    shape, classes, options, make_x = ZOO[name]
    model = build_model(name, shape, classes, **options)
    params = params_of(model)
    x, y = make_x(4), torch.tensor([0, 1, 2, 4])
    grads, losses = per_example_grads(model, params, x, y, F.cross_entropy)  # char_lstm: the loop path
    for i in range(4):
        single = single_grad(model, params, x[i], y[i])
        for k in params:
            torch.testing.assert_close(grads[k][i], single[k], rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(losses[i], F.cross_entropy(model(x[i : i + 1]), y[i : i + 1]).detach())


def test_per_example_grads_regression_loss_and_extra_grad():
    torch.manual_seed(0)
    model = build_model("linear", (3,), 0)
    params = params_of(model)
    x, y = torch.randn(5, 3), torch.randn(5)
    mse = lambda out, t: F.mse_loss(out.reshape(t.shape), t)  # noqa: E731  (the trainer's regression loss)
    reg = {k: torch.randn_like(v) for k, v in params.items()}
    grads, _ = per_example_grads(model, params, x, y, mse, extra_grad=lambda p: reg)
    for i in range(5):
        single = single_grad(model, params, x[i], y[i], mse)
        for k in params:
            torch.testing.assert_close(grads[k][i], single[k] + reg[k])


@pytest.mark.filterwarnings("ignore:Full backward hook:UserWarning")  # opacus hooks, inputs need no grad
def test_per_example_grads_match_opacus_grad_sample_module():
    from opacus import GradSampleModule

    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(2, 3, 3), nn.ReLU(), nn.Flatten(), nn.Linear(3 * 4 * 4, 4))
    x, y = torch.randn(6, 2, 6, 6), torch.randint(0, 4, (6,))
    ours, _ = per_example_grads(model, params_of(model), x, y, F.cross_entropy)
    gsm = GradSampleModule(model, loss_reduction="sum")
    F.cross_entropy(gsm(x), y, reduction="sum").backward()
    for k, p in model.named_parameters():
        torch.testing.assert_close(ours[k], p.grad_sample, rtol=1e-5, atol=1e-6)


def test_clipping_bounds_norms_and_leaves_small_gradients_unchanged():
    torch.manual_seed(0)
    grads = {"w": torch.randn(8, 3, 4), "b": torch.randn(8, 2)}
    grads["w"][:3] *= 0.01
    grads["b"][:3] *= 0.01
    clip = 1.0
    clipped, norms = clip_per_example(grads, clip)
    flat = torch.cat([g.flatten(1) for g in grads.values()], dim=1)
    torch.testing.assert_close(norms, flat.norm(dim=1))
    after = torch.cat([g.flatten(1) for g in clipped.values()], dim=1).norm(dim=1)
    assert (norms[:3] < clip).all() and (norms[3:] > clip).all()
    assert (after <= clip + 1e-6).all()
    torch.testing.assert_close(after[3:], torch.full((5,), clip))
    for k in grads:
        assert torch.equal(clipped[k][:3], grads[k][:3])


def test_zero_gradient_survives_clipping():
    clipped, norms = clip_per_example({"w": torch.zeros(2, 3)}, 1.0)
    assert torch.equal(clipped["w"], torch.zeros(2, 3)) and torch.equal(norms, torch.zeros(2))


def test_noise_has_std_clip_times_noise_multiplier():
    clip, z, n = 0.5, 1.3, 200_000
    g = torch.Generator().manual_seed(0)
    noisy = add_gaussian_noise({"a": torch.zeros(n // 2), "b": torch.zeros(n // 4, 2)}, clip, z, g)
    e = torch.cat([v.flatten() for v in noisy.values()]).double() / (clip * z)
    # sum of squares of n standard normals is chi-square(n): mean n, std sqrt(2n)
    assert abs(float((e**2).sum()) - n) < 4 * math.sqrt(2 * n)
    assert abs(float(e.mean())) < 4 / math.sqrt(n)
    assert abs(float(e.std()) - 1) < 0.01


def test_noise_is_added_to_the_sum_and_is_reproducible():
    s = {"w": torch.ones(3)}
    a = add_gaussian_noise(s, 1.0, 2.0, torch.Generator().manual_seed(3))
    b = add_gaussian_noise(s, 1.0, 2.0, torch.Generator().manual_seed(3))
    assert torch.equal(a["w"], b["w"])
    noise = 2.0 * torch.randn(3, generator=torch.Generator().manual_seed(3))
    torch.testing.assert_close(a["w"], 1.0 + noise)


def linear_problem():
    torch.manual_seed(0)
    model = nn.Linear(3, 2)
    return model, params_of(model), torch.randn(6, 3), torch.randint(0, 2, (6,))


@pytest.mark.parametrize("denominator", [6, 2.5])  # a fixed batch size; an expected Poisson batch q*n
def test_private_gradient_is_clipped_sum_over_denominator(denominator):
    model, params, x, y = linear_problem()
    clip, z = 1.0, 0.7
    grads, losses = per_example_grads(model, params, x, y, F.cross_entropy)
    clipped, norms = clip_per_example(grads, clip)
    assert (norms > clip).any() and (norms < clip).any()
    seed = 11
    out = private_gradient(
        model, params, x, y, F.cross_entropy, clip=clip, noise_multiplier=z,
        denominator=denominator, generator=torch.Generator().manual_seed(seed),
    )
    expected = add_gaussian_noise(
        {k: v.sum(0) for k, v in clipped.items()}, clip, z, torch.Generator().manual_seed(seed)
    )
    for k in params:
        torch.testing.assert_close(out.grad[k], expected[k] / denominator)
    assert out.size == 6 and out.loss == pytest.approx(float(losses.mean()))


def test_empty_batch_releases_noise_over_the_denominator():
    model, params, x, y = linear_problem()
    out = private_gradient(
        model, params, x[:0], y[:0], F.cross_entropy, clip=2.0, noise_multiplier=1.5,
        denominator=4.0, generator=torch.Generator().manual_seed(5),
    )
    noise = add_gaussian_noise({k: torch.zeros_like(v) for k, v in params.items()}, 2.0, 1.5,
                               torch.Generator().manual_seed(5))
    for k in params:
        torch.testing.assert_close(out.grad[k], noise[k] / 4.0)
    assert out.size == 0 and math.isnan(out.loss)


def test_regulariser_gradient_is_clipped_together_with_the_data_gradient():
    """spec 002 §1.2 note: clip(g + λ(w - w̄)), not clip(g) + λ(w - w̄)."""
    model, params, x, y = linear_problem()
    x, y = x[:1], y[:1]
    data, _ = per_example_grads(model, params, x, y, F.cross_entropy)  # one example: shapes (1, ...)
    clip = 1.1 * float(torch.cat([v.flatten() for v in data.values()]).norm())  # data gradient alone unclipped
    reg = {k: 3.0 * torch.ones_like(v) for k, v in params.items()}  # λ (w - w̄), large
    out = private_gradient(
        model, params, x, y, F.cross_entropy, clip=clip, noise_multiplier=0.0, denominator=1,
        generator=torch.Generator(), extra_grad=lambda p: reg,
    )
    together = clip_per_example({k: data[k] + reg[k] for k in params}, clip)[0]
    data_only = clip_per_example(data, clip)[0]
    total = torch.cat([v.flatten() for v in out.grad.values()]).norm()
    assert float(total) == pytest.approx(clip, rel=1e-5)
    for k in params:
        torch.testing.assert_close(out.grad[k], together[k][0])
        assert not torch.allclose(out.grad[k], data_only[k][0] + reg[k])


def test_poisson_batches_inclusion_rate_and_determinism():
    n, q, steps = 500, 0.1, 400
    batches = list(poisson_batches(n, q, steps, torch.Generator().manual_seed(0)))
    assert len(batches) == steps
    counts = torch.zeros(n)
    for b in batches:
        assert b.dtype == torch.int64 and torch.equal(b, b.unique())  # sorted, no repeats
        counts[b] += 1
    rate = float(counts.sum()) / (n * steps)
    assert abs(rate - q) < 4 * math.sqrt(q * (1 - q) / (n * steps))
    again = list(poisson_batches(n, q, steps, torch.Generator().manual_seed(0)))
    assert all(torch.equal(a, b) for a, b in zip(batches, again))
    other = list(poisson_batches(n, q, steps, torch.Generator().manual_seed(1)))
    assert not all(torch.equal(a, b) for a, b in zip(batches, other))


def test_poisson_batches_can_be_empty():
    sizes = [len(b) for b in poisson_batches(5, 0.05, 50, torch.Generator().manual_seed(0))]
    assert 0 in sizes


def test_shuffled_batches_are_full_epochs_with_the_last_partial_batch_dropped():
    n, b = 10, 3  # 3 steps per epoch, 1 row dropped each epoch
    batches = list(shuffled_batches(n, b, 7, torch.Generator().manual_seed(0)))
    assert len(batches) == 7 and all(len(x) == b for x in batches)
    for epoch in (batches[0:3], batches[3:6]):
        rows = torch.cat(epoch)
        assert len(rows.unique()) == 9
    again = list(shuffled_batches(n, b, 7, torch.Generator().manual_seed(0)))
    assert all(torch.equal(x, y) for x, y in zip(batches, again))
    with pytest.raises(ValueError, match="min\\(batch_size, n\\)"):
        next(shuffled_batches(3, 4, 1, torch.Generator()))


@pytest.mark.parametrize(
    "layer, kind",
    [
        (nn.BatchNorm1d(4), "BatchNorm1d"),
        (nn.SyncBatchNorm(4), "SyncBatchNorm"),
        (nn.InstanceNorm1d(4, track_running_stats=True), "InstanceNorm1d"),
    ],
)
def test_layers_that_couple_examples_are_rejected_by_name(layer, kind):
    model = nn.Sequential()
    model.add_module("fc", nn.Linear(3, 4))
    model.add_module("norm", layer)
    with pytest.raises(ValueError, match=f"layer 'norm' \\({kind}\\).*GroupNorm"):
        check_model_for_dp(model)


def test_per_example_layers_and_every_zoo_model_are_accepted():
    check_model_for_dp(nn.Sequential(nn.Linear(3, 4), nn.LayerNorm(4), nn.GroupNorm(2, 4), nn.InstanceNorm1d(4)))
    shapes = {"char_lstm": ((6,), 5), "adds_char_lstm": ((6,), 5), "convnet": ((3, 12, 12), 4), "alexnet_bn": ((3, 63, 63), 4)}  # minimum sizes
    batch_norm_by_default = {"digit_cnn", "preresnet18", "alexnet_bn"}  # Split-Mix's nets: DP-SGD needs norm = "none"
    without_batch_norm = {"adds_vgg": {"channels": []}}  # ADDS's supernet: its conv stages have BN; the MLP has none
    never_private = {"fedfed_vae"}  # FedFed's phase 1 trains its generator on raw data, without DP (spec 003 §1.6)
    for name in sorted(never_private):
        with pytest.raises(ValueError, match="BatchNorm"):
            check_model_for_dp(build_model(name, (1, 8, 8), 4))
    for name in sorted(set(MODELS.names()) - never_private):
        shape, classes = shapes.get(name, ((3, 8, 8), 4))
        options = {"norm": "none"} if name in batch_norm_by_default else without_batch_norm.get(name, {})
        check_model_for_dp(build_model(name, shape, classes, **options))
        if name in batch_norm_by_default:
            with pytest.raises(ValueError, match="BatchNorm"):
                check_model_for_dp(build_model(name, shape, classes))


@pytest.mark.parametrize("model", [nn.Linear(3, 2), nn.Sequential(nn.Embedding(4, 3), nn.LSTM(3, 2, batch_first=True))])
def test_per_example_grads_ignore_an_outer_no_grad(model):
    if isinstance(model, nn.Linear):
        x, y, loss_fn = torch.randn(2, 3), torch.tensor([0, 1]), F.cross_entropy
    else:
        x, y = torch.randint(0, 4, (2, 5)), torch.randn(2, 5, 2)
        loss_fn = lambda out, t: F.mse_loss(out[0], t)  # noqa: E731  (nn.LSTM returns (output, state))
    with torch.no_grad():
        grads, _ = per_example_grads(model, params_of(model), x, y, loss_fn)
    assert all(g.shape[0] == 2 and g.abs().sum() > 0 for g in grads.values())


def test_extra_grad_reaches_parameters_the_loss_does_not_use():
    model = nn.ModuleDict({"used": nn.Linear(3, 2), "unused": nn.Linear(3, 2)})
    model.forward = lambda x: model["used"](x)  # zero data gradient for 'unused.*' (a stride-0 expansion)
    params = params_of(model)
    reg = {"unused.weight": torch.ones(2, 3)}
    grads, _ = per_example_grads(model, params, torch.randn(4, 3), torch.tensor([0, 1, 0, 1]), F.cross_entropy,
                                 extra_grad=lambda p: reg)
    assert torch.equal(grads["unused.weight"], torch.ones(4, 2, 3))
    assert torch.equal(grads["unused.bias"], torch.zeros(4, 2))


# ---------------------------------------------------------------- closed form for linear stacks

LINEAR_STACKS = {  # name -> (model in float64, loss, make y)
    "linear-relu-linear, CE": (
        lambda: nn.Sequential(nn.Linear(7, 12), nn.ReLU(), nn.Linear(12, 3)), F.cross_entropy,
        lambda n: torch.randint(0, 3, (n,)),
    ),
    "3 layers, tanh, no bias in the middle, CE": (
        lambda: nn.Sequential(nn.Linear(7, 9), nn.Tanh(), nn.Linear(9, 8, bias=False), nn.SiLU(), nn.Linear(8, 3)),
        F.cross_entropy, lambda n: torch.randint(0, 3, (n,)),
    ),
    "sigmoid, MSE": (
        lambda: nn.Sequential(nn.Linear(7, 5), nn.Sigmoid(), nn.Linear(5, 2)), F.mse_loss,
        lambda n: torch.randn(n, 2, dtype=torch.float64),
    ),
    "one layer": (lambda: nn.Sequential(nn.Linear(7, 3)), F.cross_entropy, lambda n: torch.randint(0, 3, (n,))),
    "the model zoo's mlp (Flatten first), CE": (
        lambda: build_model("mlp", (7,), 3, hidden=(6, 5)), F.cross_entropy, lambda n: torch.randint(0, 3, (n,)),
    ),
    "the model zoo's linear model, CE": (
        lambda: build_model("linear", (7,), 3), F.cross_entropy, lambda n: torch.randint(0, 3, (n,)),
    ),
}


def generic_private_gradient(model, params, x, y, loss_fn, clip, z, denominator, seed, private_rows=None):
    """private_gradient's generic path by hand: vmap per-example gradients, clip, sum, noise, divide."""
    grads, losses = per_example_grads(model, params, x, y, loss_fn)
    factors, norms = clip_factors(grads, clip)
    if private_rows is not None:
        factors[private_rows:] = 1.0
    summed = {k: torch.tensordot(factors, g, dims=1) for k, g in grads.items()}
    noisy = add_gaussian_noise(summed, clip, z, torch.Generator().manual_seed(seed))
    return {k: v / denominator for k, v in noisy.items()}, losses, norms


@pytest.mark.parametrize("name", sorted(LINEAR_STACKS))
@pytest.mark.parametrize("z, private_rows", [(0.0, None), (1.3, None), (0.7, 15)])
def test_linear_stack_closed_form_equals_the_generic_path_in_float64(name, z, private_rows, monkeypatch):
    make_model, loss_fn, make_y = LINEAR_STACKS[name]
    torch.manual_seed(0)
    model = make_model().double()
    params = params_of(model)
    assert linear_stack(model, params) is not None
    x, y = 3 * torch.randn(20, 7, dtype=torch.float64), make_y(20)
    clip = float(clip_factors(per_example_grads(model, params, x, y, loss_fn)[0], 1.0)[1].median())  # clips half the rows
    denominator = 20
    expected, losses, norms = generic_private_gradient(model, params, x, y, loss_fn, clip, z, denominator, 5, private_rows)
    assert (norms > clip).any() and (norms < clip).any()
    monkeypatch.setattr(dp_sgd, "per_example_grads", None)  # the closed form forms no per-example gradient
    out = private_gradient(model, params, x, y, loss_fn, clip=clip, noise_multiplier=z, denominator=denominator,
                           generator=torch.Generator().manual_seed(5), private_rows=private_rows)
    assert list(out.grad) == list(params)  # the order the noise is drawn in
    for k in params:
        torch.testing.assert_close(out.grad[k], expected[k], rtol=0, atol=1e-10)
    assert out.loss == pytest.approx(float(losses.mean()), rel=1e-12)


def test_linear_stack_closed_form_flattens_image_rows_like_the_generic_path():
    """An MLP on (1, 4, 3) images: its leading Flatten acts on each row alone, so the closed
    form applies to the flattened rows and gives the vmap path's gradient."""
    torch.manual_seed(2)
    model = build_model("mlp", (1, 4, 3), 3, hidden=(8,)).double()
    params = params_of(model)
    x, y = torch.randn(16, 1, 4, 3, dtype=torch.float64), torch.randint(0, 3, (16,))
    assert linear_stack(model, params) is not None
    expected, _, norms = generic_private_gradient(model, params, x, y, F.cross_entropy, 0.3, 1.1, 16, 7)
    assert (norms > 0.3).any()  # some rows clipped
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(dp_sgd, "per_example_grads", None)
        out = private_gradient(model, params, x, y, F.cross_entropy, clip=0.3, noise_multiplier=1.1, denominator=16,
                               generator=torch.Generator().manual_seed(7))
    for k in params:
        torch.testing.assert_close(out.grad[k], expected[k], rtol=0, atol=1e-10)


def test_a_linear_stack_without_flatten_keeps_multi_axis_rows_on_the_generic_path():
    """nn.Linear on (B, T, features) rows shares its weight across T positions: no closed form."""
    model = nn.Sequential(nn.Linear(3, 2)).double()
    params = params_of(model)
    x, y = torch.randn(4, 5, 3, dtype=torch.float64), torch.randn(4, 5, 2, dtype=torch.float64)
    calls = []
    real = dp_sgd.per_example_grads

    def spy(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(dp_sgd, "per_example_grads", spy)
        private_gradient(model, params, x, y, F.mse_loss, clip=1.0, noise_multiplier=0.0, denominator=4,
                         generator=torch.Generator())
    assert calls == [1]


def test_linear_stack_closed_form_in_float32_and_under_no_grad():
    torch.manual_seed(1)
    model = nn.Sequential(nn.Linear(6, 10), nn.ReLU(), nn.Linear(10, 4))
    params, x, y = params_of(model), torch.randn(12, 6), torch.randint(0, 4, (12,))
    expected, _, _ = generic_private_gradient(model, params, x, y, F.cross_entropy, 0.5, 0.0, 12, 0)
    with torch.no_grad():
        out = private_gradient(model, params, x, y, F.cross_entropy, clip=0.5, noise_multiplier=0.0, denominator=12,
                               generator=torch.Generator())
    for k in params:
        assert out.grad[k].dtype == torch.float32
        torch.testing.assert_close(out.grad[k], expected[k], rtol=1e-5, atol=1e-7)


class _Stack(nn.Sequential):
    pass


@pytest.mark.parametrize(
    "model",
    [
        nn.Sequential(nn.Flatten(start_dim=2), nn.Linear(3, 3)),  # keeps a position axis
        nn.Sequential(nn.Linear(6, 4), nn.Flatten(), nn.Linear(4, 3)),  # Flatten not first
        nn.Sequential(nn.Linear(6, 4), nn.LayerNorm(4), nn.Linear(4, 3)),
        nn.Sequential(nn.Linear(6, 4), nn.Dropout(0.5), nn.Linear(4, 3)),
        nn.Sequential(nn.Linear(6, 4), nn.ReLU(inplace=True), nn.Linear(4, 3)),
        nn.Sequential(nn.Conv1d(1, 2, 3), nn.Flatten(), nn.Linear(8, 3)),
        _Stack(nn.Linear(6, 3)),  # a subclass may change forward
        nn.Linear(6, 3),
    ],
    ids=["partial-flatten", "inner-flatten", "layernorm", "dropout", "inplace-relu", "conv", "subclass", "bare-linear"],
)
def test_other_models_are_not_linear_stacks(model):
    assert linear_stack(model, params_of(model)) is None


def test_a_partial_params_dict_is_not_a_linear_stack():
    model = nn.Sequential(nn.Linear(6, 4), nn.ReLU(), nn.Linear(4, 3))
    params = params_of(model)
    del params["2.bias"]
    assert linear_stack(model, params) is None
