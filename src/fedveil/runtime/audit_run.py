"""``fedveil audit``: the canary membership-inference audit of a run config, through the runtime.

The game of :mod:`fedveil.privacy.audit` (Jagielski, Ullman & Oprea 2020, "Auditing
Differentially Private Machine Learning: How Private is Private SGD?"; Nasr, Song,
Thakurta, Papernot & Carlini 2021, "Adversary Instantiation: Lower Bounds for
Differentially Private Machine Learning") played on the mechanisms a configured run
uses, with the run's own trainer, privacy plan and noise code:

* example level (:class:`SiloCanaryGame`): trials of one silo's DP-SGD local training
  over the rounds it takes part in, half with a canary record added to its rows;
* client level (:class:`ClientCanaryGame`): trials of the DP-FedAvg aggregation over the
  run's rounds, half with a canary client that sends a Dirac update.

Even trials include the canary, odd trials do not; trial ``i`` draws all its randomness
(batches, cohorts, noise) from its own generator ``(seed, "audit", i)``. The scores give a
Clopper-Pearson lower bound on epsilon (:func:`~fedveil.privacy.audit.epsilon_lower_bound`),
compared with the epsilon the run's ledger accounts for exactly what one trial ran. A
bound above it means the run leaks more than it claims; ``noise=False`` shows what that
looks like (docs/audit.md): the run's noise source is then ``NoiseSource("zero")``, whose
streams give every mechanism exactly zero noise while the plan and the ledger still claim it.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, replace
from typing import Any, Iterator

import torch
from torch.func import functional_call
from tqdm.auto import tqdm

from ..errors import ConfigError
from ..config import RunConfig
from ..data.arrays import ArrayDataset
from ..engine import StackedModel, UnsupportedModelError
from ..params import Params
from ..privacy.ledger import PrivacyLedger
from ..privacy.audit import AuditResult, epsilon_lower_bound
from ..privacy.dp_sgd import ExampleDP, per_example_grads, poisson_batches
from ..privacy.randomness import NoiseSource
from ..seeding import torch_generator
from ..training.cohort import train_stacked
from ..training.request import TrainRequest
from .privacy_plan import POPULATION
from ..training.private_stacked import check_private_stacking
from .simulation import Simulation
from .vectorized import stacked_chunk_size

TRIALS = 200
EXECUTORS = ("serial", "vectorized")
STACKED_TRIALS = 100  # trials trained in one stacked computation at most (fewer for large models)
REGRESSION_TARGET = 1e6  # a regression canary's target: its gradient stays far above any clip
DIRAC_NORM = 1e6  # the canary client's update norm, in units of the initial clip: always clipped
GRAD_CHUNK = 256  # rows per per-example gradient call when finding the untouched coordinates


@dataclass(frozen=True)
class RunAudit:
    """What ``fedveil audit`` found: the audited mechanism, the canary and the bound."""

    level: str  # "example" | "client"
    subject: str  # the audited mechanism: "silo 0's DP-SGD local training", "the DP-FedAvg aggregation"
    canary: str
    executor: str  # "serial" | "vectorized" (example level), "none" (client level: nothing is trained)
    rounds: int
    steps: int  # noisy releases per trial: DP-SGD steps (example level) or aggregations (client level)
    noise_multiplier: float  # the plan's, at noise-schedule shape 1
    noise: bool  # False when the trials ran with a zero noise source
    result: AuditResult
    seconds: float

    @property
    def violated(self) -> bool:
        """Whether the empirical lower bound exceeds the accounted epsilon."""
        return self.result.violated

    @property
    def verdict(self) -> str:
        """``"consistent"``, or a one-line ``VIOLATION`` message."""
        if self.violated:
            return "VIOLATION: the run leaks more than accounted (noise off or mis-scaled?)"
        return "consistent"

    def to_dict(self) -> dict[str, Any]:
        """The audit's settings, result and verdict as a flat JSON-ready dict."""
        r = self.result
        return {
            "level": self.level, "subject": self.subject, "canary": self.canary, "executor": self.executor,
            "trials": r.trials, "rounds": self.rounds, "steps": self.steps, "noise_multiplier": self.noise_multiplier,
            "noise": "as planned" if self.noise else "forced off", "delta": r.delta,
            "accounted_epsilon": r.accounted_epsilon, "epsilon_lower_bound": r.epsilon_lower_bound,
            "confidence": r.confidence, "fpr": r.fpr, "fnr": r.fnr, "threshold": r.threshold,
            "violated": self.violated, "verdict": self.verdict, "seconds": self.seconds,
        }

    def table(self) -> str:
        """A heading line and an indented label/value table of the audit, for the terminal."""
        r = self.result
        releases = "noisy steps" if self.level == "example" else "noisy aggregations"
        rows = [
            ("trials", f"{r.trials} ({r.trials // 2} with the canary, {r.trials // 2} without), {self.seconds:.1f} s"),
            ("canary", self.canary),
            ("executor", self.executor if self.level == "example" else "none (the trials train nothing)"),
            ("noise", f"as planned (z = {self.noise_multiplier:.4g})" if self.noise
             else f"FORCED OFF (self-test; the ledger still claims z = {self.noise_multiplier:.4g})"),
            ("accounted epsilon",
             f"{r.accounted_epsilon:.4f} (delta {r.delta:g}; ledger of one trial's {self.steps} {releases})"),
            ("empirical lower bound", f"{r.epsilon_lower_bound:.4f} ({r.confidence:.0%} Clopper-Pearson; best threshold: "
                                      f"FPR {r.fpr:.3f}, FNR {r.fnr:.3f})"),
            ("verdict", self.verdict),
        ]
        head = f"{self.level}-level audit of {self.subject}, {self.rounds} round{'s' * (self.rounds != 1)}"
        return "\n".join([head, *(f"  {label:<22} {text}" for label, text in rows)])


