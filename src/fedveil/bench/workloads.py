"""Benchmark workloads: model, input shape and local training of one federated round.

Every system trains the same thing: ``clients`` clients, each doing ``steps`` SGD steps
of ``batch`` rows (lr ``lr``, no momentum) on its own ``steps * batch`` synthetic rows,
then the updates are averaged. ``dp`` adds DP-SGD (clip 1.0, noise multiplier 1.0,
fixed-size shuffled batches). Every system runs on the case's ``device`` (``auto``: CUDA
when available), with its data moved there before timing.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import Any

import torch

from ..seeding import derive_seed

CLIP = 1.0
NOISE_MULTIPLIER = 1.0
TEST_ROWS = 256  # a small separate test set, so that every generated training row is used


@dataclass(frozen=True)
class Workload:
    """One federated round to time: model and input shape, each client's
    local steps and batch, the algorithm and whether a DP variant runs."""

    name: str
    model: str
    input_shape: tuple[int, int, int]
    model_options: dict[str, Any] = field(default_factory=dict)
    num_classes: int = 10
    steps: int = 10
    batch: int = 32
    lr: float = 0.05
    algorithm: dict[str, Any] = field(default_factory=lambda: {"name": "fedavg"})
    data_options: dict[str, Any] = field(default_factory=dict)
    fedveil_only: bool = False  # a method round the baselines do not implement
    dp: bool = True  # False: the method refuses example-level DP-SGD (no DP variant is planned)

    @property
    def rows_per_client(self) -> int:
        """``steps * batch``: the synthetic training rows of each client."""
        return self.steps * self.batch


WORKLOADS: dict[str, Workload] = {
    w.name: w
    for w in (
        Workload("mlp", "mlp", (1, 28, 28)),
        Workload("lenet", "lenet", (1, 28, 28)),
        Workload("resnet", "resnet", (3, 32, 32), {"depth": 1, "width": 0.5, "groups": 4}),
        # FADE's round (Adult-sized MLP with discriminator, power loss so DP-SGD applies)
        Workload("fade", "fade_mlp", (1, 10, 11), num_classes=2,
                 algorithm={"name": "fade", "group_key": "group", "adversarial_loss": "power", "guard": None},
                 data_options={"groups": 2}, fedveil_only=True),
        # Split-Mix's round: 8 digit-CNN bases of width 1/8, budgets 8-4-2-1 (1 to 8 bases a client);
        # no BN so that DP-SGD applies
        Workload("splitmix", "digit_cnn", (3, 16, 16), {"width": 1.0, "bases": 8, "norm": "none"},
                 algorithm={"name": "split_mix"}, fedveil_only=True),
        # ADDS's round: Table 2's VGG supernet at width 1/4; each step adds validation rows and samples
        # unit masks; clients train one by one (input hook); no DP variant (ADDS refuses DP-SGD)
        Workload("adds", "adds_vgg", (1, 28, 28), {"width": 0.25}, algorithm={"name": "adds"}, fedveil_only=True,
                 dp=False),
        # FedFed's distillation round (phase 1): the beta-VAE generator and its classifier, with the
        # reparameterisation and noise draws as an input hook (client by client); no DP (refused, as the
        # paper). Phase 2's round is the base algorithm's on twice the rows.
        Workload("fedfed", "fedfed_vae", (1, 28, 28), algorithm={"name": "fedfed_distill"}, fedveil_only=True, dp=False),
        # for tests: a seconds-long run of every system
        Workload("tiny", "mlp", (1, 6, 6), {"hidden": [16]}, num_classes=4, steps=2, batch=4),
    )
}


@dataclass(frozen=True)
class Case:
    """One measurement: a workload on a system with a cohort of ``clients``."""

    workload: str
    system: str
    clients: int
    dp: bool = False
    rounds: int = 3  # measured rounds, after ``warmup`` untimed ones
    warmup: int = 1
    seed: int = 0
    steps: int | None = None  # local steps instead of the workload's (the quick suite shortens lenet)
    threads: int | None = None  # torch threads of the subprocess; None: torch's default (all cores)
    device: str = "auto"  # auto | cpu | cuda | cuda:N; a record holds the device it resolved to

    @property
    def spec(self) -> Workload:
        """The case's workload, with ``steps`` replaced when the case sets them."""
        w = WORKLOADS[self.workload]
        return w if self.steps is None else replace(w, steps=self.steps)

    def to_dict(self) -> dict[str, Any]:
        """The case's fields as a dict."""
        return asdict(self)

    def record(self) -> dict[str, Any]:
        """The fields of a result record that describe the case (effective steps and batch)."""
        return {**self.to_dict(), "steps": self.spec.steps, "batch": self.spec.batch}


