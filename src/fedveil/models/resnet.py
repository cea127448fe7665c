"""Small CIFAR ResNet (ResNet-20 style) with GroupNorm, BatchNorm or no normalisation.

GroupNorm (the default) normalises each example on its own, so it works with per-example
DP-SGD. BatchNorm mixes the examples of a batch (one example's gradient depends on the
others, so DP-SGD refuses it) and keeps running statistics, which live in the model
state next to the parameters (per client when a cohort is stacked).
"""
from __future__ import annotations

import torch
from torch import nn

from .zoo import MODELS, image_input, num_outputs, scaled

NORMS = ("group", "batch", "none")


def make_norm(norm: str, channels: int, groups: int) -> nn.Module:
    """GroupNorm(groups, channels) for ``norm="group"``, BatchNorm2d for ``"batch"``, identity for ``"none"``."""
    if norm == "group":
        return nn.GroupNorm(groups, channels)
    return nn.BatchNorm2d(channels) if norm == "batch" else nn.Identity()


def conv(c_in: int, c_out: int, kernel_size: int, stride: int, norm: str) -> nn.Conv2d:
    """A convolution with a bias only when no normalisation follows it."""
    return nn.Conv2d(c_in, c_out, kernel_size, stride, padding=kernel_size // 2, bias=norm == "none")


class BasicBlock(nn.Module):
    """``relu(norm(conv3x3(relu(norm(conv3x3(x))))) + shortcut(x))``; the shortcut is a
    1x1 convolution plus norm when the block changes the stride or channel count."""

    def __init__(self, c_in: int, c_out: int, stride: int, norm: str, groups: int) -> None:
        super().__init__()
        self.conv1 = conv(c_in, c_out, 3, stride, norm)
        self.norm1 = make_norm(norm, c_out, groups)
        self.conv2 = conv(c_out, c_out, 3, 1, norm)
        self.norm2 = make_norm(norm, c_out, groups)
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or c_in != c_out:
            self.shortcut = nn.Sequential(conv(c_in, c_out, 1, stride, norm), make_norm(norm, c_out, groups))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The block on ``x``: two conv-norm layers with a ReLU between, plus the shortcut, then a ReLU."""
        out = torch.relu(self.norm1(self.conv1(x)))
        out = self.norm2(self.conv2(out))
        return torch.relu(out + self.shortcut(x))


class ResNet(nn.Module):
    """Stem conv3x3, three stages of ``depth`` blocks (stride 1, 2, 2), global average
    pooling and a linear head."""

    def __init__(
        self, to_image: nn.Module, c_in: int, widths: tuple[int, int, int], depth: int,
        outputs: int, norm: str, groups: int,
    ) -> None:
        super().__init__()
        self.image = to_image
        self.stem = conv(c_in, widths[0], 3, 1, norm)
        self.stem_norm = make_norm(norm, widths[0], groups)
        blocks = []
        c = widths[0]
        for stage, c_out in enumerate(widths):
            for i in range(depth):
                stride = 2 if stage > 0 and i == 0 else 1
                blocks.append(BasicBlock(c, c_out, stride, norm, groups))
                c = c_out
        self.blocks = nn.Sequential(*blocks)
        self.fc = nn.Linear(c, outputs)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Logits: stem, the blocks, global average pooling, linear head."""
        x = torch.relu(self.stem_norm(self.stem(self.image(x))))
        x = self.blocks(x)
        return self.fc(x.mean(dim=(2, 3)))


@MODELS.register("resnet", "CIFAR ResNet-20 style, GroupNorm (DP-safe) by default; depth blocks per stage")
def resnet(
    input_shape: tuple,
    num_classes: int,
    depth: int = 3,
    width: float = 1.0,
    norm: str = "group",
    groups: int = 8,
) -> nn.Module:
    """ResNet with ``6 * depth + 2`` layers (``depth=3`` is ResNet-20) and stage widths
    16, 32, 64 times ``width``.

    ``norm`` is ``"group"`` (GroupNorm with ``groups`` groups, which must divide every
    stage width), ``"batch"`` (BatchNorm; not with example-level DP) or ``"none"``.
    """
    to_image, (c, _, _) = image_input(input_shape, "resnet")
    if isinstance(depth, bool) or not isinstance(depth, int) or depth < 1:
        raise ValueError(f"depth must be an int >= 1 (blocks per stage), got {depth!r}")
    if norm not in NORMS:
        raise ValueError(f"norm must be one of {NORMS}, got {norm!r}")
    widths = (scaled(16, width), scaled(32, width), scaled(64, width))
    if norm == "group":
        if isinstance(groups, bool) or not isinstance(groups, int) or groups < 1:
            raise ValueError(f"groups must be an int >= 1, got {groups!r}")
        if any(w % groups for w in widths):
            raise ValueError(f"groups={groups} must divide every stage width {widths}; change groups or width")
    return ResNet(to_image, c, widths, depth, num_outputs(num_classes), norm, groups)
