"""Split-Mix FL (Hong et al., ICLR 2022; spec 000 part 2 §A.2-A.6, reference code notes §1).

The x1 model is split into M independent base models of width r = 1/M (the model is a
:class:`~fedveil.models.ensemble.BaseEnsemble`, e.g. ``digit_cnn`` with ``bases = 8``).
Client k with width budget R_k trains n_k = floor(R_k / r) bases each round:

* **Plan** (Alg. 4.2, in :meth:`SplitMix.configure_round`): walking the round's cohort in
  order, the first base of each client comes from a cyclic pointer over a permutation of
  the bases that persists across clients and rounds (reshuffled when it wraps); the other
  n_k - 1 are drawn uniformly without replacement from the remaining bases.
* **Local training** (Alg. 4.3): one training on a model of n_k bases whose objective is
  the sum of each base's own loss on the same batch, so every base gets exactly the
  gradient of its own cross-entropy (the bases share no parameters). Momentum and weight
  decay come from ``[client]`` as for every method (the paper: 0.9, 5e-4).
* **Aggregation** (Alg. 4.1 lines 7-8): each base is the |D_k|-weighted mean over the
  clients that trained it this round; a base nobody trained keeps its value.
* **Mixing** (Alg. 4.1 line 11): a model of width R averages the logits of the first
  R / r bases; ``test_width`` picks the width the run evaluates, and
  :meth:`SplitMix.predict_at` serves any width in {r, 2r, ..., 1} without retraining.

Decisions on the spec's discrepancies (part E): budgets follow the code's ascending
client-order groups (E.1, see :mod:`~fedveil.algorithms.budgets`); learning rates and
rounds are config values, the reproductions use the code's sweeps (E.2); MACs are real
multiply-accumulates, Table 4.1 shows them /10 (E.5); bases are mixed in index order
(the code's default, no ``--sort_bases``). Example-level DP-SGD applies (one training per
round, accounted as usual) with a model without batch statistics (``norm = "none"``).
With ``adversarial`` (dual-BN PGD training, Alg. C.1) one attack is made against all of a
client's bases at once (their summed cross-entropy) by default; ``per_base = true`` attacks
each base on its own, as the reference code does (n times the PGD cost).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

import torch
from pydantic import Field
from torch import nn

from .. import params as P
from ..errors import ConfigError
from ..models.ensemble import BaseEnsemble
from ..models.functional import buffer_names, forward
from ..seeding import numpy_generator
from ..training.adversarial import prefixed, unprefixed
from ..training.request import Batch, LossFn, Objective
from .base import ALGORITHMS, Algorithm, ClientResult, ClientTask, RunContext, State
from .adversarial import AdversarialParams, AdversarialRequests
from .budgets import BudgetParams, client_budgets


class SplitMixParams(BudgetParams):
    """Budgets, test width (first test_width / r bases mixed), per-base weighting, and
    optional dual-BN adversarial training (SplitMixDAT, Alg. C.1)."""

    adversarial: AdversarialParams | None = Field(
        None, description="PGD adversarial training of the bases (Eq. 4.1; dual-BN with a dual_ norm model)"
    )
    buffers: Literal["average", "local"] = Field(
        "average", description="BN running statistics: averaged per base like parameters, or kept by each client for "
        "the bases it trained (Table C.3's 'locally tracked'; needs a *_tracked norm)"
    )


@dataclass(frozen=True)
class PerBaseLoss(Objective):
    """Sum over bases of each base's own loss: ``out`` is ``(N, n_bases, C)`` (Alg. 4.3 line 5)."""

    loss_fn: LossFn

    @property
    def per_example_ok(self) -> bool:
        """True unless the task loss couples the batch (``couples_batch``)."""
        return not getattr(self.loss_fn, "couples_batch", False)

    def mean(self, out: torch.Tensor, batch: Batch) -> torch.Tensor:
        """sum_j loss(out[:, j], y): each base's own mean loss, summed."""
        return sum(self.loss_fn(out[:, j], batch.y) for j in range(out.shape[1]))


def base_prefix(index: int) -> str:
    """The name prefix of base ``index``'s entries, ``"bases.{index}."``."""
    return f"bases.{index}."


