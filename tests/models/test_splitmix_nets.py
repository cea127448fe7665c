"""Split-Mix's width-scalable nets (spec 000 part 2, A.2, A.6, A.9): the Scaler, rescaled
init, the three BN options, the digit_cnn / preresnet18 builders and BaseEnsemble."""
from __future__ import annotations

import copy
import math

import pytest
import torch
from torch import nn
from torch.func import functional_call, stack_module_state, vmap

from fedveil.models import BaseEnsemble, Scaler, build_model, model_options, rescale_init_
from fedveil.models.digit_cnn import _digit_net
from fedveil.models.scalable import make_norm
from fedveil.privacy.dp_sgd import check_model_for_dp

torch.set_num_threads(1)

DIGITS = ((3, 28, 28), 10)
CIFAR = ((3, 32, 32), 10)


def digit(**options) -> nn.Module:
    return build_model("digit_cnn", *DIGITS, **options)


def preresnet(**options) -> nn.Module:
    return build_model("preresnet18", *CIFAR, **options)


# ------------------------------------------------------------------ Scaler and rescaled init


def test_scaler_divides_in_training_only():
    s = Scaler(0.25)
    x = torch.randn(3, 4)
    torch.testing.assert_close(s.train()(x), x * 4)
    assert torch.equal(s.eval()(x), x)
    with pytest.raises(ValueError, match="width must be a finite number > 0"):
        Scaler(0)


@pytest.mark.parametrize(
    "layer, width, full_fan_in",
    [
        (nn.Linear(512, 2048), 0.125, 4096),  # the x1 layer sees 4096 inputs
        (nn.Conv2d(16, 32, 5), 0.25, 16 * 25 * 4),
        (nn.Conv2d(16, 32, 3, groups=4), 0.5, 4 * 9 * 2),  # fan_in counts in_channels / groups
    ],
)
def test_rescale_init_uses_the_full_width_fan_in(layer, width, full_fan_in):
    torch.manual_seed(0)
    rescale_init_(layer, width)
    bound = 1 / math.sqrt(full_fan_in)  # kaiming_uniform(a=sqrt(5)): gain sqrt(1/3) * sqrt(3) / sqrt(fan_in)
    for t, closeness in ((layer.weight, 0.97), (layer.bias, 0.8)):
        top = t.abs().max().item()
        assert top <= bound and top > closeness * bound


def test_rescale_init_refuses_other_layers():
    with pytest.raises(TypeError, match="Linear or Conv"):
        rescale_init_(nn.BatchNorm1d(3), 0.5)


def test_digit_cnn_rescales_every_layer_but_the_first_conv():
    torch.manual_seed(0)
    net = digit(width=0.125)
    # conv1 keeps PyTorch's default bound 1/sqrt(3*25) = 0.115; rescaled it would be 1/sqrt(600) = 0.041
    assert net.conv1.weight.abs().max() > 0.08
    # fc1: 784 inputs at x0.125, 6272 at x1; fc3: 64 -> 512 inputs
    for layer, full_fan_in in ((net.conv2, 64 * 25), (net.conv3, 64 * 25), (net.fc1, 6272), (net.fc2, 2048), (net.fc3, 512)):
        bound = 1 / math.sqrt(full_fan_in)
        assert bound * 0.9 < layer.weight.abs().max() <= bound
    plain = digit(width=0.125, rescale_init=False)
    assert plain.fc1.weight.abs().max() > 0.9 / math.sqrt(784)


def test_preresnet_init_rescales_all_but_the_stem_and_zeroes_bn_and_linear_bias():
    torch.manual_seed(0)
    net = preresnet(width=0.125)
    assert net.conv1.weight.abs().max() > 1.5 / math.sqrt(27 * 8)  # default bound 1/sqrt(27) is kept
    conv = net.layer4[1].conv2  # 64 -> 64 channels at x0.125; 512 inputs * 9 at x1
    bound = 1 / math.sqrt(512 * 9)
    assert bound * 0.95 < conv.weight.abs().max() <= bound
    assert net.linear.weight.abs().max() <= 1 / math.sqrt(512)
    assert torch.count_nonzero(net.linear.bias) == 0
    for m in net.modules():
        if isinstance(m, nn.BatchNorm2d):
            assert torch.all(m.weight == 1) and torch.all(m.bias == 0)


