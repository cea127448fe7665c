"""A DP run writes nothing un-noised that its epsilon does not cover (issue: privacy at the
edges, item 3): keys absent, not zero; ``privacy.keep_unnoised`` keeps them for research,
and the summary says what was withheld."""
from __future__ import annotations

import pytest

from fedveil.runtime import run

from tiny_runs import algorithm_sections, merge, read_json, rows_of, tiny_config

pytestmark = pytest.mark.usefixtures("skip_plots")

EXAMPLE = {"level": "example", "noise_multiplier": 1.0}
CLIENT = {"level": "client", "noise_multiplier": 1.0, "clip": 1.0}
SMALL = {"federation": {"rounds": 2, "sampling": "poisson"}}


def outputs(tmp_path, name: str, **sections):
    out = tmp_path / name
    summary = run(tiny_config(**merge(SMALL, sections)), out, progress=False)
    return summary, rows_of(out), read_json(out / "client_metrics.json"), read_json(out / "partition.json")


def test_an_example_level_run_withholds_losses_counts_and_per_client_scores(tmp_path):
    summary, rows, clients, partition = outputs(tmp_path, "dp", privacy=EXAMPLE)
    assert all("train_loss" not in r for r in rows) and all("cohort_size" in r for r in rows)  # the schedule is public
    assert clients == [{"client": c} for c in range(5)]
    assert set(partition) == {"pooled_test_size"}
    assert summary["withheld_unnoised"] == ["train_loss", "client_metrics", "partition_counts"]
    assert "epsilon" in summary and "global_test_accuracy" in summary


def test_a_client_level_run_also_withholds_the_realised_cohort_size(tmp_path):
    summary, rows, _, _ = outputs(tmp_path, "client", privacy=CLIENT)
    assert all("cohort_size" not in r and "train_loss" not in r for r in rows)
    assert "cohort_size" in summary["withheld_unnoised"]


def test_keep_unnoised_and_runs_without_dp_write_everything(tmp_path):
    for name, privacy in (("kept", {**CLIENT, "keep_unnoised": True}), ("plain", {"level": "none"})):
        summary, rows, clients, partition = outputs(tmp_path, name, privacy=privacy)
        assert all("train_loss" in r and "cohort_size" in r for r in rows), name
        assert all("num_train" in c for c in clients) and "train_sizes" in partition, name
        assert "withheld_unnoised" not in summary, name


def test_fade_sends_no_raw_group_loss_under_client_level_dp(tmp_path):
    fade = algorithm_sections("fade", {"privacy": {**CLIENT, "keep_unnoised": True}})
    _, rows, _, _ = outputs(tmp_path, "fade_dp", **fade)
    assert rows and all("group_loss" not in r for r in rows)
    _, rows, _, _ = outputs(tmp_path, "fade_plain", **algorithm_sections("fade", {}))
    assert any("group_loss" in r for r in rows)  # the guard's statistic exists without DP