def audit_run(
    config: RunConfig,
    *,
    trials: int = TRIALS,
    client: int | None = None,
    rounds: int | None = None,
    executor: str | None = None,
    noise: bool = True,
    confidence: float = 0.95,
    seed: int | None = None,
    progress: bool = True,
) -> RunAudit:
    """Audit the privacy mechanism of ``config``'s run (its ``privacy.level``).

    ``client``: the silo audited at example level (default 0). ``rounds``: audit only the first
    ``rounds`` rounds (of the silo's rounds at example level). ``executor``: ``"serial"`` or
    ``"vectorized"`` local training at example level (default: the run's, ``"ray"`` as
    serial). ``noise=False`` runs the trials with ``NoiseSource("zero")``
    (every mechanism's noise exactly zero, the plan unchanged: the audit's self-test). ``seed``: of the
    trials (default: the run's seed). Raises :class:`ConfigError` for what cannot be audited.
    """
    if trials < 2 or trials % 2:
        raise ConfigError(f"--trials must be an even number >= 2, got {trials}")
    if not 0 < confidence < 1:
        raise ConfigError(f"--confidence must be in (0, 1), got {confidence}")
    if rounds is not None and rounds < 1:
        raise ConfigError(f"--rounds must be >= 1, got {rounds}")
    sim = Simulation.from_config(config, noise=NoiseSource("seeded" if noise else "zero"))
    if sim.privacy is None:
        raise ConfigError('audit: privacy.level is "none", nothing to audit; set privacy.level = "example" or "client"')
    seed = config.seed if seed is None else seed
    if config.privacy.level == "example":
        executor = executor or ("vectorized" if sim.executor.name == "vectorized" else "serial")  # auto resolved
        game: SiloCanaryGame | ClientCanaryGame = SiloCanaryGame(sim, client or 0, rounds, executor)
    elif client is not None or executor is not None:
        raise ConfigError("audit: --client and --executor apply to example level; a client-level audit trains nothing")
    else:
        game = ClientCanaryGame(sim, rounds)
    started = time.perf_counter()
    with tqdm(total=trials, desc=f"audit ({config.privacy.level} level)", unit="trial", disable=not progress,
              dynamic_ncols=True) as bar:
        scores = game.scores(trials, seed, bar)
    seconds = time.perf_counter() - started
    result = epsilon_lower_bound(
        scores[0::2], scores[1::2], config.privacy.delta, confidence, accounted_epsilon=game.accounted_epsilon()
    )
    return RunAudit(
        config.privacy.level, game.subject, game.canary, game.executor, len(game.rounds), game.steps,
        game.noise_multiplier, noise, result, seconds,
    )


def _trial_generator(seed: int, trial: int) -> torch.Generator:
    return torch_generator(seed, "audit", trial)


def _first_rounds(available: list[int], rounds: int | None, who: str) -> list[int]:
    if not available:
        raise ConfigError(f"audit: {who} takes part in no round of this run; choose another --client")
    if rounds is not None and rounds > len(available):
        raise ConfigError(f"--rounds {rounds}: {who} takes part in only {len(available)} rounds")
    return available[:rounds]


# ----------------------------------------------------------------------- example level


