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
all people, pooled across silos; recall and F1 at threshold 0.5. Each silo's node-level
``(epsilon, 1/n_k)`` comes from :mod:`.node_dp` with the steps it actually took.
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
        if len(probs) != len(labels) or len(labels) == 0:
            raise ValueError(f"need as many predictions as labels (> 0), got {len(probs)} and {len(labels)}")
        positives = int(labels.sum())
        pred = (probs >= 0.5).astype(int)
        ap = float(average_precision_score(labels, probs)) if positives else float("nan")
        recall = float(recall_score(labels, pred, zero_division=0))
        return cls(ap, recall, float(f1_score(labels, pred, zero_division=0)), positives, len(labels))


@dataclass
class SiloResult:
    name: str
    num_people: int
    probs: np.ndarray
    labels: np.ndarray
    steps: int = 0
    batch_size: int = 0
    max_occurrences: int = 0  # most neighbourhoods one person is in (the accounting's S)
    privacy: dict[str, NodeDP] = field(default_factory=dict)

    @property
    def metrics(self) -> Metrics:
        return Metrics.of(self.probs, self.labels)


@dataclass
class PipelineResult:
    name: str
    silos: list[SiloResult]

    @property
    def metrics(self) -> Metrics:
        """Pooled over all silos' people."""
        return Metrics.of(np.concatenate([s.probs for s in self.silos]), np.concatenate([s.labels for s in self.silos]))

    def max_epsilon(self, key: str) -> float:
        return max(s.privacy[key].epsilon for s in self.silos)


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


def privacy_of(silo: SiloFeatures, cfg: PipelineConfig, steps: int) -> tuple[int, dict[str, NodeDP]]:
    """Node-level epsilons of a silo that took ``steps`` DP-SGD steps (delta = 1/n_k).

    ``"thesis"``: Theorem 2.4.4 as printed, with ``S`` = the most neighbourhoods one person
    of this silo is actually in (sound for this sample). ``"code"``: [C2]'s exponent and
    ``D = S_1`` as [C2] passes it (comparable with the thesis's Table 2.6).
    """
    n, batch, sigma = silo.num_nodes, min(cfg.train.batch_size, silo.num_nodes), cfg.train.noise_multiplier
    occ = silo.max_occurrences()
    return occ, {
        "thesis": node_epsilon(n, occ, batch, sigma, steps, convention="thesis"),
        "code": node_epsilon(n, min(cfg.num_neighbours, n), batch, sigma, steps, convention="code"),
    }


def run_centralised(silo: SiloFeatures, cfg: PipelineConfig, progress: bool = False, name: str = "centralised") -> PipelineResult:
    theta = torch.zeros(silo.layout.dim + 1)
    theta, log = train(
        theta, silo, cfg.train, cfg.central_epochs, numpy_generator(cfg.seed, "windows", name),
        torch_generator(cfg.seed, "dpsgd", name), progress=progress, desc=name,
    )
    occ, privacy = privacy_of(silo, cfg, log.steps)
    result = SiloResult(name, silo.num_nodes, predict(theta, silo), silo.test_labels(), log.steps,
                        min(cfg.train.batch_size, silo.num_nodes), occ, privacy)
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
        occ, privacy = privacy_of(silo, cfg, steps[k])
        results.append(SiloResult(k, silo.num_nodes, predict(theta[k], silo), silo.test_labels(), steps[k],
                                  min(cfg.train.batch_size, silo.num_nodes), occ, privacy))
    return PipelineResult(name, results)


def run_sir_baseline(silos: dict[str, SiloFeatures], name: str = "sir_baseline") -> PipelineResult:
    """The organisers' baseline, federated: numerators and denominators summed over the silos
    (with one silo this is the centralised fit). No training on examples, so no DP-SGD."""
    model = SIRBaseline.combine([SIRBaseline.fit(s.states) for s in silos.values()])
    return PipelineResult(name, [SiloResult(k, s.num_nodes, model.predict(s.states), s.test_labels()) for k, s in silos.items()])
