"""Width-scaling pieces of Split-Mix's nets (spec 000 part 2, A.6): the rescale layer, the
rescaled initialisation, the three BatchNorm options, and the width checks the builders share.

A net of width ``w`` has every hidden channel count ``c`` turned into ``int(w * c)`` (the
reference's rounding: down); the image's channels and the class outputs are never scaled.
"""
from __future__ import annotations

import math
from typing import Callable

import torch
from torch import nn

from .dual_bn import DualBatchNorm, FiLMDualBatchNorm
from .ensemble import ensemble_or_net
from .norm_conversion import group_count

NORMS = ("batch_average", "batch_tracked", "dual_batch_average", "dual_batch_tracked", "film_dual_batch_average",
         "film_dual_batch_tracked", "group", "none")


def _check_width(width: float) -> float:
    if isinstance(width, bool) or not isinstance(width, (int, float)) or not width > 0 or not math.isfinite(width):
        raise ValueError(f"width must be a finite number > 0, got {width!r}")
    return float(width)


class Scaler(nn.Module):
    """Split-Mix's rescale layer (HeteroFL's Scaler, spec A.6): ``x / width`` in training
    mode, the identity in eval mode (dropout-style); it sits after a conv/linear, before its BN."""

    def __init__(self, width: float) -> None:
        super().__init__()
        self.width = _check_width(width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x / width`` in training mode, ``x`` in eval mode."""
        return x / self.width if self.training else x

    def extra_repr(self) -> str:
        """The width in the module's printout."""
        return f"width={self.width:g}"


def scaler(width: float, enabled: bool) -> nn.Module:
    """A :class:`Scaler` when the rescale layer is on, else the identity."""
    return Scaler(width) if enabled else nn.Identity()


def rescale_init_(module: nn.Module, width: float) -> nn.Module:
    """Re-initialise a Conv/Linear ``module`` of a width-``width`` net as PyTorch's default
    (kaiming-uniform, a = sqrt(5)) would initialise the full-width layer: fan_in becomes
    ``fan_in / width``, so weights and bias are ~ U(-b, b) with ``b = 1 / sqrt(fan_in / width)``
    (spec A.6; smaller initial weights than the narrow layer's own default)."""
    if not isinstance(module, (nn.Linear, nn.modules.conv._ConvNd)):
        raise TypeError(f"rescale_init_ takes a Linear or Conv layer, got {type(module).__name__}")
    fan_in = module.weight[0].numel()  # in_features, or in_channels / groups * kernel size
    bound = 1.0 / math.sqrt(fan_in / _check_width(width))
    with torch.no_grad():
        module.weight.uniform_(-bound, bound)
        if module.bias is not None:
            module.bias.uniform_(-bound, bound)
    return module


def rescale_init_except_first_(net: nn.Module, width: float, first: str = "conv1") -> nn.Module:
    """:func:`rescale_init_` on every Conv / Linear of ``net`` except ``first``, the layer that
    sees the raw image (spec A.6); nothing to do at width 1."""
    if width != 1:
        for name, module in net.named_modules():
            if isinstance(module, (nn.Conv2d, nn.Linear)) and name != first:
                rescale_init_(module, width)
    return net


def build_scalable(
    model: str, make_net: Callable[[float, str, bool, bool], nn.Module], width: float, bases: int, narrowest: int,
    norm: str, rescale_init: bool | None, rescale_layer: bool | None,
) -> nn.Module:
    """The options every width-scalable builder shares, checked, then ``make_net(width, norm,
    rescale_init, rescale_layer)`` or, with ``bases > 1``, its Split-Mix ensemble
    (:func:`~fedveil.models.ensemble.ensemble_or_net`). ``narrowest`` is the architecture's
    smallest hidden channel count at width 1."""
    split_width(model, width, bases, narrowest)
    check_norm(norm)
    init = resolve_rescale_init(norm, rescale_init)
    layer = resolve_rescale_layer(norm, rescale_layer)
    return ensemble_or_net(lambda w: make_net(w, norm, init, layer), width, bases)


def make_norm(norm: str, channels: int, dims: int) -> nn.Module:
    """The BN after a layer of ``channels`` outputs (Table C.3 options): ``"batch_average"``
    normalises with the batch's statistics in training AND eval and keeps no buffers (the
    paper's default); ``"batch_tracked"`` is ordinary BatchNorm with running statistics;
    ``"group"`` is GroupNorm (Wu & He 2018: each example normalised on its own, so example-level
    DP-SGD can bound it; groups as :func:`~.norm_conversion.group_count`); ``"none"`` is the
    identity (no normalisation at all); the ``"dual_"`` forms are a
    clean and a noise BN of that kind, mixed at test time (:mod:`.dual_bn`); the ``"film_dual_"``
    forms are OAT's lambda-conditioned dual BNs. ``dims`` is 1 (after a linear layer) or 2 (after
    a convolution)."""
    check_norm(norm)
    if dims not in (1, 2):
        raise ValueError(f"dims must be 1 or 2, got {dims!r}")
    if norm == "none":
        return nn.Identity()
    if norm == "group":
        return nn.GroupNorm(group_count(channels, dims), channels)
    tracked = norm.endswith("tracked")
    if norm.startswith("film_dual_"):
        return FiLMDualBatchNorm(channels, dims, tracked)
    if norm.startswith("dual_"):
        return DualBatchNorm(channels, dims, tracked)
    cls = nn.BatchNorm1d if dims == 1 else nn.BatchNorm2d
    return cls(channels, track_running_stats=tracked)


def check_norm(norm: str) -> str:
    """``norm`` if it is one of :data:`NORMS`, else a ValueError."""
    if norm not in NORMS:
        raise ValueError(f"norm must be one of {NORMS}, got {norm!r}")
    return norm


def split_width(model: str, width: float, bases: int, narrowest: int) -> float:
    """The width of each of ``bases`` base nets of a width-``width`` model (``width / bases``),
    after checking the options; ``narrowest`` is the architecture's smallest hidden channel
    count at width 1, which must keep at least one channel."""
    width = _check_width(width)
    if isinstance(bases, bool) or not isinstance(bases, int) or bases < 1:
        raise ValueError(f"bases must be an int >= 1, got {bases!r}")
    base_width = width / bases
    if int(base_width * narrowest) < 1:
        per_base = f" / bases={bases} = {base_width:g}" if bases > 1 else ""
        raise ValueError(
            f"{model}: width={width:g}{per_base} gives int({base_width:g} * {narrowest}) = 0 channels "
            f"to its narrowest layer; each base needs width >= 1/{narrowest} = {1 / narrowest:g}"
        )
    return base_width


def check_flag(name: str, value: bool) -> bool:
    """``value`` if it is a bool, else a ValueError naming option ``name``."""
    if not isinstance(value, bool):
        raise ValueError(f"{name} must be True or False, got {value!r}")
    return value


def resolve_rescale_init(norm: str, rescale_init: bool | None) -> bool:
    """``None`` (the default): the rescaled init is on with BatchNorm (the paper's setting) and
    off with ``"group"`` and ``"none"``. Its smaller weights leave a narrow net without
    normalisation with an output near zero, and, followed by GroupNorm (scale-invariant, so
    small weights take large effective steps), the digit CNN of width 1/8 did not learn
    either (``tests/models/test_splitmix_nets.py``)."""
    if rescale_init is None:
        return norm not in ("none", "group")
    return check_flag("rescale_init", rescale_init)


def resolve_rescale_layer(norm: str, rescale_layer: bool | None) -> bool:
    """``None`` (the default): the Scaler is on with BatchNorm (the paper's setting) and off with
    ``norm = "none"``: without a BN after it, a training-only division by the width would make
    the trained net differ from the evaluated one (and grow activations width^-depth-fold).
    GroupNorm undoes any scale, so the Scaler changes nothing there and is off by default."""
    if rescale_layer is None:
        return norm not in ("none", "group")
    check_flag("rescale_layer", rescale_layer)
    if rescale_layer and norm == "none":
        raise ValueError(
            "rescale_layer needs a BatchNorm after each layer to absorb its training-only division by the width; "
            "with norm = \"none\" leave rescale_layer unset (or false)"
        )
    return rescale_layer
