"""ADDS supernets: networks whose hidden units can be sampled per step (Gong et al. 2021,
§3.3-3.4 and Table 2; spec 001 §1.4-1.5, §2.2).

A :class:`Supernet` has sampleable layers of ``unit_counts`` units each; a unit mask
multiplies a unit's output. :class:`SampledNet` (``adds_vgg``) stacks conv stages ``Conv3x3
-> BN -> ReLU -> mask -> MaxPool2 (ceil)`` and hidden ``Linear -> ReLU -> mask`` layers;
:class:`SampledCharLSTM` (``adds_char_lstm``) samples only non-recurrent connections (§4.1.3).
The head is never sampled. A supernet reads per-row inputs from the batch's groups
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
from torch.func import functional_call

from . import unit_sampling as us
from .zoo import MODELS, num_outputs

UNIT_MASK, UNIFORMS, EPS, ROLE, LABEL = "unit_mask", "adds_u", "adds_eps", "adds_role", "adds_label"
LRP_EPS = 1e-9  # z+ rule stabiliser: only guards 0 / 0 (every z+ is >= 0)
ALPHA = "alpha"
# (axis, sampleable layer, repeat): entries [c * repeat, (c + 1) * repeat) of the axis belong to unit c
UnitAxes = dict[str, list[tuple[int, int, int]]]
MaskFn = Callable[[int, torch.Tensor], "torch.Tensor | None"]


def _same(t: torch.Tensor) -> torch.Tensor:
    return t


def _detached(t: torch.Tensor) -> torch.Tensor:
    return t.detach()


def _masked(h: torch.Tensor, m: torch.Tensor | None) -> torch.Tensor:
    """``h`` (N, C, ...) times a per-row unit mask ``m`` (N, C), if any."""
    return h if m is None else h * m.view(*m.shape, *([1] * (h.dim() - 2)))


class Supernet(nn.Module):
    """What every ADDS supernet shares: keep ratios, the sampling forward and the group
    protocol. Subclasses define ``unit_counts``, :meth:`unit_axes`, :meth:`run` and :meth:`macs`."""

    takes_groups = True
    unit_counts: list[int]
    head: nn.Linear

    def __init__(self, num_units: int, alpha_range: tuple[float, float]) -> None:
        super().__init__()
        self.alpha_range = alpha_range
        self.alpha = nn.Parameter(torch.full((num_units,), alpha_range[1]))

    def unit_axes(self) -> UnitAxes:
        """Which axes of which parameters each sampleable layer's units index (subnet extraction, Eq. 19's masks)."""
        raise NotImplementedError

    def run(self, x: torch.Tensor, mask_fn: MaskFn, detach: bool = False) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """The network with each layer's output multiplied by ``mask_fn(k, b_k)`` (``(N, C_k)``
        or None), weights detached if asked; returns the logits and the importances b_k."""
        raise NotImplementedError

    def macs(self, counts: Sequence[int] | None = None) -> int:
        """Multiply-accumulates per example of the subnet keeping ``counts[k]`` units per layer (default: all)."""
        raise NotImplementedError

    def alphas(self, alpha: torch.Tensor | None = None) -> torch.Tensor:
        """Keep ratios clamped to ``alpha_range``, gradient passed straight through (the
        module's own ``alpha`` by default)."""
        alpha = self.alpha if alpha is None else alpha
        return alpha + (alpha.clamp(*self.alpha_range) - alpha).detach()

    def forward(self, x: torch.Tensor, groups: dict[str, torch.Tensor] | None = None) -> torch.Tensor:
        """Logits: with fixed ``UNIT_MASK`` masks, the whole supernet in eval mode
        or without draws, else ADDS's sampled forward (:meth:`sampled_forward`)."""
        groups = groups or {}
        if UNIT_MASK in groups:
            per_layer = self.split_units(groups[UNIT_MASK].to(self.head.weight.dtype))
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
        out = self.head.weight.new_empty((len(x), self.head.out_features))
        train, val = ~role, role
        reference = train if train.any() else role
        # importances of the step: the weight rows' (LRP: computed first; slim: during their pass)
        labels = groups[LABEL][reference] if LABEL in groups else None
        importances = self.given_importances(x[reference], labels)

        def masks(rows: torch.Tensor, straight: bool) -> MaskFn:
            def at(k: int, b: torch.Tensor) -> torch.Tensor:
                if straight or len(importances) > k:
                    b = importances[k]  # constants of the step
                else:
                    importances.append(b)
                return us.sample_mask(alphas[k], b, eps, uniforms[k][rows], straight)
            return at

        if train.any():
            out[train] = self.run(x[train], masks(train, False))[0]
        elif not importances:
            importances.extend(self.run(x, lambda k, b: None, detach=True)[1])
        if val.any():
            out[val] = self.run(x[val], masks(val, True), detach=True)[0]
        return out

    def given_importances(self, x: torch.Tensor, labels: torch.Tensor | None) -> list[torch.Tensor]:
        """Importances computed before a step's passes (LRP); empty when the passes make them
        as they go (slim)."""
        return []

    def split_units(self, per_row: torch.Tensor) -> list[torch.Tensor]:
        """``(N, J)`` per-row unit values -> one ``(N, C_k)`` tensor per layer."""
        return list(torch.split(per_row, self.unit_counts, dim=1))

    def importances(self, x: torch.Tensor, labels: torch.Tensor | None = None) -> list[torch.Tensor]:
        """b_k of every layer for the whole supernet on the rows ``x`` (Alg. 1 line 16)."""
        given = self.given_importances(x, labels)
        if given:
            return given
        with torch.no_grad():
            return self.run(x, lambda k, b: None)[1]


class SampledNet(Supernet):
    """VGG / MLP supernet; see the module docstring."""

    def __init__(
        self, input_shape: Sequence[int], num_classes: int, channels: Sequence[int], hidden: Sequence[int],
        alpha_range: tuple[float, float] = (0.05, 0.999), importance: str = "slim",
    ) -> None:
        super().__init__(len(channels) + len(hidden), alpha_range)
        if importance not in ("slim", "lrp"):
            raise ValueError(f"importance must be 'slim' or 'lrp', got {importance!r}")
        self.importance = importance
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

    def run(self, x: torch.Tensor, mask_fn: MaskFn, detach: bool = False) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """Conv stages then hidden FC layers, each output masked by
        ``mask_fn``; slim importances: |BN gamma| and mean activations."""
        p = _detached if detach else _same
        h, importances = x, []
        for k, (conv, norm) in enumerate(zip(self.convs, self.norms)):
            z = F.batch_norm(F.conv2d(h, p(conv.weight), padding=1), None, None, p(norm.weight), p(norm.bias), True)
            h = F.relu(z)
            b = us.normalised(norm.weight)
            importances.append(b)
            h = F.max_pool2d(_masked(h, mask_fn(k, b)), 2, ceil_mode=True)
        h = h.flatten(1)
        for j, fc in enumerate(self.fcs):
            k = len(self.convs) + j
            h = F.relu(F.linear(h, p(fc.weight), p(fc.bias)))
            b = us.normalised(h.detach().mean(0))
            importances.append(b)
            h = _masked(h, mask_fn(k, b))
        return F.linear(h, p(self.head.weight), p(self.head.bias)), importances

    def given_importances(self, x: torch.Tensor, labels: torch.Tensor | None) -> list[torch.Tensor]:
        """The LRP importances with ``importance = "lrp"``; none (slim: made during the passes) otherwise."""
        return self.lrp_importances(x, labels) if self.importance == "lrp" else []

    def lrp_importances(self, x: torch.Tensor, labels: torch.Tensor | None = None) -> list[torch.Tensor]:
        """ADDS (LRP) importances (Eq. 10-11, the z+ rule): the relevance of the true class's
        logit (the predicted class's without labels), propagated layer by layer down to each
        sampleable layer's output; a unit's b is the mean over rows of |its relevance|
        (summed over positions). ReLU and BatchNorm pass relevance through, max-pooling
        gives it to the winners, and a conv / linear layer of input a and weights W sends
        ``a * (W+^T (R / z+))`` down, ``z+ = W+ a`` (biases excluded)."""
        with torch.enable_grad():
            inputs, pooled, h = [], [], x.detach()
            for conv, norm in zip(self.convs, self.norms):
                inputs.append(h)
                z = F.batch_norm(F.conv2d(h, conv.weight.detach(), padding=1), None, None,
                                 norm.weight.detach(), norm.bias.detach(), True)
                a = F.relu(z)
                pooled.append(a)
                h = F.max_pool2d(a, 2, ceil_mode=True)
            map_shape, h = h.shape, h.flatten(1)
            for fc in self.fcs:
                inputs.append(h)
                h = F.relu(F.linear(h, fc.weight.detach(), fc.bias.detach()))
            logits = F.linear(h, self.head.weight.detach(), self.head.bias.detach())
            target = logits.argmax(1) if labels is None else labels.long()
            relevance = torch.zeros_like(logits).scatter_(1, target[:, None], logits.gather(1, target[:, None]))
            relevance = _z_plus(h, relevance, lambda a: F.linear(a, self.head.weight.detach().clamp(min=0)))
            out: list[torch.Tensor] = []
            for fc, a in zip(reversed(self.fcs), reversed(inputs[len(self.convs):])):
                out.append(us.normalised(relevance.abs().mean(0)))
                relevance = _z_plus(a, relevance, lambda t, w=fc.weight: F.linear(t, w.detach().clamp(min=0)))
            relevance = relevance.view(map_shape)
            for conv, a, before_pool in zip(reversed(self.convs), reversed(inputs[: len(self.convs)]), reversed(pooled)):
                relevance = _z_plus(before_pool, relevance, lambda t: F.max_pool2d(t, 2, ceil_mode=True))
                out.append(us.normalised(relevance.abs().sum((2, 3)).mean(0)))
                relevance = _z_plus(a, relevance, lambda t, w=conv.weight: F.conv2d(t, w.detach().clamp(min=0), padding=1))
        return out[::-1]

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

def _z_plus(a: torch.Tensor, relevance: torch.Tensor, positive_map: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
    """One z+ step (Eq. 11) by the gradient trick: ``R_in = a * grad_a <positive_map(a), R / z>``."""
    a = a.detach().requires_grad_(True)
    z = positive_map(a)
    (grad,) = torch.autograd.grad(z, a, grad_outputs=(relevance / (z + LRP_EPS)).detach())
    return (a * grad).detach()


def _check_range(alpha_min: float, alpha_max: float) -> None:
    if not 0 < alpha_min < alpha_max < 1:
        raise ValueError(f"need 0 < alpha_min < alpha_max < 1, got {alpha_min}, {alpha_max}")


def _scaled(sizes: Sequence[int], width: float) -> list[int]:
    return [max(1, int(width * s)) for s in sizes]


@MODELS.register("adds_vgg", "ADDS's VGG supernet (FEMNIST, Table 2): conv 64-128-256, FC 1024-1024; units sampleable")
def adds_vgg(
    input_shape: tuple, num_classes: int, width: float = 1.0, channels: Sequence[int] = (64, 128, 256),
    hidden: Sequence[int] = (1024, 1024), alpha_min: float = 0.05, alpha_max: float = 0.999, importance: str = "slim",
) -> nn.Module:
    """Table 2's VGG: three ``Conv3x3-BN-ReLU-MaxPool2`` stages and two hidden FC layers,
    each scaled by ``width`` (``int(width c)``); ``channels = []`` gives an MLP supernet.
    ``importance``: "slim" (|BN gamma|, mean activations) or "lrp" (z+ relevance)."""
    if not 0 < width <= 4:
        raise ValueError(f"width must lie in (0, 4], got {width}")
    _check_range(alpha_min, alpha_max)
    return SampledNet(input_shape, num_outputs(num_classes), _scaled(channels, width), _scaled(hidden, width),
                      (alpha_min, alpha_max), importance)


class SampledCharLSTM(Supernet):
    """Next-character supernet (§4.1.3: sampling only on non-recurrent layers): embedding ->
    LSTM -> mask -> LSTM -> last step -> mask -> Linear -> ReLU -> mask -> head. A masked
    unit of the first LSTM is cut from the second LSTM's input only; both recurrences run
    whole, so the recurrent weights are always full. Units: the first LSTM's outputs, the
    second's, the hidden FC neurons; importance: mean ``|h|`` (over rows and steps) and mean
    activation."""

    def __init__(self, vocab: int, embed_dim: int, hidden: int, fc: int, alpha_range: tuple[float, float]) -> None:
        super().__init__(3, alpha_range)
        self.embed = nn.Embedding(vocab, embed_dim)
        self.lstm1 = nn.LSTM(embed_dim, hidden, batch_first=True)
        self.lstm2 = nn.LSTM(hidden, hidden, batch_first=True)
        self.fc = nn.Linear(hidden, fc)
        self.head = nn.Linear(fc, vocab)
        self.unit_counts = [hidden, hidden, fc]

    def unit_axes(self) -> UnitAxes:
        """The sampled axes: the second LSTM's input, the FC layer's rows and columns, the head's inputs."""
        return {
            "lstm2.weight_ih_l0": [(1, 0, 1)],
            "fc.weight": [(0, 2, 1), (1, 1, 1)],
            "fc.bias": [(0, 2, 1)],
            "head.weight": [(1, 2, 1)],
        }

    def _lstm(self, lstm: nn.LSTM, x: torch.Tensor, detach: bool) -> torch.Tensor:
        if not detach:
            return lstm(x)[0]
        return functional_call(lstm, {k: v.detach() for k, v in lstm.named_parameters()}, (x,))[0]

    def run(self, x: torch.Tensor, mask_fn: MaskFn, detach: bool = False) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """Embedding, two LSTMs and the FC layer, each masked by
        ``mask_fn``; importances mean ``|h|`` and mean activation."""
        p = _detached if detach else _same
        h1 = self._lstm(self.lstm1, F.embedding(x, p(self.embed.weight)), detach)
        b1 = us.normalised(h1.detach().abs().mean((0, 1)))
        m1 = mask_fn(0, b1)
        h2 = self._lstm(self.lstm2, h1 if m1 is None else h1 * m1[:, None, :], detach)[:, -1]
        b2 = us.normalised(h2.detach().abs().mean(0))
        h2 = _masked(h2, mask_fn(1, b2))
        z = F.relu(F.linear(h2, p(self.fc.weight), p(self.fc.bias)))
        b3 = us.normalised(z.detach().mean(0))
        z = _masked(z, mask_fn(2, b3))
        return F.linear(z, p(self.head.weight), p(self.head.bias)), [b1, b2, b3]

    def macs(self, counts: Sequence[int] | None = None, seq_len: int = 80) -> int:
        """Multiply-accumulates per example of ``seq_len`` characters: both LSTMs' gate
        products at every step (the second's input narrowed to the kept units), the FC layer
        and the head."""
        k1, k2, k3 = self.unit_counts if counts is None else counts
        e, h = self.embed.embedding_dim, self.lstm1.hidden_size
        recurrent = seq_len * (4 * h * (e + h) + 4 * h * (k1 + h))
        return recurrent + k2 * k3 + k3 * self.head.out_features


@MODELS.register("adds_char_lstm", "ADDS's next-character supernet: 2 LSTMs + FC, non-recurrent units sampleable")
def adds_char_lstm(
    input_shape: tuple, num_classes: int, embed_dim: int = 8, hidden: int = 256, fc: int = 256,
    alpha_min: float = 0.05, alpha_max: float = 0.999,
) -> nn.Module:
    """Predicts the character after an int64 ``(N, seq_len)`` window (vocabulary
    ``num_classes``); the paper's text model is a 2-layer LSTM of 256 (its FC sizes are not
    given: ``fc`` is ours)."""
    if len(input_shape) != 1 or num_classes < 1:
        raise ValueError(f"adds_char_lstm needs (seq_len,) character ids and a vocabulary, got {input_shape}, {num_classes}")
    for option, value in (("embed_dim", embed_dim), ("hidden", hidden), ("fc", fc)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{option} must be an int >= 1, got {value!r}")
    _check_range(alpha_min, alpha_max)
    return SampledCharLSTM(num_classes, embed_dim, hidden, fc, (alpha_min, alpha_max))
