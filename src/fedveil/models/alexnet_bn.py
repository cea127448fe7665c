"""FedBN's AlexNet with BatchNorm (DomainNet), width-scalable for Split-Mix (spec 000 part 2
§A.9, Table C.2): 57,063,498 parameters at x1 on 3x256x256 with 10 classes (Table 4.1).

Conv(64, k11, s4, p2)-BN-ReLU-MaxPool(3, 2), Conv(192, k5, p2)-BN-ReLU-MaxPool(3, 2),
Conv(384, k3, p1)-BN-ReLU, Conv(256, k3, p1)-BN-ReLU, Conv(256, k3, p1)-BN-ReLU-MaxPool(3, 2),
AdaptiveAvgPool(6, 6), FC(4096)-BN1d-ReLU, FC(4096)-BN1d-ReLU, FC(num_classes). As for the
digits CNN: a Scaler after every conv / linear layer but the last, before its BN; rescaled
init on every layer but conv1 (the reference re-initialises conv1 normally).
"""
from __future__ import annotations

from collections import OrderedDict

from torch import nn

from .scalable import build_scalable, make_norm, rescale_init_except_first_, scaler
from .zoo import MODELS, image_input, num_outputs

CONVS = ((64, 11, 4, 2), (192, 5, 1, 2), (384, 3, 1, 1), (256, 3, 1, 1), (256, 3, 1, 1))
POOL_AFTER = (1, 2, 5)
FCS = (4096, 4096)
MIN_SIZE = 63  # conv1 and three 3x3 / 2 poolings still leave a pixel


def _alexnet(input_shape: tuple, outputs: int, width: float, norm: str, rescale_init: bool, rescale_layer: bool) -> nn.Sequential:
    to_image, (c, _, _) = image_input(input_shape, "alexnet_bn")
    layers: OrderedDict[str, nn.Module] = OrderedDict(image=to_image)

    def block(name: str, i: int, layer: nn.Module, channels: int, dims: int) -> None:
        layers[name] = layer
        layers[f"scale{i}"] = scaler(width, rescale_layer)
        layers[f"bn{i}"] = make_norm(norm, channels, dims)
        layers[f"relu{i}"] = nn.ReLU()

    c_in = c
    for i, (channels, kernel, stride, padding) in enumerate(CONVS, start=1):
        c_out = int(width * channels)
        block(f"conv{i}", i, nn.Conv2d(c_in, c_out, kernel, stride, padding), c_out, 2)
        if i in POOL_AFTER:
            layers[f"pool{i}"] = nn.MaxPool2d(3, 2)
        c_in = c_out
    layers["avgpool"] = nn.AdaptiveAvgPool2d((6, 6))
    layers["flatten"] = nn.Flatten()
    f_in = c_in * 36
    for j, units in enumerate(FCS, start=1):
        f_out = int(width * units)
        block(f"fc{j}", len(CONVS) + j, nn.Linear(f_in, f_out), f_out, 1)
        f_in = f_out
    layers[f"fc{len(FCS) + 1}"] = nn.Linear(f_in, outputs)
    net = nn.Sequential(layers)
    return rescale_init_except_first_(net, width) if rescale_init else net


@MODELS.register("alexnet_bn", "FedBN's AlexNet with BN (Table C.2, DomainNet), width-scalable; bases>1 = Split-Mix")
def alexnet_bn(
    input_shape: tuple,
    num_classes: int,
    width: float = 1.0,
    bases: int = 1,
    norm: str = "batch_average",
    rescale_init: bool | None = None,
    rescale_layer: bool | None = None,
) -> nn.Module:
    """AlexNet with BN for 256x256 images (any (C, H, W) with H, W >= 63); options as
    ``digit_cnn``: hidden channels ``c -> int(width * c)``, ``bases`` Split-Mix base nets,
    ``norm``, ``rescale_init``, ``rescale_layer`` (default: on with BN)."""
    _, (_, h, w) = image_input(input_shape, "alexnet_bn")
    if h < MIN_SIZE or w < MIN_SIZE:
        raise ValueError(f"alexnet_bn needs images of at least {MIN_SIZE}x{MIN_SIZE}, got {h}x{w}")
    outputs = num_outputs(num_classes)
    return build_scalable(
        "alexnet_bn", lambda *opts: _alexnet(input_shape, outputs, *opts), width, bases, min(c for c, *_ in CONVS),
        norm, rescale_init, rescale_layer,
    )
