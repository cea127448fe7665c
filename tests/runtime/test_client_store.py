"""Client state in memory or on disk: the same run either way, compact tensors, and a
disk run killed after a checkpoint resumes bit-for-bit whatever later rounds wrote."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from fedveil.config import ConfigError, validate
from fedveil.runtime import Simulation, run
from fedveil.runtime.client_store import DiskClientStore, compact, make_client_store
from fedveil.runtime.run_dir import RunDirError
from tiny_runs import KillAfterRound, Killed, assert_same_state, load_checkpoint, read_json, rows_of, tiny_config, tiny_raw, without_wall_clock

pytestmark = pytest.mark.usefixtures("skip_plots")

ROUNDS, EVERY, KILL_AT = 6, 2, 3
CASES = {
    "scaffold-serial": dict(algorithm={"name": "scaffold"}, client={"momentum": 0.5}),
    "local-vectorized": dict(algorithm={"name": "local"}, executor="vectorized"),
}




def config_for(case: str, backend: str):
    return tiny_config(**CASES[case], federation={"rounds": ROUNDS, "client_state": backend}, checkpoint={"every": EVERY})


def states_dir(run_dir: Path) -> Path:
    return Path(run_dir) / "client_states"


def checkpoint_with_states(run_dir: Path) -> dict:
    """The checkpoint with a disk run's client index replaced by the states it points to."""
    checkpoint = load_checkpoint(run_dir)
    index = checkpoint["clients"]
    assert all(isinstance(v, int) for v in index.values()), "a disk checkpoint holds versions, not states"
    states = {cid: torch.load(states_dir(run_dir) / f"c{cid}.r{v}.pt", weights_only=True) for cid, v in index.items()}
    return {**checkpoint, "clients": states}


def assert_same_results(a: Path, b: Path) -> None:
    assert without_wall_clock(rows_of(a)) == without_wall_clock(rows_of(b))
    assert without_wall_clock(read_json(a / "summary.json")) == without_wall_clock(read_json(b / "summary.json"))
    assert read_json(a / "client_metrics.json") == read_json(b / "client_metrics.json")


def assert_owns_storage(state, where: str) -> None:
    """Every tensor is contiguous and its storage holds exactly its own elements."""
    for key, value in state.items():
        if isinstance(value, dict):
            assert_owns_storage(value, f"{where}.{key}")
        elif isinstance(value, torch.Tensor):
            assert value.is_contiguous(), f"{where}.{key} is not contiguous"
            own = value.numel() * value.element_size()
            assert value.untyped_storage().nbytes() == own, f"{where}.{key} is a view of a larger tensor"
            assert value.storage_offset() == 0, f"{where}.{key} is a view"


# ------------------------------------------------------------------ whole runs


@pytest.mark.parametrize("case", list(CASES))
def test_disk_run_equals_memory_run(tmp_path, case):
    memory, disk = tmp_path / "memory", tmp_path / "disk"
    run(config_for(case, "memory"), memory, progress=False)
    run(config_for(case, "disk"), disk, progress=False)
    assert_same_results(disk, memory)
    assert not states_dir(memory).exists()
    final_memory, final_disk = load_checkpoint(memory), checkpoint_with_states(disk)
    assert final_memory["clients"], "the algorithm should keep client state"
    assert_same_state(final_disk["server"], final_memory["server"])
    assert_same_state(final_disk["clients"], final_memory["clients"], "clients")
    # after the final checkpoint only the newest version of each client is left
    index = load_checkpoint(disk)["clients"]
    assert sorted(p.name for p in states_dir(disk).iterdir()) == sorted(f"c{c}.r{v}.pt" for c, v in index.items())


@pytest.mark.parametrize("case", list(CASES))
def test_killed_disk_run_resumes_bit_for_bit(tmp_path, case):
    config = config_for(case, "disk")
    full, resumed = tmp_path / "full", tmp_path / "resumed"
    run(config, full, progress=False)
    with pytest.raises(Killed):
        Simulation.from_config(config, [KillAfterRound(KILL_AT)]).run(resumed)

    index = load_checkpoint(resumed)["clients"]
    assert load_checkpoint(resumed)["round"] == EVERY
    for cid, version in index.items():  # the checkpoint's versions survived round 3's writes
        assert (states_dir(resumed) / f"c{cid}.r{version}.pt").exists()
    assert any((states_dir(resumed) / f"c{cid}.r{KILL_AT}.pt").exists() for cid in index), (
        "round 3 should have written new versions of clients the checkpoint refers to"
    )
    # what a later round would have left: a new version and a torn temporary file
    cid = next(iter(index))
    (states_dir(resumed) / f"c{cid}.r{KILL_AT + 1}.pt").write_bytes(b"newer than the checkpoint")
    (states_dir(resumed) / f"c{cid}.r{KILL_AT + 1}.pt.tmp").write_bytes(b"torn")

    Simulation.from_config(config).run(resumed, resume=True)
    assert_same_results(resumed, full)
    assert_same_state(checkpoint_with_states(resumed), checkpoint_with_states(full))
    assert sorted(p.name for p in states_dir(resumed).iterdir()) == sorted(p.name for p in states_dir(full).iterdir())


def test_resume_refuses_when_a_checkpointed_state_file_is_missing(tmp_path):
    config = config_for("scaffold-serial", "disk")
    with pytest.raises(Killed):
        Simulation.from_config(config, [KillAfterRound(KILL_AT)]).run(tmp_path)
    cid, version = next(iter(load_checkpoint(tmp_path)["clients"].items()))
    (states_dir(tmp_path) / f"c{cid}.r{version}.pt").unlink()
    with pytest.raises(RunDirError, match=rf"missing .*c{cid}\.r{version}\.pt.*start a new run"):
        Simulation.from_config(config).run(tmp_path, resume=True)