@dataclass
class SiloRateDP(ExampleDP):
    """The plan's DP-SGD with the Poisson rate held at the silo's own ``B / n``: the canary
    joins the rows without changing how the other rows are sampled (add/remove adjacency)."""

    rate: float = 1.0

    def batches(self, num_rows: int, steps: int, generator: torch.Generator, device=None) -> Iterator[torch.Tensor]:
        """Row indices of each private step; Poisson batches are drawn at ``rate`` whatever ``num_rows`` is."""
        if self.sampling == "poisson":
            return poisson_batches(num_rows, self.rate, steps, self.source(generator), device)
        return super().batches(num_rows, steps, generator, device)


def canary_input(x: torch.Tensor, num_classes: int) -> tuple[torch.Tensor, str]:
    """One input built from what the rows ``x`` use least, and its description.

    Features: the largest absolute feature value on every coordinate all rows leave at
    zero (the least used one when there is none), zero elsewhere. Token windows: the
    least frequent token at every position.
    """
    if not x.is_floating_point():
        counts = torch.bincount(x.flatten(), minlength=max(num_classes, int(x.max()) + 1))
        token = int(counts.argmin())
        return torch.full_like(x[0], token), f"token {token} ({int(counts[token])} uses) at every position"
    usage = x.abs().sum(0)
    unused = usage == 0
    if bool(unused.any()):
        chosen, where = unused, f"{int(unused.sum())} input coordinates no training row uses"
    else:
        chosen, where = usage == usage.min(), "the least used input coordinate"
    value = float(x.abs().max()) or 1.0
    return torch.where(chosen, value, 0.0).to(x.dtype), f"{value:.3g} on {where}"


