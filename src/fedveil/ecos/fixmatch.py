"""FixMatch cloud training: ECOS's use case 1, selective manual labelling, semi-supervised part
(spec 000 part 2, B.6 Case 1, Table 5.2; FixMatch, Sohn et al. NeurIPS 2020).

The cloud has the ECOS-selected samples labelled by a third party and the rest of its pool
unlabelled. It trains with FixMatch's loss ``L_s + lambda_u L_u``:

* ``L_s``: mean cross-entropy of the labelled rows, weakly augmented;
* ``L_u``: for each unlabelled row, the pseudo-label is the arg-max of the model's softmax on
  a weakly augmented copy (no gradient, evaluation mode); if that maximum probability is at
  least ``tau`` the row contributes the cross-entropy of its *strongly* augmented copy
  against the pseudo-label; ``L_u`` is the sum over the ``mu B`` unlabelled rows of the batch
  divided by ``mu B`` (FixMatch Eq. 4, unconfident rows count in the denominator).

Constants: ``lambda_u = 0.1`` (B.6's unlabelled-loss coefficient), ``tau = 0.95`` and
``mu = 7`` unlabelled rows per labelled row (the FixMatch paper's defaults; B.6 gives neither),
SGD with momentum 0.9 and weight decay 5e-4 (B.6, :class:`~fedveil.ecos.cloud_training.CloudSGD`).

There is no second training loop: the training is one call of the runtime's
:class:`~fedveil.training.local.LocalTrainer` (``sgd.epochs`` passes over the labelled rows)
whose :class:`~fedveil.training.request.TrainRequest` carries

* ``private_rows``: the labelled rows come first and drive the step count; the unlabelled
  rows follow and join each batch in proportion, ``round(B n_u / n_l) = mu B`` rows a step;
* ``input_fn`` (:class:`FixMatchInputs`): labelled rows -> weak copies with their labels,
  unlabelled rows -> strong copies with their pseudo-labels and a ``"confident"`` row flag;
* ``objective`` (:class:`FixMatchLoss`): ``L_s + lambda_u L_u`` on that batch.

Decisions and scale-downs:

* No EMA of the weights for evaluation (B.6: moving-average factor 0.9). The trainer has no
  per-step hook to keep a running average, and an EMA with factor 0.9 averages over about
  the last 10 steps, which at the end of training is close to the last iterate: the last
  iterate is returned.
* No frozen-backbone warm-up (B.6: train the last linear layer only for 30 epochs, then
  fine-tune end to end). That warm-up protects an ImageNet-pretrained backbone; none can be
  downloaded here, and every model starts from scratch (the same
  :func:`~fedveil.ecos.cloud_training.initial_model` as the supervised path for a seed).
* Augmentations are hand-written in torch (no torchvision), per row, all randomness from the
  step's generator. Weak: translation by up to 2 pixels in each direction, by zero-padding
  and cropping (images are dark-background digits; a zero border keeps an interior digit's
  pixel mass), and no horizontal flip (flipped digits are other symbols). Strong, a fixed
  RandAugment stand-in: weak, then contrast and brightness jitter, Gaussian pixel noise and
  a Cutout square of side ``round(H / 4)`` filled with grey 0.5 (FixMatch's Cutout fills
  grey), clamped to [0, 1].
* Only ``min(n_unlabelled, mu n_l)`` unlabelled rows, drawn once under the
  ``ecos/fixmatch-unlabelled`` stream of the seed, enter the training: with ``epochs``
  counted over the labelled rows each of them is then seen about once an epoch, as in the
  paper's ``mu B`` unlabelled rows a step. With fewer unlabelled rows the per-step share is
  smaller (``round(B n_u / n_l)``).
* An empty labelled set trains nothing (the initial model, as
  :func:`~fedveil.ecos.cloud_training.train_classifier`); an empty unlabelled set is plain
  supervised training on weak copies, through the same call.
"""
from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ..data.arrays import ArrayDataset
from ..models.functional import forward, model_state
from ..params import Params
from ..privacy import checks
from ..privacy.randomness import permutation
from ..seeding import torch_generator
from ..training.local import LocalTrainer, task_loss
from ..training.request import Batch, Objective
from .cloud_training import CloudModel, CloudSGD, initial_model

