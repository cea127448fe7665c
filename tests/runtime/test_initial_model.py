"""``model.pt`` (the final global model of a run) and ``model.init_from`` / ``model.init_skip``.

A tiny FADE run (fade_mlp on rotated digits: encoder, head and discriminator ``disc.``)
trains two rounds; its model.pt is compared with the checkpoint's server parameters and a
memory recorder's model, and then fed to other configs as their initial model.
"""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from fedveil.config import ConfigError, validate
from fedveil.runtime import MemoryRecorder, run
from fedveil.runtime.simulation import Simulation
from tiny_runs import algorithm_sections, load_checkpoint, merge, tiny_raw

FADE = algorithm_sections("fade", {"federation": {"rounds": 2, "clients_per_round": 3}, "checkpoint": {"every": 0}})
FADE_NAMES = {
    "encoder.fc1.weight", "encoder.fc1.bias", "encoder.fc2.weight", "encoder.fc2.bias",
    "head.fc1.weight", "head.fc1.bias", "head.out.weight", "head.out.bias",
    "disc.fc1.weight", "disc.fc1.bias", "disc.out.weight", "disc.out.bias",
    "reverse.lam",
}


def fade_raw(**extra):
    return tiny_raw(**merge(FADE, extra))


def fade_sim(**model) -> Simulation:
    return Simulation.from_config(validate(fade_raw(model=model)))


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    """A finished two-round FADE run directory (plots skipped)."""
    import fedveil.runtime.simulation as simulation

    out = tmp_path_factory.mktemp("run") / "fade"
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(simulation, "write_report", lambda path: [])
        run(validate(fade_raw()), out, progress=False)
    torch.set_num_threads(threads)
    return out


@pytest.fixture(scope="module")
def saved(trained) -> dict[str, torch.Tensor]:
    return torch.load(trained / "model.pt", weights_only=True)


@pytest.fixture(scope="module")
def fresh() -> dict[str, torch.Tensor]:
    """The initial model of the same config without init_from."""
    return {k: v.clone() for k, v in fade_sim().init.items()}


def assert_equal(a: torch.Tensor, b: torch.Tensor, name: str) -> None:
    assert a.dtype == b.dtype and a.shape == b.shape, name
    assert torch.equal(a, b), f"{name} differs"


# --- model.pt -----------------------------------------------------------------------------


def test_run_directory_holds_the_final_global_model(trained, saved):
    assert (trained / "model.pt").is_file()
    assert set(saved) == FADE_NAMES  # parameters and buffers, nothing else
    assert all(v.device.type == "cpu" for v in saved.values())
    server = load_checkpoint(trained)["server"]["params"]
    assert set(server) == FADE_NAMES
    for name in FADE_NAMES:
        assert_equal(saved[name], server[name], name)


def test_saved_model_is_trained_not_the_initial_one(saved, fresh):
    assert set(fresh) == FADE_NAMES
    changed = {n for n in FADE_NAMES if not torch.equal(saved[n], fresh[n])}
    assert {"encoder.fc1.weight", "head.out.weight", "disc.out.weight"} <= changed


def test_memory_recorder_keeps_the_same_model(saved):
    recorder = MemoryRecorder()
    assert recorder.model is None
    fade_sim().record(recorder)
    assert set(recorder.model) == FADE_NAMES
    for name in FADE_NAMES:
        assert_equal(recorder.model[name], saved[name], name)


def test_model_pt_after_a_linear_run_matches_its_checkpoint(tmp_path, monkeypatch):
    import fedveil.runtime.simulation as simulation

    monkeypatch.setattr(simulation, "write_report", lambda path: [])
    run(validate(tiny_raw(federation={"rounds": 2})), tmp_path / "lin", progress=False)
    model = torch.load(tmp_path / "lin" / "model.pt", weights_only=True)
    server = load_checkpoint(tmp_path / "lin")["server"]["params"]
    assert set(model) == {"fc.weight", "fc.bias"} == set(server)
    for name in model:
        assert_equal(model[name], server[name], name)
    assert model["fc.weight"].abs().sum() > 0  # the linear model starts at zero: it trained


# --- init_from ----------------------------------------------------------------------------


def test_init_from_a_run_directory_loads_every_tensor(trained, saved):
    sim = fade_sim(init_from=str(trained))
    assert set(sim.init) == FADE_NAMES
    for name in FADE_NAMES:
        assert_equal(sim.init[name], saved[name], name)
    # the run's round-0 server state starts from it
    server = sim.fresh_state()["server"]["params"]
    for name in FADE_NAMES:
        assert_equal(server[name], saved[name], name)


def test_init_from_the_run_directorys_model_pt_file(trained, saved):
    init = fade_sim(init_from=str(trained / "model.pt")).init
    for name in FADE_NAMES:
        assert_equal(init[name], saved[name], name)


def test_init_from_any_pt_file(saved, tmp_path):
    path = tmp_path / "weights.pt"
    torch.save({k: v + 1.0 for k, v in saved.items()}, path)
    init = fade_sim(init_from=str(path)).init
    for name in FADE_NAMES:
        assert_equal(init[name], saved[name] + 1.0, name)


def test_init_from_casts_to_the_models_dtype(saved, tmp_path):
    path = tmp_path / "double.pt"
    torch.save({k: v.double() for k, v in saved.items()}, path)
    init = fade_sim(init_from=str(path)).init
    for name in FADE_NAMES:
        assert init[name].dtype == torch.float32
        assert_equal(init[name], saved[name].double().float(), name)


