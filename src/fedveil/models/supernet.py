"""ADDS supernets: feed-forward networks whose hidden units can be sampled per step
(Gong et al. 2021, §3.3-3.4 and Table 2; spec 001 §1.4-1.5, §2.2).

``SampledNet`` is a stack of sampleable layers, conv stages ``Conv3x3 -> BN -> ReLU ->
mask -> MaxPool2 (ceil)`` then hidden ``Linear -> ReLU -> mask``, then a linear head that is
never sampled. Its units are the conv channels and hidden neurons (``unit_counts``); a unit
mask multiplies a unit's output. The network reads per-row inputs from the batch's groups
(``takes_groups``), which is how the algorithm drives it:

* ``groups[UNIT_MASK]`` ``(N, J)``: fixed 0/1 masks (a subnet, FedDrop's sub-model);
* ``groups[UNIFORMS]`` ``(N, J)``, ``groups[EPS]`` ``(N,)``, ``groups[ROLE]`` ``(N,)``: ADDS
  sampling. Rows of role 0 (weight step) use hard masks ``[u < p]`` and train the weights;
  rows of role 1 (architecture step, validation rows) run on detached weights with
  straight-through masks, so their loss trains only the keep ratios (Eq. 9, 18).
* no groups (evaluation): the whole supernet.

Keep ratios are the trainable parameter ``alpha`` (one per layer), used clamped to
``alpha_range`` = [lo, hi] with a straight-through gradient (the spec's projected step;
Theorem 1 needs only a compact range; hi < 1 since at alpha = 1 Eq. 14 has no root). Importance (§1.3, "slim"): a conv channel's
``|gamma|`` of its BatchNorm, a hidden neuron's mean ``|activation|`` over the step's weight
rows; normalised to a maximum of 1 per layer. BatchNorm uses batch statistics at train and
test time (no running statistics: the paper leaves their aggregation open).

The mask sits after the ReLU: for a 0/1 mask ``ReLU(m y) = m ReLU(y)`` (same values), but a
dropped unit still receives the straight-through gradient of switching it on.
"""
from __future__ import annotations

import math
from typing import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from . import unit_sampling as us
from .zoo import MODELS, num_outputs

UNIT_MASK, UNIFORMS, EPS, ROLE = "unit_mask", "adds_u", "adds_eps", "adds_role"
ALPHA = "alpha"
# (axis, sampleable layer, repeat): entries [c * repeat, (c + 1) * repeat) of the axis belong to unit c
UnitAxes = dict[str, list[tuple[int, int, int]]]
MaskFn = Callable[[int, torch.Tensor], "torch.Tensor | None"]