def fedveil_config(case: Case, executor: str) -> dict[str, Any]:
    """The raw fedveil config of ``case``: every client holds exactly ``steps * batch`` rows."""
    w = case.spec
    c, h, wd = w.input_shape
    raw: dict[str, Any] = {
        "seed": case.seed,
        "executor": executor,
        "device": case.device,
        "data": {
            "name": "synthetic_images",
            "num_clients": case.clients,
            "val_fraction": 0.0,
            "test_fraction": 0.0,
            "partition": {"name": "iid"},
            "options": {
                "channels": c, "height": h, "width": wd, "num_classes": w.num_classes,
                "rows": case.clients * w.rows_per_client, "test_rows": TEST_ROWS, **w.data_options,
            },
        },
        "model": {"name": w.model, "options": dict(w.model_options)},
        "algorithm": dict(w.algorithm),
        "client": {"steps": w.steps, "batch_size": w.batch, "lr": w.lr},
        "federation": {"rounds": case.warmup + case.rounds, "clients_per_round": case.clients},
    }
    if case.threads is not None:  # the case's thread count, not the run's rule
        raw["threads"] = case.threads
    if case.dp:
        raw["privacy"] = {
            "level": "example", "clip": CLIP, "noise_multiplier": NOISE_MULTIPLIER, "batch_sampling": "shuffle",
        }
    return raw


def client_tensors(w: Workload, cid: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Client ``cid``'s ``steps * batch`` Gaussian images and random labels (baselines)."""
    g = torch.Generator().manual_seed(derive_seed(seed, "bench", cid))
    x = torch.randn((w.rows_per_client, *w.input_shape), generator=g)
    y = torch.randint(0, w.num_classes, (w.rows_per_client,), generator=g)
    return x, y


def cohort_tensors(w: Workload, clients: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """All clients' rows stacked: ``(clients, rows, C, H, W)`` and ``(clients, rows)``."""
    x = torch.empty((clients, w.rows_per_client, *w.input_shape))
    y = torch.empty((clients, w.rows_per_client), dtype=torch.long)
    for cid in range(clients):
        x[cid], y[cid] = client_tensors(w, cid, seed)
    return x, y


# --- suites ------------------------------------------------------------------------------

SYSTEMS = (
    "fedveil-auto", "fedveil-serial", "fedveil-threads", "fedveil-vectorized", "plain-loop", "centralised", "flower", "opacus",
)
COHORTS = (10, 100, 1000)
FULL_ROUNDS = {10: 5, 100: 3, 1000: 2}  # measured rounds by cohort size
# --quick (about a minute on 2 cores): (workload, dp, local steps, measured rounds, systems)
QUICK = (
    ("mlp", False, None, 3, ("fedveil-serial", "fedveil-vectorized", "plain-loop", "centralised")),
    ("mlp", True, None, 1, ("fedveil-serial", "fedveil-vectorized", "opacus")),
    ("lenet", False, 2, 1, ("fedveil-serial", "fedveil-vectorized", "plain-loop")),
)


def suite(
    quick: bool, systems=None, workloads=None, cohorts=None, rounds: int | None = None, dp: bool | None = None,
    threads: int | None = None, device: str = "auto",
) -> list[Case]:
    """The cases of the quick or the full suite, optionally restricted to some systems,
    workloads, cohort sizes and to the non-private (``dp=False``) or DP-SGD variants;
    ``rounds`` overrides the measured rounds, ``threads`` sets torch's thread count,
    ``device`` where every case computes."""
    for name in workloads or ():
        if name not in WORKLOADS:
            raise ValueError(f"unknown workload '{name}'; choose from {', '.join(WORKLOADS)}")
    if quick and not workloads:
        plan = list(QUICK)
    else:  # the full suite, or --quick on chosen workloads (all systems, 2 measured rounds)
        names = workloads or ("mlp", "lenet", "resnet")
        chosen = tuple(s for s in SYSTEMS if s != "flower") if quick else SYSTEMS
        plan = [(w, private, None, 2 if quick else None, chosen) for w in names for private in (False, True)
                if WORKLOADS[w].dp or not private]
    cases = []
    for name, private, steps, measured, plan_systems in plan:
        if dp is not None and private != dp:
            continue
        for clients in cohorts or ((10,) if quick else COHORTS):
            n = rounds or measured or FULL_ROUNDS.get(clients, 2)
            chosen_systems = systems or plan_systems
            if WORKLOADS[name].fedveil_only:
                chosen_systems = [s for s in chosen_systems if s.startswith("fedveil-")]
            cases += [Case(name, s, clients, private, n, steps=steps, threads=threads, device=device) for s in chosen_systems]
    return cases
