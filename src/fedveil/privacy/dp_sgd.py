"""Example-level DP-SGD: per-example gradients, clipping, Gaussian noise, batch samplers.

One private step (spec 002 §1.2, [C1] ``privatize_grad_hk``)::

    g_i = grad L_i(w)                              # full per-example objective, regulariser included
    ĝ_i = g_i * min(1, C / (||g_i||_2 + 1e-15))    # global L2 norm over all parameter tensors
    g̃   = (sum_i ĝ_i + C * z * N(0, I)) / denominator

``denominator`` is the fixed batch size for shuffled batches and the *expected* batch size
``q * n`` for Poisson batches (so an empty Poisson batch releases noise / (q n)).
Per-example gradients come from ``torch.func.vmap`` over ``grad`` (no loop over examples),
except for recurrent models (see :func:`per_example_grads`); for a plain stack of
``nn.Linear`` layers and elementwise activations, :func:`private_gradient` computes the
norms and the clipped sum in closed form instead (:func:`linear_stack_grads`).
Models must not mix examples within a batch: call :func:`check_model_for_dp` once per model.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Iterator

import torch
from torch import nn
from torch.func import functional_call, grad_and_value, vmap
from torch.utils._pytree import tree_map

from ..params import Params
from . import checks
from .randomness import NoiseSource, RandomSource, permutation, standard_normal, uniform

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
ExtraGrad = Callable[[Params], Params]

CLIP_EPS = 1e-15  # spec 002 §1.2: min(1, C / (||g|| + 1e-15))


def check_model_for_dp(model: nn.Module) -> None:
    """Raise ``ValueError`` naming the first layer that couples the examples of a batch.

    BatchNorm (any variant, SyncBatchNorm included) normalises with batch statistics, and
    InstanceNorm with ``track_running_stats`` accumulates running statistics over the batch:
    either way one example's influence is no longer bounded by its clipped gradient.
    GroupNorm, LayerNorm and InstanceNorm without running statistics act per example.
    """
    for name, module in model.named_modules():
        if isinstance(module, nn.modules.batchnorm._BatchNorm):
            why = "normalises with statistics of the whole batch"
        elif isinstance(module, nn.modules.instancenorm._InstanceNorm) and module.track_running_stats:
            why = "accumulates running statistics over the batch (track_running_stats=True)"
        else:
            continue
        raise ValueError(
            f"layer '{name or '<root>'}' ({type(module).__name__}) {why}, which breaks per-example "
            "DP-SGD; use GroupNorm or LayerNorm instead (zoo models: e.g. resnet norm='group'; your module: "
            "fedveil.models.batchnorm_to_groupnorm(model) converts it)"
        )


def per_example_grads(
    model: nn.Module,
    params: Params,
    x: torch.Tensor,
    y: torch.Tensor,
    loss_fn: LossFn,
    extra_grad: ExtraGrad | None = None,
    buffers: Params | None = None,
) -> tuple[Params, torch.Tensor]:
    """Per-example gradients ``{name: (B, *shape)}`` and per-example losses ``(B,)``.

    ``loss_fn(out, y)`` is the batch-mean loss of the local trainer, applied to one example
    at a time; ``y`` may be any structure of per-row tensors with an ``unsqueeze`` method
    (a tensor, or a training :class:`~fedveil.training.request.Batch` with group labels). ``extra_grad(params)`` is the gradient of an example-independent term of the
    per-example objective (e.g. MR-MTL's ``λ(w - w̄)`` of ``λ/2 ||w - w̄||²``), a dict over
    some or all parameter names; it is added to every per-example gradient, so it is clipped together with the data gradient
    (spec 002 §1.2 note). ``buffers`` (default: the model's own) are read, never updated
    (DP-SGD refuses layers that update them from the batch). ``B`` must be > 0.
    Models with ``nn.RNNBase`` layers (char_lstm) loop over the examples with autograd.
    """
    if len(x) == 0:
        raise ValueError("per_example_grads needs at least one example")
    params = {k: v.detach() for k, v in params.items()}
    buffers = dict(model.named_buffers()) if buffers is None else buffers

    def example_loss(p: Params, xi: torch.Tensor, yi: torch.Tensor) -> torch.Tensor:
        out = functional_call(model, (p, buffers), (xi.unsqueeze(0),))
        return loss_fn(out, yi.unsqueeze(0))

    if any(isinstance(m, nn.RNNBase) for m in model.modules()):
        # torch.func runs aten::lstm/gru/rnn through a slow fallback (measured 5-40x slower than
        # plain autograd on CPU, torch 2.13), so recurrent models loop over the examples.
        each = [_autograd_grad_and_value(example_loss, params, x[i], tree_map(lambda t: t[i], y)) for i in range(len(x))]
        grads = {k: torch.stack([g[k] for g, _ in each]) for k in params}
        losses = torch.stack([loss for _, loss in each])
    else:
        grads, losses = vmap(grad_and_value(example_loss), in_dims=(None, 0, 0))(params, x, y)
    if extra_grad is not None:
        # out of place: vmap returns unused parameters' zero gradients as stride-0 expansions
        extra = extra_grad(params)
        grads = {k: g + extra[k].detach() if k in extra else g for k, g in grads.items()}
    return grads, losses.detach()


def _autograd_grad_and_value(
    loss: Callable[[Params, torch.Tensor, torch.Tensor], torch.Tensor],
    params: Params,
    xi: torch.Tensor,
    yi: torch.Tensor,
) -> tuple[Params, torch.Tensor]:
    leaves = {k: v.detach().requires_grad_(True) for k, v in params.items()}
    with torch.enable_grad():
        value = loss(leaves, xi, yi)
    return dict(zip(leaves, torch.autograd.grad(value, list(leaves.values())))), value.detach()


def clip_factors(grads: Params, clip: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-example scale ``min(1, C / (norm + 1e-15))`` and global L2 ``norm``, both ``(B,)``.

    The norm is taken over all tensors together: per-tensor row norms, then their norm
    (no concatenation of the flattened gradients).
    """
    rows = [torch.linalg.vector_norm(g.flatten(1), dim=1) for g in grads.values()]
    norms = torch.linalg.vector_norm(torch.stack(rows), dim=0)
    return _scale(norms, clip), norms


def _scale(norms: torch.Tensor, clip: float) -> torch.Tensor:
    """``min(1, C / (norm + 1e-15))`` per example."""
    checks.positive("clip", clip)
    return (clip / (norms + CLIP_EPS)).clamp(max=1.0)


# Parameter-free layers that act on each feature of each row alone: what a linear stack may
# hold between its nn.Linear layers (not in place: the closed form keeps every layer's output).
ELEMENTWISE = (nn.ReLU, nn.LeakyReLU, nn.ELU, nn.GELU, nn.SiLU, nn.Sigmoid, nn.Tanh, nn.Softplus, nn.Identity)


def flattens_rows(module: nn.Module) -> bool:
    """Whether ``module`` is an ``nn.Flatten`` of everything but the batch axis (each row alone)."""
    return type(module) is nn.Flatten and module.start_dim == 1 and module.end_dim == -1


def linear_stack(model: nn.Module, params: Params) -> list[tuple[str, nn.Module]] | None:
    """The layers of ``model`` if it is a plain ``nn.Sequential`` of ``nn.Linear`` layers and
    :data:`ELEMENTWISE` activations (not in place), optionally after a leading row-wise
    ``nn.Flatten`` (the model zoo's ``mlp`` and ``linear``), whose parameters are exactly
    ``params``, else None."""
    if type(model) is not nn.Sequential:  # a subclass may change the forward
        return None
    layers = list(model.named_children())
    body = layers[1:] if layers and flattens_rows(layers[0][1]) else layers
    if not all(type(m) is nn.Linear or (type(m) in ELEMENTWISE and not getattr(m, "inplace", False)) for _, m in body):
        return None
    if not layers or set(params) != {name for name, _ in model.named_parameters()}:
        return None
    return layers


def closed_form_layers(
    model: nn.Module, params: Params, x: torch.Tensor, extra_grad: ExtraGrad | None
) -> list[tuple[str, nn.Module]] | None:
    """The :func:`linear_stack` layers when :func:`private_gradient` clips rows ``x`` in
    closed form (no ``extra_grad``; ``(B, features)`` rows or a leading ``nn.Flatten``), else None."""
    layers = linear_stack(model, params) if extra_grad is None else None
    if layers is not None and x.dim() != 2 and not flattens_rows(layers[0][1]):
        return None  # a Linear on (B, T, features) rows shares its weight across positions
    return layers


@dataclass(frozen=True)
class LinearStackGrads:
    """Per-example gradients of a linear stack, factored: for the layer ``z = W a + b`` named
    ``l``, example n's gradients are ``dW_n = delta_n a_n^T`` and ``db_n = delta_n`` with
    ``a = inputs[l]`` and ``delta = deltas[l] = dL_n/dz_n``, both ``(B, features)``."""

    inputs: dict[str, torch.Tensor]
    deltas: dict[str, torch.Tensor]
    biased: dict[str, bool]

    def norms(self) -> torch.Tensor:
        """Global L2 norms ``(B,)``: ``||g_n||^2 = sum_l |delta_ln|^2 (|a_ln|^2 + [l has a bias])``."""
        sq = [
            self.deltas[l].square().sum(1) * (self.inputs[l].square().sum(1) + float(self.biased[l]))
            for l in self.inputs
        ]
        return torch.stack(sq).sum(0).sqrt()

    def weighted_sum(self, factors: torch.Tensor) -> Params:
        """``sum_n f_n g_n`` by layer: ``(f delta)^T a`` and ``sum_n f_n delta_n``."""
        out = {}
        for l, a in self.inputs.items():
            fd = factors[:, None] * self.deltas[l]
            out[f"{l}.weight"] = fd.T @ a
            if self.biased[l]:
                out[f"{l}.bias"] = fd.sum(0)
        return out


def linear_stack_grads(
    layers: list[tuple[str, nn.Module]], params: Params, x: torch.Tensor, y: torch.Tensor, loss_fn: LossFn
) -> tuple[LinearStackGrads, torch.Tensor]:
    """Factored per-example gradients (:class:`LinearStackGrads`) and per-example losses ``(B,)``
    of a :func:`linear_stack` on rows ``x`` (``(B, features)``, or any shape after a leading
    ``nn.Flatten``). No layer mixes rows, so one
    backward pass of the summed per-example losses gives every ``delta_n = dL_n/dz_n``."""
    a, inputs, outputs = x.detach(), {}, {}
    with torch.enable_grad():
        for name, module in layers:
            if type(module) is nn.Linear:
                inputs[name] = a.detach()
                bias = params.get(f"{name}.bias")
                z = nn.functional.linear(a, params[f"{name}.weight"].detach(), None if bias is None else bias.detach())
                a = outputs[name] = z if z.requires_grad else z.requires_grad_()  # the first layer's z is a leaf
            else:
                a = module(a)
        losses = vmap(lambda out, yi: loss_fn(out.unsqueeze(0), yi.unsqueeze(0)))(a, y)
        deltas = torch.autograd.grad(losses.sum(), list(outputs.values()))
    biased = {name: f"{name}.bias" in params for name in inputs}
    return LinearStackGrads(inputs, dict(zip(outputs, deltas)), biased), losses.detach()


def clip_per_example(grads: Params, clip: float) -> tuple[Params, torch.Tensor]:
    """Per-example gradients scaled to global L2 norm <= ``clip``, and the norms before clipping."""
    factors, norms = clip_factors(grads, clip)
    return {k: g * factors.view(-1, *([1] * (g.dim() - 1))) for k, g in grads.items()}, norms


def add_gaussian_noise(summed: Params, clip: float, noise_multiplier: float, generator: RandomSource) -> Params:
    """``summed + C * z * N(0, I)``, drawn from ``generator`` (a seeded torch generator or
    :data:`~fedveil.privacy.randomness.SECURE`) tensor by tensor in key order."""
    checks.positive("clip", clip)
    checks.positive("noise_multiplier", noise_multiplier, allow_zero=True)
    std = clip * noise_multiplier
    return {k: v + std * standard_normal(v.shape, generator, v.dtype, device=v.device) for k, v in summed.items()}


@dataclass(frozen=True)
class PrivateGradient:
    """One DP-SGD step's gradient: the clipped per-example gradients summed, noised and divided."""

    grad: Params  # (sum of clipped per-example gradients + noise) / denominator
    loss_sum: float  # non-private, for logging only
    size: int  # examples in the batch (0 for an empty Poisson batch)

    @property
    def loss(self) -> float:
        """Mean batch loss (non-private, logging only); NaN for an empty batch."""
        return self.loss_sum / self.size if self.size else float("nan")


def private_gradient(
    model: nn.Module,
    params: Params,
    x: torch.Tensor,
    y: torch.Tensor,
    loss_fn: LossFn,
    *,
    clip: float,
    noise_multiplier: float,
    denominator: float,
    generator: RandomSource,
    extra_grad: ExtraGrad | None = None,
    private_rows: int | None = None,
    buffers: Params | None = None,
) -> PrivateGradient:
    """One privatised gradient (spec 002 §1.2): clip, sum, add ``C z N(0, I)``, divide.

    ``denominator``: the fixed batch size for :func:`shuffled_batches`, ``q * n`` for
    :func:`poisson_batches` (plus the public rows of a mixed batch). An empty batch gives
    ``noise / denominator``. With ``private_rows``, only the first ``private_rows`` rows
    are private and clipped; the others are public and enter the sum unclipped (their
    influence needs no bound), so the noise still covers exactly the private rows.
    A :func:`linear_stack` on ``(B, features)`` rows (or rows of any shape that it flattens
    first) without ``extra_grad`` gets the same gradient in closed form
    (:class:`LinearStackGrads`), without per-example gradients.
    """
    checks.positive("denominator", denominator)
    layers = closed_form_layers(model, params, x, extra_grad)
    if len(x) == 0:
        summed = {k: torch.zeros_like(v) for k, v in params.items()}
        loss_sum = 0.0
    elif layers is not None:  # closed form, no per-example gradient formed
        factored, losses = linear_stack_grads(layers, params, x, y, loss_fn)
        factors = _scale(factored.norms(), clip)
        if private_rows is not None:
            factors[private_rows:] = 1.0
        sums = factored.weighted_sum(factors)
        summed = {k: sums[k] for k in params}  # parameter order: the noise is drawn in it
        loss_sum = float(losses.sum())
    else:
        grads, losses = per_example_grads(model, params, x, y, loss_fn, extra_grad, buffers)
        factors, _ = clip_factors(grads, clip)
        if private_rows is not None:
            factors[private_rows:] = 1.0
        summed = {k: torch.tensordot(factors, g, dims=1) for k, g in grads.items()}
        loss_sum = float(losses.sum())
    noisy = add_gaussian_noise(summed, clip, noise_multiplier, generator)
    return PrivateGradient({k: v / denominator for k, v in noisy.items()}, loss_sum, len(x))


def poisson_batches(
    n: int, sample_rate: float, steps: int, generator: RandomSource, device: torch.device | str | None = None
) -> Iterator[torch.Tensor]:
    """``steps`` batches of row indices, each row included independently with probability
    ``sample_rate`` (the sampled Gaussian mechanism's sampling); batches may be empty.
    Drawn where ``generator`` lives, the indices are moved to ``device`` (that of the rows)."""
    _check_steps(n, steps)
    checks.fraction("sample_rate", sample_rate, one=True)
    for _ in range(steps):
        rows = torch.nonzero(uniform(n, generator) < sample_rate).flatten()
        yield rows if device is None else rows.to(device)


def shuffled_batches(
    n: int, batch_size: int, steps: int, generator: RandomSource, device: torch.device | str | None = None
) -> Iterator[torch.Tensor]:
    """``steps`` batches of exactly ``batch_size`` row indices: shuffle every epoch, take
    consecutive batches and drop the last partial one ([C1] ``epoch_generator``, spec 002
    §1.2), so an epoch has ``n // batch_size`` steps and the denominator is always ``batch_size``.
    Pass ``batch_size = min(B, n)`` for the spec's ``B_k``. Drawn where ``generator`` lives,
    each permutation is moved to ``device`` (that of the rows) once per epoch."""
    _check_steps(n, steps)
    if not 0 < batch_size <= n:
        raise ValueError(f"batch_size must be in [1, n={n}], got {batch_size}; use min(batch_size, n)")
    remaining = steps
    while remaining > 0:
        order = permutation(n, generator, device)
        for start in range(0, n - batch_size + 1, batch_size):
            yield order[start : start + batch_size]
            remaining -= 1
            if remaining == 0:
                return


def _check_steps(n: int, steps: int) -> None:
    if n <= 0:
        raise ValueError(f"cannot sample batches from {n} rows")
    checks.integer("steps", steps)


@dataclass
class ExampleDP:
    """One client's DP-SGD settings for a round of local training (spec 002 §1.2).

    ``batch_size`` is ``B_k = min(B, n_k)``: the expected batch size of Poisson batches
    (rate ``B_k / n_k``) or the fixed size of shuffled batches, and the denominator of
    the privatised gradient either way. Every ``train`` call opens a training
    (:meth:`begin_training`) and counts its steps in it; once ``client_update`` returns,
    the executor copies :attr:`trainings` into ``ClientResult.dp_trainings`` and the runtime
    records each training as its own release (a shuffled training draws its own permutations).
    ``noise``: the run's :class:`~fedveil.privacy.randomness.NoiseSource`, which gives the
    batches' and the noise's stream (the client's seeded generator, the secure source, or
    zero noise).
    """

    clip: float
    noise_multiplier: float
    sampling: str  # "poisson" | "shuffle"
    batch_size: int
    noise: NoiseSource = field(default_factory=NoiseSource)
    trainings: list[int] = field(default_factory=list)  # steps taken by each train call, in order

    @property
    def steps_taken(self) -> int:
        """DP-SGD steps over all local trainings so far (what the ledger accounts)."""
        return sum(self.trainings)

    def begin_training(self) -> None:
        """Start counting a new local training's steps (each is recorded as its own release)."""
        self.trainings.append(0)

    def count_step(self) -> None:
        """Count one noisy step of the current local training."""
        self.trainings[-1] += 1

    def source(self, generator: torch.Generator) -> RandomSource:
        """Where this client's private batches and noise come from."""
        return self.noise.stream("dp-sgd", generator)

    def batches(
        self, num_rows: int, steps: int, generator: torch.Generator, device: torch.device | str | None = None
    ) -> Iterator[torch.Tensor]:
        """Row indices of each private step, on ``device`` (that of the rows; default the CPU)."""
        source = self.source(generator)
        if self.sampling == "poisson":
            return poisson_batches(num_rows, self.batch_size / num_rows, steps, source, device)
        return shuffled_batches(num_rows, self.batch_size, steps, source, device)
