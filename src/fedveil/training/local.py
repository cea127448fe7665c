"""Local training on one client: mini-batch SGD with momentum, weight decay and lr schedules.

The trainer is functional: it takes a parameter dict and returns a new one, so the
same code serves every algorithm (a ``grad_hook`` adds FedProx's proximal term,
SCAFFOLD's control variates, ...) and every executor.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Iterator, Protocol

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call

from ..data.arrays import ArrayDataset
from ..engine.grad_terms import AffineGradTerm
from ..params import Params
from ..privacy.dp_sgd import ExampleDP, private_gradient

GradHook = Callable[[Params, Params], Params]


class SGDSettings(Protocol):
    """What the trainer reads from its configuration (the run's ``[client]`` section)."""

    epochs: int
    steps: int | None
    batch_size: int  # 0 = full batch
    lr: float
    momentum: float
    weight_decay: float
    lr_schedule: str  # constant | step | exponential | cosine
    lr_decay: float
    lr_step_rounds: int


CLASSIFICATION_LOSSES = ("cross_entropy", "hinge")
REGRESSION_LOSSES = ("mse", "half_mse")


def multiclass_hinge(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Weston-Watkins SVM loss, mean over the batch of sum_{j != y} max(0, 1 - f_y + f_j);
    with two classes it is the binary hinge max(0, 1 - m) on the margin m = f_y - f_other."""
    true = out.gather(1, y.view(-1, 1))
    margins = (1.0 - true + out).clamp(min=0.0)
    return (margins.sum(1) - 1.0).mean()  # the j = y term contributes exactly 1


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
    loss: float  # mean training loss over the steps taken
    steps: int
    examples: int  # examples processed (steps x batch, counting repeats)


@dataclass
class LocalTrainer:
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

    def batch_indices(self, num_rows: int, generator: torch.Generator) -> Iterator[torch.Tensor]:
        """Row indices of each step: shuffled epochs, the last batch of an epoch may be short."""
        if num_rows == 0:
            raise ValueError("cannot train on a client with no training rows")
        batch, remaining = self._batch(num_rows), self.num_steps(num_rows)
        while remaining > 0:
            order = torch.randperm(num_rows, generator=generator)
            for start in range(0, num_rows, batch):
                yield order[start : start + batch]
                remaining -= 1
                if remaining == 0:
                    return

    def loss_and_grad(self, params: Params, x: torch.Tensor, y: torch.Tensor) -> tuple[float, Params]:
        """Mean loss on the batch and its gradient with respect to ``params``."""
        leaves = {k: v.detach().requires_grad_(True) for k, v in params.items()}
        loss = self.loss_fn(functional_call(self.model, leaves, (x,)), y)
        grads = torch.autograd.grad(loss, list(leaves.values()))
        return float(loss.detach()), dict(zip(leaves.keys(), grads))

    def train(
        self,
        params: Params,
        data: ArrayDataset,
        generator: torch.Generator,
        round_idx: int,
        grad_hook: GradHook | None = None,
        dp: ExampleDP | None = None,
    ) -> tuple[Params, LocalStats]:
        """Run local SGD (PyTorch semantics: g += wd*w; buf = m*buf + g; w -= lr*buf).

        With ``dp`` each step's gradient is the DP-SGD estimate (clipped per-example
        gradients, Gaussian noise, divided by the batch size); the algorithm's
        ``grad_hook``, weight decay and momentum then act on it as post-processing,
        except a ``clipped`` :class:`AffineGradTerm`, which is added to every
        per-example gradient before clipping.
        """
        lr, c = self.lr_at(round_idx), self.config
        in_clip = dp is not None and is_clipped_term(grad_hook)
        if dp is not None:
            dp.begin_training()
        w = {k: v.detach().clone() for k, v in params.items()}
        momentum: Params | None = None
        losses, examples = [], 0
        for idx in self._batches(len(data), generator, dp):
            if dp is None:
                loss, g = self.loss_and_grad(w, data.x[idx], data.y[idx])
            else:
                private = private_gradient(
                    self.model, w, data.x[idx], data.y[idx], self.loss_fn, clip=dp.clip,
                    noise_multiplier=dp.noise_multiplier, denominator=dp.batch_size, generator=dp.source(generator),
                    extra_grad=grad_hook.value if in_clip else None,
                )
                loss, g = private.loss, private.grad
                dp.count_step()
            if grad_hook is not None and not in_clip:
                g = grad_hook(w, g)
            if c.weight_decay:
                g = {k: g[k] + c.weight_decay * w[k] for k in w}
            if c.momentum:
                momentum = g if momentum is None else {k: c.momentum * momentum[k] + g[k] for k in w}
                g = momentum
            w = {k: w[k] - lr * g[k] for k in w}
            losses.append(loss)
            examples += len(idx)
        seen = [x for x in losses if not math.isnan(x)]  # an empty Poisson batch has no loss
        mean_loss = sum(seen) / len(seen) if seen else float("nan")
        return w, LocalStats(loss=mean_loss, steps=len(losses), examples=examples)

    def _batches(self, num_rows: int, generator: torch.Generator, dp: ExampleDP | None) -> Iterator[torch.Tensor]:
        if dp is None:
            return self.batch_indices(num_rows, generator)
        return dp.batches(num_rows, self.num_steps(num_rows, dp), generator)
