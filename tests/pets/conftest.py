"""A hand-made four-person data set in the challenge's schema (spec 002 §4.1)."""
from __future__ import annotations

import numpy as np
import pytest

from fedveil.pets.tables import NUM_DAYS, PandemicTables, outcome_table


def tiny_tables() -> PandemicTables:
    pids = np.array([10, 20, 30, 40])
    states = np.zeros((4, NUM_DAYS), dtype=np.int8)
    states[1, 30:38] = 1  # pid 20: I on days 30..37, then R
    states[1, 38:] = 2
    return PandemicTables(
        person={"pid": pids, "hid": np.array([1, 1, 2, 3]), "person_number": np.array([1, 2, 1, 1]),
                "age": np.array([30, 50, 10, 70]), "sex": np.array([1, 2, 1, 2])},
        household={"hid": np.array([1, 2, 3]), "hh_size": np.array([2, 1, 1]), "region": np.array([0, 0, 1])},
        residence_locations={"rlid": np.array([101, 102, 103]), "longitude": np.array([-80.0, -79.0, -78.0]),
                             "latitude": np.array([37.0, 38.0, 39.0])},
        activity_locations={"alid": np.array([1, 2, 3]), "longitude": np.array([-80.5, -79.5, -78.5]),
                            "latitude": np.array([37.5, 38.5, 39.5]), "work": np.array([1, 0, 0]),
                            "shopping": np.array([0, 0, 1]), "school": np.array([0, 1, 0]), "other": np.array([0, 0, 0]),
                            "college": np.array([0, 0, 0]), "religion": np.array([0, 0, 0])},
        activity_location_assignment={
            "pid": np.array([10, 10, 20, 30, 30, 40, 40]),
            "activity_number": np.array([1, 2, 1, 1, 2, 1, 2]),
            "activity_type": np.array([1, 2, 1, 1, 5, 1, 3]),
            "start_time": np.array([0, 28800, 0, 0, 28800, 0, 61200]),
            "duration": np.array([57600, 28800, 86400, 64800, 21600, 84600, 1800]),
            "lid": np.array([101, 1, 101, 102, 2, 103, 3]),
        },
        population_network={
            "pid1": np.array([10, 10, 30, 20]),
            "pid2": np.array([20, 40, 40, 10]),
            "lid": np.array([101, 1, 3, 101]),
            "start_time": np.array([64800, 32400, 61200, 21600]),
            "duration": np.array([36000, 3600, 1800, 7200]),
            "activity1": np.array([1, 2, 3, 1]),
            "activity2": np.array([1, 2, 3, 1]),
        },
        disease_outcome=outcome_table(pids, states),
        target={"pid": pids, "infected": np.array([1, 0, 0, 0])},
    )


@pytest.fixture
def tiny() -> PandemicTables:
    return tiny_tables()
