"""pFedMe (Dinh, Tran, Nguyen 2020, "Personalized Federated Learning with Moreau
Envelopes", NeurIPS), a baseline of the ADDS reproduction (spec 001 §4).

Client i receives the global model w and sets its local copy w_i = w and its personal model
theta_i = w. Each local step r (the run's ``[client]`` section fixes how many and the batch
size B, exactly as for FedAvg: ``trainer.batch_indices``, so the batches are FedAvg's) draws
a batch D and

1. approximately solves the personal problem on that batch (Alg. 1 of the paper)
       theta_i ~ argmin_theta f_i(theta; D) + lambda/2 ||theta - w_i||^2
   with K = ``inner_steps`` gradient steps of size ``personal_lr``, warm-started from the
   previous step's theta_i (as the authors' code does):
       theta <- theta - personal_lr (grad f_i(theta; D) + lambda (theta - w_i) [+ wd theta]);
2. moves the local copy towards it:  w_i <- w_i - eta lambda (w_i - theta_i),
   eta the client learning rate of the round (``client.lr`` and its schedule).

The client sends w_i - w; the server sets w <- (1 - beta) w + beta sum_i p_i w_i, i.e.
w + beta sum_i p_i (w_i - w), with p_i = n_i / n (``weighting = "samples"``, as the authors'
code) or 1/|S| (``"uniform"``, the paper's Eq.). The last theta_i is kept as client state
and is the client's personal model (``personal_params``, like Ditto's v_i).

How it sits on the core: step 1 is one ``LocalTrainer.run`` of K full-batch steps on the
batch's rows, with the FedProx-style gradient term lambda (theta - w_i) written as an
:class:`~fedveil.engine.grad_terms.AffineGradTerm`; step 2 is tensor arithmetic. The inner
trainer is the run's trainer (same model, loss and weight decay) with the inner settings:
K steps, full batch, lr = ``personal_lr`` constant, no momentum. Because a train request
cannot change the step count or learning rate, the inner solves are run by that trainer
directly, not posted through ``task.trainer``: the vectorized executor therefore runs
pFedMe client by client (in its threads), with the same numbers as the serial executor.

Deviations and decisions:

* ``client.momentum`` is not used (pFedMe's outer and inner updates are plain steps);
  ``client.weight_decay`` acts on the inner steps (the ``mu`` term of the authors'
  optimiser); ``client.lr`` is the outer eta.
* Buffers (BatchNorm running statistics) follow theta's forward passes: w_i takes theta_i's
  statistics at the end, and the server averages them plainly (beta is not applied).
* Rows inside one inner solve are reshuffled by a fixed stream (order only; full batch).
* ``client.lr * lam >= 2`` is refused: the outer step would overshoot theta_i and diverge
  (keep eta lambda < 1, so w_i moves part of the way towards theta_i).

Privacy: example-level DP is refused. DP-SGD would release K noisy gradients of the SAME
sampled batch per local step; the privacy plan accounts every DP-SGD step as a fresh
Poisson/shuffled sample, which would understate the loss (the K releases compose on one
subsample, with no amplification between them). Client-level DP is refused too (the
runtime's DP-FedAvg applies FedAvg's server step, not beta).
"""
from __future__ import annotations

import math
from typing import Any, Literal

import torch
from pydantic import Field

from .. import params as P
from ..engine.grad_terms import AffineGradTerm
from ..errors import ConfigError
from ..models.functional import buffer_names, parameter_names
from ..training.local import LocalStats, LocalTrainer
from .base import ALGORITHMS, Algorithm, AlgorithmParams, ClientResult, ClientTask, RunContext, State

INNER_SHUFFLE_SEED = 0  # the stream that orders the rows of each inner full batch (irrelevant to the maths)


class PFedMeParams(AlgorithmParams):
    """pFedMe's settings: lambda, the K inner steps and their step size, the server mix beta and the weighting."""

    lam: float = Field(15.0, gt=0.0, description="lambda_p: pull of the personal model theta_i towards the local model w_i")
    inner_steps: int = Field(5, ge=1, description="K: gradient steps solving the personal problem on each batch")
    personal_lr: float = Field(0.01, gt=0.0, description="step size of the K inner steps")
    beta: float = Field(1.0, gt=0.0, description="server mix: w <- (1 - beta) w + beta mean(w_i); 1 = the plain mean")
    weighting: Literal["samples", "uniform"] = Field(
        "samples", description="mean of the local models weighted by client training-set size, or uniformly"
    )


