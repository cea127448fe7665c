"""Neighbourhood feature vectors and random-window labels, one example per person (spec 002 §4.3).

Per node (``D_NODE = 10``, [C2] ``create_node_features`` + ``centrality_measures``):
``[degree, pagerank, age, sex, hh_size, worked, schooled, shopped, home_only, out_time]`` —
degree and undirected PageRank MinMax-scaled per column; age standardised; ``sex - 1.5``;
Box-Cox transformed household size; four ``{-0.5, 0.5}`` flags (ever worked = type 2, ever
at school or college = 5/6, ever shopped = 3, only home activities); time out of home =
total duration of types 2, 3, 5, 6 in days.

Per sampled contact (``D_EDGE = 10``): ``start_time/86400``, ``duration/86400``, standardised
longitude and latitude of the contact's location, and its six flags (work, shopping, school,
other, college, religion; residences all 0). Activity one-hots are left out as in the final
submission (Table 2.3).

Example vector of person ``i`` for the window of days ``[s, s + 21)`` (:class:`FeatureLayout`)::

    [ego node features (10), ego all-S-in-window flag (1)]
    ++ for each of the S sampled neighbours: [node features (10), S/I/R one-hots of the 21 days (63), contact (10)]

so ``d = 11 + 83 S`` (1671 for S = 20). Empty neighbour slots are all zeros (node, history
*and* contact features; [C2] zeroes the node and history parts only and leaves the
placeholder's contact features in, which this implementation does not copy).

Several features are statistics of the whole silo, not of a person's neighbourhood: the
MinMax range of degree and PageRank, PageRank itself (a function of the whole contact
graph), the mean and standard deviation of age, the Box-Cox ``lambda`` of household size (a
maximum-likelihood fit on the silo) and the mean and standard deviation of the coordinates
of the locations the silo's people use. Changing one person therefore moves the features of
examples that do not contain them, against Theorem 2.4.4's premise (:mod:`.node_dp`).

Labels: ``y = 1`` iff the ego is S on all 21 window days and I or R on one of the next 7.
Training draws one window start ``s ~ U{0..28}`` per person per epoch; inference uses the
last window (start 36, days 36..56), labelled with the hidden week (``target``).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy import stats

from .graph import PLACEHOLDER, contact_graph, occurrences, pagerank, sample_neighbours
from .tables import (
    COLLEGE,
    HOME,
    LOCATION_FLAGS,
    NUM_DAYS,
    PRED_DAYS,
    SCHOOL,
    SHOPPING,
    STATE_CODE,
    WORK,
    PandemicTables,
    index_of,
    state_matrix,
)

D_CENTRALITY = 2
D_PERSONAL = 8
D_NODE = D_CENTRALITY + D_PERSONAL
WINDOW = 21
NUM_STATES = 3
D_HISTORY = WINDOW * NUM_STATES
D_EDGE = 2 + 2 + len(LOCATION_FLAGS)
NUM_TRAIN_STARTS = NUM_DAYS - WINDOW - PRED_DAYS  # starts 0..28 (29 choices)
TEST_START = NUM_DAYS - WINDOW  # 36: days 36..56
SECONDS_PER_DAY = 86_400.0


@dataclass(frozen=True)
class FeatureLayout:
    """Positions of the blocks in an example vector with ``num_neighbours`` slots."""

    num_neighbours: int

    def __post_init__(self) -> None:
        if self.num_neighbours < 1:
            raise ValueError(f"the number of sampled neighbours S must be >= 1, got {self.num_neighbours}")

    ego_node = slice(0, D_NODE)
    ego_all_s = D_NODE
    block = D_NODE + D_HISTORY + D_EDGE  # 83 per neighbour

    @property
    def dim(self) -> int:
        """d = 11 + 83 S, the length of one example vector."""
        return D_NODE + 1 + self.num_neighbours * self.block

    def neighbour(self, j: int) -> slice:
        """The positions of neighbour slot ``j``'s block (node, history, contact)."""
        if not 0 <= j < self.num_neighbours:
            raise IndexError(f"neighbour slot {j} outside 0..{self.num_neighbours - 1}")
        start = D_NODE + 1 + j * self.block
        return slice(start, start + self.block)

    def neighbour_node(self, j: int) -> slice:
        """The positions of neighbour slot ``j``'s node features."""
        s = self.neighbour(j).start
        return slice(s, s + D_NODE)

    def neighbour_history(self, j: int) -> slice:
        """The positions of neighbour slot ``j``'s S/I/R one-hots of the window's days."""
        s = self.neighbour(j).start + D_NODE
        return slice(s, s + D_HISTORY)

    def neighbour_edge(self, j: int) -> slice:
        """The positions of neighbour slot ``j``'s contact features."""
        s = self.neighbour(j).start + D_NODE + D_HISTORY
        return slice(s, s + D_EDGE)


