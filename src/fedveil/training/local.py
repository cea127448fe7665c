"""Local training on one client: mini-batch SGD with momentum, weight decay and lr schedules.

The trainer is functional: it takes a model state (parameters and buffers) and returns a
new one, so the same code serves every algorithm (a ``grad_hook`` adds FedProx's proximal
term, SCAFFOLD's control variates, ...) and every executor. What a training does beyond
plain SGD on the trainer's loss (another model variant, a whole-batch objective, a
parameter mask, private and public rows) is said by its :class:`TrainRequest`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Iterator, Protocol

import torch
import torch.nn.functional as F
from torch import nn

from ..data.arrays import ArrayDataset
from ..engine.grad_terms import AffineGradTerm
from ..models.functional import buffer_names, forward, parameter_names
from ..params import Params
from ..privacy.dp_sgd import ExampleDP, check_model_for_dp
from ..privacy.randomness import permutation
from .private_step import client_private_gradient
from .request import Batch, GradHook, Objective, TaskLoss, TrainRequest


class SGDSettings(Protocol):
    """What the trainer reads from its configuration (the run's ``[client]`` section)."""

    epochs: int
    steps: int | None
    batch_size: int  # 0 = full batch
    lr: float
    momentum: float
    weight_decay: float
    lr_schedule: str  # constant | step | exponential | cosine | dann
    lr_decay: float
    lr_step_rounds: int


CLASSIFICATION_LOSSES = ("cross_entropy", "masked_cross_entropy", "hinge")
REGRESSION_LOSSES = ("mse", "half_mse")


def multiclass_hinge(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Weston-Watkins SVM loss, mean over the batch of sum_{j != y} max(0, 1 - f_y + f_j);
    with two classes it is the binary hinge max(0, 1 - m) on the margin m = f_y - f_other."""
    true = out.gather(1, y.view(-1, 1))
    margins = (1.0 - true + out).clamp(min=0.0)
    return (margins.sum(1) - 1.0).mean()  # the j = y term contributes exactly 1


def masked_cross_entropy(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """HeteroFL's local masked cross-entropy (Diao et al. 2021; Split-Mix's class non-IID
    loss, spec 000 part 2 §A.6): logits of the classes absent from the batch's labels are
    multiplied by 0 (not set to -inf), then cross-entropy. It couples the rows of a batch."""
    present = torch.zeros(out.shape[-1], dtype=out.dtype, device=out.device).index_fill(0, y, 1.0)
    return F.cross_entropy(out * present, y)


masked_cross_entropy.couples_batch = True  # read by TaskLoss / PerBaseLoss: no per-example losses


def task_loss(task: str, name: str = "auto") -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """The batch-mean training loss ``name`` for ``task`` ("auto": cross-entropy for
    classification, mean squared error for regression)."""
    if task not in ("classification", "regression"):
        raise ValueError(f"unknown task '{task}'")
    if name == "auto":
        name = "cross_entropy" if task == "classification" else "mse"
    allowed = CLASSIFICATION_LOSSES if task == "classification" else REGRESSION_LOSSES
    if name not in allowed:
        raise ValueError(f"loss '{name}' does not fit a {task} task; choose one of {', '.join(allowed)}")
    if name == "cross_entropy":
        return F.cross_entropy
    if name == "masked_cross_entropy":
        return masked_cross_entropy
    if name == "hinge":
        return multiclass_hinge
    if name == "mse":
        return lambda out, y: F.mse_loss(out.reshape(y.shape), y)
    return lambda out, y: 0.5 * F.mse_loss(out.reshape(y.shape), y)


def is_clipped_term(hook: GradHook | None) -> bool:
    """Whether ``hook`` belongs inside DP-SGD's per-example clipping (see :class:`AffineGradTerm`)."""
    return isinstance(hook, AffineGradTerm) and hook.clipped


@dataclass
class LocalStats:
    """What one local training reports besides the new parameters."""

    loss: float  # mean training loss over the steps taken
    steps: int
    examples: int  # examples processed (steps x batch, counting repeats)


@dataclass
class LocalTrainer:
    """A client's local training: SGD (with momentum, weight decay and the configured learning
    rate schedule) or, with an :class:`~fedveil.privacy.dp_sgd.ExampleDP`, DP-SGD, for the
    requested steps or epochs over its rows, on the stateless ``model`` with the parameters a
    request carries. One trainer serves every client; the executors call :meth:`train`."""

    model: nn.Module
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    config: SGDSettings
    total_rounds: int

    def lr_at(self, round_idx: int) -> float:
        """Learning rate of round ``round_idx`` (0-based) under the configured schedule."""
        c = self.config
        if c.lr_schedule == "constant":
            return c.lr
        if c.lr_schedule == "step":
            return c.lr * c.lr_decay ** (round_idx // c.lr_step_rounds)
        if c.lr_schedule == "exponential":
            return c.lr * c.lr_decay**round_idx
        if c.lr_schedule == "dann":  # DANN / FADE (spec 004 §1.10), per round: lr (1 + 10 t / T)^-0.75
            return c.lr * (1 + 10 * round_idx / self.total_rounds) ** -0.75
        return 0.5 * c.lr * (1 + math.cos(math.pi * round_idx / self.total_rounds))  # cosine

    def num_steps(self, num_rows: int, dp: ExampleDP | None = None) -> int:
        """Local steps per round: ``steps`` if set, else ``epochs`` passes over the rows
        (shuffled DP-SGD drops the last partial batch, so an epoch is ``n // B`` steps)."""
        if self.config.steps is not None:
            return self.config.steps
        batch = self._batch(num_rows)
        if dp is not None and dp.sampling == "shuffle":
            return self.config.epochs * (num_rows // batch)
        return self.config.epochs * math.ceil(num_rows / batch)

    def _batch(self, num_rows: int) -> int:
        b = self.config.batch_size
        return num_rows if b == 0 or b >= num_rows else b

    def batch_indices(
        self, num_rows: int, generator: torch.Generator, device: torch.device | None = None
    ) -> Iterator[torch.Tensor]:
        """Row indices of each step: shuffled epochs, the last batch of an epoch may be short."""
        if num_rows == 0:
            raise ValueError("cannot train on a client with no training rows")
        batch, remaining = self._batch(num_rows), self.num_steps(num_rows)
        while remaining > 0:
            order = permutation(num_rows, generator, device)
            for start in range(0, num_rows, batch):
                yield order[start : start + batch]
                remaining -= 1
                if remaining == 0:
                    return

    def objective_of(self, request: TrainRequest) -> Objective:
        """The request's objective, or the task loss on the model's output."""
        return request.objective if request.objective is not None else TaskLoss(self.loss_fn)

    def loss_and_grad(
        self, params: Params, batch: Batch, model: nn.Module | None = None,
        objective: Objective | None = None, buffers: Params | None = None,
    ) -> tuple[float, Params]:
        """Objective value on the batch and its gradient with respect to ``params``
        (``buffers``, e.g. BatchNorm running statistics, are updated in place)."""
        model = self.model if model is None else model
        objective = TaskLoss(self.loss_fn) if objective is None else objective
        leaves = {k: v.detach().requires_grad_(True) for k, v in params.items()}
        out = forward(model, {**leaves, **(buffers or {})}, batch.x, train=True, groups=batch.groups)
        loss = objective.mean(out, batch)
        grads = torch.autograd.grad(loss, list(leaves.values()), allow_unused=True)
        return float(loss.detach()), {k: torch.zeros_like(v) if g is None else g for (k, v), g in zip(leaves.items(), grads)}

    def train(
        self,
        params: Params,
        data: ArrayDataset,
        generator: torch.Generator,
        round_idx: int,
        grad_hook: GradHook | None = None,
        dp: ExampleDP | None = None,
        **request,
    ) -> tuple[Params, LocalStats]:
        """Run local SGD on ``data`` from ``params``; the keyword arguments are the other
        fields of :class:`TrainRequest` (``model``, ``objective``, ``param_mask``, ``private_rows``, ``input_fn``)."""
        return self.run(TrainRequest(params, data, generator, round_idx, grad_hook, dp, **request))

    def run(self, request: TrainRequest) -> tuple[Params, LocalStats]:
        """Run one local training (PyTorch semantics: g += wd*w; buf = m*buf + g; w -= lr*buf).

        With ``dp`` each step's gradient is the DP-SGD estimate (clipped per-example
        gradients of the private rows, Gaussian noise, public rows unclipped, divided by
        the batch size); the algorithm's ``grad_hook``, weight decay and momentum then act
        on it as post-processing, except a ``clipped`` :class:`AffineGradTerm`, which is
        added to every per-example gradient before clipping. ``param_mask`` zeroes the
        masked coordinates' gradient (noise included) before momentum, so they stay put.
        """
        model = self.model if request.model is None else request.model
        objective, dp, grad_hook, mask = self.objective_of(request), request.dp, request.grad_hook, request.param_mask
        lr, c = self.lr_at(request.round_idx), self.config
        in_clip = dp is not None and is_clipped_term(grad_hook)
        if dp is not None:
            check_model_for_dp(model)
            dp.begin_training()
        names = parameter_names(model)
        w = {k: request.params[k].detach().clone() for k in names}
        buffers = {k: request.params[k].detach().clone() for k in buffer_names(model)}
        momentum: Params | None = None
        losses, examples = [], 0
        for idx, private in self.step_rows(request):
            batch = Batch.of(request.data, idx)
            if request.input_fn is not None:
                batch = request.input_fn({**w, **buffers}, batch, request.generator)
            if dp is None:
                loss, g = self.loss_and_grad(w, batch, model, objective, buffers)
            else:
                step = client_private_gradient(
                    model, w, batch, objective, dp, dp.source(request.generator), dp.batch_size + len(idx) - private,
                    private, grad_hook.value if in_clip else None, buffers,
                )
                loss, g = step.loss, step.grad
                dp.count_step()
            if grad_hook is not None and not in_clip:
                g = grad_hook(w, g)
            if c.weight_decay:
                g = {k: g[k] + c.weight_decay * w[k] for k in w}
            if mask is not None:
                g = {k: g[k] * mask[k] if k in mask else g[k] for k in w}
            if c.momentum:
                momentum = g if momentum is None else {k: c.momentum * momentum[k] + g[k] for k in w}
                g = momentum
            w = {k: w[k] - lr * g[k] for k in w}
            losses.append(loss)
            examples += len(idx)
        seen = [x for x in losses if not math.isnan(x)]  # an empty Poisson batch has no loss
        mean_loss = sum(seen) / len(seen) if seen else float("nan")
        return {**w, **buffers}, LocalStats(loss=mean_loss, steps=len(losses), examples=examples)

    def step_rows(self, request: TrainRequest) -> Iterator[tuple[torch.Tensor, int]]:
        """Each step's row indices and how many of them (the first ones) are private.

        Steps are counted over the private rows ``[0, num_private)`` (all rows unless
        ``private_rows`` is set): shuffled epochs without DP, the DP sampler's batches under
        DP-SGD (only they are accounted). Public rows join each step by plain shuffled
        batches from the client's generator, in the same proportion:
        ``round(B * n_public / n_private)`` rows a step (at least 1).
        """
        dp, device = request.dp, request.data.x.device
        n_private = request.num_private
        if dp is None:
            private = self.batch_indices(n_private, request.generator, device)
            batch = self._batch(n_private)
        else:
            private = dp.batches(n_private, self.num_steps(n_private, dp), request.generator, device)
            batch = dp.batch_size
        if not request.num_public:
            for idx in private:
                yield idx, len(idx)
            return
        public = _shuffled(request.num_public, public_batch_size(batch, n_private, request.num_public), request.generator, device)
        for idx in private:
            yield torch.cat([idx, next(public) + n_private]), len(idx)


def public_batch_size(private_batch: int, n_private: int, n_public: int) -> int:
    """Public rows added to each DP-SGD step: the private batch's share of the private rows."""
    return min(n_public, max(1, round(private_batch * n_public / n_private)))


def _shuffled(n: int, batch: int, generator: torch.Generator, device: torch.device) -> Iterator[torch.Tensor]:
    """Endless shuffled batches of ``batch`` rows (a new permutation every epoch, last partial dropped)."""
    while True:
        order = permutation(n, generator, device)
        for start in range(0, n - batch + 1, batch):
            yield order[start : start + batch]