def count_scaler_calls(net: nn.Module, x: torch.Tensor) -> int:
    calls = []
    handles = [m.register_forward_hook(lambda *_: calls.append(1)) for m in net.modules() if isinstance(m, Scaler)]
    net(x)
    for h in handles:
        h.remove()
    return len(calls)


def test_scalers_follow_every_conv_and_linear_but_the_output_layer():
    # digits: conv1-3, fc1, fc2; preresnet: stem + 2 per block (8 blocks) + 3 shortcuts
    assert count_scaler_calls(digit(width=0.5), torch.randn(2, 3, 28, 28)) == 5
    assert count_scaler_calls(preresnet(width=0.125), torch.randn(2, 3, 32, 32)) == 1 + 16 + 3
    assert count_scaler_calls(digit(width=0.5, rescale_layer=False), torch.randn(2, 3, 28, 28)) == 0


def test_digit_scalers_sit_before_a_relu_and_not_after_fc3():
    """Without BN and biases the net is positively homogeneous: five Scalers multiply the
    training-mode logits by (1/width)^5 over the eval-mode ones."""
    torch.manual_seed(0)
    net = _digit_net((3, 28, 28), 10, 0.5, "none", True, True)  # the builder refuses Scalers without BN
    with torch.no_grad():
        for m in net.modules():
            if isinstance(m, (nn.Conv2d, nn.Linear)):
                m.bias.zero_()
    x = torch.randn(3, 3, 28, 28)
    torch.testing.assert_close(net.train()(x), net.eval()(x) * 2**5)


# ------------------------------------------------------------------ BN options


@pytest.mark.parametrize("build", [digit, preresnet])
def test_batch_average_norm_has_no_buffers_and_uses_batch_statistics_in_eval(build):
    torch.manual_seed(0)
    net = build(width=0.125, rescale_layer=False)
    assert list(net.buffers()) == []
    assert any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in net.modules())
    x = torch.randn(6, *(DIGITS if build is digit else CIFAR)[0])
    eval_out = net.eval()(x)
    torch.testing.assert_close(eval_out, net.train()(x))  # eval normalises like training
    net.eval()
    assert not torch.allclose(net(x[:3]), eval_out[:3])  # ... so it depends on the rest of the batch


@pytest.mark.parametrize("build", [digit, preresnet])
def test_batch_tracked_norm_keeps_running_statistics(build):
    net = build(width=0.125, norm="batch_tracked", rescale_init=False, rescale_layer=False)
    names = [n for n, _ in net.named_buffers()]
    assert names and all(n.rsplit(".", 1)[1] in ("running_mean", "running_var", "num_batches_tracked") for n in names)
    x = torch.randn(4, *(DIGITS if build is digit else CIFAR)[0])
    net.eval()
    torch.testing.assert_close(net(x[:2]), net(x)[:2])  # eval uses the running statistics


@pytest.mark.parametrize("build", [digit, preresnet])
def test_no_norm_has_no_batchnorm(build):
    net = build(width=0.125, norm="none")
    assert not any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in net.modules())
    assert list(net.buffers()) == []


def test_make_norm():
    assert isinstance(make_norm("batch_average", 4, 1), nn.BatchNorm1d)
    assert make_norm("batch_average", 4, 2).running_mean is None
    assert make_norm("batch_tracked", 4, 2).running_mean.shape == (4,)
    assert isinstance(make_norm("none", 4, 2), nn.Identity)
    with pytest.raises(ValueError, match="dims must be 1 or 2"):
        make_norm("batch_average", 4, 3)
    with pytest.raises(ValueError, match="norm must be one of"):
        make_norm("layer", 4, 2)
    assert make_norm("group", 8, 2).num_groups == 4 and make_norm("group", 256, 1).num_groups == 16


# ------------------------------------------------------------------ builders


def test_widths_round_down_like_the_reference():
    net = digit(width=0.3)  # int(0.3 * c): 19, 19, 38 channels; 614, 153 units
    assert (net.conv1.out_channels, net.conv2.out_channels, net.conv3.out_channels) == (19, 19, 38)
    assert (net.fc1.in_features, net.fc1.out_features, net.fc2.out_features) == (38 * 49, 614, 153)
    assert (net.conv1.in_channels, net.fc3.out_features) == (3, 10)  # never scaled
    res = preresnet(width=0.3)  # 19, 38, 76, 153
    assert [res.get_submodule(f"layer{i}.1.conv2").out_channels for i in (1, 2, 3, 4)] == [19, 38, 76, 153]
    assert (res.conv1.in_channels, res.linear.in_features, res.linear.out_features) == (3, 153, 10)


