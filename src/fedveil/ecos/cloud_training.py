"""Cloud training on the selected samples: ECOS's use case 1, selective manual labelling
(spec 000 part 2, B.6 Case 1, Table 5.2), supervised part.

The cloud has the selected samples labelled by a third party and trains a classifier on
them with the runtime's own trainer (:class:`fedveil.training.local.LocalTrainer`, one call
of ``epochs`` passes), from a model built under a fixed seed; :func:`accuracy` scores it on
the client's test rows.

Decisions and scale-downs:

* :func:`train_classifier` is plain supervised SGD on the labelled selection;
  :func:`fedveil.ecos.fixmatch.train_fixmatch` adds FixMatch's unlabelled cloud term
  (coefficient 0.1) through the same trainer, from the same :func:`initial_model`.
* Every method is trained with the same :class:`CloudSGD` (B.6: SGD, momentum 0.9, weight
  decay 5e-4; lr and epochs at CPU scale) and the same initial model for a given seed.
* An empty selection (ECOS selects nothing when no noisy score is positive) trains nothing:
  the cloud's model is its initial state.
"""
from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from ..data.arrays import ArrayDataset
from ..metrics import build_metrics
from ..models import build_model
from ..models.functional import forward, model_state
from ..params import Params
from ..privacy import checks
from ..seeding import derive_seed, torch_generator
from ..training.local import LocalTrainer, task_loss

__all__ = ["CloudModel", "CloudSGD", "LR_SCHEDULES", "accuracy", "initial_model", "train_classifier"]

#: The trainer's learning-rate schedules (:meth:`LocalTrainer.lr_at`); one training is its round 0.
LR_SCHEDULES = ("constant", "step", "exponential", "cosine", "dann")


@dataclasses.dataclass(frozen=True)
class CloudSGD:
    """The cloud's SGD settings (B.6: momentum 0.9, weight decay 5e-4), in the trainer's
    :class:`~fedveil.training.local.SGDSettings` shape; ``batch_size`` 0 is the full batch."""

    epochs: int = 30
    batch_size: int = 32
    lr: float = 0.05
    momentum: float = 0.9
    weight_decay: float = 5e-4
    steps: int | None = None
    lr_schedule: str = "constant"
    lr_decay: float = 1.0
    lr_step_rounds: int = 1

    def __post_init__(self) -> None:
        object.__setattr__(self, "epochs", checks.integer("epochs", self.epochs, minimum=1))
        object.__setattr__(self, "batch_size", checks.integer("batch_size", self.batch_size))
        object.__setattr__(self, "lr", checks.positive("lr", self.lr))
        if not 0.0 <= checks.real("momentum", self.momentum) < 1.0:
            raise ValueError(f"momentum must be in [0, 1); got {self.momentum!r}.")
        object.__setattr__(self, "weight_decay", checks.positive("weight_decay", self.weight_decay, allow_zero=True))
        if self.steps is not None:
            object.__setattr__(self, "steps", checks.integer("steps", self.steps, minimum=1))
        object.__setattr__(self, "lr_schedule", checks.one_of("lr_schedule", self.lr_schedule, LR_SCHEDULES))
        object.__setattr__(self, "lr_decay", checks.positive("lr_decay", self.lr_decay))
        object.__setattr__(self, "lr_step_rounds", checks.integer("lr_step_rounds", self.lr_step_rounds, minimum=1))


@dataclasses.dataclass(eq=False)
class CloudModel:
    """A trained classifier: the module, its state, the training seconds and mean training loss."""

    model: nn.Module
    params: Params
    seconds: float
    loss: float


def initial_model(
    input_shape: tuple[int, ...], num_classes: int, model: str, model_options: Mapping[str, Any], seed: int
) -> nn.Module:
    """Zoo model ``model`` (``model_options``) for ``input_shape`` rows, its weights drawn under
    the ``ecos/model`` stream of ``seed`` (the global torch RNG is left as it was): every
    cloud training of a seed (supervised, FixMatch) starts from the same weights."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(derive_seed(seed, "ecos/model"))
        return build_model(model, tuple(input_shape), num_classes, **dict(model_options))


def train_classifier(
    data: ArrayDataset,
    num_classes: int,
    model: str,
    model_options: Mapping[str, Any],
    sgd: CloudSGD,
    seed: int,
) -> CloudModel:
    """B.6 Case 1: train zoo model ``model`` (``model_options``) on the labelled ``data`` with
    cross-entropy, one :meth:`LocalTrainer.train` call of ``sgd.epochs`` passes.  The model
    is built under the ``ecos/model`` stream of ``seed`` and the batches come from
    ``ecos/cloud-train``, so the same seed gives every method the same start."""
    if not isinstance(data, ArrayDataset):
        raise ValueError(f"data must be an ArrayDataset; got {type(data).__name__}.")
    if not isinstance(sgd, CloudSGD):
        raise ValueError(f"sgd must be CloudSGD; got {type(sgd).__name__}.")
    num_classes = checks.integer("num_classes", num_classes, minimum=2)
    seed = checks.integer("seed", seed)
    net = initial_model(tuple(data.x.shape[1:]), num_classes, model, model_options, seed)
    params = model_state(net)
    if len(data) == 0:
        return CloudModel(net, params, 0.0, float("nan"))
    trainer = LocalTrainer(net, task_loss("classification"), sgd, total_rounds=1)
    start = time.perf_counter()
    params, stats = trainer.train(params, data, torch_generator(seed, "ecos/cloud-train"), 0)
    return CloudModel(net, params, time.perf_counter() - start, stats.loss)


def accuracy(model: nn.Module, params: Params, data: ArrayDataset, batch_size: int = 1024) -> float:
    """Share of ``data``'s rows whose arg-max logit is the label, by :func:`forward` in
    evaluation mode on chunks of ``batch_size`` rows."""
    if not isinstance(data, ArrayDataset) or len(data) == 0:
        raise ValueError("accuracy needs a non-empty ArrayDataset.")
    batch_size = checks.integer("batch_size", batch_size, minimum=1)
    (metric,) = build_metrics(["accuracy"], "classification")
    with torch.no_grad():
        for start in range(0, len(data), batch_size):
            chunk = ArrayDataset(data.x[start : start + batch_size], data.y[start : start + batch_size])
            metric.update(forward(model, params, chunk.x), chunk)
    return metric.compute()["accuracy"]
