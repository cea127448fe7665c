"""What a Ray worker gets and gives back: the task's privacy budget goes out (IFCA's private
selection needs it), CPU tensors travel, and the DP steps come back in the results."""
from __future__ import annotations

import pytest
import torch

from fedveil.runtime import Simulation
from fedveil.runtime.ray_executor import _run_shard, _shard_payload
from fedveil.runtime.device import tensors_of
from tiny_runs import tiny_config, without_wall_clock

IFCA_DP = dict(
    algorithm={"name": "ifca", "clusters": 2, "select_fraction": 0.5}, privacy={"level": "example", "epsilon": 4.0},
    federation={"rounds": 2},
)


@pytest.mark.parametrize("inner", ["serial", "threads"])
def test_a_shard_is_rebuilt_with_its_budget_and_returns_its_dp_steps(inner):
    """The worker side, in process: the serial executor's results, steps included; bit for bit
    when the worker trains serially on the caller's one thread. The threads executor's two
    workers each compute on one OpenMP thread, but MKL's GEMMs in a new thread take torch's
    global count (two), which orders float32 sums differently: equal to 1e-6."""
    torch.set_num_threads(1)
    sim = Simulation.from_config(tiny_config(executor="serial", threads=1, **IFCA_DP))
    state = sim.fresh_state()
    jobs = [(sim.task(c, 0), sim.client_state(state, c)) for c in (0, 2)]
    payloads = [_shard_payload(t, s) for t, s in jobs]
    assert [p["privacy_budget"] for p in payloads] == [4.0, 4.0]
    assert all(t.device == torch.device("cpu") for p in payloads for t in tensors_of(p["data"]))
    local = sim.executor.run_cohort(sim.algorithm, state["server"], [(sim.task(c, 0), None) for c in (0, 2)])
    torch.set_num_threads(2 if inner == "threads" else 1)  # the threads inner executor: two workers
    try:
        remote = _run_shard(sim.algorithm, state["server"], payloads, inner, "cpu")
    finally:
        torch.set_num_threads(1)
    for r, l in zip(remote, local):
        assert r.dp_trainings == l.dp_trainings and len(r.dp_trainings) == 1 and r.dp_trainings[0] > 0
        assert r.releases == l.releases and r.message["cluster"] == l.message["cluster"]
        for k, v in l.message["delta"].items():
            if inner == "serial":
                assert torch.equal(r.message["delta"][k], v)
            else:
                torch.testing.assert_close(r.message["delta"][k], v, rtol=0, atol=1e-6)


def test_ifca_with_example_dp_on_ray_equals_serial():
    pytest.importorskip("ray")
    import ray

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, ignore_reinit_error=True)
    try:
        sections = dict(IFCA_DP, ray={"workers": 2, "inner": "serial"})
        serial = Simulation.from_config(tiny_config(executor="serial", **sections)).record()
        on_ray = Simulation.from_config(tiny_config(executor="ray", **sections)).record()
    finally:
        ray.shutdown()
    assert on_ray["epsilon"] == serial["epsilon"] > 0
    assert (on_ray.pop("executor"), serial.pop("executor")) == ("ray", "serial")
    assert without_wall_clock(on_ray) == without_wall_clock(serial)
