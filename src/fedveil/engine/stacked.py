"""One forward pass for K copies of a model with different parameters (DESIGN idea 4).

The model is traced once with ``torch.fx``; the traced graph is then run with
*stacked* parameters (``{name: (K, *shape)}``) on a *merged* batch (``(K * B, ...)``,
client-major: rows ``k*B .. k*B+B-1`` belong to client ``k``). Parameter-free
operations (activations, pooling, flatten, views on the batch dimension) run as they
are on the merged batch; every layer with parameters is replaced by a batched kernel:

* ``Linear``: one ``baddbmm`` over the K clients;
* ``Conv2d``: one grouped convolution (the K clients' channels side by side,
  ``groups = K * groups``) or one convolution per client, whichever was faster when
  first timed for the layer's shapes (:func:`conv_mode`);
* ``GroupNorm`` / ``LayerNorm``: the normalisation on the merged batch, then the
  per-client affine transform;
* ``Embedding``: one lookup in the K tables laid end to end;
* ``BatchNorm1d`` / ``BatchNorm2d`` (training mode): each client's batch statistics over
  its real rows only (padding rows excluded), its own running statistics updated in the
  stacked buffers ``(K, *shape)``, then its own affine transform.

A model with any other parametric layer (or a layer with buffers other than BatchNorm), or one that reads its parameters outside
its modules, raises :class:`UnsupportedModelError`; callers fall back to training
those clients one by one.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import fx, nn

from ..models.layers import GradientReversal, reverse_gradient
from ..params import Params
from .reused import ReusedBuffers

Stacked = dict[str, torch.Tensor]  # parameter name -> (K, *shape)


class UnsupportedModelError(ValueError):
    """The model cannot be run stacked; the message says which layer and why."""


def _linear(m: nn.Linear, p: Stacked, x: torch.Tensor, k: int) -> torch.Tensor:
    rows = x.reshape(k, -1, m.in_features)
    w = p["weight"].transpose(1, 2)
    out = torch.baddbmm(p["bias"].unsqueeze(1), rows, w) if "bias" in p else torch.bmm(rows, w)
    return out.reshape(*x.shape[:-1], m.out_features), x


def clients_side_by_side(t: torch.Tensor, k: int) -> torch.Tensor:
    """The merged rows ``(K * B, C, ...)`` of K clients as ``(B, K * C, ...)``: client ``c``'s
    channels at ``[c C, (c + 1) C)``, the layout of a convolution with the clients as groups."""
    b = t.shape[0] // k
    return t.reshape(k, b, *t.shape[1:]).transpose(0, 1).reshape(b, k * t.shape[1], *t.shape[2:])


def _conv_grouped(m: nn.Conv2d, weight: torch.Tensor, bias, x: torch.Tensor, k: int) -> torch.Tensor:
    """The K clients' channels side by side, one convolution with ``groups = K * groups``."""
    b = x.shape[0] // k
    out = F.conv2d(
        clients_side_by_side(x, k), weight.reshape(k * m.out_channels, *weight.shape[2:]),
        None if bias is None else bias.reshape(-1), m.stride, m.padding, m.dilation, k * m.groups,
    )
    merged = out.reshape(b, k, m.out_channels, *out.shape[2:]).transpose(0, 1)
    return merged.reshape(k * b, m.out_channels, *out.shape[2:])


def _conv_per_client(m: nn.Conv2d, weight: torch.Tensor, bias, x: torch.Tensor, k: int) -> torch.Tensor:
    """One convolution per client on its contiguous rows (no layout change)."""
    # unbind, not indexing: its backward stacks the K gradients once instead of
    # scattering each into a zero tensor of the full stack
    rows, weights = x.reshape(k, -1, *x.shape[1:]).unbind(0), weight.unbind(0)
    biases = [None] * k if bias is None else bias.unbind(0)
    outs = [F.conv2d(r, w, b, m.stride, m.padding, m.dilation, m.groups) for r, w, b in zip(rows, weights, biases)]
    return torch.cat(outs)


CONV_MODES = {"grouped": _conv_grouped, "per_client": _conv_per_client}
PER_CLIENT_MARGIN = 1.25
_conv_choice: dict[tuple, str] = {}


