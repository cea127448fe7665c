"""The Ray executor on a local Ray instance gives the serial executor's results."""
from __future__ import annotations

import pytest
import torch

from fedveil.runtime import run
from tiny_runs import rows_of, tiny_config, without_wall_clock

pytest.importorskip("ray")
pytestmark = pytest.mark.usefixtures("skip_plots")


@pytest.fixture(scope="module")
def local_ray():
    import ray

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, ignore_reinit_error=True)
    yield
    ray.shutdown()


def test_ray_equals_serial_with_example_dp_and_client_state(tmp_path, local_ray):
    """Three workers, SCAFFOLD (client state stays with the server), example-level DP
    (the server accounts the steps the workers took)."""
    sections = dict(
        algorithm={"name": "scaffold"}, federation={"rounds": 3, "clients_per_round": 4, "sampling": "poisson"},
        privacy={"level": "example", "noise_multiplier": 1.0, "keep_unnoised": True}, ray={"workers": 3},
    )
    finals = {}
    for executor in ("serial", "ray"):
        out = tmp_path / executor
        run(tiny_config(executor=executor, **sections), out, progress=False)
        finals[executor] = (rows_of(out), torch.load(out / "checkpoint.pt", weights_only=False))
    (rows_s, ck_s), (rows_r, ck_r) = finals["serial"], finals["ray"]
    for a, b in zip(without_wall_clock(rows_s), without_wall_clock(rows_r)):
        assert a.keys() == b.keys()
        assert a["epsilon"] == b["epsilon"] > 0
        assert a["train_loss"] == pytest.approx(b["train_loss"], rel=1e-5)
    for k, v in ck_s["server"]["params"].items():
        assert float((v - ck_r["server"]["params"][k]).norm() / v.norm()) <= 1e-5
    assert ck_s["clients"].keys() == ck_r["clients"].keys()
    for cid, state in ck_s["clients"].items():
        for k, v in state["control"].items():
            torch.testing.assert_close(v, ck_r["clients"][cid]["control"][k], rtol=1e-4, atol=1e-6)
