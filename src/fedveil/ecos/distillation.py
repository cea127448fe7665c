"""Adaptive model compression by distillation: ECOS's use case 2 (spec 000 part 2, B.6 Case 2,
Table 5.3; Hinton, Vinyals & Dean 2015).

A large teacher is trained once on all the cloud's labelled open-source data
(:func:`train_teacher`, plain supervised training with
:func:`~fedveil.ecos.cloud_training.train_classifier`); a small student, the model the
low-power client will run, is then trained on the selected samples only (ECOS, K-Center or
Random) with the loss of B.6,

``L = kd_weight * T^2 * KL(softmax(z_t / T) || softmax(z_s / T)) + (1 - kd_weight) * CE(z_s, y)``

(:class:`DistillationLoss`), ``z_t`` the teacher's logits, ``z_s`` the student's, ``y`` the
true labels of the selected samples, with B.6's ``kd_weight = 0.1`` and ``T = 10``.

Decisions:

* The teacher is fixed while the student trains, so its logits are computed once, in
  evaluation mode (:func:`fedveil.models.functional.forward`), and carried as the per-row
  group ``"teacher_logits"`` of the training data: no second network in the loop.  The
  student is trained by ONE :meth:`fedveil.training.local.LocalTrainer.train` call whose
  ``objective`` is :class:`DistillationLoss`; batches come from the ``ecos/cloud-train``
  stream and the student's weights from :func:`~fedveil.ecos.cloud_training.initial_model`,
  exactly as in :func:`~fedveil.ecos.cloud_training.train_classifier`, so ``kd_weight = 0`` reproduces
  plain supervised training of the same model on the same rows.
* The KL term is multiplied by ``T^2`` (Hinton et al.'s scaling).  The gradient of the
  soft-target term with respect to the student's logits is ``(p_s^T - p_t^T) / T``; its
  size shrinks as ``1 / T^2`` once the logits are small next to ``T`` (Hinton et al.,
  Sec. 2.1), so without the factor the KD term of B.6 would enter at T = 10 about a hundred
  times weaker than its 0.1 weight says.  ``T^2`` keeps the two terms' relative weight
  independent of ``T``; it is also the form of the common PyTorch KD recipe that B.6's
  ``0.1 L_KD + 0.9 L_CE``, ``T = 10`` reads like.
* Both terms are per-row means (KL summed over classes, then averaged over rows), so the
  loss of a batch of one is that row's loss: ``per_example_ok`` stays True.
* Scale-downs (B.6): no linear-head warm-up (30 epochs) and no 500-epoch fine-tune of an
  ImageNet-pretrained ResNet18; the student is a small zoo model trained from scratch for
  ``sgd.epochs`` passes over the selection.  An empty selection trains nothing (the initial
  student, as ``train_classifier`` does).
"""
from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Mapping
from typing import Any

import torch
import torch.nn.functional as F

from ..data.arrays import ArrayDataset
from ..models.functional import forward, model_state
from ..privacy import checks
from ..seeding import torch_generator
from ..training.local import LocalTrainer, task_loss
from ..training.request import Batch, Objective
from .cloud_training import CloudModel, CloudSGD, initial_model, train_classifier

__all__ = ["TEACHER_LOGITS", "DistillationLoss", "distill", "teacher_logits", "train_teacher"]

#: The per-row group holding the fixed teacher's logits (``N x num_classes``).
TEACHER_LOGITS = "teacher_logits"


def _check_kd(kd_weight: Any, temperature: Any) -> tuple[float, float]:
    w = checks.real("kd_weight", kd_weight)
    if not 0.0 <= w <= 1.0:
        raise ValueError(f"kd_weight must be in [0, 1]; got {kd_weight!r}.")
    t = checks.real("temperature", temperature)
    if not (t > 0.0 and math.isfinite(t)):
        raise ValueError(f"temperature must be a positive finite number; got {temperature!r}.")
    return w, t


