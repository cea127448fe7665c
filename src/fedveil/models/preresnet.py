"""HeteroFL's pre-activation ResNet18, width-scalable for Split-Mix (spec 000 part 2, A.9).

Layer names follow the reference (``conv1``, ``layer1..4.{i}.n1/conv1/n2/conv2/shortcut``,
``n4``, ``linear``). As there, a Scaler follows the stem and every conv of the blocks
(shortcut included), none follows the linear head; rescaled init covers every conv/linear
but the stem (its input is the raw image), then BN weight 1 / bias 0 and linear bias 0.
"""
from __future__ import annotations

import torch
from torch import nn

from .scalable import build_scalable, make_norm, rescale_init_except_first_, scaler
from .zoo import MODELS, image_input, num_outputs

STAGES = (64, 128, 256, 512)
BLOCKS = (2, 2, 2, 2)


class PreActBlock(nn.Module):
    """``out = relu(n1(x))``; ``sc = S(shortcut(out))`` (1x1 conv) when the block changes the
    stride or width, else ``x``; ``S(conv2(relu(n2(S(conv1(out)))))) + sc`` (S: the Scaler)."""

    def __init__(self, c_in: int, c_out: int, stride: int, norm: str, scale: nn.Module) -> None:
        super().__init__()
        self.n1 = make_norm(norm, c_in, 2)
        self.conv1 = nn.Conv2d(c_in, c_out, 3, stride, 1, bias=False)
        self.n2 = make_norm(norm, c_out, 2)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, 1, 1, bias=False)
        self.shortcut = nn.Conv2d(c_in, c_out, 1, stride, bias=False) if stride != 1 or c_in != c_out else None
        self.scale = scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The block on ``x``: ``relu(n1(x))`` through the two
        scaled convs (``relu(n2)`` between), plus the shortcut."""
        out = torch.relu(self.n1(x))
        shortcut = x if self.shortcut is None else self.scale(self.shortcut(out))
        out = self.scale(self.conv1(out))
        out = self.scale(self.conv2(torch.relu(self.n2(out))))
        return out + shortcut


class PreResNet(nn.Module):
    """Stem conv3x3, four stages of pre-activation blocks (strides 1, 2, 2, 2), ``relu(n4)``,
    global average pooling, linear head."""

    def __init__(
        self, input_shape: tuple, outputs: int, width: float, norm: str, rescale_init: bool, rescale_layer: bool
    ) -> None:
        super().__init__()
        self.image, (c, _, _) = image_input(input_shape, "preresnet18")
        widths = [int(width * k) for k in STAGES]
        self.scale = scaler(width, rescale_layer)
        self.conv1 = nn.Conv2d(c, widths[0], 3, 1, 1, bias=False)
        c_in = widths[0]
        for stage, (c_out, n) in enumerate(zip(widths, BLOCKS)):
            blocks = []
            for i in range(n):
                blocks.append(PreActBlock(c_in, c_out, 2 if stage > 0 and i == 0 else 1, norm, self.scale))
                c_in = c_out
            self.add_module(f"layer{stage + 1}", nn.Sequential(*blocks))
        self.n4 = make_norm(norm, c_in, 2)
        self.linear = nn.Linear(c_in, outputs)
        if rescale_init:
            rescale_init_except_first_(self, width)
        for module in self.modules():
            if isinstance(module, nn.BatchNorm2d):
                nn.init.ones_(module.weight)
                nn.init.zeros_(module.bias)
        nn.init.zeros_(self.linear.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Logits: stem, the four stages, ``relu(n4)``, global average pooling, linear head."""
        out = self.scale(self.conv1(self.image(x)))
        out = self.layer4(self.layer3(self.layer2(self.layer1(out))))
        out = torch.relu(self.n4(out))
        return self.linear(out.mean(dim=(2, 3)))


@MODELS.register("preresnet18", "HeteroFL's pre-activation ResNet18 (CIFAR), width-scalable; bases>1 = Split-Mix ensemble")
def preresnet18(
    input_shape: tuple,
    num_classes: int,
    width: float = 1.0,
    bases: int = 1,
    norm: str = "batch_average",
    rescale_init: bool | None = None,
    rescale_layer: bool | None = None,
) -> nn.Module:
    """Pre-activation ResNet18, stage widths 64/128/256/512 x ``width`` (``int(width * c)``),
    2 blocks per stage, convs without bias (11,172,170 parameters on 3x32x32, 10 classes).

    Options as :func:`fedveil.models.digit_cnn.digit_cnn`: ``bases=M > 1`` gives a
    :class:`BaseEnsemble` of ``M`` nets of width ``width / M``; ``norm`` one of
    ``scalable.NORMS``; ``rescale_init`` / ``rescale_layer`` (spec A.6).
    """
    image_input(input_shape, "preresnet18")
    outputs = num_outputs(num_classes)
    return build_scalable(
        "preresnet18", lambda *opts: PreResNet(input_shape, outputs, *opts), width, bases, min(STAGES),
        norm, rescale_init, rescale_layer,
    )
