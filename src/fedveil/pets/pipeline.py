"""Centralised and federated (MR-MTL) pandemic-forecasting pipelines (spec 002 §4.5, §4.6).

Per silo (both pipelines): CSV tables -> contact graph -> deterministic 1-hop sample
(``S_1 = 20``) -> node / contact / centrality features (:func:`build_silo_features`) ->
DP-SGD logistic regression with focal loss on random-window examples (:mod:`.logreg`).

- **Centralised**: one model on the whole graph, ``central_epochs = 2`` epochs.
- **Federated MR-MTL**: silo ``k`` keeps its own model ``theta_k`` (zero init); each of the
  ``rounds = 2`` rounds every silo trains ``local_epochs = 1`` epoch of DP-SGD with MR-MTL's
  regulariser gradient ``lambda (theta_k - theta_bar)`` added to every per-example gradient
  before clipping (``theta_bar`` fixed during the round), then the server sets
  ``theta_bar = sum_k n_k theta_k / sum_k n_k``. Each silo predicts with its own model.
  ``lambda = 0`` is local training.
- **SIR baseline** (:mod:`.baseline`): organisers' constant-risk model, fitted centrally or
  federated (summed numerator and denominator).

Metrics (§4.6): average precision (AUPRC, ``sklearn.metrics.average_precision_score``) over
all people, pooled across silos; recall and F1 at threshold 0.5.

Privacy figure: each silo reports the node-level ``(epsilon, delta = 1/n_k)`` of Theorem 2.4.4
(:mod:`.node_dp`) for the steps it actually took, *under the theorem's assumptions*. It is
**not a node-level guarantee for this pipeline**, because one person's change reaches more
than the ``S`` examples the theorem counts:

(i) features that are statistics of the whole silo (:mod:`.features`): MinMax-scaled degree
    and PageRank (PageRank itself global), standardised age, Box-Cox household size with a
    fitted ``lambda``, standardised location coordinates; one person's change moves every
    example's features. Their contacts' degrees also change, which re-draws those contacts'
    neighbour samples (:func:`.graph.sample_neighbours`);
(ii) ``S``: without a cap it is the observed most neighbourhoods one person is in, a
     statistic of the data (a neighbouring graph can have more); with a cap it is the
     a-priori cap, but the capped sampler cascades (one change alters later nodes' picks);
(iii) sampling: each step draws its batch independently, as the theorem assumes
      (:func:`.logreg.uniform_batches`; it used to be shuffled epochs). No example-level
      epsilon is reported.

It is kept as a comparison with the thesis's Table 2.6, which rests on the same assumptions.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch
from sklearn.metrics import average_precision_score, f1_score, recall_score

from ..seeding import numpy_generator, torch_generator
from .baseline import SIRBaseline
from .features import SiloFeatures, build_silo_features
from .logreg import TrainConfig, predict, train
from .node_dp import NodeDP, node_epsilon
from .tables import PandemicTables, split_by_region


@dataclass(frozen=True)
class PipelineConfig:
    """Settings of both pipelines: S_1, the DP-SGD training, epochs, MR-MTL rounds and lambda, and the seed."""

    num_neighbours: int = 20  # S_1
    train: TrainConfig = field(default_factory=TrainConfig)
    central_epochs: int = 2
    rounds: int = 2
    local_epochs: int = 1
    mrmtl_lambda: float = 0.0006  # thesis convention (lambda/2 ||w - w_bar||^2); = [C2]'s 0.0003 with gradient 2 lambda
    seed: int = 1234

    def __post_init__(self) -> None:
        if self.num_neighbours < 1:
            raise ValueError(f"num_neighbours (S_1) must be >= 1, got {self.num_neighbours}")
        if self.central_epochs < 0 or self.rounds < 0 or self.local_epochs < 0 or self.mrmtl_lambda < 0:
            raise ValueError("epochs, rounds and mrmtl_lambda must be >= 0")


@dataclass(frozen=True)
class Metrics:
    """Forecast quality (§4.6): AUPRC, recall and F1 at 0.5, and the positives among the people scored."""

    ap: float  # average precision (AUPRC)
    recall: float  # at threshold 0.5
    f1: float  # at threshold 0.5
    positives: int
    num_people: int

    @property
    def positive_rate(self) -> float:
        """The AP of a random guess."""
        return self.positives / self.num_people

    @classmethod
    def of(cls, probs: np.ndarray, labels: np.ndarray) -> "Metrics":
        """The metrics of predicted probabilities ``probs`` against 0/1 ``labels`` (AP is NaN without positives)."""
        if len(probs) != len(labels) or len(labels) == 0:
            raise ValueError(f"need as many predictions as labels (> 0), got {len(probs)} and {len(labels)}")
        positives = int(labels.sum())
        pred = (probs >= 0.5).astype(int)
        ap = float(average_precision_score(labels, probs)) if positives else float("nan")
        recall = float(recall_score(labels, pred, zero_division=0))
        return cls(ap, recall, float(f1_score(labels, pred, zero_division=0)), positives, len(labels))


@dataclass
class SiloResult:
    """One silo's predictions and labels, its DP-SGD steps and batch size, and Theorem 2.4.4's figures."""

    name: str
    num_people: int
    probs: np.ndarray
    labels: np.ndarray
    steps: int = 0
    batch_size: int = 0
    thm244_s: int = 0  # the S given to Theorem 2.4.4 (SiloFeatures.occurrence_bound)
    thm244: dict[str, NodeDP] = field(default_factory=dict)  # not a guarantee here (module docstring)

    @property
    def metrics(self) -> Metrics:
        """The :class:`Metrics` of this silo's predictions."""
        return Metrics.of(self.probs, self.labels)


