"""CSV files in the challenge's schema (spec 002 §4.1): round trip and clear errors."""
from __future__ import annotations

import numpy as np
import pytest

from fedveil.pets.csv_io import read_csv_tables, write_csv_tables
from fedveil.pets.tables import state_matrix


def test_round_trip(tmp_path, tiny):
    write_csv_tables(tiny, tmp_path)
    assert (tmp_path / "disease_outcome_target.csv").exists()
    back = read_csv_tables(tmp_path)
    for name, table in tiny.tables().items():
        assert set(back.tables()[name]) == set(table), name
        for column, values in table.items():
            np.testing.assert_allclose(back.tables()[name][column], values, err_msg=f"{name}.{column}")
    np.testing.assert_array_equal(state_matrix(back.disease_outcome, back.person["pid"]),
                                  state_matrix(tiny.disease_outcome, tiny.person["pid"]))
    assert (tmp_path / "disease_outcome.csv").read_text().splitlines()[1] == "0,10,S"


def test_missing_column_names_file_and_column(tmp_path, tiny):
    write_csv_tables(tiny, tmp_path)
    path = tmp_path / "population_network.csv"
    lines = path.read_text().splitlines()
    path.write_text("\n".join(",".join(f for i, f in enumerate(line.split(",")) if i != 3) for line in lines) + "\n")
    with pytest.raises(ValueError, match=r"population_network\.csv: missing column\(s\) 'start_time'"):
        read_csv_tables(tmp_path)


def test_missing_file_and_bad_state(tmp_path, tiny):
    write_csv_tables(tiny, tmp_path)
    outcome = tmp_path / "disease_outcome.csv"
    outcome.write_text(outcome.read_text().replace("0,10,S", "0,10,X", 1))
    with pytest.raises(ValueError, match="disease_outcome.csv: state must be one of S, I, R; data row 1"):
        read_csv_tables(tmp_path)
    (tmp_path / "household.csv").unlink()
    with pytest.raises(FileNotFoundError, match="household.csv: missing"):
        read_csv_tables(tmp_path)


def test_target_is_optional(tmp_path, tiny):
    write_csv_tables(tiny, tmp_path)
    (tmp_path / "disease_outcome_target.csv").unlink()
    assert read_csv_tables(tmp_path).target is None
