"""MOCHA, primal form trained with DP-SGD (Smith et al. 2017; spec 002 §2.6, [C1] ``mocha.py``).

Silo k trains w_k on F_k(w) + lambda/2 tr(W_w^T Sigma W_w) + l2/2 ||w||^2, where W_w
stacks all silos' models of the round start (K x d) with row k replaced by w. The
gradient with respect to row k is lambda (Sigma W_w)_k + l2 w
= (lambda Sigma_kk + l2) w + lambda sum_{j != k} Sigma_kj w_j: affine in w, so it is an
:class:`AffineGradTerm` (clipped with each example, as in [C1]). After the round the
server sets A = W W^T, (D, V) = eigh(A), D <- max(D, 1e-8), s = sqrt(D) / sum sqrt(D),
Sigma <- V diag(s) V^T; Sigma starts at I / K.

Known deviation, kept to match [C1]'s curves (spec §8): Zhang-Yeung-style MTL puts
Sigma^{-1} inside the trace; [C1] uses Sigma = (W W^T)^{1/2} / tr(.) directly.
The server holds every silo's model (they are the released personal models).
"""
from __future__ import annotations

from typing import Any

import torch
from pydantic import Field

from .. import params as P
from ..engine.grad_terms import AffineGradTerm
from .base import ALGORITHMS, Algorithm, AlgorithmParams, ClientResult, ClientTask, State

EIGEN_FLOOR = 1e-8


class MochaParams(AlgorithmParams):
    """MOCHA's settings: lambda of the task-relationship regulariser, l2, and where its gradient is clipped."""

    lam: float = Field(0.001, ge=0.0, description="strength lambda of the task-relationship regulariser")
    l2: float = Field(0.0, ge=0.0, description="l2 regularisation of each silo's model")
    reg_in_clip: bool = Field(True, description="under DP-SGD clip the regulariser gradient with each example's ([C1])")


def task_covariance(models: list[P.Params]) -> torch.Tensor:
    """Sigma = V diag(sqrt(D) / sum sqrt(D)) V^T for (D, V) = eigh(W W^T) ([C1] Mocha update)."""
    flat = torch.stack([torch.cat([v.reshape(-1) for v in m.values()]) for m in models]).double()
    eigenvalues, vectors = torch.linalg.eigh(flat @ flat.T)
    root = eigenvalues.clamp(min=EIGEN_FLOOR).sqrt()
    return (vectors * (root / root.sum())) @ vectors.T


@ALGORITHMS.register("mocha", "MOCHA (primal): personal models coupled by a learned task covariance")
class Mocha(Algorithm):
    """Personal models trained on F_k + lambda/2 tr(W^T Sigma W); Sigma re-estimated from W each round."""

    delta_messages = False  # its messages are personal models, not a delta

    Params = MochaParams
    has_personal_models = True
    has_global_model = False

    def init_server(self, initial: P.Params) -> State:
        """Every silo's model a copy of the initial model, and Sigma = I / K."""
        k = self.ctx.num_clients
        models = {cid: P.clone(initial) for cid in range(k)}
        return {"params": initial, "models": models, "sigma": torch.eye(k, dtype=torch.float64, device=self.ctx.device) / k}

    def grad_hook(self, server_state: State, client_id: int) -> AffineGradTerm:
        """Row k's regulariser gradient (lambda Sigma_kk + l2) w
        + lambda sum_{j != k} Sigma_kj w_j, as an affine term."""
        sigma, models = server_state["sigma"], server_state["models"]
        lam = self.hp.lam
        coupling = P.zeros_like(models[client_id])
        for j, w_j in models.items():
            if j != client_id and sigma[client_id, j] != 0:
                coupling = P.add(coupling, w_j, lam * float(sigma[client_id, j]))
        scale = lam * float(sigma[client_id, client_id]) + self.hp.l2
        return AffineGradTerm(scale, coupling, clipped=self.hp.reg_in_clip)

    def client_update(self, server_state: State, client_state: State | None, task: ClientTask) -> ClientResult:
        """Local (DP-)SGD on the silo's model with :meth:`grad_hook`; sends the trained model."""
        start = server_state["models"][task.client_id]
        hook = self.grad_hook(server_state, task.client_id)
        new, stats = task.trainer.train(start, task.data.train, task.generator, task.round, hook, dp=task.dp)
        return ClientResult(message={"params": new}, stats=stats)

    def aggregate(self, server_state: State, results: list[tuple[int, dict[str, Any]]], round_idx: int) -> State:
        """Stores the received models and re-estimates Sigma from all of them (:func:`task_covariance`)."""
        if not results:
            return server_state
        models = dict(server_state["models"])
        for cid, message in results:
            models[cid] = {k: v.detach().clone() for k, v in message["params"].items()}
        ordered = [models[c] for c in sorted(models)]
        return {**server_state, "models": models, "sigma": task_covariance(ordered)}

    def personal_params(self, server_state: State, client_state: State | None, task: ClientTask) -> P.Params:
        """The silo's model as the server holds it."""
        return server_state["models"][task.client_id]
