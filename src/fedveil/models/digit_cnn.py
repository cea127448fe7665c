"""FedBN's Digits CNN, width-scalable for Split-Mix (spec 000 part 2, A.9, Table C.1).

Layer names follow the reference (``conv1..3``, ``bn1..5``, ``fc1..3``). Where the reference
puts them: a Scaler after conv1-3 and fc1-2, before their BN (none after the output layer
fc3); rescaled init on every conv/linear but conv1, whose input is the raw image (fc3's
input is width-scaled, so it is rescaled too).
"""
from __future__ import annotations

from collections import OrderedDict

from torch import nn

from .scalable import build_scalable, make_norm, rescale_init_except_first_, scaler
from .zoo import MODELS, image_input, num_outputs

CONVS = (64, 64, 128)
FCS = (2048, 512)
MIN_SIZE = 4


def _digit_net(
    input_shape: tuple, outputs: int, width: float, norm: str, rescale_init: bool, rescale_layer: bool
) -> nn.Sequential:
    to_image, (c, h, w) = image_input(input_shape, "digit_cnn")
    c1, c2, c3 = (int(width * k) for k in CONVS)
    f1, f2 = (int(width * k) for k in FCS)
    layers: OrderedDict[str, nn.Module] = OrderedDict(image=to_image)

    def block(name: str, i: int, layer: nn.Module, channels: int) -> None:
        """layer -> Scaler -> BN (``bn{i}``) -> ReLU."""
        layers[name] = layer
        layers[f"scale{i}"] = scaler(width, rescale_layer)
        layers[f"bn{i}"] = make_norm(norm, channels, 2 if isinstance(layer, nn.Conv2d) else 1)
        layers[f"relu{i}"] = nn.ReLU()

    block("conv1", 1, nn.Conv2d(c, c1, 5, 1, 2), c1)
    layers["pool1"] = nn.MaxPool2d(2)
    block("conv2", 2, nn.Conv2d(c1, c2, 5, 1, 2), c2)
    layers["pool2"] = nn.MaxPool2d(2)
    block("conv3", 3, nn.Conv2d(c2, c3, 5, 1, 2), c3)
    layers["flatten"] = nn.Flatten()
    block("fc1", 4, nn.Linear(c3 * (h // 4) * (w // 4), f1), f1)
    block("fc2", 5, nn.Linear(f1, f2), f2)
    layers["fc3"] = nn.Linear(f2, outputs)
    net = nn.Sequential(layers)
    return rescale_init_except_first_(net, width) if rescale_init else net


@MODELS.register("digit_cnn", "FedBN's Digits CNN (Table C.1), width-scalable; bases>1 = Split-Mix ensemble")
def digit_cnn(
    input_shape: tuple,
    num_classes: int,
    width: float = 1.0,
    bases: int = 1,
    norm: str = "batch_average",
    rescale_init: bool | None = None,
    rescale_layer: bool | None = None,
) -> nn.Module:
    """conv5x5(64)-BN-ReLU-pool, conv5x5(64)-BN-ReLU-pool, conv5x5(128)-BN-ReLU, fc2048-BN-ReLU,
    fc512-BN-ReLU, fc(num_classes) (Table C.1; 14,219,210 parameters on 3x28x28, 10 classes).

    Hidden channels ``c -> int(width * c)``. ``bases=M > 1`` gives a :class:`BaseEnsemble` of
    ``M`` nets of width ``width / M``. ``norm`` is one of ``scalable.NORMS`` (default: batch
    statistics at train and test, no buffers); ``rescale_init`` / ``rescale_layer`` (default: on with BN) are the
    Split-Mix init and Scaler (spec A.6; turn both off with tracked BN). Images of any
    ``(C, H, W)`` or ``(H, W)`` with H, W >= 4.
    """
    _, (_, h, w) = image_input(input_shape, "digit_cnn")
    if h < MIN_SIZE or w < MIN_SIZE:
        raise ValueError(f"digit_cnn needs images of at least {MIN_SIZE}x{MIN_SIZE}, got {h}x{w}")
    outputs = num_outputs(num_classes)
    return build_scalable(
        "digit_cnn", lambda *opts: _digit_net(input_shape, outputs, *opts), width, bases, min(CONVS + FCS),
        norm, rescale_init, rescale_layer,
    )
