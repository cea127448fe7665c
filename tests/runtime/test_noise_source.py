"""One noise source for every mechanism (issue: privacy at the edges, item 1).

* Every mechanism registered in :data:`MECHANISMS` is exercised by a case below and asks
  the run's :class:`NoiseSource` for its stream; every release label any case records in
  a ledger belongs to a mechanism that asked. A new mechanism, or a release drawn outside
  the source, fails here.
* Behaviour, per mechanism: a zero source gives the exact, noiseless value; a secure
  source gives different noise on every run with the same seed, so the seed does not
  regenerate it (the regenerate-and-subtract attack fails); a seeded source is reproducible.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from fedveil.ecos.pipeline import ECOSSettings, label, select
from fedveil.ecos.private_knn import KNNSettings
from fedveil.privacy.client_dp import ClientLevelDP
from fedveil.privacy.ledger import PrivacyLedger
from fedveil.privacy.randomness import MECHANISMS, SECURE, NoiseSource, ZeroNoiseStream, standard_normal, uniform
from fedveil.runtime import MemoryRecorder, Simulation
from fedveil.seeding import torch_generator

from tiny_runs import algorithm_sections, merge, tiny_config

pytestmark = pytest.mark.usefixtures("skip_plots")

EXAMPLE = {"level": "example", "noise_multiplier": 1.0}
CLIENT = {"level": "client", "noise_multiplier": 1.0, "clip": 1.0}
RUN_CASES = {
    "dp-sgd serial": {"privacy": EXAMPLE, "executor": "serial"},
    "dp-sgd vectorized, shuffled": {"privacy": {**EXAMPLE, "batch_sampling": "shuffle"}, "executor": "vectorized"},
    "dp-fedavg adaptive, poisson cohorts": {
        "privacy": {**CLIENT, "adaptive_clip": True, "clip_count_noise": 2.0}, "federation": {"sampling": "poisson"},
    },
    "distributed dp-fedavg under secure aggregation": {
        "privacy": {**CLIENT, "delta": 1e-5}, "secure_aggregation": {"enabled": True},
        "federation": {"clients_per_round": 5},
    },
    "ifca": algorithm_sections("ifca", {"privacy": {"level": "example", "epsilon": 8.0, "delta": 1e-5}}),
    "fedfed": algorithm_sections("fedfed_fedavg", {}),
}


def run_with(sections: dict, source: NoiseSource) -> Simulation:
    sim = Simulation.from_config(tiny_config(**merge(sections, {"federation": {"rounds": 2}})), noise=source)
    sim.record(MemoryRecorder())
    return sim


def ledger_labels(ledger: PrivacyLedger) -> set[str]:
    return {r.label for s in ledger.subjects for r in ledger.releases(s)}


# ECOS runs outside the simulation: its two uploads, on tiny striped images
SIDE = 8
ECOS_SETTINGS = ECOSSettings(extractor_options={"cells": 2}, R=4, sigma=5.0, accountant="rdp")


def stripes(n: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    x = 0.1 * torch.rand(n, 1, SIDE, SIDE, generator=gen)
    x[:, :, :, ::2] += 0.8
    return x.clamp(0, 1)


def ecos_uploads(source: NoiseSource, seed: int = 0):
    client, cloud = stripes(60, 0), stripes(80, 1)
    ledger = PrivacyLedger("rdp")
    chosen = select("ecos", client, cloud, 20, ECOS_SETTINGS, ledger, "client", seed=seed, noise=source)
    labels = label(client, torch.arange(60) % 2, cloud[:10], 2, ECOS_SETTINGS, KNNSettings(), ledger, "client",
                   seed=seed, noise=source)
    return chosen, labels, ledger


def test_every_registered_mechanism_draws_from_the_run_source_and_every_release_is_covered():
    asked: set[str] = set()
    for name, sections in RUN_CASES.items():
        source = NoiseSource("secure")  # secure: the client-level cohorts ask too
        sim = run_with(sections, source)
        labels = ledger_labels(sim.privacy.ledger)
        drawn = {m for m, n in source.requests.items() if n}
        covered = {lab for m in drawn for lab in MECHANISMS[m]}
        assert labels and labels <= covered, f"{name}: releases {labels - covered} were not drawn from the source"
        asked |= drawn
    source = NoiseSource("secure")
    _, _, ledger = ecos_uploads(source)
    drawn = {m for m, n in source.requests.items() if n}
    assert ledger_labels(ledger) <= {lab for m in drawn for lab in MECHANISMS[m]}
    asked |= drawn
    assert asked == set(MECHANISMS), f"registered mechanisms no case exercises: {set(MECHANISMS) - asked}"


def test_an_unregistered_mechanism_is_refused():
    with pytest.raises(ValueError, match="register it in MECHANISMS"):
        NoiseSource().stream("my-new-release", torch.Generator())


def fedfed_pool(source: NoiseSource) -> torch.Tensor:
    sim = Simulation.from_config(tiny_config(**algorithm_sections("fedfed_fedavg", {})), noise=source)
    return sim.fresh_state()["server"]["shared"]["x"]


def test_fedfed_secure_pools_differ_seeded_ones_repeat_and_the_seed_does_not_unmask_secure_noise():
    """The attack of the issue: subtract the noise regenerated from the seed. x_s itself is the
    zero source's pool; sigma is the tiny config's (2.0)."""
    sigma = 2.0
    x_s = fedfed_pool(NoiseSource("zero"))
    seeded_a, seeded_b = fedfed_pool(NoiseSource("seeded")), fedfed_pool(NoiseSource("seeded"))
    secure_a, secure_b = fedfed_pool(NoiseSource("secure")), fedfed_pool(NoiseSource("secure"))
    assert torch.equal(seeded_a, seeded_b)
    assert not torch.equal(secure_a, secure_b)
    assert float((secure_a - secure_b).std()) == pytest.approx(sigma * 2**0.5, rel=0.1)  # two independent N(0, sigma^2)

    # regenerate every client's release noise from config.json's seed, in client order
    regenerated, at = torch.empty_like(x_s), 0
    sim = Simulation.from_config(tiny_config(**algorithm_sections("fedfed_fedavg", {})))
    for cid, client in enumerate(sim.data.clients):
        n = len(client.train)
        regenerated[at:at + n] = standard_normal((n, *x_s.shape[1:]), torch_generator(sim.config.seed, "setup", cid))
        at += n
    assert float((seeded_a - sigma * regenerated - x_s).abs().max()) < 1e-5  # seeded: the attack recovers x_s
    residual = secure_a - sigma * regenerated - x_s
    assert float(residual.std()) == pytest.approx(sigma * 2**0.5, rel=0.1)  # secure: it recovers noise, not x_s


def test_a_zero_source_gives_every_mechanism_its_noiseless_value():
    # DP-FedAvg: the mean of the clipped updates, exactly
    dp = ClientLevelDP(clip=1.0, noise_multiplier=3.0, expected_cohort=2, sampling="fixed")
    updates = [{"w": torch.tensor([3.0, 4.0])}, {"w": torch.tensor([0.3, 0.4])}]
    stream = NoiseSource("zero").stream("dp-fedavg", torch.Generator().manual_seed(0))
    mean, _ = dp.noisy_mean(updates, {"w": torch.zeros(2)}, stream)
    assert torch.allclose(mean["w"], torch.tensor([(0.6 + 0.3) / 2, (0.8 + 0.4) / 2]))
    # ECOS: the coverage counts are whole numbers (the Poisson-sampled counts) and kNN labels the plain votes'
    chosen, _, _ = ecos_uploads(NoiseSource("zero"))
    scores = np.asarray(chosen.summary.scores)
    assert np.array_equal(scores, np.round(scores)) and scores.sum() > 0
    # a zero stream still samples: its uniforms are its generator's
    zero = ZeroNoiseStream(torch.Generator().manual_seed(5))
    assert torch.equal(torch.rand(4, generator=torch.Generator().manual_seed(5)), uniform(4, zero))


def test_ecos_uploads_are_seeded_reproducible_and_secure_fresh():
    a, la, _ = ecos_uploads(NoiseSource("seeded"), seed=3)
    b, lb, _ = ecos_uploads(NoiseSource("seeded"), seed=3)
    c, _, _ = ecos_uploads(NoiseSource("secure"), seed=3)
    d, _, _ = ecos_uploads(NoiseSource("secure"), seed=3)
    assert np.array_equal(a.summary.scores, b.summary.scores) and np.array_equal(la.answer.labels, lb.answer.labels)
    assert not np.array_equal(c.summary.scores, d.summary.scores)


def test_secure_rng_in_the_config_makes_the_run_source_secure():
    sim = Simulation.from_config(tiny_config(privacy={**EXAMPLE, "secure_rng": True}))
    assert sim.algorithm.ctx.noise.secure and sim.privacy.noise is sim.algorithm.ctx.noise
    assert sim.privacy.task_dp(0, 0).source(torch.Generator()) is SECURE
    assert NoiseSource.for_config(False).kind == "seeded"
