"""Parameter and MAC counts against hand formulas and Split-Mix's Table 4.1 (spec 000 part 2, A.9 [X]).

The formulas below are written from the layer tables (Table C.1, HeteroFL's PreResNet18), not
from the builders: a conv k x k from a to b channels has a*b*k*k weights (+ b biases in the
digits CNN) and b*H_out*W_out*a*k*k MACs; a BN has 2 parameters per channel.
"""
from __future__ import annotations

import pytest
import torch
from torch import nn

from fedveil.models import build_model, count_macs, count_params

torch.set_num_threads(1)

DIGITS = ((3, 28, 28), 10)
CIFAR = ((3, 32, 32), 10)
WIDTHS = (0.125, 0.25, 0.5, 1.0)


def hidden(c: int, w: float) -> int:
    return int(c * w)


def digit_params(w: float, classes: int = 10) -> int:
    c1, c2, c3, f1, f2 = (hidden(c, w) for c in (64, 64, 128, 2048, 512))
    convs = (3 * c1 + c1 * c2 + c2 * c3) * 25 + (c1 + c2 + c3)
    fcs = c3 * 7 * 7 * f1 + f1 + f1 * f2 + f2 + f2 * classes + classes
    bns = 2 * (c1 + c2 + c3 + f1 + f2)
    return convs + fcs + bns


def digit_macs(w: float, classes: int = 10) -> int:
    c1, c2, c3, f1, f2 = (hidden(c, w) for c in (64, 64, 128, 2048, 512))
    return (c1 * 28 * 28 * 3 + c2 * 14 * 14 * c1 + c3 * 7 * 7 * c2) * 25 + c3 * 49 * f1 + f1 * f2 + f2 * classes


def preresnet_layers(w: float):
    """(c_in, c_out, stride, has_shortcut) for the 8 blocks, and the stage widths."""
    widths = [hidden(c, w) for c in (64, 128, 256, 512)]
    blocks, c_in = [], widths[0]
    for stage, c in enumerate(widths):
        blocks.append((c_in, c, 1 if stage == 0 else 2, stage > 0))
        blocks.append((c, c, 1, False))
        c_in = c
    return widths, blocks


def preresnet_params(w: float, classes: int = 10) -> int:
    widths, blocks = preresnet_layers(w)
    total = 3 * widths[0] * 9  # stem, no bias
    for c_in, c_out, _, shortcut in blocks:
        total += 2 * c_in + c_in * c_out * 9 + 2 * c_out + c_out * c_out * 9 + (c_in * c_out if shortcut else 0)
    return total + 2 * widths[3] + widths[3] * classes + classes  # n4, linear


def preresnet_macs(w: float, classes: int = 10) -> int:
    widths, blocks = preresnet_layers(w)
    side = 32
    total = widths[0] * side * side * 3 * 9
    for c_in, c_out, stride, shortcut in blocks:
        side //= stride
        total += side * side * (c_out * c_in * 9 + c_out * c_out * 9 + (c_out * c_in if shortcut else 0))
    return total + widths[3] * classes


def millions(n: int) -> float:
    return round(n / 1e6, 3)


# ------------------------------------------------------------------ #Params (Table 4.1)


def test_digit_cnn_params_match_table_4_1_exactly():
    assert digit_params(0.125) == 224_194 and digit_params(1.0) == 14_219_210  # by hand, see the brief
    for w, table in zip(WIDTHS, (0.224, 0.892, 3.559, 14.219)):
        n = count_params(build_model("digit_cnn", *DIGITS, width=w))
        assert n == digit_params(w) and millions(n) == table


def test_preresnet18_params_match_table_4_1_exactly():
    # x1: stem 1,728; stage 1 2 * 73,984; stage 2 229,760 + 295,424; stage 3 918,272 + 1,180,672;
    # stage 4 3,671,552 + 4,720,640; n4 1,024; linear 5,130
    assert preresnet_params(1.0) == 11_172_170
    for w, table in zip(WIDTHS, (0.176, 0.701, 2.797, 11.172)):
        n = count_params(build_model("preresnet18", *CIFAR, width=w))
        assert n == preresnet_params(w) and millions(n) == table


@pytest.mark.parametrize(
    "name, shape, one_base, table",
    [
        ("digit_cnn", DIGITS, digit_params(0.125), (0.224, 0.448, 0.897, 1.794)),
        ("preresnet18", CIFAR, preresnet_params(0.125), (0.176, 0.352, 0.705, 1.409)),
    ],
)
def test_split_mix_params_are_bases_times_one_base(name, shape, one_base, table):
    for w, expected in zip(WIDTHS, table):
        n_bases = round(w / 0.125)
        n = count_params(build_model(name, *shape, width=w, bases=n_bases))
        assert n == n_bases * one_base and millions(n) == expected


