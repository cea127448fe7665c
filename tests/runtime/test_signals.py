"""A method's own signals where a researcher looks (issue 36, item 5): the console summary,
the learning curves and ``fedveil compare`` show the evaluation metrics (fairness gaps,
per-group accuracy) and the algorithm's extra metrics under its labels; a 4,000-round run
plots readably."""
from __future__ import annotations

import json

import numpy as np

from fedveil.algorithms import ALGORITHMS
from fedveil.cli.main import print_signals
from fedveil.runtime.compare import compare_runs, format_table
from fedveil.runtime.plots import MARKED_POINTS, learning_curves_figure
from fedveil.runtime.signals import algorithm_labels, eval_signals, method_signals, signal_label

from test_compare import config, write_run

FADE_ROW = {
    "round": 4, "cohort_size": 2, "lr": 0.1, "train_loss": 0.8, "elapsed_s": 1.0, "epsilon": 2.0,
    "epsilon_per_client": [1.0, 2.0], "global_test_loss": 0.5, "global_test_accuracy": 0.8,
    "global_test_equalized_odds_gap": 0.07, "global_client_accuracy_mean": 0.8, "personal_accuracy_mean": 0.7,
    "lambda": 0.9, "adversarial_users": 0.5, "group_loss": 0.21,
}


def test_the_signals_are_the_evaluation_metrics_and_the_algorithms_extras():
    assert eval_signals(FADE_ROW, "accuracy") == ["global_test_equalized_odds_gap"]
    assert method_signals([FADE_ROW, {"round": 5, "alpha_3": 0.4}]) == ["lambda", "adversarial_users", "group_loss", "alpha_3"]
    labels = algorithm_labels("fade")
    assert labels == ALGORITHMS.get("fade").signal_labels and signal_label("lambda", labels).startswith("adversarial weight")
    assert signal_label("cluster_0_share", {}) == "cluster 0 share" and algorithm_labels("no_such_method") == {}


def test_the_console_summary_prints_them_under_the_methods_labels(tmp_path, capsys):
    (tmp_path / "metrics.jsonl").write_text(json.dumps({**FADE_ROW, "round": 3}) + "\n" + json.dumps(FADE_ROW) + "\n")
    summary = {"algorithm": "fade", "score": "accuracy", **FADE_ROW}
    print_signals(summary, tmp_path)
    out = capsys.readouterr().out
    assert "global model: equalized_odds_gap" in out and "0.07" in out
    assert "adversarial weight lambda (schedule)" in out and "group discriminator loss" in out
    assert "epsilon" not in out and "cohort" not in out


def test_the_learning_curves_get_a_panel_of_method_signals_and_long_runs_stay_readable():
    rows = [{"round": r, "train_loss": 1.0 + 0.3 * np.sin(r), "lambda": 1 - np.exp(-r / 500)} for r in range(1, 4001)]
    rows[-1].update(global_test_accuracy=0.8, global_test_loss=0.5)
    fig = learning_curves_figure(rows, "accuracy", labels=ALGORITHMS.get("fade").signal_labels)
    titles = [ax.get_title() for ax in fig.axes]
    assert "method signals per round (client mean)" in titles
    panel = fig.axes[titles.index("method signals per round (client mean)")]
    assert [t.get_text() for t in panel.get_legend().get_texts()] == ["adversarial weight lambda (schedule) (running mean of 80)"]
    loss = fig.axes[titles.index("loss per round")]
    smooth = [line for line in loss.get_lines() if "running mean" in str(line.get_label())]
    assert len(smooth) == 1 and len(smooth[0].get_xdata()) == 4000 - 80 + 1
    every = smooth[0].get_markevery()
    assert len(smooth[0].get_xdata()) / every <= MARKED_POINTS + 1  # about 30 markers, not 4,000


def test_compare_shows_the_fairness_gap_columns(tmp_path):
    for seed, gap in ((0, 0.1), (1, 0.3)):
        run = tmp_path / "runs" / f"s{seed}"
        write_run(run, config(1.0, seed), [0.5, 0.6], 1.0)
        summary = json.loads((run / "summary.json").read_text())
        (run / "summary.json").write_text(json.dumps({**summary, "global_test_equalized_odds_gap": gap}))
    table = format_table(compare_runs([tmp_path / "runs"]))
    assert "final equalized_odds_gap" in table and "0.2000 ± 0.1414" in table


def test_a_setup_releases_epsilon_is_labelled_as_the_releases():
    from fedveil.cli.main import spent_label

    assert spent_label({"privacy_level": "none", "setup_releases": ["shared features"]}) == (
        "epsilon of the shared features release")
    assert spent_label({"privacy_level": "example", "setup_releases": ["shared features"]}) == "privacy spent (epsilon)"


def test_counts_go_on_a_log_axis_beside_the_shares():
    rows = [{"round": r, "train_loss": 1 / r, "kept_units": 0.6, "params_uploaded": 7000.0 + r} for r in range(1, 11)]
    fig = learning_curves_figure(rows, "accuracy", labels=ALGORITHMS.get("adds").signal_labels)
    logged = [ax for ax in fig.axes if ax.get_yscale() == "log"]
    assert len(logged) == 1 and [line.get_label() for line in logged[0].get_lines()] == [
        "parameters uploaded per client (right, log)"]
    panel = next(ax for ax in fig.axes if ax.get_title() == "method signals per round (client mean)")
    assert [line.get_label() for line in panel.get_lines()] == ["share of units kept"]
    assert {t.get_text() for t in panel.get_legend().get_texts()} == {
        "share of units kept", "parameters uploaded per client (right, log)"}


def test_a_methods_mse_signal_does_not_make_a_classification_run_a_regression():
    from fedveil.runtime.report import run_score

    assert run_score([{"round": 1, "global_test_accuracy": 0.5, "reconstruction_mse": 0.1}]) == "accuracy"
    assert run_score([{"round": 1, "global_test_mse": 0.02}]) == "mse"
    assert run_score([{"round": 1, "personal_mse_mean": 0.02}]) == "mse"