__all__ = [
    "CONFIDENT", "FixMatchInputs", "FixMatchLoss", "FixMatchSettings", "LABELLED",
    "strong_augment", "train_fixmatch", "weak_augment",
]

#: Row flag (0/1) of the training data and of each batch: the row has a true label.
LABELLED = "labelled"
#: Row flag (0/1) added by :class:`FixMatchInputs`: the unlabelled row's pseudo-label passes the threshold.
CONFIDENT = "confident"
#: Grey value of the Cutout square (FixMatch fills Cutout with grey).
CUTOUT_FILL = 0.5


def _images(x: torch.Tensor) -> torch.Tensor:
    if not isinstance(x, torch.Tensor) or x.dim() != 4 or not x.is_floating_point():
        raise ValueError(f"augmentations take float images N x C x H x W; got {getattr(x, 'shape', type(x).__name__)}.")
    return x


def _uniform(shape: tuple[int, ...], generator: torch.Generator, like: torch.Tensor) -> torch.Tensor:
    """Uniforms in [0, 1) drawn where ``generator`` lives, moved to ``like``'s device and dtype."""
    return torch.rand(shape, generator=generator, device=generator.device).to(like.device, like.dtype)


def _randint(high: int, shape: tuple[int, ...], generator: torch.Generator, device: torch.device) -> torch.Tensor:
    return torch.randint(high, shape, generator=generator, device=generator.device).to(device)


def weak_augment(x: torch.Tensor, generator: torch.Generator, max_shift: int = 2) -> torch.Tensor:
    """FixMatch's weak augmentation for digits: each row translated by ``(dy, dx)``, each drawn
    uniformly from ``{-max_shift, ..., max_shift}``, by zero-padding and cropping (pixels
    shifted out are lost, the uncovered border is 0); no flip."""
    x = _images(x)
    max_shift = checks.integer("max_shift", max_shift)
    n, c, h, w = x.shape
    shift = _randint(2 * max_shift + 1, (n, 2), generator, x.device) - max_shift
    if max_shift == 0 or n == 0:
        return x.clone()
    padded = F.pad(x, (max_shift, max_shift, max_shift, max_shift))
    # output pixel (i, j) is input pixel (i - dy, j - dx): padded index i + max_shift - dy
    rows = torch.arange(h, device=x.device).view(1, h) + max_shift - shift[:, :1]
    cols = torch.arange(w, device=x.device).view(1, w) + max_shift - shift[:, 1:]
    n_idx = torch.arange(n, device=x.device).view(n, 1, 1, 1)
    c_idx = torch.arange(c, device=x.device).view(1, c, 1, 1)
    return padded[n_idx, c_idx, rows.view(n, 1, h, 1), cols.view(n, 1, 1, w)]


def strong_augment(
    x: torch.Tensor, generator: torch.Generator, *, brightness: float = 0.2, contrast: float = 0.3,
    noise: float = 0.05, cutout: float = 0.25,
) -> torch.Tensor:
    """FixMatch's strong augmentation, a fixed stand-in for RandAugment + Cutout: each row is
    :func:`weak_augment`-ed, its contrast scaled about its mean by ``U(1 - contrast, 1 + contrast)``,
    shifted by ``U(-brightness, brightness)``, given ``N(0, noise^2)`` pixel noise and a grey
    Cutout square of side ``max(1, round(cutout * H))`` (``cutout * W`` wide) at a uniform
    position inside the image, then clamped to [0, 1]."""
    out = weak_augment(x, generator)
    n, c, h, w = out.shape
    scale = 1 + contrast * (2 * _uniform((n, 1, 1, 1), generator, out) - 1)
    shift = brightness * (2 * _uniform((n, 1, 1, 1), generator, out) - 1)
    mean = out.mean(dim=(1, 2, 3), keepdim=True)
    out = mean + scale * (out - mean) + shift
    out = out + noise * torch.randn(out.shape, generator=generator, device=generator.device).to(out.device, out.dtype)
    side_h, side_w = max(1, round(cutout * h)), max(1, round(cutout * w))
    top = _randint(h - side_h + 1, (n, 1, 1), generator, out.device)
    left = _randint(w - side_w + 1, (n, 1, 1), generator, out.device)
    i = torch.arange(h, device=out.device).view(1, h, 1)
    j = torch.arange(w, device=out.device).view(1, 1, w)
    square = (i >= top) & (i < top + side_h) & (j >= left) & (j < left + side_w)  # (n, h, w)
    out = torch.where(square.unsqueeze(1), torch.full_like(out, CUTOUT_FILL), out)
    return out.clamp(0.0, 1.0)