def feature_dim(num_neighbours: int) -> int:
    """The example length d = 11 + 83 S for ``num_neighbours`` = S slots."""
    return FeatureLayout(num_neighbours).dim


def minmax(x: np.ndarray) -> np.ndarray:
    """Per-column MinMax scaling to [0, 1] (a constant column becomes 0)."""
    lo, span = x.min(axis=0), np.ptp(x, axis=0)
    return (x - lo) / np.where(span > 0, span, 1.0)


def standardise(x: np.ndarray) -> np.ndarray:
    """Zero mean, unit (population) standard deviation; a constant column is only centred."""
    std = x.std(axis=0)
    return (x - x.mean(axis=0)) / np.where(std > 0, std, 1.0)


def personal_features(data: PandemicTables) -> np.ndarray:
    """``(n, 8)``: age, sex, hh_size, worked, schooled, shopped, home_only, out_time."""
    person, ala = data.person, data.activity_location_assignment
    pids = person["pid"]
    hh_size = data.household["hh_size"][index_of(data.household["hid"], person["hid"], "person", "hid")].astype(float)
    if hh_size.min(initial=1.0) <= 0:
        raise ValueError("household: hh_size must be >= 1")
    boxcox = stats.boxcox(hh_size)[0] if np.ptp(hh_size) > 0 else np.zeros_like(hh_size)
    who = index_of(pids, ala["pid"], "activity_location_assignment", "pid")
    kind = ala["activity_type"]

    def ever(*types: int) -> np.ndarray:
        return np.bincount(who[np.isin(kind, types)], minlength=len(pids)) > 0

    away = np.isin(kind, (WORK, SHOPPING, SCHOOL, COLLEGE))
    out_time = np.bincount(who[away], weights=ala["duration"][away].astype(float), minlength=len(pids)) / SECONDS_PER_DAY
    home_only = np.bincount(who[kind != HOME], minlength=len(pids)) == 0
    flags = np.column_stack([ever(WORK), ever(SCHOOL, COLLEGE), ever(SHOPPING), home_only]).astype(float) - 0.5
    return np.column_stack([standardise(person["age"].astype(float)), person["sex"] - 1.5, boxcox, flags, out_time])


def location_table(data: PandemicTables) -> tuple[np.ndarray, np.ndarray]:
    """Location ids (residences then activity locations) and their ``(m, 8)`` features:
    standardised longitude, latitude, then the six flags (residences all 0)."""
    res, act = data.residence_locations, data.activity_locations
    lids = np.concatenate([res["rlid"], act["alid"]])
    if len(np.unique(lids)) != len(lids):
        raise ValueError("residence_locations.rlid and activity_locations.alid must be distinct location ids")
    coords = np.column_stack([
        np.concatenate([res["longitude"], act["longitude"]]),
        np.concatenate([res["latitude"], act["latitude"]]),
    ]).astype(float)
    flags = np.vstack([np.zeros((len(res["rlid"]), len(LOCATION_FLAGS))), np.column_stack([act[f] for f in LOCATION_FLAGS])])
    return lids, np.column_stack([standardise(coords) if len(lids) else coords, flags])


def edge_features(data: PandemicTables, edge: np.ndarray) -> np.ndarray:
    """``(n, S, 10)`` features of the sampled contacts ``edge`` (network rows; placeholder -> zeros)."""
    net = data.population_network
    lids, loc = location_table(data)
    valid = edge != PLACEHOLDER
    rows = edge[valid]
    out = np.zeros(edge.shape + (D_EDGE,), dtype=np.float32)
    where = index_of(lids, net["lid"][rows], "population_network", "lid (a location missing from the location tables)")
    out[valid] = np.column_stack([
        net["start_time"][rows] / SECONDS_PER_DAY,
        net["duration"][rows] / SECONDS_PER_DAY,
        loc[where],
    ])
    return out