def test_resume_without_checkpoint_clears_the_killed_runs_states(tmp_path):
    config = tiny_config(**CASES["scaffold-serial"], federation={"rounds": 3, "client_state": "disk"}, checkpoint={"every": 0})
    full, resumed = tmp_path / "full", tmp_path / "resumed"
    run(config, full, progress=False)
    with pytest.raises(Killed):
        Simulation.from_config(config, [KillAfterRound(2)]).run(resumed)
    assert any(states_dir(resumed).iterdir())
    Simulation.from_config(config).run(resumed, resume=True)
    assert_same_results(resumed, full)
    assert_same_state(checkpoint_with_states(resumed), checkpoint_with_states(full))


# ------------------------------------------------------------ compact tensors


def test_vectorized_states_are_stored_as_compact_copies(tmp_path):
    """The vectorized executor hands each client views of the cohort's stacked tensors;
    the store must not keep the whole stack alive through them (nor write it to disk)."""
    config = tiny_config(executor="vectorized", algorithm={"name": "local"}, federation={"rounds": 1})
    sim = Simulation.from_config(config)
    cohort = [int(c) for c in sim.schedule[0]]
    jobs = [(sim.task(cid, 0), sim.client_state(sim.fresh_state(), cid)) for cid in cohort]
    raw = sim.executor.run_cohort(sim.algorithm, sim.fresh_state()["server"], jobs)
    weight = next(iter(raw[0].state["params"].values()))
    assert weight.untyped_storage().nbytes() > weight.numel() * weight.element_size(), "precondition: a view"

    for backend in ("memory", "disk"):
        store = make_client_store(backend, tmp_path / backend)
        state = sim.fresh_state(store)
        sim.train_round(state, 0)
        for cid in cohort:
            assert_owns_storage(store.get(cid), f"{backend} client {cid}")


def test_compact_clones_nested_tensors_and_keeps_other_values():
    stacked = torch.arange(12.0).reshape(3, 4)
    state = {"a": stacked[1], "nested": {"b": [stacked[:, 0], 7]}, "t": (stacked.T,), "n": "name"}
    out = compact(state)
    assert_owns_storage({"a": out["a"], "b": out["nested"]["b"][0], "t": out["t"][0]}, "out")
    assert out["nested"]["b"][1] == 7 and out["n"] == "name" and isinstance(out["t"], tuple)
    assert torch.equal(out["t"][0], stacked.T) and torch.equal(out["nested"]["b"][0], stacked[:, 0])
    stacked.zero_()
    assert out["a"].tolist() == [4.0, 5.0, 6.0, 7.0], "a copy, not a view"
    owner = torch.ones(3)
    assert compact({"w": owner})["w"].data_ptr() == owner.data_ptr(), "a tensor owning its storage is not copied"


# ------------------------------------------------------------- disk versions


def files(store: DiskClientStore) -> list[str]:
    return sorted(p.name for p in store.directory.iterdir())


def test_disk_versions_live_as_long_as_a_checkpoint_needs_them(tmp_path):
    store = DiskClientStore(tmp_path)
    one = {"c": torch.ones(2)}
    store.put(1, one, 1)
    store.put(1, {"c": torch.full((2,), 2.0)}, 2)
    assert files(store) == ["c1.r2.pt"]  # no checkpoint needed round 1's version
    store.checkpoint_saved(2)
    store.put(1, {"c": torch.full((2,), 3.0)}, 3)
    assert files(store) == ["c1.r2.pt", "c1.r3.pt"]  # the round-2 checkpoint still needs r2
    store.put(1, {"c": torch.full((2,), 4.0)}, 4)
    assert files(store) == ["c1.r2.pt", "c1.r4.pt"]  # r3 was never checkpointed
    assert store.to_checkpoint() == {1: 4} and len(store) == 1
    store.checkpoint_saved(4)
    assert files(store) == ["c1.r4.pt"]
    assert store.get(1)["c"].tolist() == [4.0, 4.0] and store.get(2) is None


def test_disk_restore_keeps_exactly_the_checkpointed_versions(tmp_path):
    store = DiskClientStore(tmp_path)
    store.put(2, {"c": torch.tensor([1.0])}, 1)
    store.put(1, {"c": torch.tensor([2.0])}, 2)
    store.checkpoint_saved(2)  # index {1: 2, 2: 1}
    store.put(1, {"c": torch.tensor([3.0])}, 3)
    store.put(3, {"c": torch.tensor([3.0])}, 3)
    assert files(store) == ["c1.r2.pt", "c1.r3.pt", "c2.r1.pt", "c3.r3.pt"]
    (tmp_path / "c2.r3.pt.tmp").write_bytes(b"torn")
    (tmp_path / "c3.r3.pt.0123abcd.tmp").write_bytes(b"torn")  # atomic_write's own temporary name
    (tmp_path / "notes.txt").write_text("not ours")
    resumed = DiskClientStore(tmp_path)
    resumed.restore({1: 2, 2: 1}, 2)
    assert files(resumed) == ["c1.r2.pt", "c2.r1.pt", "notes.txt"]
    assert resumed.get(1)["c"].tolist() == [2.0] and resumed.get(3) is None


# ------------------------------------------------------------------- config


def test_unknown_backend_is_a_config_error():
    with pytest.raises(ConfigError, match=r"federation\.client_state: Input should be 'memory' or 'disk'"):
        validate(tiny_raw(federation={"client_state": "ram"}))
    with pytest.raises(ValueError, match="unknown client state backend 'ram'; choose one of memory, disk"):
        make_client_store("ram", "unused")