@pytest.mark.parametrize(
    "name, input_shape, num_classes, out",
    [
        ("digit_cnn", (3, 28, 28), 10, (5, 10)),
        ("digit_cnn", (12, 20), 4, (5, 4)),  # (H, W): one channel; flatten 3 * 5 * 16
        ("digit_cnn", (2, 4, 7), 0, (5, 1)),  # regression, smallest image
        ("preresnet18", (3, 32, 32), 10, (5, 10)),
        ("preresnet18", (1, 9, 13), 3, (5, 3)),
    ],
)
def test_output_shapes(name, input_shape, num_classes, out):
    net = build_model(name, input_shape, num_classes, width=0.125)
    assert net(torch.randn(5, *input_shape)).shape == out


@pytest.mark.parametrize("name", ["digit_cnn", "preresnet18"])
def test_options_are_the_documented_ones(name):
    assert model_options(name) == {
        "width": 1.0, "bases": 1, "norm": "batch_average", "rescale_init": None, "rescale_layer": None,
    }


@pytest.mark.parametrize(
    "name, options, match",
    [
        ("digit_cnn", {"bases": 0}, "bases must be an int >= 1"),
        ("digit_cnn", {"bases": 2.0}, "bases must be an int >= 1"),
        ("digit_cnn", {"bases": True}, "bases must be an int >= 1"),
        ("preresnet18", {"width": 0}, "width must be a finite number > 0"),
        ("preresnet18", {"width": "1"}, "width must be a finite number > 0"),
        ("digit_cnn", {"width": 0.01}, r"width=0.01 gives int\(0.01 \* 64\) = 0 channels"),
        ("preresnet18", {"width": 1.0, "bases": 128}, r"bases=128 = 0.0078125 gives .* = 0 channels.*>= 1/64"),
        ("digit_cnn", {"norm": "layer"}, "norm must be one of"),
        ("preresnet18", {"norm": "batch"}, "norm must be one of"),
        ("digit_cnn", {"rescale_init": "yes"}, "rescale_init must be True or False"),
        ("preresnet18", {"rescale_layer": 1}, "rescale_layer must be True or False"),
    ],
)
def test_bad_options_raise_readable_errors(name, options, match):
    shape = DIGITS[0] if name == "digit_cnn" else CIFAR[0]
    with pytest.raises(ValueError, match=match):
        build_model(name, shape, 10, **options)


def test_too_small_or_badly_shaped_images_are_refused():
    with pytest.raises(ValueError, match="at least 4x4"):
        build_model("digit_cnn", (3, 3, 28), 10)
    with pytest.raises(ValueError, match=r"\(C, H, W\) or \(H, W\)"):
        build_model("preresnet18", (784,), 10)


# ------------------------------------------------------------------ ensembles


def test_bases_build_an_ensemble_of_independent_narrow_nets():
    torch.manual_seed(0)
    ens = digit(width=1.0, bases=8)
    assert isinstance(ens, BaseEnsemble) and ens.num_bases == 8 and ens.base_width == 0.125 and ens.width == 1.0
    assert all(b.conv1.out_channels == 8 and b.fc2.out_features == 64 for b in ens.bases)
    assert not torch.equal(ens.bases[0].conv1.weight, ens.bases[1].conv1.weight)
    # each base is rescaled with its own width 0.125: fc1 has 784 inputs, bound 1/sqrt(6272)
    assert all(b.fc1.weight.abs().max() <= 1 / math.sqrt(6272) for b in ens.bases)
    assert all(isinstance(m, Scaler) and m.width == 0.125 for m in ens.modules() if isinstance(m, Scaler))
    half = preresnet(width=0.5, bases=2)
    assert half.num_bases == 2 and half.bases[1].layer4[0].conv1.out_channels == 128
    assert not isinstance(digit(width=0.5), BaseEnsemble)


