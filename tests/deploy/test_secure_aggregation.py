"""Secure aggregation in a deployment (issue 35, item 1), over the in-process transport:
the server receives only masked vectors (no update, no message), their unmasked sum is the
plain sum of the silos' quantised updates, the deployed run equals the simulation (which
sums the same integers in the clear), the aggregate is FedAvg's within the quantisation
bound, and a silo lost after the key stages is survived."""
from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("Crypto")

from fedveil.deploy import DeployedServer, prepare_silos, wire  # noqa: E402
from fedveil.deploy.loopback import LoopbackTransport  # noqa: E402
from fedveil.deploy.silo import Silo  # noqa: E402
from fedveil.deploy.silo_data import read_federation, silo_folder  # noqa: E402
from fedveil.runtime.recorder import MemoryRecorder  # noqa: E402
from fedveil.runtime.secure_sum import quantization_bound  # noqa: E402
from fedveil.runtime.simulation import Simulation  # noqa: E402

from tests.deploy.test_loopback import assert_same_params  # noqa: E402
from tests.runtime.tiny_runs import deploy_config  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:privacy.secure_rng is false")
SECURE = {"enabled": True, "threshold": 0.6, "bits": 20, "clip_range": 4.0, "weight_scale": 100.0}


def secure_config(**changes):
    base = dict(algorithm={"name": "fedavg"}, federation={"rounds": 3, "clients_per_round": 5}, checkpoint={"every": 1},
                privacy={"level": "example", "epsilon": 4.0, "delta": 1e-5, "clip": 1.0}, secure_aggregation=SECURE)
    return deploy_config(**{**base, **changes})


class Recording(LoopbackTransport):
    """The loopback transport, keeping every reply the server received."""

    def __init__(self, silos, faults=None):
        super().__init__(silos, faults or {})
        self.replies: list[tuple[str, int, int, object]] = []

    def exchange(self, kind, round_idx, requests):
        out = super().exchange(kind, round_idx, requests)
        self.replies += [(kind, round_idx, cid, reply) for cid, reply in out.items()]
        return out


def deploy(config, where, faults=None):
    prepare_silos(config, where)
    shape, _ = read_federation(where)
    silos = {k: Silo.from_folder(config, silo_folder(where, k), share_metrics=True) for k in range(shape.num_clients)}
    transport = Recording(silos, faults)
    recorder = MemoryRecorder()
    summary = DeployedServer(config, shape).run(transport, recorder)
    return summary, recorder, transport


def test_the_server_sees_only_masked_vectors_whose_sum_is_the_silos_quantised_sum(tmp_path):
    config = secure_config()
    summary, recorder, transport = deploy(config, tmp_path / "fed")
    assert [r["survivors"] for r in recorder.rows] == [5, 5, 5] and summary["deployment"]["quarantined"] == {}
    train = [(r, cid, wire.unpack(*reply)) for kind, r, cid, reply in transport.replies if kind == "train"]
    assert len(train) == 15
    for r, cid, value in train:
        assert "message" not in value and "secure_input" not in value  # no update, quantised or not
        record = transport.silos[cid]._record(r)
        quantized = wire.unpack(record["reply_tensors"], record["reply_skeleton"])["secure_input"].numpy()
        masked = value["masked"].numpy()
        assert not np.array_equal(masked, quantized)
        assert abs(np.corrcoef(masked.astype(float), quantized.astype(float))[0, 1]) < 0.5
    # the sum of round 1's masked vectors, unmasked, is the plain sum of the quantised inputs
    round1 = {cid: value for r, cid, value in train if r == 0}
    inputs = [wire.unpack(transport.silos[c]._record(0)["reply_tensors"], transport.silos[c]._record(0)["reply_skeleton"])
              ["secure_input"].numpy() for c in round1]
    plain = np.sum(inputs, axis=0) % (1 << 32)
    masked_sum = np.sum([v["masked"].numpy() for v in round1.values()], axis=0) % (1 << 32)
    assert not np.array_equal(masked_sum, plain)  # the masks do not cancel without the unmask stage
    assert summary["epsilon"] <= 4.0 * (1 + 1e-6)


