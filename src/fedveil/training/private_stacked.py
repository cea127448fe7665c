"""DP-SGD gradients for K clients at once, without materialising every per-example gradient.

Book-keeping (Bu et al. 2023, "Differentially private optimization on large models
at small cost"): one forward records each parametric layer's input ``a`` and one
backward gives the gradient ``g`` of the summed per-example losses with respect to
the layer's output. A layer's per-example gradient is a function of ``(a_i, g_i)``
only, so its squared norm is computed from them directly:

* Linear without a sequence dimension: ``||a_i||^2 ||g_i||^2`` (+ ``||g_i||^2`` bias);
  with one (``T`` positions): the ghost norm ``<a_i a_i^T, g_i g_i^T>`` (Li et al. 2022),
  or the materialised ``g_i^T a_i`` when that is smaller;
* Conv2d: the per-example gradients ``g_i^T a_i`` as one convolution whose groups are
  the examples (:mod:`fedveil.training.conv_grads`), or, when they cost fewer
  multiplications (many channels on few positions), the ghost norm on the unfolded input;
* GroupNorm / LayerNorm / Embedding: their small per-example gradients directly.

The clipped sum ``sum_i c_i g_i^T a_i`` is then one batched matmul per layer (no
second backward). A layer called several times in one forward (a reused block) has one
per-example gradient, the sum over its calls: its calls' inputs and output gradients are
joined along the position axis (Linear, Conv2d, Embedding: ``sum_c g_c^T a_c`` is the
product of the joined matrices) or their per-example gradients added (norm layers), so the
norm clipped is that of the summed gradient, never the root of the calls' summed squares
(which could let ``sqrt(2) C`` through). Noise is drawn per client, tensor by tensor in parameter order,
from the client's own generator, as :func:`fedveil.privacy.dp_sgd.add_gaussian_noise`
does, and the sum is divided by each client's denominator (spec 002 §1.2).
"""
from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ..engine.stacked import CONV_MODES, LayerRecord, StackedModel, UnsupportedModelError
from ..privacy.dp_sgd import CLIP_EPS, ExampleDP
from ..privacy.randomness import RandomSource, fill_standard_normal_
from .conv_grads import client_weight_grads, conv_padding, example_weight_grads

CHUNK = 256  # examples per slice when per-example quantities are materialised


def check_private_stacking(model: nn.Module) -> None:
    """Raise :class:`UnsupportedModelError` for a layer without a book-keeping rule."""
    for name, module in model.named_modules():
        if isinstance(module, nn.Conv2d) and module.groups != 1:
            raise UnsupportedModelError(f"layer '{name}': grouped Conv2d has no per-example norm rule here")
        if isinstance(module, nn.Conv2d):
            try:
                conv_padding(module)
            except UnsupportedModelError as err:
                raise UnsupportedModelError(f"layer '{name}': {err}") from None


@dataclass
class _Rule:
    """A layer's book-keeping for one step: its per-example squared norms ``sq (N,)``;
    ``add_clipped(c, k, targets, alpha)``, which adds ``alpha * sum_i c_i g_i`` per client
    (``(K, *shape)``) to ``targets[param]`` in place; and ``dots(term)``, the per-example
    ``<g_i, r_k>`` with client terms ``r``."""

    sq: torch.Tensor
    add_clipped: Callable[[torch.Tensor, int, dict[str, torch.Tensor], float], None]
    dots: Callable[[dict[str, torch.Tensor]], torch.Tensor]


def _adding(clipped_sums) -> Callable[[torch.Tensor, int, dict[str, torch.Tensor], float], None]:
    """``add_clipped`` from a function giving each parameter's clipped sums."""

    def add_clipped(c: torch.Tensor, k: int, targets: dict[str, torch.Tensor], alpha: float) -> None:
        for name, value in clipped_sums(c, k).items():
            targets[name].add_(value, alpha=alpha)

    return add_clipped