def test_params_exclude_running_statistics():
    tracked = build_model("digit_cnn", *DIGITS, width=0.25, norm="batch_tracked")
    assert count_params(tracked) == digit_params(0.25)
    assert count_params(build_model("digit_cnn", *DIGITS, width=0.25, norm="none")) == digit_params(0.25) - 2 * (
        16 + 16 + 32 + 512 + 128
    )


# ------------------------------------------------------------------ MACs (Table 4.1 = about these / 10)


def test_digit_cnn_macs():
    expected = 64 * 28 * 28 * 3 * 25 + 64 * 14 * 14 * 64 * 25 + 128 * 7 * 7 * 64 * 25 + 6272 * 2048 + 2048 * 512 + 512 * 10
    assert expected == digit_macs(1.0) == 47_767_552  # Table 4.1: 4.8M
    for w in WIDTHS:
        assert count_macs(build_model("digit_cnn", *DIGITS, width=w), DIGITS[0]) == digit_macs(w)
    ens = build_model("digit_cnn", *DIGITS, width=1.0, bases=8)
    assert count_macs(ens, DIGITS[0]) == 8 * digit_macs(0.125)


def test_preresnet18_macs():
    # x1: stem 1,769,472; stage 1 4 * 37,748,736; stages 2-4 134,217,728 each; linear 5,120
    x1 = 1_769_472 + 4 * 37_748_736 + 3 * 134_217_728 + 5_120
    assert preresnet_macs(1.0) == x1 == 555_422_720  # spec A.9: 555.4M analytic, table 55.7M
    assert count_macs(build_model("preresnet18", *CIFAR, width=1.0), CIFAR[0]) == x1
    assert count_macs(build_model("preresnet18", *CIFAR, width=0.25), CIFAR[0]) == preresnet_macs(0.25)
    split_mix = count_macs(build_model("preresnet18", *CIFAR, width=1.0, bases=8), CIFAR[0])
    assert split_mix == 8 * preresnet_macs(0.125) == 70_980_608  # spec A.9: 71.0M analytic, table 7.2M
    assert round(split_mix / 1e6, 1) == 71.0


def test_macs_of_grouped_strided_convs_and_linear_layers():
    model = nn.Sequential(
        nn.Conv2d(4, 8, 3, groups=2),  # 5x5 -> 3x3: 8*9 outputs x (4/2)*9 = 1,296
        nn.Conv2d(8, 6, 1, stride=2),  # 3x3 -> 2x2: 6*4 outputs x 8 = 192
        nn.Flatten(),
        nn.Linear(24, 7),  # 168
    )
    model.train()
    assert count_macs(model, (4, 5, 5)) == 1_296 + 192 + 168
    assert model.training  # the mode is restored
    assert not model[0]._forward_hooks  # the hooks are removed


def test_macs_of_an_image_without_channel_dimension():
    net = build_model("digit_cnn", (12, 20), 4, width=0.125)
    # 8, 8, 16 channels, 256, 64 units; 12x20 -> 6x10 -> 3x5
    expected = (8 * 240 * 1 + 8 * 60 * 8 + 16 * 15 * 8) * 25 + 16 * 15 * 256 + 256 * 64 + 64 * 4
    assert count_macs(net, (12, 20)) == expected


def _alexnet_params(w: float) -> int:
    """Table C.2 by hand at width w on 3x256x256, 10 classes: conv weights + biases, two BN
    parameters per channel, fc layers on the 6x6 pooled map."""
    c = [int(w * k) for k in (64, 192, 384, 256, 256)]
    f = [int(w * k) for k in (4096, 4096)]
    kernels = (11, 5, 3, 3, 3)
    total, c_in = 0, 3
    for c_out, k in zip(c, kernels):
        total += c_in * c_out * k * k + c_out + 2 * c_out
        c_in = c_out
    f_in = c_in * 36
    for f_out in f:
        total += f_in * f_out + f_out + 2 * f_out
        f_in = f_out
    return total + f_in * 10 + 10


def test_alexnet_bn_matches_table_4_1_params_and_the_analytic_macs():
    from fedveil.models import build_model
    from fedveil.models.complexity import count_macs, count_params

    shape = (3, 256, 256)
    for w, table in ((0.125, 0.902), (0.25, 3.584), (0.5, 14.289), (1.0, 57.063)):
        got = count_params(build_model("alexnet_bn", shape, 10, width=w))
        assert got == _alexnet_params(w) and round(got / 1e6, 3) == table
    assert _alexnet_params(1.0) == 57_063_498
    split_mix = count_params(build_model("alexnet_bn", shape, 10, width=1.0, bases=8))
    assert split_mix == 8 * _alexnet_params(0.125) and round(split_mix / 1e6, 3) == 7.214
    # 64*63*63*3*121 + 192*31*31*64*25 + 384*15*15*192*9 + 256*15*15*384*9 + 256*15*15*256*9
    # + 9216*4096 + 4096*4096 + 4096*10 = 923,069,120 (the spec's 923.1M; Table 4.1 shows 92.5M)
    assert count_macs(build_model("alexnet_bn", shape, 10, width=1.0, norm="none"), shape) == 923_069_120