@dataclass
class SiloFeatures:
    """Everything needed to build any window's examples for one silo (the cacheable part)."""

    pids: np.ndarray  # (n,)
    node: np.ndarray  # (n, D_NODE) float32
    neighbour: np.ndarray  # (n, S) node indices, PLACEHOLDER for empty slots
    edge: np.ndarray  # (n, S, D_EDGE) float32, zeros for empty slots
    states: np.ndarray  # (n, 57) int8 codes S=0, I=1, R=2
    target: np.ndarray | None  # (n,) hidden-week "infected", if known
    occurrence_cap: int | None = None  # the a-priori cap of the neighbour sample, if it was capped

    @property
    def num_nodes(self) -> int:
        """The number of people n of the silo."""
        return len(self.pids)

    @property
    def layout(self) -> FeatureLayout:
        """The :class:`FeatureLayout` of this silo's neighbour sample size S."""
        return FeatureLayout(self.neighbour.shape[1])

    def max_occurrences(self) -> int:
        """Most neighbourhoods any one person appears in (a statistic of the data)."""
        return int(occurrences(self.neighbour).max(initial=1))

    def occurrence_bound(self) -> int:
        """The ``S`` given to Theorem 2.4.4: the a-priori cap if the sample was capped (a public
        constant), else the observed :meth:`max_occurrences` (data-dependent)."""
        return self.max_occurrences() if self.occurrence_cap is None else self.occurrence_cap

    def examples(self, idx: np.ndarray, start: np.ndarray | int) -> np.ndarray:
        """``(len(idx), d)`` float32 example vectors of nodes ``idx`` for windows starting at ``start``."""
        idx = np.asarray(idx, dtype=np.int64)
        start = np.broadcast_to(np.asarray(start, dtype=np.int64), idx.shape)
        _check_starts(start, TEST_START)
        b, num = len(idx), self.neighbour.shape[1]
        days = start[:, None] + np.arange(WINDOW)  # (B, 21)
        out = np.zeros((b, self.layout.dim), dtype=np.float32)
        out[:, :D_NODE] = self.node[idx]
        out[:, D_NODE] = (self.states[idx[:, None], days] == STATE_CODE["S"]).all(axis=1)
        blocks = out[:, D_NODE + 1 :].reshape(b, num, FeatureLayout.block)  # a view into out
        nb = self.neighbour[idx]
        valid = nb != PLACEHOLDER
        rows, slots = np.nonzero(valid)
        people = nb[rows, slots]
        blocks[rows, slots, :D_NODE] = self.node[people]
        # one-hot S/I/R of day t of the window at offset D_NODE + 3 t + state
        history = blocks[:, :, D_NODE : D_NODE + D_HISTORY].reshape(b, num, WINDOW, NUM_STATES)
        state = self.states[people[:, None], days[rows]]  # (valid slots, 21)
        history[rows[:, None], slots[:, None], np.arange(WINDOW)[None, :], state] = 1.0
        blocks[:, :, D_NODE + D_HISTORY :] = self.edge[idx]
        return out

    def labels(self, idx: np.ndarray, start: np.ndarray | int) -> np.ndarray:
        """Training labels: S on all days of the window and I or R on one of the next 7."""
        idx = np.asarray(idx, dtype=np.int64)
        start = np.broadcast_to(np.asarray(start, dtype=np.int64), idx.shape)
        _check_starts(start, NUM_TRAIN_STARTS - 1)
        return window_labels(self.states[idx], start)

    def test_labels(self) -> np.ndarray:
        """Labels of the last window: S on days 36..56 and infected in the hidden week."""
        if self.target is None:
            raise ValueError("no target table (hidden week) for this silo: test labels are unknown")
        all_s = (self.states[:, TEST_START:] == STATE_CODE["S"]).all(axis=1)
        return (all_s & (self.target == 1)).astype(np.float32)


def window_labels(states: np.ndarray, start: np.ndarray) -> np.ndarray:
    """``y = 1`` iff S on days ``[s, s + 21)`` and I or R on one of days ``[s + 21, s + 28)``
    (rows of ``states`` are people; ``start`` holds each row's ``s``)."""
    rows = np.arange(len(states))[:, None]
    window = states[rows, start[:, None] + np.arange(WINDOW)]
    future = states[rows, start[:, None] + WINDOW + np.arange(PRED_DAYS)]
    return ((window == STATE_CODE["S"]).all(axis=1) & (future != STATE_CODE["S"]).any(axis=1)).astype(np.float32)


def _check_starts(start: np.ndarray, last: int) -> None:
    if start.size and (start.min() < 0 or start.max() > last):
        raise ValueError(f"window starts must lie in 0..{last}, got {start.min()}..{start.max()}")


def build_silo_features(
    data: PandemicTables, num_neighbours: int = 20, progress: bool = False, max_occurrences: int | None = None
) -> SiloFeatures:
    """Graph, deterministic neighbour sample and feature tables of one silo (spec 002 §4.5,
    per silo); ``max_occurrences`` caps the neighbourhoods a person is in (:func:`sample_neighbours`)."""
    pids = data.person["pid"]
    graph = contact_graph(pids, data.population_network)
    neighbour, edge = sample_neighbours(graph, num_neighbours, progress=progress, max_occurrences=max_occurrences)
    centrality = minmax(np.column_stack([graph.degree.astype(float), pagerank(graph)])) if len(pids) else np.zeros((0, 2))
    node = np.column_stack([centrality, personal_features(data)]).astype(np.float32)
    target = None
    if data.target is not None:
        target = np.zeros(len(pids), dtype=np.int8)
        target[index_of(pids, data.target["pid"], "target", "pid")] = data.target["infected"]
    return SiloFeatures(pids, node, neighbour, edge_features(data, edge), state_matrix(data.disease_outcome, pids), target,
                        max_occurrences)

