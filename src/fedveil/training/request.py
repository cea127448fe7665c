"""What one local training is asked to do: the train request and the objective it minimises.

A method that needs more than "SGD on ``loss(model(x), y)``" widens the request, never
the loop (DESIGN idea 7). The serial trainer and its stacked twin read the same request:

* ``model``: the variant to train (a width, a sub-network, a second network such as a
  discriminator or a VAE); requests for different variants are stacked separately;
* ``objective``: the loss of a whole :class:`Batch` (inputs, targets, per-row groups such as
  a sensitive attribute or row weights), possibly several losses combined;
* ``param_mask``: 0/1 tensors (broadcastable to the parameter) of the coordinates that may
  move; masked coordinates get no update and, under DP-SGD, no noise;
* ``private_rows``: only the first ``private_rows`` rows of the data are the client's own
  (e.g. own rows followed by a public or shared pool): local steps are counted over them,
  the other rows join each batch in proportion, and DP-SGD samples, clips, counts and
  accounts only the own rows;
* ``input_fn``: ``(state, batch, generator) -> batch`` applied to each step's batch with
  the current model state before the forward, e.g. PGD adversarial pairs; it must map each
  row on its own (row i of the result depends on row i and the state only), so per-example
  losses stay per example under DP-SGD. Such requests are trained client by client.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, NamedTuple

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import vmap

from ..data.arrays import ArrayDataset
from ..params import Params
from ..privacy.dp_sgd import ExampleDP

GradHook = Callable[[Params, Params], Params]
InputFn = Callable[[Params, "Batch", torch.Generator], "Batch"]
LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


class Batch(NamedTuple):
    """The rows of one step: inputs, targets and every per-row group tensor of the data set.

    A named tuple, so ``torch.func.vmap`` slices it row by row for per-example gradients.
    """

    x: torch.Tensor
    y: torch.Tensor
    groups: dict[str, torch.Tensor]

    @classmethod
    def of(cls, data: ArrayDataset, index: torch.Tensor) -> "Batch":
        """The rows ``index`` of ``data``: inputs, targets and every group."""
        return cls(data.x[index], data.y[index], {k: v[index] for k, v in data.groups.items()})

    def unsqueeze(self, dim: int = 0) -> "Batch":
        """This single row as a batch of one (inside ``vmap``)."""
        return Batch(self.x.unsqueeze(dim), self.y.unsqueeze(dim), {k: v.unsqueeze(dim) for k, v in self.groups.items()})

    def rows(self, lo: int, hi: int) -> "Batch":
        """Rows ``lo:hi`` of this batch."""
        return Batch(self.x[lo:hi], self.y[lo:hi], {k: v[lo:hi] for k, v in self.groups.items()})


class Objective:
    """The loss of a batch. Subclasses implement :meth:`mean`, the batch-mean loss, and
    define it so that :meth:`mean` of a batch of one is that example's loss: DP-SGD and the
    stacked engine evaluate it example by example (:meth:`per_example`). An objective that
    couples the examples of a batch (a loss of batch statistics) sets ``per_example_ok =
    False``: it cannot be used under DP-SGD, and the stacked engine applies it client by
    client. Objectives are compared with ``==`` to group requests, so make them frozen
    dataclasses.
    """

    per_example_ok: bool = True

    def mean(self, out: Any, batch: Batch) -> torch.Tensor:
        """The batch-mean loss of the outputs ``out`` on ``batch`` (a scalar tensor)."""
        raise NotImplementedError

    def per_example(self, out: Any, batch: Batch) -> torch.Tensor:
        """Each example's loss, ``(N,)`` (by ``vmap`` of :meth:`mean` over single rows)."""
        if not self.per_example_ok:
            raise ValueError(f"objective {type(self).__name__} couples the examples of a batch: no per-example losses")

        def one(out_i, row: Batch) -> torch.Tensor:
            return self.mean(_unsqueeze(out_i), row.unsqueeze())

        return vmap(one)(out, batch)


def _unsqueeze(out: Any) -> Any:
    if isinstance(out, torch.Tensor):
        return out.unsqueeze(0)
    return type(out)(_unsqueeze(o) for o in out)  # tuple outputs of multi-head models


@dataclass(frozen=True)
class TaskLoss(Objective):
    """The trainer's ``loss(out, y)`` (cross-entropy, MSE, hinge, ...): the default objective."""

    loss_fn: LossFn

    @property
    def per_example_ok(self) -> bool:  # a loss marked ``couples_batch`` (masked cross-entropy) is not per example
        """False when ``loss_fn`` is marked ``couples_batch``."""
        return not getattr(self.loss_fn, "couples_batch", False)

    def mean(self, out: torch.Tensor, batch: Batch) -> torch.Tensor:
        """``loss_fn(out, batch.y)``."""
        return self.loss_fn(out, batch.y)

    def per_example(self, out: Any, batch: Batch) -> torch.Tensor:
        """Each example's loss: cross-entropy unreduced (the same numbers as the ``vmap`` of
        :meth:`mean`, without it), any other loss by :meth:`Objective.per_example`."""
        if self.loss_fn is F.cross_entropy:
            return F.cross_entropy(out, batch.y, reduction="none")
        return super().per_example(out, batch)


@dataclass
class TrainRequest:
    """The arguments of one local training (one :meth:`LocalTrainer.train` call).

    ``params`` is the model state: parameters, trained by SGD, and buffers (BatchNorm
    running statistics), updated by the forward; the result has the same keys.
    ``None`` for ``model`` / ``objective`` means the trainer's own.
    """

    params: Params
    data: ArrayDataset
    generator: torch.Generator
    round_idx: int
    grad_hook: GradHook | None = None
    dp: ExampleDP | None = None
    model: nn.Module | None = None
    objective: Objective | None = None
    param_mask: Params | None = None
    private_rows: int | None = None
    input_fn: InputFn | None = None

    def __post_init__(self) -> None:
        if self.private_rows is not None and not 0 < self.private_rows <= len(self.data):
            raise ValueError(f"private_rows must be in [1, {len(self.data)}] (the data's rows), got {self.private_rows}")
        if self.objective is not None and self.dp is not None and not self.objective.per_example_ok:
            raise ValueError(
                f"objective {type(self.objective).__name__} couples the examples of a batch, which per-example "
                "DP-SGD cannot bound; use an objective with per-example losses"
            )

    @property
    def num_private(self) -> int:
        """Rows DP-SGD samples from (all rows unless ``private_rows`` is set)."""
        return len(self.data) if self.private_rows is None else self.private_rows

    @property
    def num_public(self) -> int:
        """Rows after the first ``num_private`` (the public or shared pool; 0 unless ``private_rows`` is set)."""
        return len(self.data) - self.num_private


__all__ = ["Batch", "GradHook", "InputFn", "LossFn", "Objective", "TaskLoss", "TrainRequest"]