class SiloCanaryGame:
    """Trials of silo ``cid``'s DP-SGD local training (the run's trainer and planned
    ``ExampleDP``), chained over the rounds it takes part in from the run's initial model,
    with and without a canary row.

    The silo's DP guarantee covers everything it releases; the adversary here sees its
    model after its last training and knows the initial model and the canary. Score: the
    model's move along the canary's gradient direction at the initial model, restricted to
    the parameter coordinates no training row's gradient touches there (the first-layer
    weights of unused inputs), where a model without the canary carries only noise.
    """

    def __init__(self, sim: Simulation, cid: int, rounds: int | None, executor: str) -> None:
        if not 0 <= cid < sim.data.num_clients:
            raise ConfigError(f"--client must be in [0, {sim.data.num_clients - 1}], got {cid}")
        if executor not in EXECUTORS:
            raise ConfigError(f"--executor must be one of {', '.join(EXECUTORS)}, got '{executor}'")
        self.privacy, self.cid, self.executor = sim.privacy, cid, executor
        self.plan = sim.privacy.plan.clients[cid]
        self.subject = f"silo {cid}'s DP-SGD local training"
        self.rounds = _first_rounds(list(self.plan.rounds), rounds, f"client {cid}")
        self.steps = self.plan.steps_per_training * len(self.rounds)
        self.noise_multiplier = self.plan.noise_multiplier
        # a fixed step count: the canary's extra row must not add a step
        fixed_steps = sim.trainer.config.model_copy(update={"steps": self.plan.steps_per_training})
        self.trainer = replace(sim.trainer, config=fixed_steps)
        self.init = sim.init
        self.data = sim.data.clients[cid].train
        x_c, where = canary_input(self.data.x, sim.data.num_classes)
        canary = ArrayDataset(x_c.unsqueeze(0), self._canary_target(x_c, sim.data.task))
        self.data_in = ArrayDataset(torch.cat([self.data.x, canary.x]), torch.cat([self.data.y, canary.y]))
        self.direction, restricted = self._direction(canary)
        label = f"label {int(canary.y[0])}" if sim.data.task == "classification" else f"target {REGRESSION_TARGET:g}"
        self.canary = (f"one record: {where}, {label}; score: move along its gradient"
                       + (" on coordinates no row touches" if restricted else ""))
        self.ran: list[ExampleDP] = []  # trial 0's DP-SGD trainings, for the ledger
        self.stacked = self._stacked_model() if executor == "vectorized" else None

    def _canary_target(self, x_c: torch.Tensor, task: str) -> torch.Tensor:
        """Classification: the class the initial model finds least likely; regression: a huge target."""
        if task == "regression":
            return torch.full_like(self.data.y[:1], REGRESSION_TARGET)
        with torch.no_grad():
            logits = functional_call(self.trainer.model, self.init, (x_c.unsqueeze(0),))
        return logits.argmin(1).to(self.data.y.dtype)

    def _direction(self, canary: ArrayDataset) -> tuple[Params, bool]:
        """Unit canary gradient at the initial model on the coordinates no training row's
        gradient touches (all of it when that leaves nothing), and whether it was restricted."""
        model, loss_fn = self.trainer.model, self.trainer.loss_fn
        g_c = {k: v[0] for k, v in per_example_grads(model, self.init, canary.x, canary.y, loss_fn)[0].items()}
        touched = {k: torch.zeros_like(v, dtype=torch.bool) for k, v in g_c.items()}
        for start in range(0, len(self.data), GRAD_CHUNK):
            rows = slice(start, start + GRAD_CHUNK)
            grads, _ = per_example_grads(model, self.init, self.data.x[rows], self.data.y[rows], loss_fn)
            for k, g in grads.items():
                touched[k] |= (g != 0).any(0)
        untouched = {k: torch.where(touched[k], 0.0, v) for k, v in g_c.items()}
        restricted = _norm(untouched) > 0
        chosen = untouched if restricted else g_c
        norm = _norm(chosen)
        if norm == 0:
            raise ConfigError("audit: the canary's gradient is zero at the initial model; nothing to measure")
        return {k: v / norm for k, v in chosen.items()}, restricted

    def _stacked_model(self) -> StackedModel:
        try:
            stacked = StackedModel(self.trainer.model)
            check_private_stacking(self.trainer.model)
        except UnsupportedModelError as err:
            raise ConfigError(f"--executor vectorized: {err}; use --executor serial") from None
        return stacked

    def _dp(self, round_idx: int, trial: int) -> SiloRateDP:
        """A fresh copy of the plan's ExampleDP for round ``round_idx`` (trainings accumulate)."""
        planned = self.privacy.task_dp(self.cid, round_idx)
        dp = SiloRateDP(
            planned.clip, planned.noise_multiplier, planned.sampling, planned.batch_size, planned.noise,
            rate=self.plan.sample_rate,
        )
        if trial == 0:
            self.ran.append(dp)
        return dp

    def score(self, params: Params) -> float:
        """The move from the initial model along the canary's descent direction."""
        return -sum(float(torch.dot((params[k] - self.init[k]).flatten(), u.flatten())) for k, u in self.direction.items())

    def scores(self, trials: int, seed: int, bar: tqdm) -> list[float]:
        """The score of each of ``trials`` trials (even: with the canary), stacked in chunks where the model allows."""
        self.ran = []
        if self.stacked is None:
            out = []
            for i in range(trials):
                out.append(self._serial_trial(i, seed))
                bar.update(1)
            return out
        out, size = [], min(STACKED_TRIALS, stacked_chunk_size(self.trainer.model))
        for first in range(0, trials, size):
            chunk = range(first, min(first + size, trials))
            out += self._stacked_trials(chunk, seed)
            bar.update(len(chunk))
        return out

    def _serial_trial(self, trial: int, seed: int) -> float:
        generator = _trial_generator(seed, trial)
        data = self.data_in if trial % 2 == 0 else self.data
        w = self.init
        for r in self.rounds:
            w, _ = self.trainer.train(w, data, generator, r, dp=self._dp(r, trial))
        return self.score(w)

    def _stacked_trials(self, trials: range, seed: int) -> list[float]:
        generators = [_trial_generator(seed, i) for i in trials]
        params = [self.init] * len(trials)
        for r in self.rounds:
            requests = [
                TrainRequest(p, self.data_in if i % 2 == 0 else self.data, g, r, dp=self._dp(r, i))
                for p, g, i in zip(params, generators, trials)
            ]
            params = [w for w, _ in train_stacked(self.trainer, self.stacked, requests)]
        return [self.score(w) for w in params]

    def accounted_epsilon(self) -> float:
        """Epsilon of trial 0's trainings, recorded in a fresh ledger by the run's own
        bookkeeping (every trial runs the same steps at the same noise)."""
        fresh = replace(self.privacy, ledger=PrivacyLedger(self.privacy.config.accountant))
        for dp in self.ran:
            fresh.record_client(self.cid, self.plan.num_train, dp, dp.trainings)
        return fresh.ledger.epsilon(self.cid, self.privacy.config.delta)


def _norm(params: Params) -> float:
    return math.sqrt(sum(float(v.double().square().sum()) for v in params.values()))


# ------------------------------------------------------------------------ client level