def test_the_deployed_secure_run_equals_the_simulation_and_fedavg_within_the_bound(tmp_path):
    config = secure_config()
    _, deployed, _ = deploy(config, tmp_path / "fed")
    simulated = MemoryRecorder()
    Simulation.from_config(config).record(simulated)
    assert_same_params(deployed.model, simulated.model)  # the same integers summed, masked or not
    # one round against plain FedAvg from the same state: within the quantisation bound
    one = {"rounds": 1, "clients_per_round": 5}
    plain, secure = MemoryRecorder(), MemoryRecorder()
    Simulation.from_config(secure_config(federation=one, secure_aggregation={"enabled": False})).record(plain)
    Simulation.from_config(secure_config(federation=one)).record(secure)
    sizes = Simulation.from_config(secure_config(federation=one)).data.train_sizes()
    total_p = float(sum(sizes)) / SECURE["weight_scale"]
    # error of sum(p delta) and of sum(p) each below the bound; the mean divides by sum(p)
    bound = quantization_bound(5, SECURE["clip_range"], SECURE["bits"])
    worst = bound / total_p * (1 + 1 / (total_p - bound)) * 2
    for key in plain.model:
        gap = (plain.model[key].double() - secure.model[key].double()).abs().max().item()
        assert 0 < gap < worst, key


def test_a_silo_lost_after_the_key_stages_is_survived_and_its_masks_removed(tmp_path):
    config = secure_config()
    summary, recorder, transport = deploy(config, tmp_path / "lost", faults={(1, 2): "lost"})
    rows = recorder.rows
    assert [r["survivors"] for r in rows] == [5, 4, 5] and rows[1]["dropped"] == {"2": "timeout"}
    # the same as a run where silo 2 was down at round 2's train stage (never trained): same survivors, same sum
    _, down, _ = deploy(config, tmp_path / "down", faults={(1, 2): "down"})
    assert_same_params(recorder.model, down.model)
    assert transport.silos[2].epsilon() > 0  # it trained and spent; its update never reached the aggregate


def test_too_few_silos_end_the_round_with_the_model_unchanged(tmp_path):
    config = secure_config(federation={"rounds": 2, "clients_per_round": 5})
    faults = {(0, k): "lost" for k in (0, 1, 2)}  # 2 of 5 answer: below the threshold of 3
    _, recorder, _ = deploy(config, tmp_path / "fed", faults=faults)
    assert recorder.rows[0]["survivors"] == 0
    assert all("secure aggregation stopped" in why or why == "timeout" for why in recorder.rows[0]["dropped"].values())
    assert recorder.rows[1]["survivors"] == 5


def test_algorithms_that_need_each_message_are_refused_in_one_line():
    with pytest.raises(Exception, match="secure_aggregation: mr_mtl's server needs each client's message"):
        Simulation.from_config(secure_config(algorithm={"name": "mr_mtl"}))
    with pytest.raises(Exception, match="cannot bound or trim"):
        secure_config(federation={"rounds": 1, "clients_per_round": 5, "aggregation": "median"})


def test_a_silo_refuses_secure_stages_in_a_run_without_them(tmp_path):
    config = secure_config(secure_aggregation={"enabled": False})
    prepare_silos(config, tmp_path / "fed")
    silo = Silo.from_folder(config, silo_folder(tmp_path / "fed", 0))
    with pytest.raises(Exception, match="does not use secure aggregation"):
        silo.answer("train.secagg_advertise", 0, *wire.pack({"round": 0, "client": 0}))


class Corrupting(Recording):
    """Replaces silo ``silo``'s reply to ``kind`` in round 1 by ``bad`` (a malformed value)."""

    def __init__(self, silos, kind, silo, bad):
        super().__init__(silos)
        self.kind, self.silo, self.bad = kind, silo, bad

    def exchange(self, kind, round_idx, requests):
        out = super().exchange(kind, round_idx, requests)
        if kind == self.kind and round_idx == 0 and self.silo in out:
            out[self.silo] = wire.pack(self.bad)
        return out


