"""``fedveil compare``'s grouping and statistics, on run directories written by hand with
known numbers, and its plots; the metrics table of ``fedveil report``."""
from __future__ import annotations

import json
import statistics

import matplotlib.image
import pytest

from fedveil.config import RunConfig
from fedveil.runtime.compare import compare_runs, differing_keys, find_runs, format_table, table_rows, to_json
from fedveil.runtime.compare_plots import CURVES_FILE, EPSILON_FILE, group_curve, write_plots
from fedveil.runtime.metrics_table import run_table, thin
from fedveil.runtime.run_dir import RunDirError

# (epsilon, seed) -> accuracy per round (3 rounds), final epsilon spent
RUNS = {
    (1.0, 0): ([0.30, 0.40, 0.38], 0.99),
    (1.0, 1): ([0.20, 0.45, 0.50], 1.00),
    (1.0, 2): ([0.25, 0.35, 0.41], 0.98),
    (8.0, 0): ([0.50, 0.70, 0.72], 7.90),
    (8.0, 1): ([0.55, 0.75, 0.74], 8.00),
}


def write_run(path, config, accuracies, epsilon=None, finished=True):
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps(config))
    rows = []
    for i, acc in enumerate(accuracies, 1):
        row = {"round": i, "train_loss": 2.0 - acc, "global_test_accuracy": acc}
        if epsilon is not None:
            row["epsilon"] = epsilon * i / len(accuracies)
        rows.append(row)
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    if finished:
        summary = {"score": "accuracy", **rows[-1], "rounds_completed": len(rows)}
        (path / "summary.json").write_text(json.dumps(summary))


def config(epsilon, seed, **changes):
    cfg = RunConfig().model_dump()
    cfg["seed"] = seed
    cfg["privacy"].update(level="example", epsilon=epsilon)
    for key, value in changes.items():
        section, name = key.split("__")
        cfg[section][name] = value
    return cfg


@pytest.fixture
def runs(tmp_path):
    for (eps, seed), (accs, spent) in RUNS.items():
        write_run(tmp_path / "sw" / f"eps{eps}-s{seed}", config(eps, seed), accs, spent)
    write_run(tmp_path / "sw" / "unfinished", config(8.0, 2), [0.1], 2.0, finished=False)
    return tmp_path / "sw"


def test_groups_by_the_keys_that_differ_with_mean_and_sample_std(runs):
    comparison = compare_runs([runs])
    assert comparison.keys == ["privacy.epsilon"]
    assert [g.values for g in comparison.groups] == [{"privacy.epsilon": 1.0}, {"privacy.epsilon": 8.0}]
    assert [r.path.name for r in comparison.unfinished] == ["unfinished"]
    rows = table_rows(comparison)
    for row, eps in zip(rows, (1.0, 8.0)):
        finals = [accs[-1] for (e, _), (accs, _) in RUNS.items() if e == eps]
        bests = [max(accs) for (e, _), (accs, _) in RUNS.items() if e == eps]
        spent = [s for (e, _), (_, s) in RUNS.items() if e == eps]
        mean, std, n = row["final accuracy"]
        assert (mean, std, n) == pytest.approx((statistics.mean(finals), statistics.stdev(finals), len(finals)))
        assert row["best accuracy"] == pytest.approx((statistics.mean(bests), statistics.stdev(bests), len(bests)))
        assert row["final epsilon"] == pytest.approx((statistics.mean(spent), statistics.stdev(spent), len(spent)))
        assert "best epsilon" not in row
    assert rows[0]["seeds"] == [0, 1, 2]


def test_the_table_and_its_json(runs):
    comparison = compare_runs([runs])
    text = format_table(comparison)
    lines = text.splitlines()
    assert lines[0].split()[:3] == ["epsilon", "n", "final"]
    assert lines[1].split()[:3] == ["1.0", "3", f"{statistics.mean([0.38, 0.50, 0.41]):.4f}"]
    assert "1 unfinished runs left out: unfinished" in text
    md = format_table(comparison, markdown=True)
    assert md.splitlines()[0].startswith("| epsilon | n | final accuracy | best accuracy |")
    data = to_json(comparison)
    assert data["keys"] == ["privacy.epsilon"]
    assert data["groups"][1]["metrics"]["final accuracy"]["n"] == 2
    json.dumps(data)  # plain JSON


