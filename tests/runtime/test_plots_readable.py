"""The run plots stay readable: integer round ticks, an epsilon curve for DP runs only, client
scores for 1 to 1,000 clients, a bounded label map without cell text at 1,000 clients."""
from __future__ import annotations

import numpy as np
import pytest
from tiny_runs import tiny_config

from fedveil.data.label_plot import MAX_HEIGHT, MAX_WIDTH, label_distribution_figure
from fedveil.runtime import run
from fedveil.runtime.plots import (
    CLIENT_SCORES_FILE,
    LEARNING_CURVES_FILE,
    PRIVACY_CURVE_FILE,
    client_scores_figure,
    learning_curves_figure,
    plot_privacy_curve,
    privacy_figure,
    privacy_target,
)
from fedveil.runtime.report import write_report

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def rows(rounds: int, clients: int = 0, score: str = "accuracy") -> list[dict]:
    """Synthetic metrics rows; with ``clients`` > 0 the DP keys of an example-level run."""
    out = []
    for r in range(1, rounds + 1):
        row = {"round": r, "train_loss": 1 / r, "global_test_loss": 1.1 / r, f"global_test_{score}": 1 - 0.5 / r}
        if clients:
            spent = np.sqrt(r) * np.linspace(0.1, 1.0, clients)
            row.update(epsilon=float(spent.max()), epsilon_per_client=spent.tolist())
        out.append(row)
    return out


def visible_ticks(ax) -> list[float]:
    lo, hi = sorted(ax.get_xlim())
    return [t for t in ax.get_xticks() if lo <= t <= hi]


def assert_integer_rounds(fig, rounds: int) -> None:
    fig.canvas.draw()
    for ax in fig.axes:
        ticks = visible_ticks(ax)
        assert ticks and all(float(t).is_integer() for t in ticks), ticks
        assert min(ticks) <= rounds


@pytest.mark.parametrize("rounds", [1, 3, 7, 40])
def test_round_ticks_are_integers(rounds):
    assert_integer_rounds(learning_curves_figure(rows(rounds), "accuracy"), rounds)
    assert_integer_rounds(privacy_figure(rows(rounds, clients=4), target=2.0), rounds)


def test_one_round_shows_one_tick():
    fig = learning_curves_figure(rows(1), "accuracy")
    fig.canvas.draw()
    assert visible_ticks(fig.axes[0]) == [1]


def test_privacy_plot_only_for_dp_rows(tmp_path):
    assert privacy_figure(rows(3)) is None
    assert plot_privacy_curve(rows(3), tmp_path / PRIVACY_CURVE_FILE) is None
    assert not (tmp_path / PRIVACY_CURVE_FILE).exists()
    path = plot_privacy_curve(rows(3, clients=5), tmp_path / PRIVACY_CURVE_FILE, target=1.5)
    assert path.read_bytes()[:8] == PNG_SIGNATURE


@pytest.mark.parametrize("clients, per_client_lines", [(5, 5), (100, 1)])
def test_privacy_plot_draws_clients_and_target(clients, per_client_lines):
    ax = privacy_figure(rows(4, clients=clients), target=1.5).axes[0]
    labels = ax.get_legend_handles_labels()[1]
    assert "epsilon, largest over clients" in labels and "planned epsilon 1.5" in labels
    assert ("each client" in labels) == (clients <= 20)
    assert (f"range over {clients} clients" in labels) == (clients > 20)
    grey = [line for line in ax.lines if line.get_color() == "0.55"]
    assert len(grey) == (per_client_lines if clients <= 20 else 0)


def test_privacy_target_prefers_the_config_budget():
    assert privacy_target({"privacy": {"epsilon": 2.0}}, {"planned_epsilon": 1.0}) == 2.0
    assert privacy_target({"privacy": {"epsilon": None}}, {"planned_epsilon": 1.0}) == 1.0
    assert privacy_target({"privacy": {}}, {"planned_epsilon_per_client": [0.5, 3.0, 0.0]}) == 3.0
    assert privacy_target({"privacy": {}}, None) is None


@pytest.mark.parametrize("n", [1, 5, 1000])
@pytest.mark.parametrize("score", ["accuracy", "mse"])
def test_client_scores_for_few_and_many_clients(tmp_path, n, score):
    rng = np.random.default_rng(n)
    clients = [{"client": i, f"global_{score}": rng.uniform(), f"personal_{score}": rng.uniform()} for i in range(n)]
    fig = client_scores_figure(clients, score, "toy")
    ax = fig.axes[0]
    assert ax.get_ylabel() == f"{score} ({'lower' if score == 'mse' else 'higher'} is better)"
    curves = [line for line in ax.lines if len(line.get_xdata()) == n and line.get_label().startswith(("global", "pers"))]
    assert len(curves) == 2
    ordered = curves[0].get_ydata()  # worst first: ascending accuracy, descending mse
    assert list(ordered) == sorted(ordered, reverse=score == "mse")
    assert (curves[0].get_marker() == "o") == (n <= 30)
    fig.savefig(tmp_path / "scores.png")


def test_label_map_of_1000_clients_and_62_classes_is_bounded_and_has_no_cell_text():
    counts = np.random.default_rng(0).integers(0, 30, (1000, 62))
    fig = label_distribution_figure(counts, class_names=[f"c{k}" for k in range(62)])
    width, height = fig.get_size_inches()
    assert width <= MAX_WIDTH and height <= MAX_HEIGHT
    heat = fig.axes[0]
    assert not heat.texts
    assert len(heat.get_yticks()) <= 20
    fig.canvas.draw()
    labels = [t.get_text() for t in heat.get_xticklabels()]
    assert labels == [f"c{k}" for k in range(62)]


def test_label_map_of_few_clients_carries_counts():
    counts = np.arange(50).reshape(5, 10)
    heat = label_distribution_figure(counts).axes[0]
    assert sorted(int(t.get_text()) for t in heat.texts) == list(range(50))
    assert list(heat.get_yticks()) == list(range(5))


def test_write_report_draws_the_privacy_curve_of_a_dp_run(tmp_path):
    out = tmp_path / "dp"
    config = tiny_config(
        privacy={"level": "example", "noise_multiplier": 1.0, "keep_unnoised": True}, federation={"rounds": 2},
        checkpoint={"every": 0},
    )
    run(config, out, progress=False)  # the run itself draws the plots (the label plot: kept un-noised counts)
    names = [LEARNING_CURVES_FILE, PRIVACY_CURVE_FILE, CLIENT_SCORES_FILE, "label_distribution.png"]
    for name in names:
        assert (out / name).read_bytes()[:8] == PNG_SIGNATURE
        (out / name).unlink()
    assert [p.name for p in write_report(out)] == names
    assert all((out / name).exists() for name in names)


def test_write_report_of_a_run_without_dp_has_no_privacy_curve(tmp_path):
    out = tmp_path / "plain"
    run(tiny_config(federation={"rounds": 1}, checkpoint={"every": 0}), out, progress=False)
    assert PRIVACY_CURVE_FILE not in [p.name for p in write_report(out)]
    assert not (out / PRIVACY_CURVE_FILE).exists()
