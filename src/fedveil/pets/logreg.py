"""DP-SGD logistic regression on neighbourhood vectors (spec 002 §4.5, §1.2).

The model is one weight vector ``theta = [w, b]`` of size ``d + 1`` (zero init); the logit of
example ``x`` is ``w.x + b``. For a loss ``l(z, y)`` of the logit the per-example gradient is
closed-form, ``g_i = l'(z_i, y_i) [x_i, 1]``, so no autograd is needed. MR-MTL's regulariser
(objective ``lambda/2 ||theta - theta_bar||^2``, thesis convention) adds
``lambda (theta - theta_bar)`` to *every* per-example gradient before clipping (spec 002
§1.2 note; [C2] writes the objective as ``lambda ||.||^2`` and adds ``2 lambda (theta - theta_bar)``,
so [C2]'s ``lambda = 0.0003`` is ``lambda = 0.0006`` here).

A step is the DP-SGD step of :mod:`fedveil.privacy.dp_sgd`: global-L2 clip
``min(1, C / (||g_i|| + 1e-15))``, sum, Gaussian noise ``C z N(0, I)``, divide by the batch
size, ``theta <- theta - lr * g``. Every step's batch is an independent uniform draw of
``B_k = min(B, n_k)`` of the ``n_k`` examples without replacement (:func:`uniform_batches`), the
sampling Theorem 2.4.4 accounts for (a hypergeometric ``rho`` per step, composed over the
steps; :mod:`.node_dp`). An "epoch" is ``n_k // B_k`` such steps, so every step has the same
denominator and the step count is that of shuffled epochs with the last partial batch
dropped. [C2] shuffles every epoch into consecutive batches (keeping the partial one): the
batches of an epoch are then disjoint, which the per-step hypergeometric accounting does not
describe. Each epoch draws a fresh random window start ``s ~ U{0..28}`` per person (§4.3).
"""
from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import torch
from tqdm.auto import tqdm

from ..privacy.dp_sgd import CLIP_EPS, add_gaussian_noise
from ..privacy.randomness import RandomSource, permutation
from .features import NUM_TRAIN_STARTS, TEST_START, SiloFeatures
from .focal import focal_loss, focal_loss_grad


# field: (integers only, valid value, the rule as the error states it)
_TRAIN_RULES = {
    "batch_size": (True, lambda v: v >= 1, "an integer >= 1"),
    "lr": (False, lambda v: v > 0, "a number > 0"),
    "clip": (False, lambda v: v > 0, "a number > 0"),
    "noise_multiplier": (False, lambda v: v >= 0, "a number >= 0"),
    "gamma": (False, lambda v: v >= 0, "a number >= 0 (focal loss)"),
    "alpha": (False, lambda v: 0 <= v <= 1, "None or a number in [0, 1] (focal loss)"),
}


@dataclass(frozen=True)
class TrainConfig:
    """DP-SGD settings; defaults are the final submission's ([C2] ``CENTRAL_HPARAMS``)."""

    batch_size: int = 512
    lr: float = 0.2
    clip: float = 15.0
    noise_multiplier: float = 0.01
    gamma: float = 2.0  # focal loss
    alpha: float | None = 0.75  # focal loss; None with gamma = 0 is plain BCE

    def __post_init__(self) -> None:
        for name, (integer, ok, rule) in _TRAIN_RULES.items():
            value = getattr(self, name)
            if name == "alpha" and value is None:
                continue
            kinds = (int, np.integer) if integer else (int, float, np.integer, np.floating)
            if isinstance(value, bool) or not isinstance(value, kinds) or not ok(value):
                raise ValueError(f"TrainConfig.{name} must be {rule}, got {value!r}")


def per_example_grads(
    theta: torch.Tensor, x: torch.Tensor, y: torch.Tensor, cfg: TrainConfig, prox: torch.Tensor | None = None
) -> torch.Tensor:
    """``(B, d + 1)`` gradients of the per-example objective (loss plus the optional
    example-independent term ``prox``, e.g. ``lambda (theta - theta_bar)``).

    The reference form: :func:`clipped_sum` gets the clipped sum without materialising these.
    """
    dz = focal_loss_grad(x @ theta[:-1] + theta[-1], y, cfg.gamma, cfg.alpha)
    grads = torch.cat([dz[:, None] * x, dz[:, None]], dim=1)
    return grads if prox is None else grads + prox


