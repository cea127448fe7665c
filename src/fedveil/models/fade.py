"""FADE's three-part network (Hong et al. 2021, spec 004 §1.1, §2.1): encoder G, task
head f and group discriminator D behind a gradient reversal layer.

``forward(x)`` returns ``(task_logits, group_logits)``: ``z = G(x)``, ``f(z)``, and
``D(GRL(z))`` (DANN) or, with ``conditioning = "cdan"``, ``D(GRL(softmax(f(z)) ⊗ z))``
(CDAN, Long et al. 2018; the softmax detached as in the official code). One minimised
loss ``task + adv(D(GRL(z)), g)`` then trains D to recognise the group and G, through
the reversal, to hide it (Alg. 3.1 line 7). The discriminator's parameters are named
``disc.*`` (an algorithm masks them for users who opt out).

Decisions (spec §2.1 architectures): no dropout (a random mask per step would come from
the global RNG: runs would stop being reproducible and executors would disagree), no
weight normalisation of the head (the stacked engine trains plain Linear layers), and
no BatchNorm in the bottleneck by default.
"""
from __future__ import annotations

import math
from collections import OrderedDict
from typing import Sequence

import torch
from torch import nn

from .layers import GradientReversal
from .zoo import MODELS, image_input, num_outputs

CONDITIONINGS = ("none", "cdan")


class FadeNet(nn.Module):
    """``(f(G(x)), D(GRL(z or softmax(f(z)) ⊗ z)))``; see the module docstring."""

    def __init__(self, encoder: nn.Module, head: nn.Module, disc: nn.Module, conditioning: str = "none") -> None:
        super().__init__()
        if conditioning not in CONDITIONINGS:
            raise ValueError(f"conditioning must be one of {CONDITIONINGS}, got {conditioning!r}")
        self.encoder, self.head, self.reverse, self.disc = encoder, head, GradientReversal(), disc
        self.cdan = conditioning == "cdan"

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(task_logits, group_logits)``: f(G(x)) and D(GRL(z)), or D(GRL(softmax(f(z)) ⊗ z)) under CDAN."""
        z = self.encoder(x)
        logits = self.head(z)
        features = z
        if self.cdan:  # multilinear conditioning: the outer product of class probabilities and z
            probs = torch.softmax(logits, dim=1).detach()
            features = (probs.unsqueeze(2) * z.unsqueeze(1)).flatten(1)
        return logits, self.disc(self.reverse(features))


def _stack(fan_in: int, hidden: Sequence[int], out: int, prefix: str) -> tuple[nn.Sequential, int]:
    layers: OrderedDict[str, nn.Module] = OrderedDict()
    for i, h in enumerate(hidden, start=1):
        layers[f"{prefix}{i}"] = nn.Linear(fan_in, h)
        layers[f"relu{i}"] = nn.ReLU()
        fan_in = h
    layers["out"] = nn.Linear(fan_in, out)
    return nn.Sequential(layers), out


def _check_sizes(name: str, values: Sequence[int]) -> None:
    if not isinstance(values, (tuple, list)) or not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in values):
        raise ValueError(f"{name} must be a sequence of positive ints, got {values!r}")


def _parts(z_dim: int, num_classes: int, head_hidden, disc_hidden, groups: int, conditioning: str):
    _check_sizes("head_hidden", head_hidden)
    _check_sizes("disc_hidden", disc_hidden)
    if isinstance(groups, bool) or not isinstance(groups, int) or groups < 2:
        raise ValueError(f"groups must be an int >= 2 (the discriminator's classes), got {groups!r}")
    classes = num_outputs(num_classes)
    head, _ = _stack(z_dim, head_hidden, classes, "fc")
    disc_in = z_dim * classes if conditioning == "cdan" else z_dim
    disc, _ = _stack(disc_in, disc_hidden, groups, "fc")
    return head, disc


@MODELS.register("fade_mlp", "FADE encoder/head/discriminator MLP (Adult: 110-100-64, head 64-32-2, D 64-32-E)")
def fade_mlp(
    input_shape: tuple, num_classes: int, hidden: tuple[int, ...] = (100,), z_dim: int = 64,
    head_hidden: tuple[int, ...] = (32,), disc_hidden: tuple[int, ...] = (32,), groups: int = 2,
    conditioning: str = "none",
) -> nn.Module:
    """The official code's Adult network without dropout: encoder ``in -> hidden -> z_dim``
    (ReLU after every layer), head ``z -> head_hidden -> classes``, discriminator
    ``z -> disc_hidden -> groups``."""
    _check_sizes("hidden", hidden)
    _check_sizes("z_dim", [z_dim])
    layers: OrderedDict[str, nn.Module] = OrderedDict(flatten=nn.Flatten())
    fan_in = math.prod(input_shape)
    for i, h in enumerate((*hidden, z_dim), start=1):
        layers[f"fc{i}"] = nn.Linear(fan_in, h)
        layers[f"relu{i}"] = nn.ReLU()
        fan_in = h
    head, disc = _parts(z_dim, num_classes, head_hidden, disc_hidden, groups, conditioning)
    return FadeNet(nn.Sequential(layers), head, disc, conditioning)


@MODELS.register("fade_cnn", "FADE network for digits: conv3x3(16)-pool-conv3x3(32)-pool bottleneck, head, D")
def fade_cnn(
    input_shape: tuple, num_classes: int, z_dim: int = 100, head_hidden: tuple[int, ...] = (),
    disc_hidden: tuple[int, ...] = (50, 20), groups: int = 2, conditioning: str = "none",
) -> nn.Module:
    """A small LeNet-style encoder with padded 3x3 convolutions (so 8x8 digits fit as well as
    28x28 MNIST) and a ``z_dim`` bottleneck; discriminator ``z -> 50 -> 20 -> groups`` as
    in the official digits code."""
    to_image, (c, h, w) = image_input(input_shape, "fade_cnn")
    _check_sizes("z_dim", [z_dim])
    encoder = nn.Sequential(OrderedDict(
        image=to_image,
        conv1=nn.Conv2d(c, 16, 3, padding=1), relu1=nn.ReLU(), pool1=nn.MaxPool2d(2),
        conv2=nn.Conv2d(16, 32, 3, padding=1), relu2=nn.ReLU(), pool2=nn.MaxPool2d(2),
        flatten=nn.Flatten(), bottleneck=nn.Linear(32 * (h // 4) * (w // 4), z_dim), relu3=nn.ReLU(),
    ))
    if h < 4 or w < 4:
        raise ValueError(f"fade_cnn needs images of at least 4x4, got {h}x{w}")
    head, disc = _parts(z_dim, num_classes, head_hidden, disc_hidden, groups, conditioning)
    return FadeNet(encoder, head, disc, conditioning)