@dataclasses.dataclass(frozen=True)
class FixMatchSettings:
    """FixMatch's constants: ``unlabeled_weight`` lambda_u (B.6: 0.1), ``threshold`` tau on the
    pseudo-label's probability and ``unlabeled_ratio`` mu, unlabelled rows per labelled row
    (the FixMatch paper: 0.95 and 7)."""

    unlabeled_weight: float = 0.1
    threshold: float = 0.95
    unlabeled_ratio: int = 7

    def __post_init__(self) -> None:
        weight = checks.positive("unlabeled_weight", self.unlabeled_weight, allow_zero=True)
        object.__setattr__(self, "unlabeled_weight", weight)
        object.__setattr__(self, "threshold", checks.fraction("threshold", self.threshold, zero=True, one=True))
        object.__setattr__(self, "unlabeled_ratio", checks.integer("unlabeled_ratio", self.unlabeled_ratio, minimum=1))


def _flag(batch: Batch, name: str) -> torch.Tensor:
    if name not in batch.groups:
        raise ValueError(f"a FixMatch batch needs the per-row group '{name}'; it has {sorted(batch.groups)}.")
    return batch.groups[name] != 0


@dataclasses.dataclass(frozen=True)
class FixMatchInputs:
    """``TrainRequest.input_fn``: rows flagged ``"labelled"`` become weak copies with their
    labels; every other row becomes its strong copy labelled by the arg-max of ``model``'s
    softmax (current state, evaluation mode, no gradient) on an independent weak copy, with
    the group ``"confident"`` = 1 where that probability is ``>= threshold`` (0 on labelled
    rows). Each output row depends only on its own input row, its random draws and the state."""

    model: nn.Module
    threshold: float = 0.95

    def __post_init__(self) -> None:
        object.__setattr__(self, "threshold", checks.fraction("threshold", self.threshold, zero=True, one=True))

    def __call__(self, state: Params, batch: Batch, generator: torch.Generator) -> Batch:
        labelled = _flag(batch, LABELLED)
        x = weak_augment(batch.x, generator)
        y = batch.y.clone()
        confident = torch.zeros(len(y), dtype=batch.x.dtype, device=batch.x.device)
        unlabelled = (~labelled).nonzero().flatten()
        if len(unlabelled):
            rows = batch.x[unlabelled]
            groups = {k: v[unlabelled] for k, v in batch.groups.items()}
            with torch.no_grad():
                weak = weak_augment(rows, generator)
                probs = forward(self.model, {k: v.detach() for k, v in state.items()}, weak, train=False,
                                groups=groups).softmax(dim=-1)
                top, pseudo = probs.max(dim=-1)
            x[unlabelled] = strong_augment(rows, generator)
            y[unlabelled] = pseudo.to(y.dtype)
            confident[unlabelled] = (top >= self.threshold).to(confident.dtype)
        return Batch(x, y, {**batch.groups, CONFIDENT: confident})