def _time_conv(mode: str, m: nn.Conv2d, x_shape: tuple, k: int, repeats: int = 2) -> float:
    """Seconds for forward + backward of one mode on random data of the real shapes."""
    gen = torch.Generator().manual_seed(0)  # never the global RNG: runs stay reproducible
    x = torch.randn(x_shape, generator=gen).requires_grad_(True)
    weight = torch.randn((k, *m.weight.shape), generator=gen).requires_grad_(True)
    bias = None if m.bias is None else torch.randn((k, m.out_channels), generator=gen).requires_grad_(True)
    best = float("inf")
    for _ in range(repeats + 1):
        start = time.perf_counter()
        with torch.enable_grad():
            CONV_MODES[mode](m, weight, bias, x, k).sum().backward()
        best = min(best, time.perf_counter() - start)
    return best


def conv_mode(m: nn.Conv2d, x_shape: tuple, k: int, device: torch.device = torch.device("cpu")) -> str:
    """The faster of grouped / per-client convolution for these shapes, timed once (cached;
    batch sizes share a timing within a power of two, so Poisson batches are not re-timed).

    On CPU neither wins everywhere: grouped convolution is faster for LeNet-sized layers,
    per-client convolutions for ResNet's narrow 3x3 layers on 32x32 inputs. On a GPU one
    grouped convolution is taken without timing (one kernel launch instead of K).
    """
    if device.type != "cpu":
        return "grouped"
    rows_bucket = (x_shape[0] // max(k, 1)).bit_length()  # Poisson batches vary: time once per power of two
    key = (m.in_channels, m.out_channels, m.kernel_size, m.stride, m.padding, m.dilation, m.groups,
           m.bias is not None, tuple(x_shape[1:]), rows_bucket, k)
    if key not in _conv_choice:
        if k == 1:
            _conv_choice[key] = "per_client"
        else:  # per-client only on a clear win: close timings flip with machine noise
            grouped, per_client = (_time_conv(mode, m, x_shape, k) for mode in ("grouped", "per_client"))
            _conv_choice[key] = "per_client" if per_client * PER_CLIENT_MARGIN < grouped else "grouped"
    return _conv_choice[key]


def _conv2d(m: nn.Conv2d, p: Stacked, x: torch.Tensor, k: int) -> torch.Tensor:
    if m.padding_mode != "zeros":
        raise UnsupportedModelError(f"Conv2d with padding_mode={m.padding_mode!r}")
    mode = conv_mode(m, tuple(x.shape), k, x.device)
    return CONV_MODES[mode](m, p["weight"], p.get("bias"), x, k), x


def _group_norm(m: nn.GroupNorm, p: Stacked, x: torch.Tensor, k: int) -> torch.Tensor:
    """Per client, so the affine transform stays fused in the kernel (saved: the input)."""
    rows = x.reshape(k, -1, *x.shape[1:]).unbind(0)
    outs = [
        F.group_norm(r, m.num_groups, w, b, m.eps) for r, w, b in zip(rows, p["weight"].unbind(0), p["bias"].unbind(0))
    ]
    return torch.cat(outs), x


def _layer_norm(m: nn.LayerNorm, p: Stacked, x: torch.Tensor, k: int) -> torch.Tensor:
    normed = F.layer_norm(x, m.normalized_shape, None, None, m.eps)
    shape = tuple(m.normalized_shape)
    rows = normed.reshape(k, -1, *shape) * p["weight"].unsqueeze(1)
    if "bias" in p:
        rows = rows + p["bias"].unsqueeze(1)
    return rows.reshape(x.shape), normed


def _embedding(m: nn.Embedding, p: Stacked, x: torch.Tensor, k: int) -> torch.Tensor:
    if m.padding_idx is not None or m.max_norm is not None:
        raise UnsupportedModelError("Embedding with padding_idx or max_norm")
    offsets = torch.arange(k, device=x.device).reshape(k, *([1] * x.dim())) * m.num_embeddings
    flat = (x.reshape(k, -1, *x.shape[1:]) + offsets).reshape(x.shape)
    return F.embedding(flat, p["weight"].reshape(k * m.num_embeddings, m.embedding_dim)), flat


def _batch_norm(m: nn.modules.batchnorm._BatchNorm, p: Stacked, buffers: Stacked, x: torch.Tensor, k: int,
                rows: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Training-mode BatchNorm per client (``rows (K, B)``: 1 for real rows, ``None``: all real).

    Statistics over each client's real rows and spatial positions; the output normalises
    with the biased variance, the running variance is updated with the unbiased one, as
    ``F.batch_norm`` does. Padding rows are normalised with their client's statistics."""
    b = x.shape[0] // k
    xs = x.reshape(k, b, x.shape[1], -1)  # (K, B, C, spatial)
    weight = torch.ones(k, b, 1, 1, dtype=x.dtype, device=x.device) if rows is None else rows.to(x.dtype).view(k, b, 1, 1)
    count = weight.sum((1, 3), keepdim=True) * xs.shape[3]  # (K, 1, 1, 1) values per channel
    if bool((count == 1).any()):  # as F.batch_norm: one value per channel has no variance
        raise ValueError("BatchNorm needs more than 1 value per channel when training; a client's batch has 1 row")
    mean = (xs * weight).sum((1, 3), keepdim=True) / count
    var = ((xs - mean).square() * weight).sum((1, 3), keepdim=True) / count
    out = (xs - mean) / torch.sqrt(var + m.eps)
    if "weight" in p:
        out = out * p["weight"].view(k, 1, -1, 1) + p["bias"].view(k, 1, -1, 1)
    if m.track_running_stats:
        with torch.no_grad():
            n = count.view(k, 1)
            tracked = buffers["num_batches_tracked"]
            tracked.add_(1)
            factor = (1.0 / tracked.to(x.dtype)).view(k, 1) if m.momentum is None else m.momentum
            unbiased = var.view(k, -1) * n / (n - 1).clamp(min=1)
            buffers["running_mean"].mul_(1 - factor).add_(factor * mean.view(k, -1))
            buffers["running_var"].mul_(1 - factor).add_(factor * unbiased)
    return out.reshape(x.shape), x


def _gradient_reversal(m: nn.Module, p: Stacked, buffers: Stacked, x: torch.Tensor, k: int,
                       rows: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """:class:`~fedveil.models.fade.GradientReversal` with each client's own ``lam``."""
    lam = buffers["lam"].to(x.dtype).repeat_interleave(x.shape[0] // k).view(-1, *([1] * (x.dim() - 1)))
    return reverse_gradient(x, lam), x


BUFFERED: dict[type, Callable[..., tuple[torch.Tensor, torch.Tensor]]] = {
    nn.BatchNorm1d: _batch_norm,
    nn.BatchNorm2d: _batch_norm,
    GradientReversal: _gradient_reversal,
}


# Each kernel returns (output, saved): what per-example gradients of the layer need
# (the input for Linear / Conv2d / GroupNorm, the normalised input for LayerNorm, the
# offset indices for Embedding). See fedveil.training.private_stacked.
BATCHED: dict[type, Callable[[Any, Stacked, torch.Tensor, int], tuple[torch.Tensor, torch.Tensor]]] = {
    nn.Linear: _linear,
    nn.Conv2d: _conv2d,
    nn.GroupNorm: _group_norm,
    nn.LayerNorm: _layer_norm,
    nn.Embedding: _embedding,
}


@dataclass
class LayerRecord:
    """One parametric layer's call in a recorded forward (for per-example gradients)."""

    name: str  # module path ("" for the root)
    module: nn.Module
    output: torch.Tensor  # merged (K * B, ...)
    saved: torch.Tensor  # see BATCHED

    def param_name(self, param: str) -> str:
        """The model-level name of this layer's parameter ``param`` (e.g. ``"fc1.weight"``)."""
        return f"{self.name}.{param}" if self.name else param


class _StackedInterpreter(fx.Interpreter):
    def __init__(self, graph_module: fx.GraphModule, stacked: Stacked, k: int, record: list | None,
                 buffers: Stacked | None, rows: torch.Tensor | None) -> None:
        super().__init__(graph_module)
        self.stacked, self.k, self.record, self.buffers, self.rows = stacked, k, record, buffers, rows

    def call_module(self, target: str, args, kwargs) -> Any:
        module = self.fetch_attr(target)
        own = dict(module.named_parameters(recurse=False))
        prefix = f"{target}." if target else ""
        params = {name: self.stacked[prefix + name] for name in own}
        if type(module) in BUFFERED:
            names = [name for name, _ in module.named_buffers(recurse=False)]
            if names and self.buffers is None:
                raise ValueError(f"layer '{target}' keeps running statistics: pass the stacked buffers")
            buffers = {name: self.buffers[prefix + name] for name in names}
            out, saved = BUFFERED[type(module)](module, params, buffers, *args, self.k, self.rows, **kwargs)
        elif not own:
            return super().call_module(target, args, kwargs)
        else:
            out, saved = BATCHED[type(module)](module, params, *args, self.k, **kwargs)
        if self.record is not None and own:
            self.record.append(LayerRecord(target, module, out, saved))
        return out


class StackedModel:
    """Runs ``model``'s forward with K parameter sets at once (see module doc)."""

    def __init__(self, model: nn.Module) -> None:
        self.names = [n for n, _ in model.named_parameters()]
        owners: dict[int, str] = {}
        for name, param in model.named_parameters(remove_duplicate=False):
            if id(param) in owners:
                raise UnsupportedModelError(
                    f"parameter '{name}' is the same tensor as '{owners[id(param)]}' (tied weights); "
                    "stacked kernels keep one copy per layer"
                )
            owners[id(param)] = name
        kernels = (*BATCHED, *BUFFERED)
        for name, module in model.named_modules():
            stateful = any(True for _ in module.parameters(recurse=False)) or any(True for _ in module.buffers(recurse=False))
            if stateful and type(module) not in kernels:
                raise UnsupportedModelError(
                    f"layer '{name}' ({type(module).__name__}) has no stacked kernel "
                    f"(supported: {', '.join(t.__name__ for t in kernels)})"
                )
        leaves = kernels
        try:
            graph_module = fx.GraphModule(model, _Tracer(leaves).trace(model))
        except Exception as err:  # noqa: BLE001 - any tracing failure means "cannot stack"
            raise UnsupportedModelError(f"the model cannot be traced by torch.fx: {err}") from None
        for node in graph_module.graph.nodes:
            if node.op == "get_attr" and node.target in dict(model.named_parameters()):
                raise UnsupportedModelError(f"the model reads parameter '{node.target}' outside its layer")
        self.graph_module = graph_module
        self.reused = ReusedBuffers()  # the stacked parameters and batches of its computations, kept between rounds

    def __call__(self, stacked: Stacked, x: torch.Tensor, k: int, record: list | None = None,
                 buffers: Stacked | None = None, rows: torch.Tensor | None = None) -> torch.Tensor:
        """Outputs ``(K * B, ...)`` for the merged batch ``x`` of ``K * B`` rows (training mode);
        with ``record`` (a list), appends a :class:`LayerRecord` per parametric layer call.
        ``buffers`` (``{name: (K, *shape)}``) are the clients' BatchNorm statistics, updated in
        place; ``rows (K, B)`` marks the real (non-padding) rows BatchNorm may average over."""
        return _StackedInterpreter(self.graph_module, stacked, k, record, buffers, rows).run(x)


class _Tracer(fx.Tracer):
    def __init__(self, leaves: tuple[type, ...]) -> None:
        super().__init__()
        self.leaves = leaves

    def is_leaf_module(self, m: nn.Module, qualname: str) -> bool:
        return isinstance(m, self.leaves) or super().is_leaf_module(m, qualname)


def stack_params(param_sets: list[Params], names: list[str]) -> Stacked:
    """``{name: (K, *shape)}``: the entries ``names`` of the K parameter sets stacked along a new leading axis."""
    return {n: torch.stack([p[n] for p in param_sets]) for n in names}


__all__ = [
    "StackedModel", "UnsupportedModelError", "LayerRecord", "stack_params", "clients_side_by_side", "BATCHED", "BUFFERED",
]
