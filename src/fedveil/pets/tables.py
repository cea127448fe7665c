"""The PETs pandemic-forecasting tables (spec 002 §4.1) held as columns of numpy arrays.

A table is a ``dict`` from column name to a 1-D array; all columns of a table have the
same length. :data:`SCHEMA` lists the columns the pipeline reads from each file (the
challenge's files carry more; extra columns are kept and ignored). Infection states are
stored as codes ``0 = S, 1 = I, 2 = R`` (:data:`STATES`); the CSV files hold the letters.

``target`` is the hidden prediction week (days 57..63 of the challenge): ``infected = 1``
iff the person is S on the last observed day (56) and I or R on one of the next 7 days.
The synthetic stand-in writes a ``region`` column into ``household`` (the administrative
unit the challenge cut its silos along); :func:`split_by_region` cuts silos with it.
"""
from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np

Table = dict[str, np.ndarray]

STATES = ("S", "I", "R")
STATE_CODE = {s: i for i, s in enumerate(STATES)}
NUM_DAYS = 57  # observed days 0..56 ([C2] NUM_DAYS)
PRED_DAYS = 7  # the hidden week 57..63
REGION_COLUMN = "region"

SCHEMA: dict[str, tuple[str, ...]] = {
    "person": ("pid", "hid", "person_number", "age", "sex"),
    "household": ("hid", "hh_size"),
    "residence_locations": ("rlid", "longitude", "latitude"),
    "activity_locations": ("alid", "longitude", "latitude", "work", "shopping", "school", "other", "college", "religion"),
    "activity_location_assignment": ("pid", "activity_number", "activity_type", "start_time", "duration", "lid"),
    "population_network": ("pid1", "pid2", "lid", "start_time", "duration", "activity1", "activity2"),
    "disease_outcome": ("day", "pid", "state"),
    "target": ("pid", "infected"),
}
FLOAT_COLUMNS = frozenset({"longitude", "latitude"})
LOCATION_FLAGS = ("work", "shopping", "school", "other", "college", "religion")
# activity types (7 in the challenge): 1 home, 2 work, 3 shopping, 5 school, 6 college as [C2] data_utils reads them;
# 4 = other and 7 = religion are this implementation's names for the remaining two
HOME, WORK, SHOPPING, OTHER, SCHOOL, COLLEGE, RELIGION = 1, 2, 3, 4, 5, 6, 7


def check_columns(name: str, table: Table, where: str) -> None:
    """Raise ``ValueError`` naming ``where`` (a file or table) and the missing columns."""
    missing = [c for c in SCHEMA[name] if c not in table]
    if missing:
        raise ValueError(
            f"{where}: missing column(s) {', '.join(repr(c) for c in missing)} "
            f"(the {name} table needs {', '.join(SCHEMA[name])}; spec 002 §4.1)"
        )
    lengths = {len(v) for v in table.values()}
    if len(lengths) > 1:
        raise ValueError(f"{where}: columns have different lengths {sorted(lengths)}")


@dataclass
class PandemicTables:
    """One data set (the whole population or one silo) in the §4.1 schema."""

    person: Table
    household: Table
    residence_locations: Table
    activity_locations: Table
    activity_location_assignment: Table
    population_network: Table
    disease_outcome: Table
    target: Table | None = None

    def __post_init__(self) -> None:
        for f in fields(self):
            table = getattr(self, f.name)
            if table is not None:
                check_columns(f.name, table, f"table '{f.name}'")

    @property
    def num_people(self) -> int:
        """The number of rows of the person table."""
        return len(self.person["pid"])

    def tables(self) -> dict[str, Table]:
        """The tables present, by name (``target`` only when known)."""
        return {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) is not None}


def take(table: Table, mask: np.ndarray) -> Table:
    """The rows of every column of ``table`` selected by ``mask``."""
    return {k: v[mask] for k, v in table.items()}