@pytest.mark.parametrize("kind, bad", [
    ("train.secagg_advertise", {"c_pk": "ab", "s_pk": "cd"}),
    ("train.secagg_share", {0: "zz"}),
    ("train.secagg_unmask", {"b": {}, "s": {}}),
])
def test_a_malformed_stage_reply_quarantines_that_silo_and_the_round_goes_on(tmp_path, kind, bad):
    config = secure_config(federation={"rounds": 2, "clients_per_round": 5})
    prepare_silos(config, tmp_path / "fed")
    shape, _ = read_federation(tmp_path / "fed")
    silos = {k: Silo.from_folder(config, silo_folder(tmp_path / "fed", k), share_metrics=True) for k in range(5)}
    recorder = MemoryRecorder()
    summary = DeployedServer(config, shape).run(Corrupting(silos, kind, 3, bad), recorder)
    first = recorder.rows[0]
    assert "3" in summary["deployment"]["quarantined"]
    if kind == "train.secagg_unmask":  # its masked update is in the sum; only its unmask reply is left out
        assert first["survivors"] == 5 and "dropped" not in first
    else:
        assert first["survivors"] == 4 and "invalid reply" in first["dropped"]["3"]
    assert recorder.rows[1]["survivors"] == 4  # quarantined: not asked again


def test_a_silo_shares_its_secrets_only_with_silos_whose_round_keys_their_registered_key_signed(tmp_path):
    """A server or a stranger who can submit a run could otherwise invent t - 1 silos, collect
    t shares of one silo's secrets and unmask its update alone."""
    from fedveil.deploy.secagg import SecAggClient
    from fedveil.deploy.silo import SiloRefused

    config = secure_config()
    prepare_silos(config, tmp_path / "fed")
    silos = {k: Silo.from_folder(config, silo_folder(tmp_path / "fed", k)) for k in range(3)}

    def advertise(k, round_idx=0):
        return wire.unpack(*silos[k].answer("train.secagg_advertise", round_idx, *wire.pack({"round": round_idx, "client": k})))

    genuine = {k: advertise(k) for k in range(3)}
    assert all(len(bytes.fromhex(a["signature"])) == 64 for a in genuine.values())
    forger = SecAggClient(7, 3).advertise(0)  # a silo of its own making, with its own keys
    impostor = {**SecAggClient(2, 3).advertise(0), "signature": genuine[2]["signature"]}  # silo 2's id, other keys
    stale = advertise(2, round_idx=1)  # silo 2's genuine advert, but for another round
    advertise(2)  # (silo 2 back in round 0)
    cases = {
        "silo 7 is not in the federation's silo keys": {**genuine, 7: forger},
        "the round keys of silo 2 are not signed by its registered key": {**genuine, 2: impostor},
        "the round keys of silo 2 are not signed": {**genuine, 2: stale},
    }
    for expected, publics in cases.items():
        with pytest.raises(SiloRefused, match=expected):
            silos[0].answer("train.secagg_share", 0, *wire.pack({"round": 0, "client": 0, "publics": publics}))
    shares = wire.unpack(*silos[0].answer("train.secagg_share", 0, *wire.pack({"round": 0, "client": 0, "publics": genuine})))
    assert set(shares) == {1, 2}


def test_a_round_is_never_unmasked_over_two_sets_of_silos(tmp_path):
    """A later session of a round (a resumed or a curious server) gets every silo's recorded
    input again, masked afresh: unmasking it over other survivors would reveal the
    difference of the two sums. The silos refuse; over the same survivors they answer."""
    from fedveil.deploy.loopback import LoopbackTransport

    config = secure_config(federation={"rounds": 1, "clients_per_round": 5})
    _, recorder, transport = deploy(config, tmp_path / "fed")
    server = DeployedServer(config, read_federation(tmp_path / "fed")[0])

    def again(faults):
        state = {"round": 0, "server": server.algorithm.init_server(server.init), "elapsed_s": 0.0, "epsilon": {},
                 "quarantined": {}}
        return server.train_round(state, 0, LoopbackTransport(transport.silos, faults))

    row = again({(0, 4): "down"})  # silo 4 left out: the sum would be the first one minus its input
    assert row["survivors"] == 0
    assert any("unmasked over silos [0, 1, 2, 3, 4] already" in why for why in row["dropped"].values())
    assert again({})["survivors"] == 5  # the same survivors: the same sum again, nothing new
