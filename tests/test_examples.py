"""Every example config is valid (and the main job's noise schedule example plans its privacy)."""
import tomllib
from pathlib import Path

import pytest

from fedveil.config import load_config
from fedveil.runtime.ecos_config import load_ecos_config
from fedveil.runtime.pets_job import load_pets_config
from fedveil.runtime.sweep_plan import plan_sweep
from fedveil.runtime import Simulation

EXAMPLES = sorted((Path(__file__).parent.parent / "examples").glob("*.toml"))


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_example_config_is_valid(path):
    table = tomllib.loads(path.read_text())
    if "ecos" in table:  # an ECOS job (`fedveil ecos`), not a federated run
        load_ecos_config(str(path))
    elif "pipeline" in table:  # a PETs job (`fedveil pets`)
        load_pets_config(str(path))
    elif "sweep" in table:  # a sweep (`fedveil sweep`): every run of its grid is validated
        assert plan_sweep(str(path), [], None).configs()
    else:
        load_config(str(path), [])


def test_schedule_example_plans_a_decaying_noise_within_budget():
    config = load_config(str(Path(__file__).parent.parent / "examples" / "dp_fedavg_schedule.toml"), [])
    sim = Simulation.from_config(config)
    shape = sim.privacy.plan.shape
    assert shape[0] > shape[-1] == 1.0
    assert 0.99 * config.privacy.epsilon <= sim.privacy.plan.planned_epsilon <= config.privacy.epsilon


def _tiny_adult(folder: Path) -> None:
    """48 training and 12 test rows in the UCI Adult format, every (sex, income) pair present."""
    folder.mkdir(parents=True)
    for name, n, dot in (("adult.data", 48, ""), ("adult.test", 12, ".")):
        rows = []
        for i in range(n):
            sex, rich = ("Female" if i % 2 else "Male"), i % 4 >= 2
            edu = "Masters, 14" if rich else "HS-grad, 9"
            rows.append(f"{25 + i}, Private, {100_000 + 997 * i}, {edu}, Never-married, Sales, Not-in-family, White, "
                        f"{sex}, 0, 0, {50 if rich else 30}, United-States, {'>50K' if rich else '<=50K'}{dot}")
        header = "|1x3 Cross validator\n" if dot else ""
        (folder / name).write_text(header + "\n".join(rows) + "\n")


def test_fade_adult_example_runs_on_adult_format_files(tmp_path):
    """The FADE example trains as written (fewer rounds) from a data.root holding the UCI files,
    and reports the fairness metrics of its [eval] section."""
    from fedveil.runtime import run

    _tiny_adult(tmp_path / "adult")
    overrides = [f'data.root="{tmp_path / "adult"}"', "data.download=false", "federation.rounds=4", "eval.every=2"]
    config = load_config(str(Path(__file__).parent.parent / "examples" / "fade_adult.toml"), overrides)
    assert config.algorithm.name == "fade" and config.model_dump()["data"]["partition"]["clients_per_domain"] == [1, 7]
    summary = run(config, tmp_path / "run", progress=False)
    for key in ("global_test_equalized_odds_gap", "global_test_demographic_parity_gap", "global_test_accuracy_group_0"):
        assert key in summary


def test_fedfed_examples_run_phase_one_then_phase_two(tmp_path):
    """The two FedFed examples chain as written (fewer rounds): phase 2 reads the phase-1 run
    directory, releases every client's features once and reports the release's epsilon."""
    from fedveil.privacy.feature_release import release_epsilon
    from fedveil.runtime import run

    examples = Path(__file__).parent.parent / "examples"
    distill = load_config(str(examples / "fedfed_distill_digits.toml"), ["federation.rounds=2"])
    run(distill, tmp_path / "distill", progress=False)
    overrides = [f'algorithm.distiller="{tmp_path / "distill"}"', "federation.rounds=2"]
    summary = run(load_config(str(examples / "fedfed_digits.toml"), overrides), tmp_path / "phase2", progress=False)
    rigorous = release_epsilon(0.15, 0.5, 8.0, 1e-5)  # one Gaussian, sensitivity rho sqrt(64)
    assert rigorous <= summary["epsilon"] <= 1.05 * rigorous  # the ledger's RDP bound, just above the exact value
    assert 0.0 <= summary["global_test_accuracy"] <= 1.0


def test_the_clinics_table_example_trains_each_clinic_under_its_budget():
    """docs/your-model-and-data.md's example, scaled to 5 rounds: three clinics from one CSV, DP at epsilon 4."""
    config = load_config(str(Path(__file__).parent.parent / "examples" / "clinics_table.toml"), ["federation.rounds=5"])
    sim = Simulation.from_config(config)
    assert sim.data.num_clients == 3 and sim.data.task == "classification"
    assert sorted(c.num_train + len(c.test) for c in sim.data.clients) == [160, 200, 240]
    summary = sim.record()
    assert 0 < summary["epsilon"] <= 4.0 * (1 + 1e-6)
