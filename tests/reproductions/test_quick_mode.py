"""Quick modes are smoke tests and say so (issue 36, item 3): they never replace committed
full results, and their reports carry a banner and no verdicts."""
from __future__ import annotations

import json

import pytest

from fedveil.cli.main import main
from fedveil.reproduce import ReproductionReport, ResultRow, write_results
from fedveil.reproduce.report import QUICK_ROOT, output_folder

REPORT = ReproductionReport(
    "a study", "spec §1", [ResultRow("eps 8", "accuracy", "0.2000 ± 0.0000 (n=1)", 0.91, "holds"),
                            ResultRow("eps 2", "gap", 0.05, "0.1 ± 0.02 (n=3)", "below paper")],
)


def test_a_quick_report_has_a_banner_no_verdicts_and_no_single_seed_spreads(tmp_path):
    md, js = write_results(REPORT, tmp_path, quick=True)
    text = md.read_text()
    assert "smoke test, not a reproduction" in text and "no verdicts" in text
    assert "holds" not in text and "below paper" not in text and "| verdict |" not in text
    assert "(n=1)" not in text and "| 0.2000 |" in text
    assert "0.1 ± 0.02 (n=3)" in text  # a real spread stays
    saved = json.loads(js.read_text())
    assert saved["quick"] is True and {r["verdict"] for r in saved["rows"]} == {""}


def test_a_full_report_keeps_its_verdicts(tmp_path):
    md, _ = write_results(REPORT, tmp_path, quick=False)
    assert "| holds |" in md.read_text() and "smoke test" not in md.read_text()


def test_quick_runs_go_elsewhere_and_never_over_full_results(tmp_path):
    assert output_folder("fade_adult", None, quick=True) == QUICK_ROOT / "fade_adult"
    assert str(output_folder("fade_adult", None, quick=False)) == "results/fade_adult"
    full = tmp_path / "full"
    write_results(REPORT, full, quick=False)
    with pytest.raises(ValueError, match="holds the full results of fade_adult"):
        output_folder("fade_adult", str(full), quick=True)
    quick = tmp_path / "quick"
    write_results(REPORT, quick, quick=True)
    assert output_folder("fade_adult", str(quick), quick=True) == quick  # a quick folder may be redone


def test_the_cli_refuses_before_running_anything(tmp_path, capsys):
    full = tmp_path / "results"
    write_results(REPORT, full, quick=False)
    before = (full / "results.md").read_text()
    assert main(["reproduce", "mrmtl_mean_estimation", "--quick", "--out", str(full)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "would overwrite them" in err[0]
    assert (full / "results.md").read_text() == before and not (full / "runs").exists()
