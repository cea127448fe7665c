"""The benchmark harness and its synthetic data set (no assertions on speed)."""
import copy
import json

import pytest
import torch

from fedveil.bench import baselines, harness
from fedveil.bench.workloads import WORKLOADS, Case, fedveil_config, suite
from fedveil.config import validate
from fedveil.data import DataError
from fedveil.errors import ConfigError
from fedveil.runtime.dataset import build_dataset

RECORD_FIELDS = {"workload", "system", "clients", "dp", "steps", "batch", "status", "note"}


def test_suite_runs_each_system_in_a_subprocess_and_writes_json(tmp_path, monkeypatch):
    monkeypatch.setitem(baselines.REQUIRES, "flower", ("fedveil_no_such_package",))  # a missing dependency
    out = tmp_path / "bench.json"
    systems = ["fedveil-serial", "plain-loop", "centralised", "flower", "fedveil-no-such-executor"]
    records = harness.run_suite(True, str(out), systems, ["tiny"], cohorts=[3], rounds=1, dp=False, echo=None)

    assert [r["system"] for r in records] == systems
    by_system = {r["system"]: r for r in records}
    for name in ("fedveil-serial", "plain-loop", "centralised"):
        r = by_system[name]
        assert r["status"] == "ok", r["note"]
        assert RECORD_FIELDS | {"seconds_per_round", "peak_mib", "tree_peak_mib", "round_seconds"} <= set(r)
        assert (r["workload"], r["clients"], r["dp"], r["steps"]) == ("tiny", 3, False, 2)
        assert r["seconds_per_round"] > 0 and r["peak_mib"] > 0
        assert len(r["round_seconds"]) == 2  # one warm-up round, one measured
        assert r["ref_system"] == "fedveil-serial"  # vectorized was not asked for
    assert by_system["flower"]["status"] == "n/a"
    assert "fedveil_no_such_package not installed" in by_system["flower"]["note"]
    assert by_system["fedveil-no-such-executor"]["status"] == "n/a"
    assert "not available" in by_system["fedveil-no-such-executor"]["note"]

    payload = json.loads(out.read_text())
    assert {"cpu", "cores", "torch", "date"} <= set(payload["machine"])
    assert payload["records"] == records
    table = harness.format_table(records)
    assert "plain-loop" in table and "n/a" in table and "ref speedup" in table


def test_suites_pair_systems_with_the_dp_variants_they_have():
    full = [c for c in suite(False) if baselines.supports(c.system, c.dp)]
    assert {c.clients for c in full} == {10, 100, 1000}
    assert {c.workload for c in full} == {"mlp", "lenet", "resnet"}
    assert not any(c.system == "opacus" and not c.dp for c in full)
    assert not any(c.system in ("plain-loop", "flower") and c.dp for c in full)
    assert {c.workload for c in suite(True)} == {"mlp", "lenet"}
    # a method round that refuses DP-SGD (ADDS) gets no DP variant, and only fedveil systems
    adds = suite(False, workloads=["adds"])
    assert adds and not any(c.dp for c in adds) and all(c.system.startswith("fedveil-") for c in adds)
    with pytest.raises(ValueError, match="unknown workload"):
        suite(True, workloads=["nope"])
    with pytest.raises(ValueError, match="unknown system"):
        harness.precheck(Case("tiny", "nope", 2))


def test_synthetic_images_give_every_client_the_rows_of_a_round():
    raw = fedveil_config(Case("mlp", "fedveil-serial", clients=100), "serial")
    raw["data"]["options"].update(channels=3, height=8, width=8)  # small images keep the test fast
    data = build_dataset(validate(raw).data, seed=0)
    assert data.num_clients == 100 and data.input_shape == (3, 8, 8) and data.num_classes == 10
    assert set(data.train_sizes().tolist()) == {WORKLOADS["mlp"].rows_per_client}  # 320 = 10 steps x 32
    assert len(data.test) == 256
    labels = torch.cat([c.train.y for c in data.clients])
    assert labels.min() >= 0 and labels.max() < 10 and len(labels.unique()) > 1


def test_synthetic_images_default_split_and_bad_options():
    raw = {"data": {"name": "synthetic_images", "num_clients": 10, "options": {"rows": 1000, "height": 12, "width": 10}}}
    data = build_dataset(validate(raw).data, seed=0)
    assert data.input_shape == (1, 12, 10)
    assert set(data.train_sizes().tolist()) == {80}  # test_fraction 0.2 of 100 rows per client
    with pytest.raises(DataError, match="channels"):
        build_dataset(validate({"data": {"name": "synthetic_images", "options": {"channels": 0}}}).data, seed=0)


