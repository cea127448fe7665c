"""Every registered model: shapes, hand-counted parameters, purity under functional_call
and vmap, gradient flow, and readable errors for bad options."""
from __future__ import annotations

import copy
import warnings
from dataclasses import dataclass, field
from typing import Callable

import pytest
import torch
import torch.nn.functional as F
from torch.func import functional_call, grad, stack_module_state, vmap

from fedveil.models import MODELS, build_model, model_options
from fedveil.registry import UnknownNameError


@dataclass(frozen=True)
class Case:
    input_shape: tuple
    num_classes: int
    params: int  # hand-computed parameter count with default options
    make_x: Callable[[int], torch.Tensor]
    options: dict = field(default_factory=dict)  # non-default builder options of the case


def images(*shape: int) -> Callable[[int], torch.Tensor]:
    return lambda n: torch.randn(n, *shape)


def chars(seq_len: int, vocab: int) -> Callable[[int], torch.Tensor]:
    return lambda n: torch.randint(0, vocab, (n, seq_len))


CASES = {
    # 784*10 + 10
    "linear": Case((1, 28, 28), 10, 7_850, images(1, 28, 28)),
    # 784*200+200 + 200*200+200 + 200*10+10
    "mlp": Case((1, 28, 28), 10, 199_210, images(1, 28, 28)),
    # conv1 1*32*5*5+32 = 832; conv2 32*64*5*5+64 = 51,264;
    # fc1 (64*7*7)*512+512 = 1,606,144; fc2 512*10+10 = 5,130  (FedAvg CNN)
    "lenet": Case((1, 28, 28), 10, 1_663_370, images(1, 28, 28)),
    # conv1 1*32*9+32 = 320; conv2 32*64*9+64 = 18,496; 28->26->13->11->5: fc 64*25*10+10 = 16,010
    "convnet": Case((1, 28, 28), 10, 34_826, images(1, 28, 28)),
    # stem conv 3*16*9 + GN 2*16 = 464
    # stage 1, 3 blocks 16->16: 3 * (2*16*16*9 + 2*2*16) = 3 * 4,672 = 14,016
    # stage 2, first block 16->32: 16*32*9 + 64 + 32*32*9 + 64 + shortcut 16*32 + 64 = 14,528
    #          2 more blocks: 2 * (2*32*32*9 + 2*64) = 37,120
    # stage 3, first block 32->64: 32*64*9 + 128 + 64*64*9 + 128 + shortcut 32*64 + 128 = 57,728
    #          2 more blocks: 2 * (2*64*64*9 + 2*128) = 147,968
    # head 64*10+10 = 650; total 464 + 14,016 + 51,648 + 205,696 + 650
    "resnet": Case((3, 16, 16), 10, 272_474, images(3, 16, 16)),
    # embedding 80*8 = 640; LSTM layer 1 4*256*(8+256) + 2*4*256 = 272,384;
    # layer 2 4*256*(256+256) + 2*4*256 = 526,336; head 256*80+80 = 20,560
    "char_lstm": Case((10,), 80, 819_920, chars(10, 80)),
    # FADE, Adult-sized: encoder 110*100+100 = 11,100 and 100*64+64 = 6,464; head 64*32+32 = 2,080
    # and 32*2+2 = 66; discriminator 64*32+32 = 2,080 and 32*2+2 = 66
    "fade_mlp": Case((110,), 2, 21_856, images(110)),
    # conv1 1*16*9+16 = 160; conv2 16*32*9+32 = 4,640; bottleneck 32*7*7*100+100 = 156,900;
    # head 100*10+10 = 1,010; discriminator 100*50+50 = 5,050, 50*20+20 = 1,020, 20*2+2 = 42
    "fade_cnn": Case((1, 28, 28), 10, 168_822, images(1, 28, 28)),
    # Split-Mix's digits CNN at x0.125 without BN (channels 8, 8, 16; fc 256, 64) on 8x8 -> 2x2:
    # conv1 1*8*25+8 = 208; conv2 8*8*25+8 = 1,608; conv3 8*16*25+16 = 3,216;
    # fc1 (16*2*2)*256+256 = 16,640; fc2 256*64+64 = 16,448; fc3 64*10+10 = 650
    "digit_cnn": Case((1, 8, 8), 10, 38_770, images(1, 8, 8), {"width": 0.125, "norm": "none"}),
    # PreResNet18 at x0.125 without BN (stages 8, 16, 32, 64; no conv biases): stem 3*8*9 = 216;
    # stage 1: 4 * 8*8*9 = 2,304; stage 2: 8*16*9 + 16*16*9 + 8*16 + 2 * 16*16*9 = 8,192;
    # stage 3: 16*32*9 + 32*32*9 + 16*32 + 2 * 32*32*9 = 32,768;
    # stage 4: 32*64*9 + 64*64*9 + 32*64 + 2 * 64*64*9 = 131,072; head 64*10+10 = 650
    "preresnet18": Case((3, 8, 8), 10, 175_202, images(3, 8, 8), {"width": 0.125, "norm": "none"}),
    # AlexNet-BN at x0.125 without BN (convs 8, 24, 48, 32, 32; fcs 512, 512) on 3x63x63 (63 -> 15 -> 7 ->
    # 7 -> 3 -> 3 -> 1, pooled to 6x6): conv1 3*8*121+8 = 2,912; conv2 8*24*25+24 = 4,824;
    # conv3 24*48*9+48 = 10,416; conv4 48*32*9+32 = 13,856; conv5 32*32*9+32 = 9,248;
    # fc1 32*36*512+512 = 590,336; fc2 512*512+512 = 262,656; fc3 512*10+10 = 5,130
    "alexnet_bn": Case((3, 63, 63), 10, 899_378, images(3, 63, 63), {"width": 0.125, "norm": "none"}),
    # ADDS's supernet as an MLP (no conv stages): fc0 64*16+16 = 1,040; fc1 16*8+8 = 136;
    # head 8*10+10 = 90; one keep ratio per hidden layer: 2 (conv stages: tests/models/test_supernet.py)
    "adds_vgg": Case((1, 8, 8), 10, 1_268, images(1, 8, 8), {"channels": [], "hidden": [16, 8]}),
    # ADDS's text supernet: embedding 80*8 = 640; LSTM 1 4*16*(8+16) + 2*4*16 = 1,664;
    # LSTM 2 4*16*(16+16) + 2*4*16 = 2,176; fc 16*8+8 = 136; head 8*80+80 = 720; 3 keep ratios
    "adds_char_lstm": Case((10,), 80, 5_339, chars(10, 80), {"embed_dim": 8, "hidden": 16, "fc": 8}),
    # FedFed's distiller, 1x28x28: encoder 16*16 + 32 + 32*16*16 + 64 = 8,544; mu, logvar 2 * (1568*64+64)
    # = 200,832; decoder 64*1568+1568 + 32*16*16 + 32 + 16*16+1 = 110,401; classifier 32*9+32 +
    # 32*64*9+64 + 64*10+10 = 19,466 (outputs: a tuple, see tests/models/test_fedfed_model.py)
    "fedfed_vae": Case((1, 28, 28), 10, 339_243, images(1, 28, 28)),
}