def test_mean_output_is_the_mean_of_the_bases_logits():
    torch.manual_seed(0)
    ens = digit(width=0.5, bases=4).eval()
    x = torch.randn(5, 3, 28, 28)
    each = [b(x) for b in ens.bases]
    torch.testing.assert_close(ens(x), sum(each) / 4)
    stacked = ens.with_bases(4, "stack")(x)
    assert stacked.shape == (5, 4, 10)
    for i in range(4):
        torch.testing.assert_close(stacked[:, i], each[i])


def test_with_bases_runs_a_state_sliced_from_the_full_ensemble():
    torch.manual_seed(0)
    full = preresnet(width=1.0, bases=8, norm="batch_tracked")
    state = {k: v.detach().clone() for k, v in (*full.named_parameters(), *full.named_buffers())}
    small = full.with_bases(3, "stack")
    assert small.num_bases == 3 and small.base_width == 0.125 and small.output == "stack"
    names = {k for k, _ in (*small.named_parameters(), *small.named_buffers())}
    assert {k.split(".")[1] for k in names} == {"0", "1", "2"} and all(k.startswith("bases.") for k in names)
    sliced = {k: v for k, v in state.items() if int(k.split(".")[1]) < 3}
    assert set(sliced) == names
    # the copies' own tensors differ from the given state: make sure the call uses the state
    with torch.no_grad():
        for p in small.parameters():
            p.zero_()
    x = torch.randn(4, 3, 32, 32)
    small.eval()
    out = functional_call(small, sliced, (x,))
    full.eval()
    for i in range(3):
        torch.testing.assert_close(out[:, i], full.bases[i](x))
    assert full.with_bases(2).output == "mean"


def test_ensemble_errors():
    with pytest.raises(ValueError, match="at least one base"):
        BaseEnsemble([], 0.125)
    with pytest.raises(ValueError, match="output must be one of"):
        BaseEnsemble([nn.Linear(2, 2)], 0.5, output="sum")
    with pytest.raises(ValueError, match=r"n must be an int in \[1, 2\]"):
        BaseEnsemble([nn.Linear(2, 2), nn.Linear(2, 2)], 0.5).with_bases(3)


def test_gradients_reach_every_base_through_per_base_losses():
    torch.manual_seed(0)
    ens = digit(width=0.25, bases=2).with_bases(2, "stack").train()
    x, y = torch.randn(4, 3, 28, 28), torch.tensor([0, 1, 2, 3])
    logits = ens(x)
    sum(nn.functional.cross_entropy(logits[:, i], y) for i in range(2)).backward()
    for k, p in ens.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, k


@pytest.mark.parametrize(
    "name, options",
    [("digit_cnn", {"width": 0.125}), ("preresnet18", {"width": 0.125}), ("digit_cnn", {"width": 0.25, "bases": 2})],
)
def test_vmap_over_stacked_states_matches_each_model(name, options):
    """A cohort's states stacked and run through one meta-device copy (the library's stacked
    execution), with batch-average BN in training mode."""
    torch.manual_seed(0)
    shape = DIGITS[0] if name == "digit_cnn" else CIFAR[0]
    models = [build_model(name, shape, 10, **options).train() for _ in range(3)]
    params, buffers = stack_module_state(models)
    shell = copy.deepcopy(models[0]).to("meta")
    x = torch.randn(4, *shape)
    out = vmap(lambda p, b: functional_call(shell, (p, b), (x,)))(params, buffers)
    for i, m in enumerate(models):
        torch.testing.assert_close(out[i], m(x))


def test_rescale_layer_defaults_to_on_with_batch_norm_and_is_refused_without():
    def scalers(net):
        return sum(isinstance(m, Scaler) for m in net.modules())

    assert scalers(build_model("digit_cnn", (1, 8, 8), 10, width=0.5)) == 5
    assert scalers(build_model("digit_cnn", (1, 8, 8), 10, width=0.5, norm="none")) == 0
    assert scalers(build_model("digit_cnn", (1, 8, 8), 10, width=0.5, norm="group")) == 0  # GroupNorm undoes any scale
    assert scalers(build_model("digit_cnn", (1, 8, 8), 10, width=0.5, rescale_layer=False)) == 0
    with pytest.raises(ValueError, match="rescale_layer needs a BatchNorm"):
        build_model("preresnet18", (3, 8, 8), 10, width=0.5, norm="none", rescale_layer=True)