def test_plain_loop_and_fedveil_compute_the_same_fedavg_round():
    """Same initial weights, data and batches (fedveil's own batch indices), plain SGD
    without momentum: the averaged models agree to float rounding."""
    from fedveil.runtime import Simulation

    case = Case("tiny", "fedveil-serial", clients=3, rounds=1, warmup=0)
    sim = Simulation.from_config(validate(fedveil_config(case, "serial")))
    cohort = [int(c) for c in sim.schedule[0]]
    clients = [(sim.data.clients[c].train.x, sim.data.clients[c].train.y) for c in cohort]
    model = copy.deepcopy(sim.model)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(sim.init[name])

    def fedveil_batches(i, n):
        return sim.trainer.batch_indices(n, sim.task(cohort[i], 0).generator)

    baselines.plain_fedavg_round(model, clients, fedveil_batches, WORKLOADS["tiny"].lr)
    state = sim.fresh_state()
    sim.train_round(state, 0)
    for name, p in model.named_parameters():
        assert not torch.equal(p, sim.init[name])  # the round moved the model
        torch.testing.assert_close(p.detach(), state["server"]["params"][name], rtol=1e-5, atol=1e-6)


def test_a_case_over_its_time_limit_is_killed_and_reported():
    record = harness.run_case(Case("tiny", "plain-loop", clients=2), timeout_s=0.3)
    assert record["status"] == "timeout" and "killed" in record["note"]


def test_in_process_cases_share_the_suites_process_and_stop_between_rounds(monkeypatch):
    """``in_process=True`` (the GPU check's mode): the cases run here, their records say so
    and hold no RSS of their own, Flower still goes to a subprocess, torch's threads are
    restored, and a case past its time limit stops after the round that passed it."""
    monkeypatch.setitem(baselines.REQUIRES, "flower", ())  # installed or not: it must not run here
    isolated = []
    monkeypatch.setattr(harness, "run_case", lambda case, timeout_s: isolated.append(case.system) or
                        {**case.record(), "status": "ok", "seconds_per_round": 1.0, "peak_mib": 1.0, "note": ""})
    threads = torch.get_num_threads()
    systems = ["fedveil-serial", "plain-loop", "flower"]
    records = harness.run_suite(True, None, systems, ["tiny"], cohorts=[3], rounds=1, dp=False, echo=None,
                                in_process=True, threads=threads + 1)
    assert isolated == ["flower"] and torch.get_num_threads() == threads
    for r in records[:2]:
        assert r["status"] == "ok" and r["isolation"] == "in-process" and r["peak_mib"] is None, r
        assert r["torch_threads"] == threads + 1 and len(r["round_seconds"]) == 2
    assert "fedveil-serial" in harness.format_table(records)

    record = harness.run_in_process(Case("tiny", "plain-loop", clients=2, rounds=50), timeout_s=0.0)
    assert record["status"] == "timeout" and record["note"].startswith("stopped after 1 of 51 rounds")


def test_every_system_runs_on_the_chosen_device_and_records_it(monkeypatch):
    """In-process: the record holds the device the case resolved to (auto: the CPU here),
    fedveil's config carries it, and CUDA on a machine without it stops the suite early."""
    import fedveil.runtime.device as device_mod

    for system in ("fedveil-serial", "plain-loop", "centralised"):
        case = Case("tiny", system, clients=2, rounds=1, warmup=0, device="cpu")
        record = harness.run_one(case)
        assert record["status"] == "ok" and record["device"] == "cpu", record
    assert harness.run_one(Case("tiny", "plain-loop", clients=2, rounds=1, warmup=0))["device"] == (
        "cuda:0" if torch.cuda.is_available() else "cpu"
    )
    assert validate(fedveil_config(Case("tiny", "fedveil-serial", 2, device="cpu"), "serial")).device == "cpu"
    assert {c.device for c in suite(True, device="cuda:1")} == {"cuda:1"}

    monkeypatch.setattr(device_mod, "cuda_available", lambda: False)
    ran = []
    monkeypatch.setattr(harness, "run_case", lambda *a, **k: ran.append(a))
    with pytest.raises(ConfigError, match="CUDA is not available"):
        harness.run_suite(True, None, ["plain-loop"], ["tiny"], device="cuda", echo=None)
    assert ran == []


def test_a_spent_budget_skips_the_cases_left_and_caps_the_running_one(monkeypatch):
    """``budget_s``: a case never gets more time than the budget has left, and once it is
    spent the remaining cases are recorded as skipped without running."""
    timeouts, clock = [], iter([0.0, 0.0, 3.0, 11.0, 11.0])
    monkeypatch.setattr(harness.time, "monotonic", lambda: next(clock))

    def fake_run_case(case, timeout_s):
        timeouts.append(timeout_s)
        return {**case.record(), "status": "ok", "seconds_per_round": 1.0, "peak_mib": 1.0, "note": ""}

    monkeypatch.setattr(harness, "run_case", fake_run_case)
    records = harness.run_suite(True, None, ["plain-loop"], ["tiny"], cohorts=[2, 3, 4], echo=None, device="cpu",
                                timeout_s=60, budget_s=10)
    assert timeouts == [10.0, 7.0]  # the whole budget, then what is left after 3 s
    assert [r["status"] for r in records] == ["ok", "ok", "skipped"]
    assert "budget of 10 s" in records[2]["note"]
