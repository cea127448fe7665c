"""``device`` is honoured and nothing is hard-wired to the CPU, checked on a machine without a GPU.

Three probes, each of which fails on a hard-coded CPU or default-device tensor:

* the run's device resolved to ``meta`` (monkeypatched): everything the run sets up (model,
  initial state, every client's data with its group labels, server and client states,
  IFCA's centroids, MOCHA's covariance) must land on ``meta``; a ``.cpu()``,
  ``device="cpu"`` or an un-moved tensor stays on the CPU and is caught;
* a whole run under ``torch.device("meta")`` as the *default* device while the run's
  device is the CPU: a tensor created without ``device=`` lands on ``meta``, breaks the
  run or ends up in its state; the run must give exactly the numbers of a normal run
  (same CPU random streams) with every state tensor on the run's device;
* a static scan of the runtime, algorithms and DP mechanisms for tensor factories without
  ``device=`` and for ``.cpu()`` / ``"cpu"`` outside a short list of reviewed places.

On a machine with CUDA, the last test also runs a tiny simulation there.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch

import fedveil
import fedveil.runtime.device as device_mod
import fedveil.runtime.simulation as simulation
from fedveil.config import validate
from fedveil.data.arrays import ArrayDataset, shared_rows
from fedveil.data.federated import ClientData, FederatedDataset
from fedveil.errors import ConfigError
from fedveil.privacy.client_dp import ClientLevelDP
from fedveil.privacy.dp_sgd import ExampleDP, add_gaussian_noise
from fedveil.privacy.randomness import SECURE, fill_standard_normal_, permutation, standard_normal, uniform
from fedveil.runtime import MemoryRecorder, Simulation, run
from fedveil.runtime.device import federated_to, resolve_device, tensors_of
from fedveil.runtime.recorder import DirectoryRecorder
from fedveil.runtime.run_dir import RunDirectory
from fedveil.runtime.client_store import DiskClientStore
from tiny_runs import KillAfterRound, Killed, read_json, rows_of, tiny_config, without_wall_clock

pytestmark = pytest.mark.usefixtures("skip_plots")

META = torch.device("meta")
DP = {"level": "example", "noise_multiplier": 1.0}


def assert_all_on(value, device: torch.device, what: str) -> None:
    found = tensors_of(value)
    assert found, f"{what}: no tensors"
    wrong = {str(t.device) for t in found if t.device != device}
    assert not wrong, f"{what}: tensors on {wrong}, expected {device}"


# ------------------------------------------------------------------ resolution


def test_auto_is_the_cpu_without_cuda_and_cuda_is_refused_with_the_fix(monkeypatch):
    monkeypatch.setattr(device_mod, "cuda_available", lambda: False)
    assert resolve_device("auto") == resolve_device("cpu") == torch.device("cpu")
    for spec in ("cuda", "cuda:0"):
        with pytest.raises(ConfigError) as err:
            resolve_device(spec)
        message = str(err.value)
        assert "\n" not in message and "CUDA is not available" in message
        assert 'use device = "auto" or "cpu"' in message and "TORCH=torch" in message


def test_auto_picks_cuda_when_present_with_its_index(monkeypatch):
    monkeypatch.setattr(device_mod, "cuda_available", lambda: True)
    monkeypatch.setattr(device_mod, "cuda_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    assert resolve_device("auto") == resolve_device("cuda") == torch.device("cuda", 0)
    assert resolve_device("cuda:1") == torch.device("cuda", 1)
    with pytest.raises(ConfigError, match="has 2 CUDA device"):
        resolve_device("cuda:2")


def test_a_misspelt_device_fails_config_validation():
    assert validate({}).device == "auto"
    with pytest.raises(ConfigError, match=r"device: 'gpu' is not a device; use auto, cpu, cuda or cuda:N"):
        validate({"device": "gpu"})


def test_cuda_without_cuda_stops_before_the_data_is_loaded(monkeypatch):
    monkeypatch.setattr(device_mod, "cuda_available", lambda: False)

    def never(*args, **kwargs):
        raise AssertionError("data loaded before the device was checked")

    monkeypatch.setattr(simulation, "build_dataset", never)
    with pytest.raises(ConfigError, match="CUDA is not available"):
        Simulation.from_config(tiny_config(device="cuda"))


def test_the_python_api_takes_a_device(tmp_path, monkeypatch):
    summary = run(tiny_config(federation={"rounds": 1}), tmp_path / "run", progress=False, device="cpu")
    assert summary["device"] == "cpu" and read_json(tmp_path / "run" / "config.json")["device"] == "cpu"
    monkeypatch.setattr(device_mod, "cuda_available", lambda: False)
    with pytest.raises(ConfigError, match="CUDA is not available"):
        run(tiny_config(), tmp_path / "gpu", progress=False, device="cuda")
    assert not (tmp_path / "gpu").exists()


# ------------------------------------------------------- setup on the resolved device


SETUPS = {
    "fedavg": {},
    "scaffold": {"algorithm": {"name": "scaffold"}},
    "mocha-dp": {"algorithm": {"name": "mocha"}, "privacy": {"level": "example", "epsilon": 4.0}},
    "ifca-dp": {"algorithm": {"name": "ifca", "clusters": 2}, "privacy": {"level": "example", "epsilon": 4.0}},
    "ditto": {"algorithm": {"name": "ditto"}},
    "client-dp": {"privacy": {"level": "client", "noise_multiplier": 1.0}},
}


@pytest.mark.parametrize("name", SETUPS)
def test_everything_a_run_sets_up_lives_on_the_resolved_device(monkeypatch, name):
    monkeypatch.setattr(simulation, "resolve_device", lambda spec: META)
    config = tiny_config(data={"name": "rotated_digits", "val_fraction": 0.1}, **SETUPS[name])
    sim = Simulation.from_config(config)
    assert sim.device == META and sim.algorithm.ctx.device == META
    assert_all_on(dict(sim.model.named_parameters()), META, "model")
    assert_all_on(sim.init, META, "initial state")
    assert_all_on(dict(sim.algorithm.ctx.model_factory().named_parameters()), META, "a fresh model")
    for cid, client in enumerate(sim.data.clients):
        assert client.val is not None and "domain" in client.train.groups
        assert_all_on(client, META, f"client {cid}'s data (train/val/test, groups)")
    assert_all_on(sim.data.test, META, "pooled test set")
    state = sim.fresh_state()
    assert_all_on(state["server"], META, "server state")
    for cid in range(sim.data.num_clients):
        client_state = sim.client_state(state, cid)
        if client_state is not None:
            assert_all_on(client_state, META, f"client {cid}'s initial state")
    assert sim.task(0, 0).data is sim.data.clients[0]


def test_the_initial_state_holds_the_buffers_of_the_model(monkeypatch):
    class Scaled(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(64, 10)
            self.register_buffer("scale", torch.full((10,), 2.0))

        def forward(self, x):
            return self.fc(x.flatten(1)) * self.scale

    monkeypatch.setattr(simulation, "build_model", lambda *args, **kwargs: Scaled())
    sim = Simulation.from_config(tiny_config())
    assert set(sim.init) == {"fc.weight", "fc.bias", "scale"}
    assert torch.equal(sim.fresh_state()["server"]["params"]["scale"], torch.full((10,), 2.0))


def test_checkpoints_hold_cpu_tensors_and_load_onto_the_run_device(tmp_path):
    config = tiny_config(algorithm={"name": "scaffold"}, federation={"rounds": 2, "client_state": "disk"})
    sim = Simulation.from_config(config)
    sim.run(tmp_path / "run")
    checkpoint = torch.load(tmp_path / "run" / "checkpoint.pt", weights_only=True)
    assert checkpoint["device"] == "cpu"
    assert_all_on({k: v for k, v in checkpoint.items() if k != "clients"}, torch.device("cpu"), "checkpoint")
    loaded = RunDirectory(tmp_path / "run").load_checkpoint(map_location=META)
    assert_all_on(loaded["server"], META, "checkpoint loaded for a meta run")
    recorder = DirectoryRecorder(RunDirectory(tmp_path / "run"), resume=True)
    store = recorder.client_store("disk", META)
    store.restore(checkpoint["clients"], checkpoint["round"])
    cid = next(iter(checkpoint["clients"]))
    assert_all_on(store.get(cid), META, "a client state read back by the disk store")
    assert isinstance(store, DiskClientStore)


def test_federated_to_moves_every_split_and_group_and_keeps_the_rest():
    def rows(n):
        return ArrayDataset(torch.randn(n, 3), torch.arange(n), {"g": torch.arange(n) % 2}, {"note": 1})

    data = FederatedDataset("toy", [ClientData(rows(4), rows(2), rows(3)), ClientData(rows(5), None, rows(2))],
                            rows(6), "classification", 2, (3,))
    moved = federated_to(data, META)
    assert_all_on(moved, META, "federated data set")
    assert moved.clients[1].val is None and moved.test.info == {"note": 1} and moved.input_shape == (3,)
    on_cpu = federated_to(data, torch.device("cpu"))
    assert on_cpu.clients[0].test.x is data.clients[0].test.x  # no copy of evaluation rows on the CPU
    # training rows are packed once into one tensor per field, each client a block of it
    trains = [c.train for c in on_cpu.clients]
    for field in ("x", "y"):
        base, starts = shared_rows([getattr(t, field) for t in trains])
        assert starts == [0, 4] and len(base) == 9
    assert torch.equal(shared_rows([t.groups["g"] for t in trains])[0], torch.tensor([0, 1, 0, 1, 0, 1, 0, 1, 0]))
    for before, after in zip(data.clients, on_cpu.clients):
        assert torch.equal(before.train.x, after.train.x) and torch.equal(before.train.y, after.train.y)
        assert after.train.info == {"note": 1}


# -------------------------------------------- a whole run with a foreign default device

RUNS = {
    "serial-dp": ("serial", DP, {}, None),
    "ifca-dp": ("serial", {"level": "example", "epsilon": 8.0}, {"name": "ifca", "clusters": 2}, None),
    "serial": ("serial", None, {}, None),
    "vectorized": ("vectorized", None, {}, None),
    "vectorized-dp": ("vectorized", DP, {}, None),
    "scaffold-vectorized": ("vectorized", None, {"name": "scaffold"}, None),
    "batchnorm-vectorized": ("vectorized", None, {}, {"name": "resnet", "options": {"depth": 1, "width": 0.25, "norm": "batch"}}),
}


@pytest.mark.parametrize(("executor", "privacy", "algorithm", "model"), RUNS.values(), ids=RUNS.keys())
def test_a_run_never_relies_on_the_default_device(executor, privacy, algorithm, model):
    """Under a ``meta`` default device a run on the CPU must compute exactly as usual: every
    tensor it creates names its device (or follows one that does)."""
    sections = {"executor": executor, "federation": {"rounds": 2}, "checkpoint": {"every": 1}}
    if privacy is not None:
        sections["privacy"] = privacy
    if algorithm:
        sections["algorithm"] = algorithm
    if model:
        sections["model"] = model
    config = tiny_config(**sections)
    expected = Simulation.from_config(config).record(MemoryRecorder())

    sim = Simulation.from_config(config)
    recorder = MemoryRecorder()
    with torch.device("meta"):
        summary = sim.record(recorder)
    assert without_wall_clock(summary) == without_wall_clock(expected)
    cpu = torch.device("cpu")
    state = recorder.load_checkpoint(cpu)
    assert_all_on(sim.data, cpu, "data")
    assert_all_on(state["server"], cpu, "server state")
    for cid, client_state in state["clients"].items():
        if client_state is not None:
            assert_all_on(client_state, cpu, f"client {cid}'s state")


# ------------------------------------------------------------------- DP noise


def test_dp_noise_is_the_cpu_streams_moved_to_the_tensor_device():
    """Same draws whatever the target device and the default device; the generator advances alike."""
    reference = torch.Generator().manual_seed(5)
    expected = torch.randn((3, 4), generator=reference)
    g = torch.Generator().manual_seed(5)
    with torch.device("meta"):
        drawn = standard_normal((3, 4), g)
        on_meta = standard_normal((3, 4), torch.Generator().manual_seed(5), device=META)
        filled = fill_standard_normal_(torch.empty(3, 4, device=META), torch.Generator().manual_seed(5))
        assert uniform(5, torch.Generator().manual_seed(1), device=META).device == META
        assert permutation(5, torch.Generator().manual_seed(1), device=META).device == META
        assert permutation(5, SECURE, device=META).device == META
        assert standard_normal((2,), SECURE, device=META).device == META
    assert drawn.device == torch.device("cpu") and torch.equal(drawn, expected)
    assert on_meta.device == META and filled.device == META
    assert torch.equal(g.get_state(), reference.get_state())
    g2 = torch.Generator().manual_seed(5)
    fill_standard_normal_(torch.empty(3, 4, device=META), g2)
    assert torch.equal(g2.get_state(), reference.get_state())  # the meta fill consumed the same CPU draws
    assert torch.equal(torch.rand(4, generator=g2), torch.rand(4, generator=reference))


def test_dp_mechanisms_keep_the_tensors_device():
    summed = {"w": torch.zeros(2, 3, device=META), "b": torch.zeros(3, device=META)}
    noisy = add_gaussian_noise(summed, 1.0, 1.0, torch.Generator().manual_seed(0))
    assert_all_on(noisy, META, "DP-SGD noise")
    server = ClientLevelDP(noise_multiplier=1.0, clip=1.0, expected_cohort=2.0)
    template = {"w": torch.zeros(2, 3, device=META)}
    mean, _ = server.noisy_mean([], template, torch.Generator().manual_seed(0))
    assert_all_on(mean, META, "DP-FedAvg noise")
    dp = ExampleDP(clip=1.0, noise_multiplier=1.0, sampling="shuffle", batch_size=2)
    assert all(b.device == META for b in dp.batches(6, 4, torch.Generator().manual_seed(0), META))
    poisson = ExampleDP(clip=1.0, noise_multiplier=1.0, sampling="poisson", batch_size=2)
    cpu = list(poisson.batches(6, 3, torch.Generator().manual_seed(0)))
    moved = list(poisson.batches(6, 3, torch.Generator().manual_seed(0), META))
    assert [len(b) for b in cpu] == [len(b) for b in moved] and all(b.device == META for b in moved)


# -------------------------------------------------------------------- static scan

PACKAGE = Path(fedveil.__file__).parent
SCANNED = [
    *sorted((PACKAGE / "runtime").glob("*.py")),
    *sorted((PACKAGE / "algorithms").glob("*.py")),
    PACKAGE / "privacy" / "dp_sgd.py",
    PACKAGE / "privacy" / "client_dp.py",
    PACKAGE / "privacy" / "randomness.py",
    PACKAGE / "params.py",
    PACKAGE / "models" / "functional.py",
]
# host-side work by design: the offline audit tool and plots/reports read CPU data
NOT_HOT = {"audit_run.py", "plots.py", "report.py"}
FACTORIES = {
    "zeros", "ones", "empty", "full", "arange", "tensor", "eye", "rand", "randn", "randint", "randperm",
    "linspace", "logspace", "as_tensor", "scalar_tensor", "empty_strided", "tril_indices", "triu_indices",
}
# (file, function) -> why it is right there: reviewed places that name the CPU on purpose
REVIEWED_CPU = {
    ("device.py", "<module>"): "the CPU device constant",
    ("device.py", "resolve_device"): "reads the spelling of the config's device",
    ("base.py", "<module>"): "RunContext's default device, for contexts built by hand",
    ("ray_executor.py", "__init__"): "a Ray worker of a CPU run computes on its own CPU",
    ("params.py", "weighted_mean"): "aggregation weights are host-side scalars",
    ("simulation.py", "__call__"): "the model is initialised on the CPU, then moved (same init on every device)",
    ("ifca.py", "init_server"): "centroids are drawn on the CPU, then moved (same centroids on every device)",
    ("initial_model.py", "initial_params"): "a saved model is read on the host (it may come from a GPU run), then moved to each fresh tensor's device",
}


def _device_problems(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), str(path))
    problems = []

    def visit(node: ast.AST, function: str) -> None:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for default in [*node.args.defaults, *node.args.kw_defaults]:  # default values may name the CPU
                if default is not None:
                    visit_defaults(default)
            for child in node.body:
                visit(child, node.name)
            return
        where = f"{path.name}:{getattr(node, 'lineno', '?')} in {function}"
        if isinstance(node, ast.Call):
            f = node.func
            keywords = {k.arg for k in node.keywords}
            if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and f.value.id == "torch" and f.attr in FACTORIES:
                if "device" not in keywords and "out" not in keywords:
                    problems.append(f"{where}: torch.{f.attr}(...) without device=")
            if isinstance(f, ast.Attribute) and f.attr == "cpu" and not node.args:
                problems.append(f"{where}: .cpu()")
        if isinstance(node, ast.Constant) and node.value == "cpu" and (path.name, function) not in REVIEWED_CPU:
            problems.append(f"{where}: \"cpu\"")
        for child in ast.iter_child_nodes(node):
            visit(child, function)

    def visit_defaults(node: ast.AST) -> None:
        for child in ast.walk(node):
            if isinstance(child, ast.Call):
                visit(child, "<default>")

    visit(tree, "<module>")
    return problems


def test_hot_paths_name_their_devices():
    """Tensor factories in the runtime, the algorithms and the DP mechanisms say where their
    tensor goes; nothing moves to or names the CPU outside the reviewed places."""
    problems = [p for path in SCANNED if path.name not in NOT_HOT for p in _device_problems(path)]
    assert not problems, "\n".join(problems)


def test_the_scan_finds_what_it_should(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text(
        "import torch\n"
        "def f(x, device='cpu'):\n"
        "    a = torch.zeros(3)\n"
        "    b = torch.tensor([1, 2], device=x.device)\n"
        "    return x.cpu(), x.to('cpu'), a, b\n"
    )
    problems = _device_problems(bad)
    assert len(problems) == 3, problems
    assert any("torch.zeros" in p for p in problems) and any(".cpu()" in p for p in problems)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("executor", ["serial", "vectorized"])
def test_a_cuda_run_keeps_everything_on_the_gpu_and_agrees_with_the_cpu(executor):
    sections = {"executor": executor, "federation": {"rounds": 2}, "privacy": DP}
    cpu = Simulation.from_config(tiny_config(device="cpu", **sections)).record()
    sim = Simulation.from_config(tiny_config(device="cuda", **sections))
    recorder = MemoryRecorder()
    summary = sim.record(recorder)
    assert summary["device"].startswith("cuda") and summary["epsilon"] == cpu["epsilon"]
    assert summary["global_test_accuracy"] == pytest.approx(cpu["global_test_accuracy"], abs=0.05)
    assert_all_on(sim.data, sim.device, "data")
    assert_all_on(recorder.load_checkpoint(sim.device)["server"], sim.device, "server state")


def test_a_run_resumes_with_another_device_setting(tmp_path):
    """``device`` says where a run computes, not what: a run started with ``device = "cpu"``
    (on a GPU machine: ``"cuda"``) resumes with another setting, and here, where both resolve
    to the CPU, ends with the uninterrupted run's numbers. (Found by the GPU check: a run
    started with ``device=cuda`` could not be resumed with ``device=cpu``.)"""
    sections = {"federation": {"rounds": 4}, "checkpoint": {"every": 2}, "privacy": DP}
    full = run(tiny_config(device="cpu", **sections), tmp_path / "full", progress=False)
    with pytest.raises(Killed):
        Simulation.from_config(tiny_config(device="cpu", **sections), [KillAfterRound(3)]).run(tmp_path / "cut")
    resumed = run(tiny_config(device="auto", **sections), tmp_path / "cut", resume=True, progress=False)
    assert without_wall_clock(resumed) == without_wall_clock(full)
    assert without_wall_clock(rows_of(tmp_path / "cut")) == without_wall_clock(rows_of(tmp_path / "full"))