def test_refresh_batch_norm_is_the_cumulative_average_of_batch_statistics():
    from fedveil.models.functional import model_state, refresh_batch_norm

    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(3, 2), nn.BatchNorm1d(2))
    state = model_state(net)
    state["1.running_mean"].fill_(5.0)  # stale statistics are thrown away
    batches = [torch.randn(8, 3), torch.randn(8, 3) + 1, torch.randn(8, 3) * 2]
    fresh = refresh_batch_norm(net, state, batches)
    with torch.no_grad():
        hidden = [net[0](x) for x in batches]
    # momentum None: the plain mean over batches of each batch's mean and unbiased variance
    torch.testing.assert_close(fresh["1.running_mean"], torch.stack([h.mean(0) for h in hidden]).mean(0))
    torch.testing.assert_close(fresh["1.running_var"], torch.stack([h.var(0) for h in hidden]).mean(0))
    assert int(fresh["1.num_batches_tracked"]) == 3
    assert state["1.running_mean"][0] == 5.0 and net[1].momentum == 0.1  # the input state and the module untouched
    with pytest.raises(ValueError, match="no BatchNorm with running statistics"):
        refresh_batch_norm(digit(width=0.125), model_state(digit(width=0.125)), batches)


def test_refresh_batch_norm_runs_the_net_as_at_test_time_scalers_off():
    from fedveil.models.functional import model_state, refresh_batch_norm

    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(3, 2), Scaler(0.5), nn.BatchNorm1d(2))
    x = torch.randn(16, 3)
    fresh = refresh_batch_norm(net, model_state(net), [x])
    with torch.no_grad():
        torch.testing.assert_close(fresh["2.running_mean"], net[0](x).mean(0))  # not divided by the width
    assert net.training  # the module's mode is restored


def test_group_norm_keeps_features_a_group_of_two_would_reduce_to_signs():
    """After a linear layer GroupNorm sees only a group's features: two features a group
    normalise to (+1, -1) whatever their values, which left Split-Mix's digit CNN at chance.
    Groups of at least 16 features keep the magnitudes; after a convolution a group spans
    every position of its channels, so two channels a group suffice."""
    from fedveil.models.norm_conversion import group_count

    pairs = nn.GroupNorm(2, 4, affine=False)(torch.tensor([[3.0, 1.0, 0.2, 0.1]]))
    torch.testing.assert_close(pairs.abs(), torch.ones(1, 4), atol=1e-2, rtol=0)  # only the signs survive
    assert [group_count(c, 1) for c in (8, 64, 256, 2048)] == [1, 4, 16, 32]
    assert [group_count(c, 2) for c in (2, 8, 16, 128)] == [1, 4, 8, 32]
    net = build_model("digit_cnn", (1, 8, 8), 10, width=0.125, norm="group")
    norms = {name: m.num_groups for name, m in net.named_modules() if isinstance(m, nn.GroupNorm)}
    assert norms == {"bn1": 4, "bn2": 4, "bn3": 8, "bn4": 16, "bn5": 4}
    check_model_for_dp(net)  # no layer mixes the examples of a batch


def test_the_private_route_of_the_digit_cnn_learns_centrally():
    """The cause of Split-Mix's stuck private route (issue 36, item 1), shown centrally on
    scikit-learn's digits: the narrow digit CNN of width 1/8 with the paper's rescaled init
    and no BatchNorm stays at chance, with norm "none" (its output near zero) and with
    GroupNorm alike; GroupNorm with the default init learns (and is what the defaults give)."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    x = torch.tensor(digits.images / 16.0, dtype=torch.float32).unsqueeze(1)
    y = torch.tensor(digits.target)

    def accuracy(**options) -> float:
        torch.manual_seed(0)
        net = build_model("digit_cnn", (1, 8, 8), 10, width=0.125, **options)
        opt = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
        gen = torch.Generator().manual_seed(0)
        for _ in range(300):
            idx = torch.randint(0, len(x), (32,), generator=gen)
            loss = nn.functional.cross_entropy(net(x[idx]), y[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
        return float((net.eval()(x).argmax(1) == y).float().mean())

    assert accuracy(norm="none", rescale_init=True) < 0.15
    assert accuracy(norm="group", rescale_init=True) < 0.15
    assert accuracy(norm="group") > 0.8  # default: rescale_init off with GroupNorm
