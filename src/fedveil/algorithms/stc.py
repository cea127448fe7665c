"""STC: Sparse Ternary Compression (Sattler, Wiedemann, Mueller, Samek 2019, "Robust and
Communication-Efficient Federated Learning from Non-IID Data", IEEE TNNLS; arXiv:1903.02891).

A baseline of the ADDS reproduction (spec 001 §4). Local training is FedAvg's (one
``task.trainer.train`` call from the received global model w); only the messages change.

Compression of an update A (all trained parameters flattened into ONE vector of n entries;
Sattler et al. compress tensor by tensor, the spec asks for the whole update):

* keep the k = ceil(p n) entries of largest |A| (p = ``sparsity``, at least one entry);
* mu = mean of |A_j| over the kept entries;
* STC(A)_j = mu sign(A_j) for the kept entries, 0 elsewhere (values in {-mu, 0, +mu}).

Upstream, with error feedback (client state ``residual`` R_i, zero at first, kept across
rounds, also through rounds the client sits out):

    Delta_i = trained model - w,   A_i = Delta_i + R_i,   S_i = STC(A_i),   R_i <- A_i - S_i

and the client sends S_i (the sum of everything sent plus the residual always equals the
sum of the client's raw updates). Downstream (``downstream = true``, the paper's
bidirectional STC) the server does the same with its own residual R (server state):

    M = sum_i p_i S_i (p_i: sample or uniform weights, as FedAvg's ``weighting``),
    B = STC(M + R),   R <- M + R - B,   w <- w + B,

i.e. the server applies its compressed broadcast B, which is exactly what every client can
reconstruct (in the paper clients that missed rounds download the missed broadcasts; here
every client receives the current w, which equals the sum of all broadcasts). With
``downstream = false`` the server applies M itself. Buffers (BatchNorm running statistics),
if the model has any, are neither compressed nor part of the residuals: the clients send
their trained buffers as they are and the server sets the weighted mean of them.

Communication accounting, per client in ``extra_metrics``:

* ``params_uploaded``: the non-zero entries of S_i (plus the dense buffer entries, if any);
* ``upload_bits``: nonzeros (b_pos + 1) + 32 (+ 32 per buffer entry): Golomb-coded positions
  (:func:`golomb_position_bits`), one sign bit per non-zero entry, and mu as one 32-bit float.

Privacy: under example-level DP the trainer runs DP-SGD as for FedAvg; compression and
error feedback only post-process its output (the residual is the client's own private
state), so the same accounting holds. Client-level DP (the server clipping and noising raw
model deltas) is not offered: the messages are compressed updates with hidden residuals.
"""
from __future__ import annotations

import math
from typing import Any, Literal, NamedTuple

import torch
from pydantic import Field

from .. import params as P
from ..models.functional import buffer_names, parameter_names
from .base import ALGORITHMS, Algorithm, AlgorithmParams, ClientResult, ClientTask, RunContext, State

GOLDEN_RATIO = (math.sqrt(5.0) + 1.0) / 2.0
MU_BITS = 32  # mu travels as one float32
DENSE_BITS = 32  # a buffer entry sent uncompressed


class STCParams(AlgorithmParams):
    """STC's settings: the kept share p of the update, the weighting, and whether the broadcast is compressed too."""

    sparsity: float = Field(
        0.2, gt=0.0, le=1.0,
        description="p: fraction of the (flattened) update's entries kept, by magnitude (1 = keep all, ternarise only)",
    )
    weighting: Literal["samples", "uniform"] = Field(
        "samples", description="average of the compressed updates weighted by client training-set size, or uniformly"
    )
    downstream: bool = Field(
        True, description="compress the server's broadcast too, with a server-side residual (bidirectional STC)"
    )


class Compressed(NamedTuple):
    """``sent``: the ternary update; ``residual``: what was left out (input - sent)."""

    sent: P.Params
    residual: P.Params
    mu: float
    nonzeros: int


def kept_count(n: int, sparsity: float) -> int:
    """k = ceil(p n), at least 1 and at most n (the tolerance keeps 0.2 * 10 at 2, not 3)."""
    return min(n, max(1, math.ceil(sparsity * n - 1e-9)))


def stc_compress(update: P.Params, sparsity: float) -> Compressed:
    """Top-k by magnitude over all entries of ``update`` taken together, then ternarised to
    {-mu, 0, +mu} with mu the mean magnitude of the kept entries; ties are broken by
    ``torch.topk``. Returns the compressed update, the residual ``update - sent``, mu and
    the number of non-zero entries sent (kept entries that are exactly 0 send nothing)."""
    names = list(update)
    flat = torch.cat([update[k].reshape(-1) for k in names])
    k = kept_count(flat.numel(), sparsity)
    values, index = torch.topk(flat.abs(), k, sorted=False)
    mu = values.mean()
    sent_flat = torch.zeros_like(flat)
    sent_flat[index] = mu * torch.sign(flat[index])
    sent, residual, start = {}, {}, 0
    for name in names:
        size = update[name].numel()
        piece = sent_flat[start : start + size].reshape(update[name].shape)
        sent[name] = piece
        residual[name] = update[name] - piece
        start += size
    return Compressed(sent, residual, float(mu), int(torch.count_nonzero(sent_flat)))