def _sequence(a: torch.Tensor, g: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(N, T, in)`` / ``(N, T, out)`` views of a Linear layer's input and output gradient."""
    n = a.shape[0]
    return a.reshape(n, -1, a.shape[-1]), g.reshape(n, -1, g.shape[-1])


MATERIALISE_LIMIT = 64 * 2**20  # floats of per-example gradients kept for the clipped sum


def _matrix_sq_norms(a: torch.Tensor, g: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``||g_i^T a_i||_F^2`` for ``a (N, T, p)``, ``g (N, T, q)``: ghost (two T x T Gram
    matrices) when ``T^2 <= p q``, else materialised ``g_i^T a_i``, which are also
    returned (``(N, q, p)``) when they fit :data:`MATERIALISE_LIMIT`, for the clipped sum."""
    n, t, p = a.shape
    q = g.shape[-1]
    if t == 1:
        return a.square().sum((1, 2)) * g.square().sum((1, 2)), None
    ghost = t * t <= p * q
    keep = not ghost and n * p * q <= MATERIALISE_LIMIT
    out = torch.empty(n, dtype=a.dtype, device=a.device)
    per_example = torch.empty(n, q, p, dtype=a.dtype, device=a.device) if keep else None
    for s in range(0, n, CHUNK):
        a_s, g_s = a[s : s + CHUNK], g[s : s + CHUNK]
        if ghost:
            out[s : s + CHUNK] = (torch.bmm(a_s, a_s.transpose(1, 2)) * torch.bmm(g_s, g_s.transpose(1, 2))).sum((1, 2))
        else:
            grads = torch.bmm(g_s.transpose(1, 2), a_s)
            out[s : s + CHUNK] = grads.square().sum((1, 2))
            if keep:
                per_example[s : s + CHUNK] = grads
    return out, per_example


def _clipped_matrix_sum(a, g, c: torch.Tensor, k: int, per_example: torch.Tensor | None) -> torch.Tensor:
    """``sum_{i in client} c_i g_i^T a_i`` per client: ``(K, q, p)``."""
    n, t, p = a.shape
    if per_example is not None:  # already materialised: a weighted sum over each client's examples
        return (per_example * c.view(n, 1, 1)).reshape(k, -1, *per_example.shape[1:]).sum(1)
    cg = (g * c.view(n, 1, 1)).reshape(k, -1, g.shape[-1])
    return torch.bmm(cg.transpose(1, 2), a.reshape(k, -1, p))


def _matrix_dots(a: torch.Tensor, g: torch.Tensor, r: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """``<g_i^T a_i, R_k> (+ <sum_t g_it, r_k>)`` per example, for ``a (N, T, p)``,
    ``g (N, T, q)`` and client terms ``R (K, q, p)``, ``bias (K, q)``: one bmm, nothing materialised."""
    n, t, p = a.shape
    k = r.shape[0]
    projected = torch.bmm(a.reshape(k, -1, p), r.transpose(1, 2)).reshape(n, t, -1)  # a_it R_k^T
    dots = (projected * g).sum((1, 2))
    if bias is not None:
        dots = dots + (g.sum(1) * bias.repeat_interleave(n // k, 0)).sum(1)
    return dots


def _joined(tensors: list[torch.Tensor]) -> torch.Tensor:
    """The calls' ``(N, T_c, d)`` tensors joined along positions (no copy for one call)."""
    return tensors[0] if len(tensors) == 1 else torch.cat(tensors, 1)


def _linear(m: nn.Linear, saved: list[torch.Tensor], grads: list[torch.Tensor]):
    pairs = [_sequence(a, g) for a, g in zip(saved, grads)]
    a, g = _joined([p[0] for p in pairs]), _joined([p[1] for p in pairs])
    sq, per_example = _matrix_sq_norms(a, g)
    has_bias = m.bias is not None
    if has_bias:
        sq = sq + g.sum(1).square().sum(1)

    def add_clipped(c: torch.Tensor, k: int, targets: dict[str, torch.Tensor], alpha: float) -> None:
        if per_example is None:  # the weight's clipped sum accumulated inside its bmm
            cg = (g * c.view(-1, 1, 1)).reshape(k, -1, g.shape[-1])
            targets["weight"].baddbmm_(cg.transpose(1, 2), a.reshape(k, -1, a.shape[-1]), alpha=alpha)
        else:
            targets["weight"].add_(_clipped_matrix_sum(a, g, c, k, per_example), alpha=alpha)
        if has_bias:
            targets["bias"].add_((g.sum(1) * c.view(-1, 1)).reshape(k, -1, g.shape[-1]).sum(1), alpha=alpha)

    def dots(term: dict[str, torch.Tensor]) -> torch.Tensor:
        return _matrix_dots(a, g, term["weight"], term.get("bias"))

    return _Rule(sq, add_clipped, dots)


def _conv2d(m: nn.Conv2d, saved: list[torch.Tensor], grads: list[torch.Tensor]):
    """Conv2d: ghost norms on the unfolded input when they cost fewer multiplications per
    example than the per-example gradients (``L (p + q) < p q`` for ``L`` positions,
    ``p = C_in k k``, ``q = C_out``: many channels on few positions), else the per-example
    gradients as convolutions (:mod:`fedveil.training.conv_grads`)."""
    q, p = m.out_channels, m.weight[0].numel()
    positions = sum(g[0].numel() for g in grads) // q
    if positions * (p + q) < p * q:
        return _conv2d_ghost(m, saved, grads)
    return _conv2d_direct(m, saved, grads)


def _conv2d_direct(m: nn.Conv2d, saved: list[torch.Tensor], grads: list[torch.Tensor]):
    """Per-example weight gradients summed over the calls, kept for the clipped sum and the
    dots when they fit :data:`MATERIALISE_LIMIT`, else formed chunk by chunk for the norms,
    the clipped sum then one convolution per call with the clients as groups (and the dots
    the client terms convolved with the inputs, dotted with the output gradients)."""
    n, q, p = grads[0].shape[0], m.out_channels, m.weight[0].numel()
    calls = list(zip(saved, grads))

    def per_example(rows: slice) -> torch.Tensor:
        return sum(example_weight_grads(m, x[rows], g[rows]) for x, g in calls)

    kept = per_example(slice(None)) if n * q * p <= MATERIALISE_LIMIT else None
    if kept is not None:
        sq = kept.square().sum((1, 2))
    else:
        sq = torch.cat([per_example(slice(s, s + CHUNK)).square().sum((1, 2)) for s in range(0, n, CHUNK)])
    bias_grads = sum(g.reshape(n, q, -1).sum(2) for g in grads) if m.bias is not None else None  # (N, q)
    if bias_grads is not None:
        sq = sq + bias_grads.square().sum(1)

    def clipped_sums(c: torch.Tensor, k: int) -> dict[str, torch.Tensor]:
        if kept is not None:  # (K, 1, B) x (K, B, q p): each client's weighted sum
            weight = torch.bmm(c.reshape(k, 1, n // k), kept.reshape(k, n // k, q * p))
        else:
            weight = sum(client_weight_grads(m, x, g * c.view(-1, 1, 1, 1), k) for x, g in calls)
        sums = {"weight": weight.reshape(k, *m.weight.shape)}
        if bias_grads is not None:
            sums["bias"] = (bias_grads * c.view(-1, 1)).reshape(k, -1, q).sum(1)
        return sums

    def dots(term: dict[str, torch.Tensor]) -> torch.Tensor:
        r = term["weight"]
        k = r.shape[0]
        if kept is not None:
            out = torch.bmm(kept.reshape(k, n // k, q * p), r.reshape(k, q * p, 1)).reshape(n)
        else:  # <g_i^T a_i, R_k> = <g_i, conv(x_i, R_k)>
            conv = CONV_MODES["per_client"]
            out = sum((conv(m, r, None, x, k) * g).reshape(n, -1).sum(1) for x, g in calls)
        if bias_grads is not None:
            out = out + (bias_grads.reshape(k, n // k, q) * term["bias"].reshape(k, 1, q)).sum(2).reshape(n)
        return out

    return _Rule(sq, _adding(clipped_sums), dots)


def _conv2d_ghost(m: nn.Conv2d, saved: list[torch.Tensor], grads: list[torch.Tensor]):
    """The calls' unfolded inputs and output gradients joined along positions, as a Linear's."""
    n = grads[0].shape[0]
    padding = conv_padding(m)
    # unfolded inputs (N, L, C_in k k) and output gradients (N, L, C_out) of every call
    a = _joined([F.unfold(x, m.kernel_size, m.dilation, padding, m.stride).transpose(1, 2) for x in saved])
    g = _joined([go.reshape(n, m.out_channels, -1).transpose(1, 2) for go in grads])
    sq, per_example = _matrix_sq_norms(a, g)
    has_bias = m.bias is not None
    if has_bias:
        sq = sq + g.sum(1).square().sum(1)

    def clipped_sums(c: torch.Tensor, k: int) -> dict[str, torch.Tensor]:
        sums = {"weight": _clipped_matrix_sum(a, g, c, k, per_example).reshape(k, *m.weight.shape)}
        if has_bias:
            sums["bias"] = (g.sum(1) * c.view(-1, 1)).reshape(k, -1, m.out_channels).sum(1)
        return sums

    def dots(term: dict[str, torch.Tensor]) -> torch.Tensor:
        weight = term["weight"]
        return _matrix_dots(a, g, weight.reshape(weight.shape[0], m.out_channels, -1), term.get("bias"))

    return _Rule(sq, _adding(clipped_sums), dots)


def _norm_call(m: nn.Module, saved: torch.Tensor, g: torch.Tensor) -> dict[str, torch.Tensor]:
    """One call's per-example affine gradients of a GroupNorm (channel dim 1) or LayerNorm
    (trailing normalized_shape)."""
    n = g.shape[0]
    if isinstance(m, nn.GroupNorm):  # saved is the input: normalise it again (no affine)
        normed = F.group_norm(saved, m.num_groups, None, None, m.eps)
        return {"weight": (g * normed).reshape(n, m.num_channels, -1).sum(2), "bias": g.reshape(n, m.num_channels, -1).sum(2)}
    shape = tuple(m.normalized_shape)
    per = {"weight": (g * saved).reshape(n, -1, *shape).sum(1)}
    if m.bias is not None:
        per["bias"] = g.reshape(n, -1, *shape).sum(1)
    return per


def _norm_layer(m: nn.Module, saved: list[torch.Tensor], grads: list[torch.Tensor]):
    """GroupNorm / LayerNorm: per-example gradients summed over the calls."""
    n = grads[0].shape[0]
    calls = [_norm_call(m, x, g) for x, g in zip(saved, grads)]
    per = {name: sum(c[name] for c in calls) for name in calls[0]}
    sq = sum(v.reshape(n, -1).square().sum(1) for v in per.values())

    def clipped_sums(c: torch.Tensor, k: int) -> dict[str, torch.Tensor]:
        return {name: (v * c.view(-1, *([1] * (v.dim() - 1)))).reshape(k, -1, *v.shape[1:]).sum(1) for name, v in per.items()}

    def dots(term: dict[str, torch.Tensor]) -> torch.Tensor:
        return sum(
            (v * term[name].repeat_interleave(n // term[name].shape[0], 0)).reshape(n, -1).sum(1)
            for name, v in per.items()
        )

    return _Rule(sq, _adding(clipped_sums), dots)


def _embedding(m: nn.Embedding, saved: list[torch.Tensor], grads: list[torch.Tensor]):
    n = grads[0].shape[0]
    idx = _joined([x.reshape(n, -1, 1) for x in saved]).squeeze(2)  # offset indices into the K tables end to end
    g = _joined([go.reshape(n, -1, m.embedding_dim) for go in grads])
    same = (idx.unsqueeze(2) == idx.unsqueeze(1)).to(g.dtype)  # (N, T, T)
    sq = (same * torch.bmm(g, g.transpose(1, 2))).sum((1, 2))

    def clipped_sums(c: torch.Tensor, k: int) -> dict[str, torch.Tensor]:
        table = torch.zeros(k * m.num_embeddings, m.embedding_dim, dtype=g.dtype, device=g.device)
        table.index_add_(0, idx.reshape(-1), (g * c.view(-1, 1, 1)).reshape(-1, m.embedding_dim))
        return {"weight": table.reshape(k, m.num_embeddings, m.embedding_dim)}

    def dots(term: dict[str, torch.Tensor]) -> torch.Tensor:
        rows = term["weight"].reshape(-1, m.embedding_dim)[idx]  # (N, T, dim): R_k at each looked-up index
        return (rows * g).sum((1, 2))

    return _Rule(sq, _adding(clipped_sums), dots)


def _noise(
    names: list[str], w: dict[str, torch.Tensor], generators: list[RandomSource], workspace: dict
) -> dict[str, torch.Tensor]:
    """Standard normal noise ``(K, *shape)``: client ``k`` fills its rows
    from ``generators[k]`` tensor by tensor in parameter order, exactly as
    :func:`~fedveil.privacy.randomness.standard_normal` in the serial trainer. Filling is
    single-threaded per call, so clients are spread over a thread pool (drawing during the
    forward and backward instead was slower on 2 cores: the pool and the matmuls' threads
    contend). Buffers are kept in ``workspace`` between steps (first-touching 80 MB a step
    costs as much as filling it)."""
    noise = {}
    for name in names:
        buf = workspace.get(name)
        if buf is None or buf.shape != w[name].shape:
            buf = workspace[name] = torch.empty_like(w[name])
        noise[name] = buf

    def fill(worker: int, rows: range) -> None:
        for row in rows:
            for name in names:
                fill_standard_normal_(noise[name][row], generators[row])

    _over_clients(len(generators), fill)
    return noise


def _step_noise_(
    names: list[str], w: dict[str, torch.Tensor], generators: list[RandomSource], coefficients: list[float],
    workspace: dict,
) -> None:
    """``w[name][k] += coefficients[k] * z`` for every parameter, with ``z`` the standard
    normals :func:`_noise` would draw (the same generators, tensors and order). Each pool
    thread draws a client's tensor into a small scratch buffer of its own and adds it at
    once, while it is in cache: no cohort-sized noise buffer is written and read back."""
    def fill(worker: int, rows: range) -> None:
        scratch = workspace.setdefault(("scratch", worker), {})
        for row in rows:
            for name in names:
                target = w[name][row]
                buf = scratch.get(name)
                if buf is None or buf.shape != target.shape:
                    buf = scratch[name] = torch.empty_like(target)
                fill_standard_normal_(buf, generators[row])
                target.add_(buf, alpha=coefficients[row])

    _over_clients(len(generators), fill)


def _over_clients(clients: int, work: Callable[[int, range], None]) -> None:
    """``work(worker, rows)`` on a pool of one worker per torch thread, worker ``i`` taking the
    clients ``i, i + workers, ...``: one draw is single-threaded, so the clients are spread."""
    workers = max(1, min(torch.get_num_threads(), clients))
    if workers == 1:  # in the calling thread: clients of the threads executor must not queue on one pool thread
        work(0, range(clients))
        return
    list(_pool(workers).map(work, range(workers), [range(i, clients, workers) for i in range(workers)]))


_POOLS: dict[int, ThreadPoolExecutor] = {}


def _pool(workers: int) -> ThreadPoolExecutor:
    if workers not in _POOLS:
        _POOLS[workers] = ThreadPoolExecutor(workers, thread_name_prefix="fedveil-noise")
    return _POOLS[workers]


def _layer_calls(records: list[LayerRecord], out_grads) -> list[tuple[LayerRecord, list, list]]:
    """Each parametric layer once, with the saved inputs and output gradients of all its calls."""
    calls: dict[int, tuple[LayerRecord, list, list]] = {}
    for rec, g in zip(records, out_grads):
        _, saved, grads = calls.setdefault(id(rec.module), (rec, [], []))
        saved.append(rec.saved)
        grads.append(g)
    return list(calls.values())


def _term_norm_terms(records: list[LayerRecord], rules, term: dict[str, torch.Tensor], k: int, width: int) -> torch.Tensor:
    """``2 <g_i, r_k> + ||r_k||^2`` per example, summed over layers and parameters."""
    cross = 0.0
    for rec, rule in zip(records, rules):
        layer_term = {p: term[rec.param_name(p)] for p, _ in rec.module.named_parameters(recurse=False)}
        cross = cross + rule.dots(layer_term)
    r_sq = sum(r.reshape(k, -1).square().sum(1) for r in term.values())
    return 2.0 * cross + r_sq.repeat_interleave(width)


_RULES = {nn.Linear: _linear, nn.Conv2d: _conv2d, nn.GroupNorm: _norm_layer, nn.LayerNorm: _norm_layer, nn.Embedding: _embedding}


def private_stacked_gradients(
    stacked: StackedModel,
    model: nn.Module,
    w: dict[str, torch.Tensor],
    x: torch.Tensor,
    y: torch.Tensor,
    mask: torch.Tensor,
    per_example_loss,
    dps: list[ExampleDP],
    generators: list[RandomSource],
    workspace: dict | None = None,
    term: dict[str, torch.Tensor] | None = None,
    private: torch.Tensor | None = None,
    denominators: list[float] | None = None,
    buffers: dict[str, torch.Tensor] | None = None,
    sgd_lr: float | None = None,
) -> tuple[dict[str, torch.Tensor] | None, torch.Tensor]:
    """Privatised gradients ``(K, *shape)`` of K clients' batches and their loss sums ``(K,)``.
    The gradients live in the noise buffers of ``workspace``, overwritten by the next call.
    With ``sgd_lr`` (plain SGD) the stacked parameters ``w`` instead take the step
    ``w -= sgd_lr * gradient`` in place, the Linear weights inside their clipped-sum bmm,
    and no gradients are returned.

    ``mask (K, B)`` marks the real rows of the padded merged batch ``x``; padding rows
    get clip factor 0. Client ``k`` uses ``dps[k]``'s clip, noise multiplier and
    denominator (its batch size) and draws its noise from ``generators[k]``.
    ``workspace`` (a dict kept by the caller across steps) holds reusable buffers.
    ``term`` (``(K, *shape)`` per parameter) is an example-independent gradient added to
    every example's gradient before clipping: ``||g_i + r||^2 = ||g_i||^2 + 2 <g_i, r> +
    ||r||^2`` with the inner products from the same records, and the clipped sum gains
    ``(sum_i c_i) r`` (spec 002 §1.2 note). ``private (K, B)`` marks the private rows of a
    mixed batch (``None``: all rows are): public rows enter unclipped (factor 1), and
    ``denominators`` (one per client; default its ``batch_size``) then count them too.
    ``y`` is whatever ``per_example_loss(out, y)`` takes (targets, or a training batch);
    ``buffers`` (``(K, *shape)``) are the clients' read-only buffers (e.g. a gradient reversal's lambda).
    """
    k = len(dps)
    records: list[LayerRecord] = []
    leaves = {n: v.detach().requires_grad_(True) for n, v in w.items()}
    out = stacked(leaves, x, k, records, buffers=buffers, rows=mask)
    flat_mask = mask.reshape(-1)
    losses = per_example_loss(out, y) * flat_mask
    outputs = [r.output for r in records]
    out_grads = torch.autograd.grad(losses.sum(), outputs, allow_unused=True)
    # a layer whose output the objective does not use (an opted-out discriminator) has zero gradients
    out_grads = [torch.zeros_like(o) if g is None else g for o, g in zip(outputs, out_grads)]
    with torch.no_grad():
        layers = _layer_calls(records, out_grads)
        records = [rec for rec, _, _ in layers]
        rules = [_RULES[type(rec.module)](rec.module, saved, grads) for rec, saved, grads in layers]
        sq = sum(rule.sq for rule in rules)
        if term is not None:
            sq = sq + _term_norm_terms(records, rules, term, k, mask.shape[1])
        clip = torch.tensor([dp.clip for dp in dps], dtype=sq.dtype, device=sq.device).repeat_interleave(mask.shape[1])
        if denominators is None:
            denominators = [float(dp.batch_size) for dp in dps]
        denominator = torch.tensor(denominators, dtype=sq.dtype, device=sq.device)
        clipped = (clip / (sq.sqrt() + CLIP_EPS)).clamp(max=1.0)
        if private is not None:  # public rows are not clipped
            clipped = torch.where(private.reshape(-1) > 0, clipped, torch.ones_like(clipped))
        # clip factor and the division by the client's denominator in one scale per example
        factors = clipped * flat_mask / denominator.repeat_interleave(mask.shape[1])
        workspace = {} if workspace is None else workspace
        scales = [dp.clip * dp.noise_multiplier / d for dp, d in zip(dps, denominators)]
        noise = None
        if sgd_lr is None:  # the noisy gradient is built in the noise buffers: scaled noise + clipped sums
            noise = _noise(stacked.names, w, generators, workspace)
            scale = torch.tensor(scales, dtype=sq.dtype, device=sq.device)
            targets, alpha = noise, 1.0
            for z in noise.values():
                z.mul_(scale.view(-1, *([1] * (z.dim() - 1))))
        else:  # w -= lr (scaled noise + clipped sums), in place
            targets, alpha = w, -sgd_lr
            _step_noise_(stacked.names, w, generators, [alpha * s for s in scales], workspace)
        for rec, rule in zip(records, rules):
            params = [p for p, _ in rec.module.named_parameters(recurse=False)]
            rule.add_clipped(factors, k, {p: targets[rec.param_name(p)] for p in params}, alpha)
        if term is not None:
            factor_sums = factors.reshape(k, -1).sum(1)
            for name, r in term.items():
                targets[name].add_(factor_sums.view(-1, *([1] * (r.dim() - 1))) * r, alpha=alpha)
        loss_sums = losses.detach().reshape(k, -1).sum(1)
    return noise, loss_sums
