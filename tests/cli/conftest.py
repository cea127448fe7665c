"""Fixtures of the command-line tests: an empty working folder, and ``fedveil`` called in-process."""
from __future__ import annotations

import pytest

import fedveil.runtime.simulation as simulation
from fedveil.cli.main import main


@pytest.fixture
def in_tmp_without_plots(tmp_path, monkeypatch):
    """Run from an empty folder (a default --out lands there) and skip the end-of-run plots."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(simulation, "write_report", lambda path: [])


@pytest.fixture
def fedveil_cli(capsys):
    """``fedveil_cli(*argv)`` -> (exit status, stdout, stderr)."""

    def call(*argv: str) -> tuple[int, str, str]:
        code = main(list(argv))
        out, err = capsys.readouterr()
        return code, out, err

    return call