def rename_bases(params: P.Params, mapping: dict[int, int]) -> P.Params:
    """The entries of the bases in ``mapping`` (from index -> to index), renamed."""
    out = {}
    for src, dst in mapping.items():
        prefix, new = base_prefix(src), base_prefix(dst)
        out.update({new + k[len(prefix):]: v for k, v in params.items() if k.startswith(prefix)})
    return out


@ALGORITHMS.register("split_mix", "Split-Mix: budget-limited clients train some of M base models; any width mixed at test time")
class SplitMix(Algorithm):
    """Split-Mix FL (Alg. 4.1-4.3); see the module docstring."""

    Params = SplitMixParams
    public_metrics = ("bases_trained", "params_uploaded")  # set by the client's budget
    signal_labels = {"bases_trained": "bases trained per client (mean)", "params_uploaded": "parameters uploaded per client"}

    def __init__(self, params: SplitMixParams, ctx: RunContext) -> None:
        super().__init__(params, ctx)
        model = ctx.trainer.model
        if not isinstance(model, BaseEnsemble):
            raise ConfigError(
                "algorithm 'split_mix' needs a model split into base models: set model.options.bases "
                "(e.g. model = \"digit_cnn\" with bases = 8)"
            )
        self.num_bases, self.base_width = model.num_bases, model.base_width
        self.budgets = client_budgets(params, ctx.num_clients, self.widths())
        self.bases_per_client = [self._bases_for(b, "a budget") for b in self.budgets]
        self.test_bases = self.num_bases if params.test_width is None else self._bases_for(params.test_width, "algorithm.test_width")
        self.objective = PerBaseLoss(ctx.trainer.loss_fn)
        self.adversarial = None if params.adversarial is None else AdversarialRequests(params.adversarial, model)
        self.buffer_keys = frozenset(buffer_names(model))
        if params.buffers == "local":
            if not self.buffer_keys:
                raise ConfigError("split_mix: buffers = \"local\" keeps BN running statistics: use a *_tracked norm")
            self.has_personal_models = True  # each client's model: the global bases with its own statistics
        # one module per base count, built up front (clients of a round run in threads)
        self.trainees = {n: model.with_bases(n, "stack") for n in range(1, self.num_bases + 1)}
        self.mixers = {n: model.with_bases(n, "mean") for n in range(1, self.num_bases + 1)}

    def _bases_for(self, width: float, what: str) -> int:
        n = math.floor(width / self.base_width + 1e-9)
        if n < 1:
            raise ConfigError(
                f"split_mix: {what} of width {width:g} is narrower than one base (width {self.base_width:g}); "
                f"raise it or use more, narrower bases"
            )
        return min(n, self.num_bases)

    def widths(self) -> list[float]:
        """The widths a trained model can be customised to: r, 2r, ..., M r."""
        return [self.base_width * (i + 1) for i in range(self.num_bases)]

    # ------------------------------------------------------------------ server
    def init_server(self, initial: P.Params) -> State:
        """The initial model, a seeded permutation of the bases and the cyclic pointer at 0 (Alg. 4.2)."""
        order = numpy_generator(self.ctx.seed, "split-mix", "order").permutation(self.num_bases)
        return {"params": initial, "order": self._as_tensor(order), "pointer": 0}

    def _as_tensor(self, order) -> torch.Tensor:
        """The base permutation P as state (plain tensors, so it checkpoints and ships)."""
        return torch.tensor([int(i) for i in order], dtype=torch.int64, device=self.ctx.device)

    def configure_round(self, server_state: State, cohort: list[int], round_idx: int) -> State:
        """SampleBaseModels (Alg. 4.2) for each client of the cohort, in order."""
        rng = numpy_generator(self.ctx.seed, "split-mix", round_idx)
        order, pointer = [int(i) for i in server_state["order"].tolist()], server_state["pointer"]
        plan = {}
        for cid in cohort:
            if pointer >= self.num_bases:
                order, pointer = [int(i) for i in rng.permutation(order)], 0
            first = order[pointer]
            pointer += 1
            rest = [b for b in order if b != first]
            extra = rng.choice(len(rest), size=self.bases_per_client[cid] - 1, replace=False)
            plan[cid] = [first] + [rest[i] for i in extra]
        return {**server_state, "order": self._as_tensor(order), "pointer": pointer, "plan": plan}

    def aggregate(self, server_state: State, results: list[tuple[int, dict[str, Any]]], round_idx: int) -> State:
        """Alg. 4.1 lines 7-8: each base moved by the weighted
        mean delta of the clients that trained it; drops the plan."""
        state = {k: v for k, v in server_state.items() if k != "plan"}
        if not results:
            return state
        messages = [m for _, m in results]
        weights = [1.0 if self.hp.weighting == "uniform" else float(m["num_examples"]) for m in messages]
        mean_delta = P.partial_mean([m["delta"] for m in messages], weights)
        params = server_state["params"]
        return {**state, "params": {**params, **{k: params[k] + d for k, d in mean_delta.items()}}}

    # ------------------------------------------------------------------ client
    def client_update(self, server_state: State, client_state: State | None, task: ClientTask) -> ClientResult:
        """Trains the client's planned bases as one model with the
        summed per-base loss (Alg. 4.3) and sends their delta."""
        bases = server_state["plan"][task.client_id]
        to_local = {g: j for j, g in enumerate(bases)}
        start = rename_bases(self._with_own_buffers(server_state["params"], client_state), to_local)
        trainee = self.trainees[len(bases)]
        if self.adversarial is None:
            new, stats = task.trainer.train(
                start, task.data.train, task.generator, task.round, dp=task.dp, model=trainee, objective=self.objective,
            )
        else:
            request = self.adversarial.request(trainee, self.objective)
            new, stats = task.trainer.train(prefixed(start), task.data.train, task.generator, task.round, dp=task.dp, **request)
            new = unprefixed(new)
        delta = rename_bases(P.sub(new, start), {j: g for g, j in to_local.items()})
        if self.hp.buffers == "local":  # the statistics stay with the client, under the bases' global names
            trained = {k: v for k, v in rename_bases(new, {j: g for g, j in to_local.items()}).items() if k in self.buffer_keys}
            client_state = {"buffers": {**(client_state or {}).get("buffers", {}), **trained}}
            delta = {k: v for k, v in delta.items() if k not in self.buffer_keys}
        message = {"delta": delta, "num_examples": task.data.num_train, "steps": stats.steps}
        uploaded = sum(v.numel() for v in delta.values())
        return ClientResult(message=message, state=client_state, stats=stats,
                            extra_metrics={"bases_trained": len(bases), "params_uploaded": uploaded})

    def _with_own_buffers(self, params: P.Params, client_state: State | None) -> P.Params:
        if self.hp.buffers != "local" or not client_state:
            return params
        return {**params, **client_state.get("buffers", {})}

    def personal_params(self, server_state: State, client_state: State | None, task: ClientTask) -> P.Params:
        """With ``buffers = "local"``: the global bases with the client's own statistics (those of
        bases it never trained stay the global ones)."""
        return self._with_own_buffers(server_state["params"], client_state)

    # ------------------------------------------------------------------ test time
    def predict(self, model: nn.Module, state: P.Params, x: torch.Tensor) -> torch.Tensor:
        """The mixed logits of the first ``test_width / r`` bases (all bases by default)."""
        return self.predict_bases(state, x, self.test_bases)

    def _served_bases(self, width: float) -> int:
        """The bases of served width ``width``; a width not in :meth:`widths` is refused."""
        n = round(width / self.base_width)
        if not (1 <= n <= self.num_bases and math.isclose(n * self.base_width, width)):
            served = ", ".join(f"{w:g}" for w in self.widths())
            raise ConfigError(f"split_mix: width {width:g} is not one the model serves; valid widths: {served}")
        return n

    def predict_at(self, state: P.Params, x: torch.Tensor, width: float) -> torch.Tensor:
        """Logits of the model customised to ``width`` (mean of the first width/r bases' logits)."""
        return self.predict_bases(state, x, self._served_bases(width))

    def model_at(self, width: float) -> nn.Module:
        """The module of the model customised to ``width`` (for its parameter and MAC counts)."""
        return self.mixers[self._served_bases(width)]

    def predict_bases(self, state: P.Params, x: torch.Tensor, n: int) -> torch.Tensor:
        """The mean of the logits of the first ``n`` bases (Alg. 4.1 line 11)."""
        return forward(self.mixers[n], rename_bases(state, {i: i for i in range(n)}), x)