def test_runs_differing_only_in_seed_make_one_group(tmp_path):
    for seed in (0, 1):
        write_run(tmp_path / f"s{seed}", config(1.0, seed), [0.5, 0.6 + seed / 10])
    comparison = compare_runs([tmp_path / "s0", tmp_path / "s1"])
    assert comparison.keys == [] and len(comparison.groups) == 1
    assert "differ only in their seed" in format_table(comparison)


def test_several_differing_keys_each_become_a_column(tmp_path):
    write_run(tmp_path / "a", config(1.0, 0, client__lr=0.1), [0.5])
    write_run(tmp_path / "b", config(1.0, 0, client__lr=0.2), [0.6])
    write_run(tmp_path / "c", config(4.0, 0, client__lr=0.2), [0.7])
    flat = [{"seed": 0, "a.x": 1, "a.y": [1]}, {"seed": 1, "a.x": 1, "a.y": [2]}, {"seed": 2, "a.x": 1, "b": 5}]
    assert differing_keys(flat) == ["a.y", "b"]
    comparison = compare_runs([tmp_path])
    assert comparison.keys == ["client.lr", "privacy.epsilon"]
    assert [g.label() for g in comparison.groups] == ["lr=0.1, epsilon=1.0", "lr=0.2, epsilon=1.0", "lr=0.2, epsilon=4.0"]


def test_what_cannot_be_compared(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(RunDirError, match="neither a run directory"):
        find_runs([tmp_path / "empty"])
    write_run(tmp_path / "only" / "r", config(1.0, 0), [0.5], finished=False)
    with pytest.raises(RunDirError, match="none of the 1 runs has finished"):
        compare_runs([tmp_path / "only"])
    write_run(tmp_path / "mixed" / "a", config(1.0, 0), [0.5])
    write_run(tmp_path / "mixed" / "b", config(1.0, 1), [0.5])
    summary = tmp_path / "mixed" / "b" / "summary.json"
    summary.write_text(json.dumps({**json.loads(summary.read_text()), "score": "mse"}))
    with pytest.raises(RunDirError, match="different tasks"):
        compare_runs([tmp_path / "mixed"])


def test_curves_average_the_rounds_every_seed_has(tmp_path):
    write_run(tmp_path / "a", config(1.0, 0), [0.2, 0.4, 0.6])
    write_run(tmp_path / "b", config(1.0, 1), [0.4, 0.6])
    group = compare_runs([tmp_path]).groups[0]
    rounds, mean, std = group_curve(group, "global_test_accuracy")
    assert rounds.tolist() == [1, 2]
    assert mean.tolist() == pytest.approx([0.3, 0.5])
    assert std.tolist() == pytest.approx([statistics.stdev([0.2, 0.4]), statistics.stdev([0.4, 0.6])])


def test_plots_are_written_and_the_epsilon_plot_only_for_dp_runs(runs, tmp_path):
    written = write_plots(compare_runs([runs]), tmp_path / "out")
    assert [p.name for p in written] == [CURVES_FILE, EPSILON_FILE]
    assert matplotlib.image.imread(written[0]).shape[1] > 800
    plain = config(None, 0)
    plain["privacy"]["level"] = "none"
    write_run(tmp_path / "np" / "a", plain, [0.5, 0.6])
    write_run(tmp_path / "np" / "b", {**plain, "seed": 1}, [0.5, 0.7])
    assert [p.name for p in write_plots(compare_runs([tmp_path / "np"]), tmp_path / "out2")] == [CURVES_FILE]


def test_thin_keeps_first_and_last_and_at_most_the_limit():
    rows = [{"round": r} for r in range(1, 201)]
    shown = thin(rows, 25)
    assert len(shown) == 25 and shown[0]["round"] == 1 and shown[-1]["round"] == 200
    assert thin(rows[:10], 25) == rows[:10]


def test_report_table_lists_the_evaluated_rounds(tmp_path):
    write_run(tmp_path / "r", config(1.0, 0), [0.25, 0.5, 0.75], 1.0)
    lines = run_table(tmp_path / "r").splitlines()
    assert lines[0] == "fedavg on digits: 3/20 rounds"
    assert lines[1].split() == ["round", "train_loss", "global_test_accuracy", "epsilon"]
    assert lines[4].split() == ["3", "1.2500", "0.7500", "1.0000"]
