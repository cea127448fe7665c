"""One of five silos is hostile (issue 34, item 3): every reply is validated before it is
used, a silo whose reply fails is dropped and quarantined (never the whole run), and robust
aggregation bounds what a well-formed but poisoned update can do."""
from __future__ import annotations

import pytest
import torch

from fedveil.deploy import wire
from fedveil.deploy.silo import Silo
from fedveil.runtime.recorder import MemoryRecorder

from tests.deploy.test_loopback import deployed
from tests.runtime.tiny_runs import deploy_config

HOSTILE = 2
BASE = dict(federation={"rounds": 3, "clients_per_round": 5}, checkpoint={"every": 1})


def poison_nan(reply):
    reply["message"]["delta"] = {k: torch.full_like(v, float("nan")) for k, v in reply["message"]["delta"].items()}


def poison_shape(reply):
    reply["message"]["delta"] = {k: torch.zeros(*v.shape, 2) for k, v in reply["message"]["delta"].items()}


def poison_bytes(reply):
    reply["message"]["delta"]["padding"] = torch.zeros(25_000_000)  # 100 MB


def poison_weight(reply):
    reply["message"]["num_examples"] = 10**12


def poison_inf_epsilon(reply):
    reply["epsilon"] = float("inf")


def scale_update(reply):
    reply["message"]["delta"] = {k: 1000.0 * v for k, v in reply["message"]["delta"].items()}


class HostileSilo(Silo):
    """A genuine silo whose train replies are rewritten by ``poison`` before they leave."""

    poison = staticmethod(poison_nan)

    def train(self, round_idx, tensors, skeleton):
        reply = wire.unpack(*super().train(round_idx, tensors, skeleton))
        self.poison(reply)
        return wire.pack(reply)


def run_with(tmp_path, name, poison=None, down=False, **sections):
    config = deploy_config(**{**BASE, **sections})
    faults = {(r, HOSTILE): "down" for r in range(3)} if down else {}
    server, transport = deployed(config, tmp_path / name, faults)
    if poison is not None:
        honest = transport.silos[HOSTILE]
        hostile = HostileSilo.__new__(HostileSilo)
        hostile.__dict__.update(honest.__dict__)
        hostile.poison = poison
        transport.silos[HOSTILE] = hostile
    recorder = MemoryRecorder()
    summary = server.run(transport, recorder)
    return summary, recorder


@pytest.mark.parametrize("poison", [poison_nan, poison_shape, poison_bytes, poison_weight, poison_inf_epsilon],
                         ids=["nan", "wrong-shape", "100MB", "weight-1e12", "epsilon-inf"])
def test_a_malformed_reply_quarantines_its_silo_and_the_run_ends_with_the_honest_silos_result(tmp_path, poison):
    summary, recorder = run_with(tmp_path, "poisoned", poison)
    _, without = run_with(tmp_path, "without", down=True)  # the same run with the hostile silo unreachable
    assert list(summary["deployment"]["quarantined"]) == [str(HOSTILE)]
    assert recorder.rows[0]["dropped"][str(HOSTILE)].startswith("invalid reply")
    assert [r["survivors"] for r in recorder.rows] == [4, 4, 4]
    for k, v in without.model.items():
        assert torch.equal(recorder.model[k], v), k  # exactly the honest silos' aggregate


@pytest.mark.parametrize("aggregation", [{"aggregation": "median"}, {"aggregation": "trimmed_mean"},
                                         {"update_norm_bound": 1.0}], ids=["median", "trimmed-mean", "norm-bound"])
def test_robust_aggregation_keeps_a_scaled_update_from_taking_over(tmp_path, aggregation):
    def distance(model):
        return sum(float((model[k] - honest.model[k]).norm()) for k in honest.model)

    _, honest = run_with(tmp_path, "honest", down=True)
    _, plain = run_with(tmp_path, "mean", scale_update)
    _, robust = run_with(tmp_path, "robust", scale_update, federation={**BASE["federation"], **aggregation})
    assert distance(plain.model) > 20 * distance(robust.model)


def zero_epsilon(reply):
    reply["epsilon"] = 0.0


def test_a_silo_that_reports_spending_nothing_under_dp_is_quarantined(tmp_path):
    privacy = {"level": "example", "epsilon": 3.0, "delta": 1e-5, "clip": 1.0}
    summary, recorder = run_with(tmp_path, "zero", zero_epsilon, privacy=privacy)
    assert "spent nothing" in summary["deployment"]["quarantined"][str(HOSTILE)]
    assert summary["epsilon_per_client"][HOSTILE] is None  # its report was never taken
    assert all(0 < e <= 3.0 * (1 + 1e-6) for c, e in enumerate(summary["epsilon_per_client"]) if c != HOSTILE)