@dataclasses.dataclass(frozen=True)
class DistillationLoss(Objective):
    """B.6 Case 2's loss of a batch: ``kd_weight * T^2 * KL(p_t || p_s) + (1 - kd_weight) * CE``
    with ``p = softmax(logits / T)``; the teacher's logits are the batch's per-row group
    ``key`` (see the module docstring for the ``T^2`` factor)."""

    kd_weight: float = 0.1
    temperature: float = 10.0
    key: str = TEACHER_LOGITS

    def __post_init__(self) -> None:
        w, t = _check_kd(self.kd_weight, self.temperature)
        object.__setattr__(self, "kd_weight", w)
        object.__setattr__(self, "temperature", t)

    def mean(self, out: torch.Tensor, batch: Batch) -> torch.Tensor:
        """The batch mean of ``kd_weight T^2 KL(teacher || student, at T) + (1 - kd_weight) CE`` (the module's loss)."""
        teacher = batch.groups.get(self.key)
        if teacher is None:
            raise ValueError(f"the batch has no {self.key!r} group: precompute the teacher's logits (see distill).")
        if teacher.shape != out.shape:
            raise ValueError(f"teacher logits of shape {tuple(teacher.shape)} do not match the student's "
                             f"{tuple(out.shape)}.")
        t = self.temperature
        ce = F.cross_entropy(out, batch.y)
        if self.kd_weight == 0.0:
            return ce
        log_student = F.log_softmax(out / t, dim=1)
        log_teacher = F.log_softmax(teacher.to(out.dtype) / t, dim=1)
        kl = (log_teacher.exp() * (log_teacher - log_student)).sum(dim=1).mean()
        return self.kd_weight * t * t * kl + (1.0 - self.kd_weight) * ce


def teacher_logits(teacher: CloudModel, x: torch.Tensor, batch_size: int = 1024) -> torch.Tensor:
    """The fixed ``teacher``'s logits of ``x`` (evaluation mode, no gradient), ``N x classes``."""
    if not isinstance(teacher, CloudModel):
        raise ValueError(f"teacher must be a trained CloudModel; got {type(teacher).__name__}.")
    batch_size = checks.integer("batch_size", batch_size, minimum=1)
    with torch.no_grad():
        parts = [forward(teacher.model, teacher.params, x[i : i + batch_size]) for i in range(0, len(x), batch_size)]
    return torch.cat(parts).detach() if parts else torch.zeros(0)


def train_teacher(
    data: ArrayDataset, num_classes: int, model: str, model_options: Mapping[str, Any], sgd: CloudSGD, seed: int
) -> CloudModel:
    """B.6 Case 2: the teacher, trained with cross-entropy on all the cloud's labelled data
    (:func:`~fedveil.ecos.cloud_training.train_classifier`)."""
    return train_classifier(data, num_classes, model, model_options, sgd, seed)


def distill(
    selected: ArrayDataset,
    teacher: CloudModel,
    num_classes: int,
    model: str,
    model_options: Mapping[str, Any],
    sgd: CloudSGD,
    seed: int,
    kd_weight: float = 0.1,
    temperature: float = 10.0,
) -> CloudModel:
    """B.6 Case 2: train the student, zoo model ``model`` (``model_options``), on the labelled
    ``selected`` rows only with :class:`DistillationLoss` against the fixed ``teacher``'s
    logits, in one :meth:`LocalTrainer.train` call of ``sgd.epochs`` passes."""
    if not isinstance(selected, ArrayDataset):
        raise ValueError(f"selected must be an ArrayDataset; got {type(selected).__name__}.")
    if not isinstance(teacher, CloudModel):
        raise ValueError(f"teacher must be a trained CloudModel; got {type(teacher).__name__}.")
    if not isinstance(sgd, CloudSGD):
        raise ValueError(f"sgd must be CloudSGD; got {type(sgd).__name__}.")
    num_classes = checks.integer("num_classes", num_classes, minimum=2)
    seed = checks.integer("seed", seed)
    objective = DistillationLoss(*_check_kd(kd_weight, temperature))
    net = initial_model(tuple(selected.x.shape[1:]), num_classes, model, model_options, seed)
    params = model_state(net)
    if len(selected) == 0:
        return CloudModel(net, params, 0.0, float("nan"))
    start = time.perf_counter()
    logits = teacher_logits(teacher, selected.x)
    if logits.shape != (len(selected), num_classes):
        raise ValueError(f"the teacher gives {tuple(logits.shape)} logits; the student needs {num_classes} classes.")
    data = ArrayDataset(selected.x, selected.y, {**selected.groups, objective.key: logits}, dict(selected.info))
    trainer = LocalTrainer(net, task_loss("classification"), sgd, total_rounds=1)
    params, stats = trainer.train(params, data, torch_generator(seed, "ecos/cloud-train"), 0, objective=objective)
    return CloudModel(net, params, time.perf_counter() - start, stats.loss)