@ALGORITHMS.register("pfedme", "pFedMe: personal models by Moreau envelopes, K inner steps per batch, beta server mix")
class PFedMe(Algorithm):
    """Bi-level pFedMe (Dinh et al. 2020, Alg. 1): personal theta_i solved by K steps per
    batch, local w_i pulled towards it, server w <- (1 - beta) w + beta mean(w_i)."""

    Params = PFedMeParams
    has_personal_models = True
    supports_example_dp = False  # K noisy gradients of one sampled batch: not what the plan accounts

    def __init__(self, params: PFedMeParams, ctx: RunContext) -> None:
        super().__init__(params, ctx)
        self.param_keys = tuple(parameter_names(ctx.trainer.model))
        self.buffer_keys = tuple(buffer_names(ctx.trainer.model))
        step = ctx.trainer.config.lr * params.lam  # every lr schedule stays at or below client.lr
        if step >= 2.0:
            raise ConfigError(
                f"pfedme: client.lr * algorithm.lam = {step:g} >= 2, so w_i <- w_i - lr lam (w_i - theta_i) overshoots "
                "theta_i by more than it started from and diverges; lower client.lr or lam (keep lr lam < 1)"
            )

    def inner_trainer(self, trainer: LocalTrainer) -> LocalTrainer:
        """The run's trainer with the inner settings: K full-batch steps of ``personal_lr``."""
        config = trainer.config.model_copy(update={
            "steps": self.hp.inner_steps, "batch_size": 0, "lr": self.hp.personal_lr,
            "momentum": 0.0, "lr_schedule": "constant",
        })
        return LocalTrainer(trainer.model, trainer.loss_fn, config, trainer.total_rounds)

    def client_update(self, server_state: State, client_state: State | None, task: ClientTask) -> ClientResult:
        """Per batch, K inner steps for theta_i, then w_i <- w_i -
        eta lambda (w_i - theta_i); sends w_i - w and keeps theta_i."""
        if task.dp is not None:
            raise ConfigError("privacy.level: pfedme does not support example-level DP (its K inner steps reuse one "
                              "sampled batch, which per-step DP-SGD accounting would understate)")
        lam, eta = self.hp.lam, task.trainer.lr_at(task.round)
        start = server_state["params"]
        w = {k: start[k] for k in self.param_keys}
        theta = dict(start)  # parameters and buffers
        inner = self.inner_trainer(task.trainer)
        rows = task.data.train
        shuffle = torch.Generator().manual_seed(INNER_SHUFFLE_SEED)
        losses, steps, examples = [], 0, 0
        for idx in task.trainer.batch_indices(len(rows), task.generator, rows.x.device):
            pull = AffineGradTerm(lam, P.scale(w, -lam))  # lambda (theta - w_i)
            theta, solved = inner.train(theta, rows.subset(idx), shuffle, task.round, pull)
            w = {k: w[k] - eta * lam * (w[k] - theta[k]) for k in self.param_keys}
            losses.append(solved.loss)
            steps, examples = steps + solved.steps, examples + solved.examples
        local = {**w, **{k: theta[k] for k in self.buffer_keys}}
        seen = [x for x in losses if not math.isnan(x)]
        stats = LocalStats(loss=sum(seen) / len(seen) if seen else float("nan"), steps=steps, examples=examples)
        message = {"delta": P.sub(local, start), "num_examples": task.data.num_train}
        return ClientResult(message=message, state={"personal": theta}, stats=stats)

    def aggregate(self, server_state: State, results: list[tuple[int, dict[str, Any]]], round_idx: int) -> State:
        """w + beta x the weighted mean of w_i - w for parameters; buffers take the plain mean."""
        if not results:  # an empty Poisson cohort leaves the model unchanged
            return server_state
        messages = [m for _, m in results]
        weights = [1.0 if self.hp.weighting == "uniform" else float(m["num_examples"]) for m in messages]
        mean = P.weighted_mean([m["delta"] for m in messages], weights)
        params = server_state["params"]
        new = {k: params[k] + (self.hp.beta * d if k in self.param_keys else d) for k, d in mean.items()}
        return {**server_state, "params": {**params, **new}}

    def personal_params(self, server_state: State, client_state: State | None, task: ClientTask) -> P.Params:
        """The client's last theta_i; the global model for a client that never trained."""
        if client_state is None:  # never sampled: the global model
            return server_state["params"]
        return client_state["personal"]