def index_of(pids: np.ndarray, values: np.ndarray, table: str, column: str) -> np.ndarray:
    """Row positions in ``pids`` of ``values`` (``ValueError`` naming ``table.column`` if one is absent)."""
    values = np.asarray(values)
    if len(values) == 0:
        return np.zeros(0, dtype=np.int64)
    if len(pids) == 0:
        raise ValueError(f"{table}: {column} {values[0]} is not in the person table")
    order = np.argsort(pids, kind="stable")
    found = order[np.searchsorted(pids, values, sorter=order).clip(max=len(pids) - 1)]
    bad = pids[found] != values
    if bad.any():
        raise ValueError(f"{table}: {column} {values[bad][0]} is not in the person table")
    return found


def state_matrix(outcome: Table, pids: np.ndarray, num_days: int = NUM_DAYS) -> np.ndarray:
    """``(len(pids), num_days)`` int8 state codes from the long ``disease_outcome`` table.

    Every (pid, day) with ``0 <= day < num_days`` must appear exactly once.
    """
    index = index_of(pids, outcome["pid"], "disease_outcome", "pid")
    day = outcome["day"].astype(np.int64)
    if len(day) and (day.min() < 0 or day.max() >= num_days):
        raise ValueError(f"disease_outcome: days must lie in 0..{num_days - 1}, got {day.min()}..{day.max()}")
    states = np.full((len(pids), num_days), -1, dtype=np.int8)
    states[index, day] = outcome["state"]
    if (states < 0).any() or len(day) != states.size:
        raise ValueError(f"disease_outcome: need exactly one row per (pid, day) for days 0..{num_days - 1}")
    return states


def outcome_table(pids: np.ndarray, states: np.ndarray) -> Table:
    """The long ``disease_outcome`` table (day-major, as the challenge's files) of a state matrix."""
    num_days = states.shape[1]
    return {
        "day": np.repeat(np.arange(num_days), len(pids)),
        "pid": np.tile(pids, num_days),
        "state": states.T.reshape(-1).astype(np.int8),
    }


def split_by_region(data: PandemicTables, column: str = REGION_COLUMN) -> dict[int, PandemicTables]:
    """Cut the population into silos by the household's ``column`` (spec 002 §4.1: silos along
    administrative boundaries). Contacts between people of different silos are dropped, as
    the challenge's partition did; each silo keeps the locations its people use."""
    if column not in data.household:
        raise ValueError(f"household table has no '{column}' column to cut silos with")
    pids = data.person["pid"]
    hh_region = data.household[column]
    person_region = hh_region[index_of(data.household["hid"], data.person["hid"], "person", "hid")]

    def region_of(values: np.ndarray, table: str, col: str) -> np.ndarray:
        return person_region[index_of(pids, values, table, col)]

    net, ala = data.population_network, data.activity_location_assignment
    r1, r2 = region_of(net["pid1"], "population_network", "pid1"), region_of(net["pid2"], "population_network", "pid2")
    ala_region = region_of(ala["pid"], "activity_location_assignment", "pid")
    out_region = region_of(data.disease_outcome["pid"], "disease_outcome", "pid")
    target_region = None if data.target is None else region_of(data.target["pid"], "target", "pid")
    silos = {}
    for region in np.unique(hh_region).tolist():
        net_k = take(net, (r1 == region) & (r2 == region))
        ala_k = take(ala, ala_region == region)
        used = np.union1d(net_k["lid"], ala_k["lid"])
        silos[int(region)] = PandemicTables(
            person=take(data.person, person_region == region),
            household=take(data.household, hh_region == region),
            residence_locations=take(data.residence_locations, np.isin(data.residence_locations["rlid"], used)),
            activity_locations=take(data.activity_locations, np.isin(data.activity_locations["alid"], used)),
            activity_location_assignment=ala_k,
            population_network=net_k,
            disease_outcome=take(data.disease_outcome, out_region == region),
            target=None if data.target is None else take(data.target, target_region == region),
        )
    return silos
