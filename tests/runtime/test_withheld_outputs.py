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
    assert summary["withheld_unnoised"] == ["train_loss", "client_metrics", "partition_counts", "client_extra_metrics"]
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


def test_only_an_algorithms_public_extra_metrics_survive_dp(tmp_path):
    """FADE's lambda and opt-out share are public and kept; FedDrop's local test accuracy and
    ADDS-style costs are not declared public, so a DP run drops them (keys absent)."""
    fade = algorithm_sections("fade", {"privacy": CLIENT})
    _, rows, _, _ = outputs(tmp_path, "fade", **fade)
    assert all({"lambda", "adversarial_users"} <= set(r) for r in rows)
    feddrop_dp = algorithm_sections("feddrop", {"privacy": EXAMPLE})
    _, rows, _, _ = outputs(tmp_path, "feddrop_dp", **feddrop_dp)
    _, plain, _, _ = outputs(tmp_path, "feddrop", **algorithm_sections("feddrop", {}))
    assert any("local_accuracy" in r for r in plain) and all("local_accuracy" not in r for r in rows)
