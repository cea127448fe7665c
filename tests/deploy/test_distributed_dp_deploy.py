"""Distributed DP in a deployment (issue 35, item 2), over the in-process transport.

* The deployed run equals its simulation bit for bit (the silos draw the same seeded
  rounding and noise streams), and its epsilon is the server's ledger of the sums it
  unmasked.
* The server never holds an un-noised sum: the sum it unmasks minus the silos' noise
  shares, regenerated here from the seeded streams, leaves noise of the summed shares'
  standard deviation, sqrt(n * share); no reply it received is an update.
* A silo lost mid-round is survived and the round accounted at the noise actually present:
  four shares, not five.
"""
from __future__ import annotations

import math

import numpy as np
import pytest

pytest.importorskip("Crypto")

from fedveil.config import ConfigError  # noqa: E402
from fedveil.deploy import wire  # noqa: E402
from fedveil.deploy.silo import check_deployable  # noqa: E402
from fedveil.privacy.randomness import NoiseSource, skellam  # noqa: E402
from fedveil.runtime.distributed_dp import silo_streams  # noqa: E402
from fedveil.runtime.secure_sum import modular_sum  # noqa: E402
from fedveil.runtime.recorder import MemoryRecorder  # noqa: E402
from fedveil.runtime.simulation import Simulation  # noqa: E402

from tests.deploy.test_loopback import assert_same_params  # noqa: E402
from tests.deploy.test_secure_aggregation import deploy  # noqa: E402
from tests.runtime.tiny_runs import deploy_config  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:privacy.secure_rng is false")


def ddp_config(**changes):
    base = dict(
        algorithm={"name": "fedavg"}, federation={"rounds": 3, "clients_per_round": 5}, checkpoint={"every": 1},
        privacy={"level": "client", "epsilon": 6.0, "delta": 1e-5, "clip": 0.5},
        secure_aggregation={"enabled": True, "threshold": 0.6},
    )
    return deploy_config(**{**base, **changes})


def secure_inputs(transport, round_idx: int) -> dict[int, np.ndarray]:
    out = {}
    for cid, silo in transport.silos.items():
        record = silo._record(round_idx)
        if record is not None:
            out[cid] = wire.unpack(record["reply_tensors"], record["reply_skeleton"])["secure_input"].numpy().astype(np.uint32)
    return out


def centred(vector: np.ndarray) -> np.ndarray:
    vector = vector.astype(np.int64) % (1 << 32)
    return np.where(vector >= 1 << 31, vector - (1 << 32), vector)


def test_the_deployed_run_equals_its_simulation_and_accounts_every_unmasked_sum(tmp_path):
    config = ddp_config()
    summary, recorder, transport = deploy(config, tmp_path / "fed")
    simulated = MemoryRecorder()
    sim = Simulation.from_config(config)
    sim_summary = sim.record(simulated)
    assert [r["survivors"] for r in recorder.rows] == [5, 5, 5]
    assert_same_params(recorder.model, simulated.model)
    assert summary["epsilon"] == pytest.approx(sim_summary["epsilon"], rel=1e-12)
    assert 0 < summary["epsilon"] <= 6.0 and summary["distributed_dp"]["rounds_released"] == 3
    assert [r["epsilon"] for r in recorder.rows] == pytest.approx([r["epsilon"] for r in simulated.rows], rel=1e-12)


def test_the_server_never_holds_an_unnoised_sum(tmp_path):
    config = ddp_config()
    _, _, transport = deploy(config, tmp_path / "fed")
    train = [(r, cid, wire.unpack(*reply)) for kind, r, cid, reply in transport.replies if kind == "train"]
    assert train and all("message" not in v and "secure_input" not in v for _, _, v in train)
    plan = Simulation.from_config(config).privacy.plan
    for r in range(3):
        inputs = secure_inputs(transport, r)
        total = modular_sum(list(inputs.values()))  # what the unmask stage reveals to the server
        share = plan.distributed.share(r, 5)
        noise = sum(skellam(total.size, share, silo_streams(NoiseSource("seeded"), config.seed, r, cid)[0])
                    for cid in inputs)
        unnoised = centred(total.astype(np.int64) - noise)  # the silos' rounded updates, never sent
        residual = centred(total) - unnoised
        assert np.array_equal(residual, noise)
        assert float(residual.std()) == pytest.approx(math.sqrt(5 * share), rel=0.15)  # d = 650 coordinates
        assert np.abs(unnoised).max() <= 5 * plan.distributed.mechanism.norm_units  # the rounded sum lies inside the noise
        for _, cid, value in ((x for x in train if x[0] == r)):
            assert not np.array_equal(value["masked"].numpy(), inputs[cid])


def test_a_silo_lost_mid_round_is_survived_and_the_round_accounted_at_the_noise_present(tmp_path):
    config = ddp_config()
    summary, recorder, transport = deploy(config, tmp_path / "lost", faults={(1, 2): "lost"})
    assert [r["survivors"] for r in recorder.rows] == [5, 4, 5]
    plan = Simulation.from_config(config).privacy.plan
    shares = [plan.distributed.share(r, 5) for r in range(3)]
    full = deploy(config, tmp_path / "full")[0]
    assert summary["epsilon"] > full["epsilon"]  # round 2 carried four shares, not five
    from fedveil.privacy.ledger import PrivacyLedger
    ledger = PrivacyLedger("rdp")
    for r, survivors in enumerate([5, 4, 5]):
        ledger.record("population", plan.distributed.mechanism.release(survivors, shares[r]))
    assert summary["epsilon"] == pytest.approx(ledger.epsilon("population", 1e-5), rel=1e-12)
    assert summary["epsilon"] <= 6.0  # four survivors still carry the planned noise (threshold 3)


def test_client_level_dp_without_secure_aggregation_is_refused_for_deployment():
    config = ddp_config(secure_aggregation={"enabled": False})
    sim = Simulation.from_config(config)
    with pytest.raises(ConfigError, match="secure_aggregation.enabled = true"):
        check_deployable(config, sim.algorithm)


def test_a_silo_knows_the_population_plan_its_max_epsilon_is_checked_against(tmp_path):
    config = ddp_config()
    _, _, transport = deploy(config, tmp_path / "fed")
    silo = transport.silos[0]
    plan = Simulation.from_config(config).privacy.plan
    assert silo.planned_epsilon_through(2) == pytest.approx(plan.planned_epsilon, rel=1e-9)
    assert 0 < silo.planned_epsilon_through(0) < silo.planned_epsilon_through(2) <= 6.0 * (1 + 1e-9)