def golomb_b_star(sparsity: float) -> int:
    """b* = 1 + floor(log2(log(phi - 1) / log(1 - p))), phi the golden ratio: the Golomb
    parameter 2^b* for gaps between kept positions, which are geometric with parameter p
    (Sattler et al. 2019, the Golomb encoding of STC's sparse positions).
    Clamped at 0 (dense updates, p >~ 0.38, give a unary code); p = 1 gives 0."""
    if sparsity >= 1.0:
        return 0
    ratio = math.log(GOLDEN_RATIO - 1.0) / math.log(1.0 - sparsity)
    return max(0, 1 + math.floor(math.log2(ratio)))


def golomb_position_bits(sparsity: float) -> float:
    """Mean bits to encode one kept position with the Golomb code of Sattler et al. 2019
    (the position-encoding equations of their STC section, arXiv:1903.02891):
    b_pos = b* + 1 / (1 - (1 - p)^(2^b*)), with b* from :func:`golomb_b_star`.
    E.g. p = 0.01: b* = 6, b_pos = 8.11; p = 0.2: b* = 2, b_pos = 3.69; p = 1: 1 bit."""
    b = golomb_b_star(sparsity)
    return b + 1.0 / (1.0 - (1.0 - sparsity) ** (2**b))


def upload_bits(nonzeros: int, sparsity: float, dense_entries: int = 0) -> float:
    """nonzeros (b_pos + 1 sign bit) + 32 bits for mu, plus 32 bits per dense entry (buffers)."""
    return nonzeros * (golomb_position_bits(sparsity) + 1.0) + MU_BITS + DENSE_BITS * dense_entries


@ALGORITHMS.register("stc", "STC: sparse ternary compression of updates with error feedback, up- and downstream")
class STC(Algorithm):
    """FedAvg's local training; top-p sparsified, ternarised updates with residuals on
    clients and server (Sattler et al. 2019)."""

    delta_messages = False  # its messages are compressed updates, not a delta

    Params = STCParams
    public_metrics = ("params_uploaded", "upload_bits")  # top-k of a fixed sparsity: sizes the config sets

    def __init__(self, params: STCParams, ctx: RunContext) -> None:
        super().__init__(params, ctx)
        self.param_keys = tuple(parameter_names(ctx.trainer.model))
        self.buffer_keys = tuple(buffer_names(ctx.trainer.model))

    def _trained(self, params: P.Params) -> P.Params:
        return {k: params[k] for k in self.param_keys}

    def init_server(self, initial: P.Params) -> State:
        """The initial model and, with ``downstream``, a zero server residual R."""
        state: State = {"params": initial}
        if self.hp.downstream:
            state["residual"] = P.zeros_like(self._trained(initial))
        return state

    def client_update(self, server_state: State, client_state: State | None, task: ClientTask) -> ClientResult:
        """FedAvg's local training; sends S_i = STC(Delta_i + R_i) and the dense buffers, keeping the residual."""
        start = server_state["params"]
        new, stats = task.trainer.train(start, task.data.train, task.generator, task.round, dp=task.dp)
        delta = P.sub(self._trained(new), self._trained(start))
        residual = client_state["residual"] if client_state is not None else P.zeros_like(delta)
        packed = stc_compress(P.add(delta, residual), self.hp.sparsity)
        buffers = {k: new[k] for k in self.buffer_keys}
        dense = sum(v.numel() for v in buffers.values())
        message = {"update": packed.sent, "buffers": buffers, "num_examples": task.data.num_train}
        metrics = {
            "params_uploaded": float(packed.nonzeros + dense),
            "upload_bits": upload_bits(packed.nonzeros, self.hp.sparsity, dense),
        }
        return ClientResult(message=message, state={"residual": packed.residual}, stats=stats, extra_metrics=metrics)

    signal_labels = {"params_uploaded": "non-zero entries uploaded per client", "upload_bits": "upload bits per client"}

    def weights(self, messages: list[dict[str, Any]]) -> list[float]:
        """The weights p_i of ``messages``: their ``num_examples``, or all 1 with uniform weighting."""
        if self.hp.weighting == "uniform":
            return [1.0] * len(messages)
        return [float(m["num_examples"]) for m in messages]

    def aggregate(self, server_state: State, results: list[tuple[int, dict[str, Any]]], round_idx: int) -> State:
        """w <- w + B with B = STC(M + R) (``downstream``) or M; buffers take the weighted mean."""
        if not results:  # an empty Poisson cohort leaves everything unchanged
            return server_state
        messages = [m for _, m in results]
        weights = self.weights(messages)
        mean = P.weighted_mean([m["update"] for m in messages], weights)
        state = dict(server_state)
        if self.hp.downstream:
            packed = stc_compress(P.add(mean, server_state["residual"]), self.hp.sparsity)
            step, state["residual"] = packed.sent, packed.residual
        else:
            step = mean
        params = server_state["params"]
        new = {**params, **P.add(self._trained(params), step)}
        if self.buffer_keys:  # running statistics: the plain weighted mean of the clients'
            new.update(P.weighted_mean([m["buffers"] for m in messages], weights))
        state["params"] = new
        return state
