"""``synthetic_pandemic``: a synthetic stand-in for the PETs challenge data (spec 002 §4.1, §9).

The challenge's synthetic Virginia population (7.6M people, 186M contacts) is available to
registered participants only, so this module builds a small population with the same
tables and columns, entirely made up:

- regions ("counties", the unit silos are cut along) of unequal size (largest / smallest =
  ``size_ratio``), each with a centre in a Virginia-like longitude/latitude box;
- households of 1..7 people (one residence location each), people with age, sex and
  ``person_number``;
- activity locations of six kinds (the six location flags work, shopping, school, other,
  college, religion) with coordinates around their region's centre, and a popularity
  drawn per location;
- daily activities by age (school, college, work, shopping, other, religion, and home for
  the rest of the day); a fraction of workers works in another region, so a few contacts
  cross region borders and are cut when the silos are formed;
- contacts (``population_network``) among all members of a household and among people
  at the same activity location, with start time, duration and both activity types;
- an outbreak from :func:`fedveil.pets.epidemic.simulate_sir` over 57 + 7 days with
  region-specific transmissibility and age-specific susceptibility; days 0..56 form the
  ``disease_outcome`` table, the hidden week 57..63 the ``target`` table.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from itertools import combinations

import numpy as np
import scipy.sparse as sp

from .epidemic import EpidemicConfig, calibrated_sir, hidden_week_target, observed
from .tables import (
    COLLEGE,
    HOME,
    LOCATION_FLAGS,
    NUM_DAYS,
    OTHER,
    REGION_COLUMN,
    RELIGION,
    SCHOOL,
    SHOPPING,
    WORK,
    PandemicTables,
    index_of,
    outcome_table,
)

HOUSEHOLD_SIZES = np.array([0.28, 0.34, 0.15, 0.13, 0.06, 0.03, 0.01])  # P(size = 1..7)
RESIDENCE_OFFSET = 1_000_000_000  # residence location ids follow the activity location ids' range
DAY = 86_400
HOUR = 3_600

# per activity type: (location flag, people per location, mean contacts per visit, transmission factor)
SETTINGS = {
    WORK: ("work", 20, 12.0, 1.0),
    SHOPPING: ("shopping", 150, 3.0, 0.6),
    OTHER: ("other", 100, 4.0, 0.8),
    SCHOOL: ("school", 400, 16.0, 1.4),
    COLLEGE: ("college", 3000, 6.0, 1.2),
    RELIGION: ("religion", 300, 5.0, 1.0),
}
HOME_FACTOR = 3.0


@dataclass(frozen=True)
class SyntheticConfig:
    """Settings of the synthetic population: people, regions and their
    size ratio, cross-region work, spread, seed and the outbreak."""

    num_people: int = 30_000
    num_regions: int = 6
    size_ratio: float = 12.0  # largest / smallest region (the challenge's silos differ > 10x)
    cross_region_work: float = 0.05  # fraction of workers employed in another region
    region_spread: float = 0.35  # std of the log transmissibility multiplier across regions (initial prevalence: 0.5)
    seed: int = 0
    epidemic: EpidemicConfig = field(default_factory=EpidemicConfig)

    def __post_init__(self) -> None:
        if self.num_people < 10:
            raise ValueError(f"num_people must be >= 10, got {self.num_people}")
        if not 1 <= self.num_regions <= self.num_people // 5:
            raise ValueError(f"num_regions must lie in 1..num_people/5, got {self.num_regions}")
        if self.size_ratio < 1 or not 0 <= self.cross_region_work <= 1 or self.region_spread < 0:
            raise ValueError("need size_ratio >= 1, 0 <= cross_region_work <= 1 and region_spread >= 0")


def region_sizes(num_people: int, num_regions: int, size_ratio: float) -> np.ndarray:
    """People per region, geometric from ``size_ratio`` times the smallest down to the smallest."""
    weights = size_ratio ** (-np.arange(num_regions) / max(num_regions - 1, 1))
    sizes = np.floor(num_people * weights / weights.sum()).astype(np.int64)
    sizes[0] += num_people - sizes.sum()
    if sizes.min() < 1:
        raise ValueError(f"{num_people} people are too few for {num_regions} regions with size_ratio {size_ratio}")
    return sizes


def synthetic_pandemic(cfg: SyntheticConfig = SyntheticConfig()) -> PandemicTables:
    """A synthetic population, contact network and outbreak in the §4.1 schema."""
    rng = np.random.default_rng(cfg.seed)
    sizes = region_sizes(cfg.num_people, cfg.num_regions, cfg.size_ratio)
    centres = np.column_stack([rng.uniform(-83.0, -76.0, cfg.num_regions), rng.uniform(36.8, 39.2, cfg.num_regions)])

    person, household, residences = _households(sizes, centres, rng)
    locations, loc_region, loc_kind, popularity = _activity_locations(sizes, centres, rng)
    person_region = household[REGION_COLUMN][person["hid"] - 1]
    assignment = _activities(person, person_region, residences, locations, loc_region, loc_kind, popularity, cfg, rng)
    network = _contacts(person, residences, assignment, rng)

    states = _outbreak(person, person_region, network, cfg, rng)
    obs = observed(states)
    return PandemicTables(
        person=person,
        household=household,
        residence_locations=residences,
        activity_locations=locations,
        activity_location_assignment=assignment,
        population_network=network,
        disease_outcome=outcome_table(person["pid"], obs[:, :NUM_DAYS]),
        target={"pid": person["pid"], "infected": hidden_week_target(obs)},
    )


def _households(sizes: np.ndarray, centres: np.ndarray, rng: np.random.Generator):
    hh_sizes, hh_region = [], []
    for region, n_k in enumerate(sizes.tolist()):
        draw = rng.choice(np.arange(1, 8), size=n_k, p=HOUSEHOLD_SIZES / HOUSEHOLD_SIZES.sum())
        cut = int(np.searchsorted(np.cumsum(draw), n_k))  # households until the region is full
        draw = draw[: cut + 1]
        draw[-1] -= draw.sum() - n_k
        hh_sizes.append(draw)
        hh_region.append(np.full(len(draw), region))
    hh_size, region = np.concatenate(hh_sizes), np.concatenate(hh_region)
    hid = np.arange(1, len(hh_size) + 1)
    person_hid = np.repeat(hid, hh_size)
    starts = np.repeat(np.cumsum(hh_size) - hh_size, hh_size)
    number = np.arange(len(person_hid)) - starts + 1
    n = len(person_hid)
    child = (number >= 3) & (rng.random(n) < 0.85)
    age = np.where(child, rng.integers(0, 18, n), np.where(number == 1, rng.integers(18, 90, n), rng.integers(18, 80, n)))
    person = {
        "pid": np.arange(1, n + 1),
        "hid": person_hid,
        "person_number": number,
        "age": age,
        "sex": rng.integers(1, 3, n),
    }
    household = {"hid": hid, "hh_size": hh_size, REGION_COLUMN: region}
    xy = centres[region] + rng.normal(0.0, 0.15, (len(hid), 2))
    residences = {"rlid": RESIDENCE_OFFSET + hid, "longitude": xy[:, 0], "latitude": xy[:, 1]}
    return person, household, residences


def _activity_locations(sizes: np.ndarray, centres: np.ndarray, rng: np.random.Generator):
    region, kind = [], []
    for k, n_k in enumerate(sizes.tolist()):
        for activity, (_, per_location, _, _) in SETTINGS.items():
            count = max(1, round(n_k / per_location))
            region.append(np.full(count, k))
            kind.append(np.full(count, activity))
    region, kind = np.concatenate(region), np.concatenate(kind)
    xy = centres[region] + rng.normal(0.0, 0.2, (len(region), 2))
    locations = {"alid": np.arange(1, len(region) + 1), "longitude": xy[:, 0], "latitude": xy[:, 1]}
    for flag in LOCATION_FLAGS:
        locations[flag] = np.array([SETTINGS[a][0] == flag for a in kind.tolist()], dtype=np.int64)
    popularity = rng.lognormal(0.0, 0.8, len(region))
    return locations, region, kind, popularity


def _activities(person, person_region, residences, locations, loc_region, loc_kind, popularity, cfg, rng):
    n = len(person["pid"])
    age = person["age"]
    u = rng.random((6, n))
    college = (age >= 18) & (age <= 22) & (u[1] < 0.35)
    plans = {  # activity -> (who, start range (h), duration range (h))
        SCHOOL: ((age >= 5) & (age <= 17) & (u[0] < 0.95), (7.5, 8.5), (6.0, 7.5)),
        COLLEGE: (college, (9.0, 12.0), (3.0, 6.0)),
        WORK: ((age >= 18) & (age <= 67) & ~college & (u[2] < 0.72), (6.5, 9.5), (6.0, 10.0)),
        SHOPPING: ((age >= 14) & (u[3] < 0.5), (16.0, 19.0), (0.5, 1.5)),
        OTHER: ((age >= 3) & (u[4] < 0.35), (12.0, 20.0), (1.0, 3.0)),
        RELIGION: (u[5] < 0.12, (9.0, 11.0), (1.0, 2.0)),
    }
    rows = {c: [] for c in ("pid", "activity_type", "start_time", "duration", "lid")}
    out_time = np.zeros(n, dtype=np.int64)
    for activity, (who, start_h, dur_h) in plans.items():
        idx = np.flatnonzero(who)
        region = person_region[idx].copy()
        if activity == WORK:  # commuters work in another region
            move = rng.random(len(idx)) < cfg.cross_region_work
            if cfg.num_regions > 1:
                region[move] = (region[move] + rng.integers(1, cfg.num_regions, move.sum())) % cfg.num_regions
        lid = _pick_locations(region, activity, loc_region, loc_kind, popularity, locations["alid"], rng)
        start = (rng.uniform(*start_h, len(idx)) * HOUR).astype(np.int64)
        duration = (rng.uniform(*dur_h, len(idx)) * HOUR).astype(np.int64)
        out_time[idx] += duration
        for c, v in zip(rows, (person["pid"][idx], np.full(len(idx), activity), start, duration, lid)):
            rows[c].append(v)
    home_lid = residences["rlid"][person["hid"] - 1]
    for c, v in zip(rows, (person["pid"], np.full(n, HOME), np.zeros(n, dtype=np.int64), DAY - out_time, home_lid)):
        rows[c].append(v)
    table = {c: np.concatenate(v) for c, v in rows.items()}
    order = np.lexsort((table["activity_type"], table["pid"]))
    table = {c: v[order] for c, v in table.items()}
    first = np.searchsorted(table["pid"], table["pid"])  # first row of each person
    table["activity_number"] = np.arange(len(order)) - first + 1
    return table


def _pick_locations(region, activity, loc_region, loc_kind, popularity, alids, rng):
    lid = np.empty(len(region), dtype=np.int64)
    for k in np.unique(region).tolist():
        candidates = np.flatnonzero((loc_region == k) & (loc_kind == activity))
        mine = region == k
        p = popularity[candidates] / popularity[candidates].sum()
        lid[mine] = alids[rng.choice(candidates, size=int(mine.sum()), p=p)]
    return lid


def _contacts(person, residences, assignment, rng):
    parts = [_household_contacts(person, residences, rng)]
    out = assignment["activity_type"] != HOME
    visits = {c: v[out] for c, v in assignment.items()}
    order = np.argsort(visits["lid"], kind="stable")
    visits = {c: v[order] for c, v in visits.items()}
    lid = visits["lid"]
    group_start = np.searchsorted(lid, lid, side="left")
    group_size = np.searchsorted(lid, lid, side="right") - group_start
    mean = np.array([SETTINGS[a][2] if a in SETTINGS else 0.0 for a in range(8)])[visits["activity_type"]]
    draws = rng.poisson(mean / 2.0) * (group_size > 1)  # each contact involves two visitors
    a = np.repeat(np.arange(len(lid)), draws)
    b = group_start[a] + rng.integers(0, group_size[a])
    keep = a != b
    a, b = a[keep], b[keep]
    lo, hi = np.minimum(a, b), np.maximum(a, b)
    pairs = np.unique(np.column_stack([lo, hi]), axis=0)
    a, b = pairs[:, 0], pairs[:, 1]
    start = np.maximum(visits["start_time"][a], visits["start_time"][b])
    end = np.minimum(visits["start_time"][a] + visits["duration"][a], visits["start_time"][b] + visits["duration"][b])
    overlap = end - start
    brief = overlap <= 0  # no common time: a short encounter at the earlier visit
    start = np.where(brief, visits["start_time"][a], start)
    duration = np.where(brief, rng.integers(300, 1800, len(a)), (overlap * rng.uniform(0.2, 1.0, len(a))).astype(np.int64))
    parts.append({
        "pid1": visits["pid"][a],
        "pid2": visits["pid"][b],
        "lid": lid[a],
        "start_time": start,
        "duration": np.maximum(duration, 60),
        "activity1": visits["activity_type"][a],
        "activity2": visits["activity_type"][b],
    })
    return {c: np.concatenate([p[c] for p in parts]) for c in parts[0]}


def _household_contacts(person, residences, rng):
    hid = person["hid"]
    sizes = np.bincount(hid)[hid]
    first = np.searchsorted(hid, hid)
    pid1, pid2 = [], []
    for size in range(2, int(sizes.max(initial=1)) + 1):
        heads = np.unique(first[sizes == size])
        for i, j in combinations(range(size), 2):
            pid1.append(person["pid"][heads + i])
            pid2.append(person["pid"][heads + j])
    pid1 = np.concatenate(pid1) if pid1 else np.zeros(0, dtype=np.int64)
    pid2 = np.concatenate(pid2) if pid2 else np.zeros(0, dtype=np.int64)
    m = len(pid1)
    return {
        "pid1": pid1,
        "pid2": pid2,
        "lid": residences["rlid"][hid[pid1 - 1] - 1],
        "start_time": (rng.uniform(17.0, 20.0, m) * HOUR).astype(np.int64),
        "duration": (rng.uniform(4.0, 12.0, m) * HOUR).astype(np.int64),
        "activity1": np.full(m, HOME),
        "activity2": np.full(m, HOME),
    }


def contact_weights(person: dict, network: dict) -> sp.csr_matrix:
    """Symmetric ``(n, n)`` weights: contact duration in days times the setting's transmission factor."""
    n = len(person["pid"])
    i = index_of(person["pid"], network["pid1"], "population_network", "pid1")
    j = index_of(person["pid"], network["pid2"], "population_network", "pid2")
    factor = np.array([0.0, HOME_FACTOR] + [SETTINGS[a][3] for a in range(WORK, RELIGION + 1)])
    w = network["duration"] / DAY * factor[network["activity1"]]
    m = sp.coo_matrix((w, (i, j)), shape=(n, n))
    return (m + m.T).tocsr()


def _outbreak(person, person_region, network, cfg: SyntheticConfig, rng) -> np.ndarray:
    region_factor = np.exp(rng.normal(0.0, cfg.region_spread, cfg.num_regions))
    age = person["age"]
    age_factor = np.select([age < 18, age >= 65], [0.6, 1.4], 1.0)
    prevalence = cfg.epidemic.initial_prevalence * np.exp(rng.normal(0.0, 0.5, cfg.num_regions))
    states, _ = calibrated_sir(
        contact_weights(person, network),
        region_factor[person_region] * age_factor,
        np.clip(prevalence[person_region], 0.0, 1.0),
        cfg.epidemic,
        seed=int(rng.integers(2**31)),
    )
    return states