@dataclass
class PipelineResult:
    """A pipeline's name and the results of its silos."""

    name: str
    silos: list[SiloResult]

    @property
    def metrics(self) -> Metrics:
        """Pooled over all silos' people."""
        return Metrics.of(np.concatenate([s.probs for s in self.silos]), np.concatenate([s.labels for s in self.silos]))

    def max_thm244_epsilon(self, key: str) -> float:
        """The largest Theorem 2.4.4 epsilon of convention ``key`` (``"thesis"`` or ``"code"``) over the silos."""
        return max(s.thm244[key].epsilon for s in self.silos)


def prepare(
    data: PandemicTables, num_neighbours: int = 20, progress: bool = False, max_occurrences: int | None = None
) -> tuple[SiloFeatures, dict[str, SiloFeatures]]:
    """Features of the whole population (centralised) and of each region's silo (federated);
    ``max_occurrences`` caps the neighbourhoods one person is in (None: [C2]'s uncapped sample)."""
    central = build_silo_features(data, num_neighbours, progress, max_occurrences)
    silos = {
        f"region{k}": build_silo_features(t, num_neighbours, progress, max_occurrences)
        for k, t in split_by_region(data).items()
    }
    return central, silos


def thm244_epsilons(silo: SiloFeatures, cfg: PipelineConfig, steps: int) -> tuple[int, dict[str, NodeDP]]:
    """Theorem 2.4.4's node-level epsilons (delta = 1/n_k) of a silo that took ``steps`` DP-SGD
    steps: figures under the theorem's assumptions, not guarantees (module docstring).

    ``"thesis"``: the theorem as printed, with ``S`` = :meth:`SiloFeatures.occurrence_bound`.
    ``"code"``: [C2]'s exponent and ``D = S_1`` as [C2] passes it (comparable with Table 2.6).
    """
    n, batch, sigma = silo.num_nodes, min(cfg.train.batch_size, silo.num_nodes), cfg.train.noise_multiplier
    bound = silo.occurrence_bound()
    return bound, {
        "thesis": node_epsilon(n, bound, batch, sigma, steps, convention="thesis"),
        "code": node_epsilon(n, min(cfg.num_neighbours, n), batch, sigma, steps, convention="code"),
    }


def run_centralised(silo: SiloFeatures, cfg: PipelineConfig, progress: bool = False, name: str = "centralised") -> PipelineResult:
    """One DP-SGD logistic regression on the whole population for
    ``central_epochs``, with its predictions and Theorem 2.4.4 figures."""
    theta = torch.zeros(silo.layout.dim + 1)
    theta, log = train(
        theta, silo, cfg.train, cfg.central_epochs, numpy_generator(cfg.seed, "windows", name),
        torch_generator(cfg.seed, "dpsgd", name), progress=progress, desc=name,
    )
    bound, eps = thm244_epsilons(silo, cfg, log.steps)
    result = SiloResult(name, silo.num_nodes, predict(theta, silo), silo.test_labels(), log.steps,
                        min(cfg.train.batch_size, silo.num_nodes), bound, eps)
    return PipelineResult(name, [result])


def run_federated(
    silos: dict[str, SiloFeatures], cfg: PipelineConfig, progress: bool = False, name: str = "mrmtl"
) -> PipelineResult:
    """MR-MTL over the silos (``cfg.mrmtl_lambda = 0``: local training)."""
    if not silos:
        raise ValueError("run_federated needs at least one silo")
    dims = {s.layout.dim for s in silos.values()}
    if len(dims) != 1:
        raise ValueError(f"all silos need the same feature dimension (same S_1), got {sorted(dims)}")
    dim = dims.pop() + 1
    theta = {k: torch.zeros(dim) for k in silos}
    centre = torch.zeros(dim)
    rngs = {k: numpy_generator(cfg.seed, "windows", name, k) for k in silos}
    gens = {k: torch_generator(cfg.seed, "dpsgd", name, k) for k in silos}
    steps = dict.fromkeys(silos, 0)
    weights = torch.tensor([float(s.num_nodes) for s in silos.values()])
    for t in range(cfg.rounds):
        for k, silo in silos.items():
            theta[k], log = train(
                theta[k], silo, cfg.train, cfg.local_epochs, rngs[k], gens[k], centre=centre,
                lam=cfg.mrmtl_lambda, progress=progress, desc=f"{name} round {t + 1}/{cfg.rounds} {k}",
            )
            steps[k] += log.steps
        centre = (weights[:, None] * torch.stack(list(theta.values()))).sum(0) / weights.sum()
    results = []
    for k, silo in silos.items():
        bound, eps = thm244_epsilons(silo, cfg, steps[k])
        results.append(SiloResult(k, silo.num_nodes, predict(theta[k], silo), silo.test_labels(), steps[k],
                                  min(cfg.train.batch_size, silo.num_nodes), bound, eps))
    return PipelineResult(name, results)


def run_sir_baseline(silos: dict[str, SiloFeatures], name: str = "sir_baseline") -> PipelineResult:
    """The organisers' baseline, federated: numerators and denominators summed over the silos
    (with one silo this is the centralised fit). No training on examples, so no DP-SGD."""
    model = SIRBaseline.combine([SIRBaseline.fit(s.states) for s in silos.values()])
    return PipelineResult(name, [SiloResult(k, s.num_nodes, model.predict(s.states), s.test_labels()) for k, s in silos.items()])