class ClientCanaryGame:
    """Trials of the run's DP-FedAvg aggregation (:class:`~fedveil.privacy.client_dp.ClientLevelDP`
    with the plan's noise per round, clip, expected cohort and adaptive clipping) over
    its rounds, with cohorts drawn as configured.

    Honest clients send the update of one local training from the initial model, computed
    once and replayed every round (the guarantee holds for any honest updates; replaying
    real ones keeps adaptive clipping realistic). The canary client sends a Dirac update
    (Nasr et al. 2021): ``DIRAC_NORM`` times the clip on the one coordinate the honest
    updates touch least, so it is clipped to exactly the clip. Poisson cohorts (add/remove
    one client): the canary joins each round with probability ``q`` in the trials with it
    and is absent in the others. Fixed-size cohorts (replace one client): client 0's slot
    sends the Dirac update with it and its negation without. Score: the sum over rounds
    of the released mean update on that coordinate (the server's optimiser is
    post-processing of these releases).
    """

    subject = "the DP-FedAvg aggregation"
    executor = "none"

    def __init__(self, sim: Simulation, rounds: int | None) -> None:
        self.privacy, self.server = sim.privacy, sim.privacy.server
        self.rounds = _first_rounds(list(range(sim.config.federation.rounds)), rounds, "the population")
        self.steps = len(self.rounds)
        self.noise_multiplier = self.privacy.plan.population_noise
        self.num_clients, self.cohort = sim.data.num_clients, sim.config.federation.clients_per_round
        self.rate = self.privacy.plan.population.sample_rate  # q = m / N
        self.initial_clip = self.server.clip
        self.template = sim.init
        self.honest = [self._honest_update(sim, cid) for cid in range(self.num_clients)]
        self.coordinate = self._least_touched()
        name, index = self.coordinate
        self.dirac = {k: torch.zeros_like(v) for k, v in sim.init.items()}
        self.dirac[name].view(-1)[index] = DIRAC_NORM * self.initial_clip
        self.negated = {k: -v for k, v in self.dirac.items()}
        sampling = self.privacy.plan.population.sampling
        how = "joins each round with probability q" if sampling == "poisson" else "client 0's slot, +/- update"
        self.canary = f"one client's Dirac update on {name}[{index}] ({how})"

    @staticmethod
    def _honest_update(sim: Simulation, cid: int) -> Params:
        w, _ = sim.trainer.train(sim.init, sim.data.clients[cid].train, torch_generator(sim.config.seed, "train", 0, cid), 0)
        return {k: w[k] - sim.init[k] for k in w}

    def _least_touched(self) -> tuple[str, int]:
        """The parameter coordinate with the smallest total absolute honest update."""
        best: tuple[float, str, int] | None = None
        for name in self.template:
            usage = sum(u[name].abs().flatten() for u in self.honest)
            index = int(usage.argmin())
            if best is None or float(usage[index]) < best[0]:
                best = (float(usage[index]), name, index)
        return best[1], best[2]

    def scores(self, trials: int, seed: int, bar: tqdm) -> list[float]:
        """The score of each of ``trials`` trials (even: with the canary client), advancing ``bar`` per trial."""
        out = []
        for i in range(trials):
            out.append(self._trial(i % 2 == 0, _trial_generator(seed, i)))
            bar.update(1)
        return out

    def _trial(self, include: bool, generator: torch.Generator) -> float:
        self.server.load_state_dict({"clip": self.initial_clip})  # adaptive clipping restarts every trial
        name, index = self.coordinate
        total = 0.0
        for r in self.rounds:
            self.server.noise_multiplier = self.privacy.plan.population_noise * float(self.privacy.plan.shape[r])
            noise = self.privacy.noise.stream("dp-fedavg", generator)
            mean, _ = self.server.noisy_mean(self._cohort_updates(include, generator), self.template, noise)
            total += float(mean[name].view(-1)[index])
        return total

    def _cohort_updates(self, include: bool, generator: torch.Generator) -> list[Params]:
        n = self.num_clients
        if self.privacy.plan.population.sampling == "poisson":
            joins = torch.rand(n + 1, generator=generator) < self.rate  # the last coin is the canary's
            updates = [self.honest[c] for c in torch.nonzero(joins[:n]).flatten().tolist()]
            return updates + [self.dirac] if include and bool(joins[n]) else updates
        cohort = torch.randperm(n, generator=generator)[: self.cohort].tolist()
        return [(self.dirac if include else self.negated) if c == 0 else self.honest[c] for c in cohort]

    def accounted_epsilon(self) -> float:
        """Epsilon of the plan's releases of the rounds run (the noise every trial claims,
        with a zero noise source too), composed in a fresh ledger."""
        releases = [release for r in self.rounds for release in self.privacy.plan.planned_round(r, [])[POPULATION]]
        return self.privacy.ledger.epsilon_of(releases, self.privacy.config.delta)


__all__ = ["RunAudit", "SiloCanaryGame", "ClientCanaryGame", "audit_run", "canary_input"]