class SampledNet(nn.Module):
    """See the module docstring."""

    takes_groups = True

    def __init__(
        self, input_shape: Sequence[int], num_classes: int, channels: Sequence[int], hidden: Sequence[int],
        alpha_range: tuple[float, float] = (0.05, 0.999),
    ) -> None:
        super().__init__()
        self.input_shape, self.channels, self.hidden = tuple(input_shape), list(channels), list(hidden)
        if not self.hidden:
            raise ValueError("a supernet needs at least one hidden fully-connected layer")
        self.convs, self.norms = nn.ModuleList(), nn.ModuleList()
        if self.channels:
            if len(self.input_shape) != 3:
                raise ValueError(f"conv stages need (C, H, W) inputs, got {self.input_shape}")
            c, h, w = self.input_shape
            for c_out in self.channels:
                self.convs.append(nn.Conv2d(c, c_out, 3, padding=1, bias=False))
                self.norms.append(nn.BatchNorm2d(c_out, track_running_stats=False))
                c, h, w = c_out, math.ceil(h / 2), math.ceil(w / 2)
            self.spatial, fan_in = h * w, c * h * w
        else:
            self.spatial, fan_in = 1, math.prod(self.input_shape)
        self.fcs = nn.ModuleList()
        for n in self.hidden:
            self.fcs.append(nn.Linear(fan_in, n))
            fan_in = n
        self.head = nn.Linear(fan_in, num_classes)
        self.alpha_range = alpha_range
        self.alpha = nn.Parameter(torch.full((len(self.unit_counts),), alpha_range[1]))

    # ------------------------------------------------------------------ structure
    @property
    def unit_counts(self) -> list[int]:
        """C_k of each sampleable layer: conv channels, then hidden neurons."""
        return self.channels + self.hidden

    def unit_axes(self) -> UnitAxes:
        """Which axes of which parameters each layer's units index (for subnet extraction,
        Eq. 19's element masks). The head's outputs and the image's channels are never sampled."""
        axes: UnitAxes = {}
        n_conv = len(self.channels)
        for k in range(n_conv):
            axes[f"convs.{k}.weight"] = [(0, k, 1)] + ([(1, k - 1, 1)] if k else [])
            axes[f"norms.{k}.weight"] = axes[f"norms.{k}.bias"] = [(0, k, 1)]
        for j in range(len(self.hidden)):
            k = n_conv + j
            inputs = [(1, k - 1, self.spatial if j == 0 else 1)] if k else []
            axes[f"fcs.{j}.weight"] = [(0, k, 1)] + inputs
            axes[f"fcs.{j}.bias"] = [(0, k, 1)]
        axes["head.weight"] = [(1, len(self.unit_counts) - 1, 1)]
        return axes

    def alphas(self, alpha: torch.Tensor | None = None) -> torch.Tensor:
        """Keep ratios clamped to ``alpha_range``, gradient passed straight through (the
        module's own ``alpha`` by default)."""
        alpha = self.alpha if alpha is None else alpha
        return alpha + (alpha.clamp(*self.alpha_range) - alpha).detach()

    # ------------------------------------------------------------------ forward
    def forward(self, x: torch.Tensor, groups: dict[str, torch.Tensor] | None = None) -> torch.Tensor:
        groups = groups or {}
        if UNIT_MASK in groups:
            per_layer = self.split_units(groups[UNIT_MASK].to(x.dtype))
            return self.run(x, lambda k, b: per_layer[k])[0]
        if not self.training or UNIFORMS not in groups:
            return self.run(x, lambda k, b: None)[0]
        return self.sampled_forward(x, groups)

    def sampled_forward(self, x: torch.Tensor, groups: dict[str, torch.Tensor]) -> torch.Tensor:
        """ADDS's two steps on one batch: weight rows (role 0) with hard masks, architecture
        rows (role 1) on detached weights with straight-through masks (Eq. 9, 13-18)."""
        role, eps = groups[ROLE].bool(), float(groups[EPS][0])
        uniforms = self.split_units(groups[UNIFORMS])
        alphas = self.alphas()
        out = x.new_empty((len(x), self.head.out_features))
        importances: list[torch.Tensor] = []

        def masks(rows: torch.Tensor, straight: bool) -> MaskFn:
            def at(k: int, b: torch.Tensor) -> torch.Tensor:
                if straight:
                    b = importances[k]  # the weight rows' importances, constants
                else:
                    importances.append(b)
                return us.sample_mask(alphas[k], b, eps, uniforms[k][rows], straight)
            return at

        train, val = ~role, role
        if train.any():
            out[train] = self.run(x[train], masks(train, False))[0]
        else:
            importances.extend(self.run(x, lambda k, b: None, detach=True)[1])
        if val.any():
            out[val] = self.run(x[val], masks(val, True), detach=True)[0]
        return out

    def split_units(self, per_row: torch.Tensor) -> list[torch.Tensor]:
        """``(N, J)`` per-row unit values -> one ``(N, C_k)`` tensor per layer."""
        return list(torch.split(per_row, self.unit_counts, dim=1))

    def run(self, x: torch.Tensor, mask_fn: MaskFn, detach: bool = False) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """The network with each layer's output multiplied by ``mask_fn(k, b_k)`` (``(N, C_k)``
        or None), weights detached if asked; returns the logits and the importances b_k."""
        def p(t: torch.Tensor) -> torch.Tensor:
            return t.detach() if detach else t

        h, importances = x, []
        for k, (conv, norm) in enumerate(zip(self.convs, self.norms)):
            z = F.batch_norm(F.conv2d(h, p(conv.weight), padding=1), None, None, p(norm.weight), p(norm.bias), True)
            h = F.relu(z)
            b = us.normalised(norm.weight)
            importances.append(b)
            m = mask_fn(k, b)
            if m is not None:
                h = h * m[:, :, None, None]
            h = F.max_pool2d(h, 2, ceil_mode=True)
        h = h.flatten(1)
        for j, fc in enumerate(self.fcs):
            k = len(self.convs) + j
            h = F.relu(F.linear(h, p(fc.weight), p(fc.bias)))
            b = us.normalised(h.detach().mean(0))
            importances.append(b)
            m = mask_fn(k, b)
            if m is not None:
                h = h * m
        return F.linear(h, p(self.head.weight), p(self.head.bias)), importances

    def macs(self, counts: Sequence[int] | None = None) -> int:
        """Multiply-accumulates per example of the subnet keeping ``counts[k]`` units of each
        layer (default: the supernet): 3x3 convs at their pre-pool resolution, the hidden
        layers and the head (spec 001 §1.10's F; biases, BN and pooling not counted)."""
        counts = list(self.unit_counts if counts is None else counts)
        total, fan_in = 0, self.input_shape[0] if self.channels else math.prod(self.input_shape)
        if self.channels:
            h, w = self.input_shape[1:]
            for c in counts[: len(self.channels)]:
                total += h * w * 9 * fan_in * c
                fan_in, h, w = c, math.ceil(h / 2), math.ceil(w / 2)
            fan_in *= h * w
        for n in counts[len(self.channels):]:
            total += fan_in * n
            fan_in = n
        return total + fan_in * self.head.out_features

    def importances(self, x: torch.Tensor) -> list[torch.Tensor]:
        """b_k of every layer for the whole supernet on the rows ``x`` (Alg. 1 line 16)."""
        with torch.no_grad():
            return self.run(x, lambda k, b: None)[1]


def _scaled(sizes: Sequence[int], width: float) -> list[int]:
    return [max(1, int(width * s)) for s in sizes]


@MODELS.register("adds_vgg", "ADDS's VGG supernet (FEMNIST, Table 2): conv 64-128-256, FC 1024-1024; units sampleable")
def adds_vgg(
    input_shape: tuple, num_classes: int, width: float = 1.0, channels: Sequence[int] = (64, 128, 256),
    hidden: Sequence[int] = (1024, 1024), alpha_min: float = 0.05, alpha_max: float = 0.999,
) -> nn.Module:
    """Table 2's VGG: three ``Conv3x3-BN-ReLU-MaxPool2`` stages and two hidden FC layers,
    each scaled by ``width`` (``int(width c)``); ``channels = []`` gives an MLP supernet."""
    if not 0 < width <= 4:
        raise ValueError(f"width must lie in (0, 4], got {width}")
    if not 0 < alpha_min < alpha_max < 1:
        raise ValueError(f"need 0 < alpha_min < alpha_max < 1, got {alpha_min}, {alpha_max}")
    return SampledNet(input_shape, num_outputs(num_classes), _scaled(channels, width), _scaled(hidden, width), (alpha_min, alpha_max))