def test_init_skip_keeps_the_fresh_discriminator(trained, saved, fresh):
    init = fade_sim(init_from=str(trained), init_skip=["disc."]).init
    assert set(init) == FADE_NAMES
    disc = {n for n in FADE_NAMES if n.startswith("disc.")}
    assert disc == {"disc.fc1.weight", "disc.fc1.bias", "disc.out.weight", "disc.out.bias"}
    for name in disc:
        assert_equal(init[name], fresh[name], name)
        assert not torch.equal(init[name], saved[name]), f"{name}: trained and fresh agree, the test says nothing"
    for name in FADE_NAMES - disc:
        assert_equal(init[name], saved[name], name)


def test_init_skip_several_prefixes(trained, saved, fresh):
    init = fade_sim(init_from=str(trained), init_skip=["head.out", "encoder.fc2."]).init
    skipped = {"head.out.weight", "head.out.bias", "encoder.fc2.weight", "encoder.fc2.bias"}
    for name in FADE_NAMES:
        assert_equal(init[name], (fresh if name in skipped else saved)[name], name)


def test_skipped_names_may_be_absent_from_or_extra_in_the_file(saved, fresh, tmp_path):
    path = tmp_path / "no_disc.pt"
    torch.save({k: v for k, v in saved.items() if not k.startswith("disc.")}, path)
    init = fade_sim(init_from=str(path), init_skip=["disc."]).init
    for name in FADE_NAMES:
        assert_equal(init[name], (fresh if name.startswith("disc.") else saved)[name], name)

    path = tmp_path / "extra_disc.pt"
    torch.save({**saved, "disc.extra.weight": torch.ones(3)}, path)
    init = fade_sim(init_from=str(path), init_skip=["disc."]).init
    assert "disc.extra.weight" not in init and set(init) == FADE_NAMES


def test_init_skip_without_init_from_is_the_fresh_model(fresh):
    init = fade_sim(init_skip=["disc."]).init
    for name in FADE_NAMES:
        assert_equal(init[name], fresh[name], name)


# --- errors -------------------------------------------------------------------------------


def init_error(**model) -> str:
    with pytest.raises(ConfigError) as err:
        fade_sim(**model)
    message = str(err.value)
    assert "\n" not in message, message
    assert message.startswith("model.init_from: "), message
    return message


def test_missing_path(tmp_path):
    message = init_error(init_from=str(tmp_path / "nowhere.pt"))
    assert f"'{tmp_path / 'nowhere.pt'}' not found" in message
    # a directory without model.pt (an unfinished or foreign run directory)
    message = init_error(init_from=str(tmp_path))
    assert f"'{tmp_path / 'model.pt'}' not found" in message


@pytest.mark.parametrize(
    "content",
    [[torch.zeros(2)], {"encoder.fc1.weight": 1.0}, {"a": {"b": torch.zeros(2)}}, torch.zeros(3)],
    ids=["list", "float-value", "nested", "bare-tensor"],
)
def test_not_a_name_to_tensor_dict(tmp_path, content):
    path = tmp_path / "bad.pt"
    torch.save(content, path)
    message = init_error(init_from=str(path))
    assert message.endswith("is not a name -> tensor dict"), message


def test_unreadable_file(tmp_path):
    path = tmp_path / "junk.pt"
    path.write_bytes(b"this is not a torch file\n")
    assert "cannot be read" in init_error(init_from=str(path))


def test_other_shapes(trained):
    with pytest.raises(ConfigError) as err:
        Simulation.from_config(validate(fade_raw(model={
            "init_from": str(trained), "options": {"hidden": [16], "z_dim": 8, "disc_hidden": [8], "groups": 6},
        })))
    message = str(err.value)
    assert "\n" not in message
    assert "'encoder.fc1.weight' has shape (8, 64)" in message and "but (16, 64) in this model" in message


def test_missing_name(saved, tmp_path):
    path = tmp_path / "short.pt"
    torch.save({k: v for k, v in saved.items() if k != "head.out.bias"}, path)
    message = init_error(init_from=str(path))
    assert "does not fit this model (missing: head.out.bias; unknown: none)" in message


def test_unknown_name(saved, tmp_path):
    path = tmp_path / "long.pt"
    torch.save({**saved, "head.extra": torch.zeros(1)}, path)
    message = init_error(init_from=str(path))
    assert "does not fit this model (missing: none; unknown: head.extra)" in message


def test_skip_does_not_hide_other_missing_names(saved, tmp_path):
    path = tmp_path / "short.pt"
    torch.save({k: v for k, v in saved.items() if not k.startswith(("disc.", "head.out."))}, path)
    message = init_error(init_from=str(path), init_skip=["disc."])
    assert "missing: head.out.bias, head.out.weight; unknown: none" in message


def test_another_model_does_not_fit(tmp_path, monkeypatch):
    import fedveil.runtime.simulation as simulation

    monkeypatch.setattr(simulation, "write_report", lambda path: [])
    out = tmp_path / "linear"
    run(validate(tiny_raw(federation={"rounds": 1})), out, progress=False)
    # the linear model's fc.* against FADE's names on the 8x8 digits
    config = validate(merge(fade_raw(), {"model": {"init_from": str(out)}}))
    with pytest.raises(ConfigError) as err:
        Simulation.from_config(config)
    message = str(err.value)
    assert "\n" not in message
    assert "missing: disc.fc1.bias, disc.fc1.weight, disc.out.bias, disc.out.weight, encoder.fc1.bias;" in message
    assert "unknown: fc.bias, fc.weight)" in message