@dataclasses.dataclass(frozen=True)
class FixMatchLoss(Objective):
    """FixMatch's ``L_s + lambda_u L_u`` on a :class:`FixMatchInputs` batch: the mean
    cross-entropy of the ``"labelled"`` rows plus ``unlabeled_weight`` times the sum of
    ``confident * CE`` over the other rows divided by their number; a term without rows is 0.
    ``L_u``'s denominator is the batch's number of unlabelled rows, which couples the rows."""

    unlabeled_weight: float = 0.1
    per_example_ok = False  # class attribute, not a field: L_u divides by the batch's unlabelled count

    def __post_init__(self) -> None:
        weight = checks.positive("unlabeled_weight", self.unlabeled_weight, allow_zero=True)
        object.__setattr__(self, "unlabeled_weight", weight)

    def mean(self, out: torch.Tensor, batch: Batch) -> torch.Tensor:
        """FixMatch's batch loss ``L_s + unlabeled_weight * L_u``: labelled rows' CE, confident pseudo-labels' CE."""
        labelled = _flag(batch, LABELLED).to(out.dtype)
        confident = _flag(batch, CONFIDENT).to(out.dtype)
        ce = F.cross_entropy(out, batch.y.clamp(min=0), reduction="none")  # unlabelled y of raw data is -1
        unlabelled = 1 - labelled
        supervised = (labelled * ce).sum() / labelled.sum().clamp(min=1)
        consistency = (unlabelled * confident * ce).sum() / unlabelled.sum().clamp(min=1)
        return supervised + self.unlabeled_weight * consistency


def train_fixmatch(
    labelled: ArrayDataset,
    unlabelled_x: torch.Tensor,
    num_classes: int,
    model: str,
    model_options: Mapping[str, Any],
    sgd: CloudSGD,
    settings: FixMatchSettings,
    seed: int,
) -> CloudModel:
    """B.6 Case 1 with FixMatch: zoo model ``model`` (built as
    :func:`~fedveil.ecos.cloud_training.train_classifier` builds it for ``seed``) trained by
    one :meth:`LocalTrainer.train` call of ``sgd.epochs`` passes over the ``labelled`` rows,
    batch ``sgd.batch_size``, each step joined by ``mu`` times as many of the (at most
    ``mu * len(labelled)``, drawn under ``ecos/fixmatch-unlabelled``) ``unlabelled_x`` rows.
    The returned loss is the mean FixMatch objective over the steps."""
    if not isinstance(labelled, ArrayDataset):
        raise ValueError(f"labelled must be an ArrayDataset; got {type(labelled).__name__}.")
    if not isinstance(unlabelled_x, torch.Tensor):
        raise ValueError(f"unlabelled_x must be a tensor; got {type(unlabelled_x).__name__}.")
    if len(unlabelled_x) and tuple(unlabelled_x.shape[1:]) != tuple(labelled.x.shape[1:]):
        raise ValueError(
            f"unlabelled_x rows have shape {tuple(unlabelled_x.shape[1:])}, the labelled rows {tuple(labelled.x.shape[1:])}."
        )
    if not isinstance(sgd, CloudSGD):
        raise ValueError(f"sgd must be CloudSGD; got {type(sgd).__name__}.")
    if not isinstance(settings, FixMatchSettings):
        raise ValueError(f"settings must be FixMatchSettings; got {type(settings).__name__}.")
    num_classes = checks.integer("num_classes", num_classes, minimum=2)
    seed = checks.integer("seed", seed)
    net = initial_model(tuple(labelled.x.shape[1:]), num_classes, model, model_options, seed)
    params = model_state(net)
    n_l = len(labelled)
    if n_l == 0:
        return CloudModel(net, params, 0.0, float("nan"))
    n_u = min(len(unlabelled_x), settings.unlabeled_ratio * n_l)
    chosen = permutation(len(unlabelled_x), torch_generator(seed, "ecos/fixmatch-unlabelled"))[:n_u].sort().values
    pool = unlabelled_x[chosen.to(unlabelled_x.device)].to(labelled.x.device, labelled.x.dtype)
    device = labelled.x.device
    data = ArrayDataset(
        torch.cat([labelled.x, pool]),
        torch.cat([labelled.y, torch.full((n_u,), -1, dtype=labelled.y.dtype, device=labelled.y.device)]),
        {LABELLED: torch.cat([torch.ones(n_l, dtype=torch.long), torch.zeros(n_u, dtype=torch.long)]).to(device)},
        dict(labelled.info),
    )
    trainer = LocalTrainer(net, task_loss("classification"), sgd, total_rounds=1)
    start = time.perf_counter()
    params, stats = trainer.train(
        params, data, torch_generator(seed, "ecos/cloud-train"), 0, private_rows=n_l,
        objective=FixMatchLoss(settings.unlabeled_weight), input_fn=FixMatchInputs(net, settings.threshold),
    )
    return CloudModel(net, params, time.perf_counter() - start, stats.loss)