def clipped_sum(
    theta: torch.Tensor, x: torch.Tensor, y: torch.Tensor, cfg: TrainConfig, prox: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """``sum_i min(1, C / (||g_i|| + 1e-15)) g_i`` and the norms ``||g_i||`` of the
    :func:`per_example_grads` ``g_i = dz_i [x_i, 1] + r``, in closed form:
    ``||g_i||^2 = dz_i^2 (||x_i||^2 + 1) + 2 dz_i [x_i, 1].r + ||r||^2`` and
    ``sum_i c_i g_i = [x, 1]^T (c * dz) + (sum_i c_i) r`` (no ``B x d`` gradient matrix)."""
    dz = focal_loss_grad(x @ theta[:-1] + theta[-1], y, cfg.gamma, cfg.alpha)
    sq = dz.square() * (x.square().sum(dim=1) + 1.0)
    if prox is not None:
        sq = sq + 2.0 * dz * (x @ prox[:-1] + prox[-1]) + prox.square().sum()
    norms = sq.clamp(min=0.0).sqrt()
    factors = (cfg.clip / (norms + CLIP_EPS)).clamp(max=1.0)
    weighted = factors * dz
    total = torch.cat([x.T @ weighted, weighted.sum()[None]])
    return (total if prox is None else total + factors.sum() * prox), norms


def private_step(
    theta: torch.Tensor,
    x: torch.Tensor,
    y: torch.Tensor,
    cfg: TrainConfig,
    generator: torch.Generator,
    prox: torch.Tensor | None = None,
) -> torch.Tensor:
    """One DP-SGD step; returns the new ``theta``."""
    total, _ = clipped_sum(theta, x, y, cfg, prox)
    noisy = add_gaussian_noise({"theta": total}, cfg.clip, cfg.noise_multiplier, generator)["theta"]
    return theta - cfg.lr * noisy / len(x)


def uniform_batches(n: int, batch_size: int, steps: int, generator: RandomSource) -> Iterator[torch.Tensor]:
    """``steps`` batches, each ``batch_size`` distinct rows of ``0..n-1`` drawn uniformly without
    replacement, independently of the other batches: the sampling of Theorem 2.4.4, where the
    number of a node's ``S`` examples in a batch is ``Hypergeometric(n, S, batch_size)``."""
    if not 0 < batch_size <= n:
        raise ValueError(f"batch_size must be in [1, n={n}], got {batch_size}")
    for _ in range(steps):
        yield permutation(n, generator)[:batch_size]


@dataclass
class TrainLog:
    """What a training did: DP-SGD steps, the (non-private) loss sum and examples seen."""

    steps: int = 0
    loss_sum: float = 0.0  # non-private, for logging only
    examples: int = 0


def train(
    theta: torch.Tensor,
    silo: SiloFeatures,
    cfg: TrainConfig,
    epochs: int,
    rng: np.random.Generator,
    generator: torch.Generator,
    centre: torch.Tensor | None = None,
    lam: float = 0.0,
    progress: bool = False,
    desc: str = "DP-SGD",
) -> tuple[torch.Tensor, TrainLog]:
    """``epochs`` epochs of DP-SGD from ``theta``; with ``centre`` and ``lam > 0`` each
    per-example gradient gets MR-MTL's ``lam (theta - centre)``. ``rng`` draws the window
    starts, ``generator`` the batches and the noise."""
    if epochs < 0 or lam < 0:
        raise ValueError(f"need epochs >= 0 and lam >= 0, got {epochs}, {lam}")
    if theta.shape != (silo.layout.dim + 1,):
        raise ValueError(f"theta must have shape ({silo.layout.dim + 1},), got {tuple(theta.shape)}")
    n = silo.num_nodes
    batch = min(cfg.batch_size, n)
    per_epoch = n // batch
    log = TrainLog()
    bar = tqdm(total=epochs * per_epoch, desc=desc, unit="step", disable=not progress, leave=False)
    for _ in range(epochs):
        starts = rng.integers(0, NUM_TRAIN_STARTS, size=n)
        for idx in uniform_batches(n, batch, per_epoch, generator):
            idx = idx.numpy()
            x = torch.from_numpy(silo.examples(idx, starts[idx])).to(theta.dtype)
            y = torch.from_numpy(silo.labels(idx, starts[idx])).to(theta.dtype)
            prox = lam * (theta - centre) if centre is not None and lam > 0 else None
            log.loss_sum += float(focal_loss(x @ theta[:-1] + theta[-1], y, cfg.gamma, cfg.alpha).sum())
            log.examples += len(idx)
            theta = private_step(theta, x, y, cfg, generator, prox)
            log.steps += 1
            bar.update()
    bar.close()
    return theta, log


def predict(theta: torch.Tensor, silo: SiloFeatures, start: int = TEST_START, chunk: int = 8192) -> np.ndarray:
    """Infection probabilities of every person of ``silo`` for the window starting at ``start``."""
    out = []
    for lo in range(0, silo.num_nodes, chunk):
        idx = np.arange(lo, min(lo + chunk, silo.num_nodes))
        x = torch.from_numpy(silo.examples(idx, start)).to(theta.dtype)
        out.append(torch.sigmoid(x @ theta[:-1] + theta[-1]).numpy())
    return np.concatenate(out) if out else np.zeros(0)