# Models with one output tensor; FADE's networks return (task logits, group logits): their
# stacked, per-example and gradient behaviour is checked in tests/runtime/test_fade.py.
SINGLE_OUTPUT = sorted(name for name in CASES if not name.startswith(("fade_", "fedfed_")))

CANNOT_VMAP_PARAMS = {
    "char_lstm": "nn.LSTM has no vmap batching rule for stacked weights (aten::lstm.input)",
    "adds_char_lstm": "nn.LSTM has no vmap batching rule for stacked weights (aten::lstm.input)",
}


def build(name: str, **options) -> torch.nn.Module:
    case = CASES[name]
    return build_model(name, case.input_shape, case.num_classes, **{**case.options, **options})


def count(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def test_every_registered_model_has_a_case():
    assert sorted(CASES) == MODELS.names()


@pytest.mark.parametrize("name", sorted(CASES))
def test_output_shape(name):
    case = CASES[name]
    model = build(name)
    out = model(case.make_x(2))
    logits = out[0] if isinstance(out, tuple) else out  # FADE: (task logits, group logits)
    assert logits.shape == (2, case.num_classes)


@pytest.mark.parametrize("name", sorted(set(SINGLE_OUTPUT) - {"char_lstm", "adds_char_lstm"}))
def test_regression_has_one_output(name):
    case = CASES[name]
    model = build_model(name, case.input_shape, 0, **case.options)
    assert model(case.make_x(3)).shape == (3, 1)


@pytest.mark.parametrize("name", sorted(CASES))
def test_parameter_count(name):
    assert count(build(name)) == CASES[name].params


@pytest.mark.parametrize(
    "name, options, expected",
    [
        # width 2: conv1 1*64*25+64 = 1,664; conv2 64*128*25+128 = 204,928;
        # fc1 (128*7*7)*1024+1024 = 6,423,552; fc2 1024*10+10 = 10,250
        ("lenet", {"width": 2}, 6_640_394),
        # width 0.5: conv1 1*16*25+16 = 416; conv2 16*32*25+32 = 12,832;
        # fc1 (32*7*7)*256+256 = 401,664; fc2 256*10+10 = 2,570
        ("lenet", {"width": 0.5}, 417_482),
        # width 2 (stages 32, 64, 128): stem 3*32*9 + 64 = 928;
        # stage 1: 3 * (2*32*32*9 + 2*64) = 55,680;
        # stage 2 (same shapes as stage 3 at width 1): 57,728 + 2 * 73,984 = 205,696;
        # stage 3: 64*128*9 + 256 + 128*128*9 + 256 + 64*128 + 256 = 230,144,
        #          + 2 * (2*128*128*9 + 2*256) = 590,848;
        # head 128*10+10 = 1,290
        ("resnet", {"width": 2}, 928 + 55_680 + 205_696 + 230_144 + 590_848 + 1_290),
        # depth 1 (ResNet-8): stem 464 + 4,672 + 14,528 + 57,728 + head 650
        ("resnet", {"depth": 1}, 464 + 4_672 + 14_528 + 57_728 + 650),
        # no norm: convs get biases, no GN: stem 432+16; stage 1 3 * 2*(2304+16);
        # stage 2 (4608+32) + (9216+32) + (512+32) + 2 * 2*(9216+32);
        # stage 3 (18432+64) + (36864+64) + (2048+64) + 2 * 2*(36864+64); head 650
        ("resnet", {"norm": "none"}, 448 + 13_920 + 51_424 + 205_248 + 650),
        # 784*50+50 + 50*10+10
        ("mlp", {"hidden": (50,)}, 39_760),
        # 784*10+10: no hidden layer is the linear model
        ("mlp", {"hidden": ()}, 7_850),
        # embedding 640; one LSTM layer 4*128*(8+128) + 2*4*128 = 70,656; head 128*80+80 = 10,320
        ("char_lstm", {"hidden": 128, "layers": 1}, 81_616),
    ],
)
def test_options_scale_parameter_count(name, options, expected):
    assert count(build(name, **options)) == expected


def test_lenet_takes_small_single_channel_images_without_channel_dim():
    # 8x8 digits: 8 -> 4 -> 2 after two pools; fc1 (64*2*2)*512+512 = 131,584
    model = build_model("lenet", (8, 8), 10)
    assert count(model) == 832 + 51_264 + 131_584 + 5_130
    assert model(torch.randn(5, 8, 8)).shape == (5, 10)


@pytest.mark.parametrize("name", sorted(CASES))
def test_functional_call_uses_the_given_params(name):
    torch.manual_seed(0)
    model, other = build(name), build(name)
    x = CASES[name].make_x(4)
    params = {k: v.detach().clone() for k, v in model.named_parameters()}
    torch.testing.assert_close(functional_call(model, params, (x,)), model(x))
    torch.testing.assert_close(functional_call(model, dict(other.named_parameters()), (x,)), other(x))


@pytest.mark.parametrize("name", SINGLE_OUTPUT)
def test_vmap_over_stacked_params(name):
    if name in CANNOT_VMAP_PARAMS:
        pytest.skip(CANNOT_VMAP_PARAMS[name])
    torch.manual_seed(0)
    models = [build(name) for _ in range(3)]
    params, buffers = stack_module_state(models)
    base = copy.deepcopy(models[0]).to("meta")

    def run(p, x):
        return functional_call(base, (p, buffers), (x,))

    make_x = CASES[name].make_x
    shared = make_x(4)
    out = vmap(run, in_dims=(0, None))(params, shared)
    per_client = torch.stack([make_x(4) for _ in range(3)])
    out_each = vmap(run)(params, per_client)
    for i, m in enumerate(models):
        torch.testing.assert_close(out[i], m(shared))
        torch.testing.assert_close(out_each[i], m(per_client[i]))


def test_char_lstm_cannot_vmap_stacked_params():
    """Keeps the char_lstm docstring honest: if torch gains the batching rule, update it."""
    models = [build("char_lstm") for _ in range(2)]
    params, _ = stack_module_state(models)
    with pytest.raises(RuntimeError, match="Batching rule not implemented"):
        vmap(functional_call, in_dims=(None, 0, None))(models[0], params, (CASES["char_lstm"].make_x(2),))


def loss_fn(name: str, model: torch.nn.Module, params: dict, x: torch.Tensor) -> torch.Tensor:
    out = functional_call(model, params, (x,))
    y = torch.arange(len(x)) % CASES[name].num_classes
    return F.cross_entropy(out, y)


@pytest.mark.parametrize("name", SINGLE_OUTPUT)
def test_per_example_gradients_match_single_example_gradients(name):
    torch.manual_seed(0)
    model = build(name)
    x = CASES[name].make_x(2)
    if name not in ("char_lstm", "adds_char_lstm"):  # float64: batched and single convolutions agree to rounding (vmap's LSTM is float32 only)
        model, x = model.double(), x.double()
    params = {k: v.detach() for k, v in model.named_parameters()}

    def example_loss(p, xi):  # one example, so its label is 0
        return loss_fn(name, model, p, xi[None])

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # char_lstm: torch's slow-fallback warning
        per_example = vmap(grad(example_loss), in_dims=(None, 0))(params, x)
    for i in range(2):
        single = grad(example_loss)(params, x[i])
        for k in params:
            torch.testing.assert_close(per_example[k][i], single[k])


@pytest.mark.parametrize("name", SINGLE_OUTPUT)
def test_gradients_reach_every_parameter(name):
    torch.manual_seed(0)
    model = build(name)
    loss_fn(name, model, dict(model.named_parameters()), CASES[name].make_x(4)).backward()
    for k, p in model.named_parameters():
        if name.startswith("adds_") and k == "alpha":  # keep ratios learn only while sampling: test_supernet.py
            continue
        assert p.grad is not None and p.grad.abs().sum() > 0, f"no gradient reaches {k}"


@pytest.mark.parametrize("name", sorted(CASES))
def test_unknown_option_names_it_and_lists_accepted_ones(name):
    with pytest.raises(ValueError) as err:
        build(name, nope=1)
    message = str(err.value)
    assert "'nope'" in message and f"model '{name}'" in message
    for option in model_options(name):
        assert option in message
    if not model_options(name):
        assert "accepted: none" in message


def test_misspelt_option_gets_a_suggestion():
    with pytest.raises(ValueError, match=r"did you mean 'hidden'.*hidden=\(200, 200\)"):
        build("mlp", hiden=(10,))


@pytest.mark.parametrize(
    "name, input_shape, num_classes, options, match",
    [
        ("lenet", (1, 28, 28), 10, {"width": 0}, "width must be a number > 0"),
        ("lenet", (1, 28, 28), 10, {"width": "2"}, "width must be a number > 0"),
        ("lenet", (1, 4, 4), 10, {}, "at least 8x8"),
        ("lenet", (784,), 10, {}, r"\(C, H, W\) or \(H, W\)"),
        ("resnet", (3, 16, 16), 10, {"norm": "layer"}, "norm must be one of"),
        ("resnet", (3, 16, 16), 10, {"depth": 0}, "depth must be an int >= 1"),
        ("resnet", (3, 16, 16), 10, {"groups": 5}, "groups=5 must divide every stage width"),
        ("mlp", (784,), 10, {"hidden": 200}, r"model 'mlp': option 'hidden': Input should be a valid tuple \(got 200\)"),
        ("mlp", (784,), 10, {"hidden": (200, 0)}, "hidden must be a sequence of positive ints"),
        ("char_lstm", (10,), 80, {"layers": 0}, "layers must be an int >= 1"),
        ("char_lstm", (10,), 0, {}, "num_classes must be the vocabulary size"),
        ("char_lstm", (1, 10), 80, {}, r"input_shape \(seq_len,\)"),
        ("linear", (784,), -1, {}, "num_classes must be an int >= 0"),
        ("linear", (0, 3), 10, {}, "input_shape must be a non-empty tuple of positive ints"),
    ],
)
def test_bad_arguments_raise_readable_errors(name, input_shape, num_classes, options, match):
    with pytest.raises(ValueError, match=match):
        build_model(name, input_shape, num_classes, **options)


def test_unknown_model_lists_the_registered_ones():
    with pytest.raises(UnknownNameError, match="did you mean 'lenet'.*adds_char_lstm, adds_vgg, alexnet_bn, char_lstm, convnet, digit_cnn, fade_cnn, fade_mlp, fedfed_vae, lenet, linear, mlp, preresnet18, resnet"):
        build_model("lenett", (1, 28, 28), 10)


def test_convnet_on_cifar_shapes_and_too_small_images():
    # conv1 3*32*9+32 = 896; conv2 18,496; 32->30->15->13->6: fc 64*36*10+10 = 23,050
    assert count(build_model("convnet", (3, 32, 32), 10)) == 42_442
    with pytest.raises(ValueError, match="at least 10x10"):
        build_model("convnet", (1, 8, 8), 10)


def test_linear_zero_init():
    model = build_model("linear", (28,), 0, zero_init=True)
    assert all(torch.count_nonzero(p) == 0 for p in model.parameters())
    assert torch.count_nonzero(build_model("linear", (28,), 0).fc.weight) > 0
