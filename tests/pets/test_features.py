"""Feature layout (d = 1671), node/contact features, deterministic sampling, window labels (spec 002 §4.3)."""
from __future__ import annotations

import math

import numpy as np
import pytest

from fedveil.pets.features import (
    FeatureLayout,
    SiloFeatures,
    build_silo_features,
    feature_dim,
    window_labels,
)
from fedveil.pets.tables import NUM_DAYS


def test_dimension_is_1671_for_20_neighbours():
    # [X] 73 * 21 - 63 + 1 + 10 * 20
    assert feature_dim(20) == 73 * 21 - 63 + 1 + 10 * 20 == 1671
    assert feature_dim(1) == 11 + 83


def test_block_positions():
    lay = FeatureLayout(20)
    assert lay.ego_node == slice(0, 10) and lay.ego_all_s == 10
    assert lay.neighbour(0) == slice(11, 94)
    assert (lay.neighbour_node(0), lay.neighbour_history(0), lay.neighbour_edge(0)) == (slice(11, 21), slice(21, 84), slice(84, 94))
    assert lay.neighbour(19) == slice(1588, 1671) and lay.neighbour_edge(19).stop == lay.dim
    with pytest.raises(IndexError):
        lay.neighbour(20)
    with pytest.raises(ValueError, match="S must be >= 1"):
        FeatureLayout(0)


def hand_silo() -> SiloFeatures:
    """3 people, S = 2: person 0 has neighbours (1, empty), person 1 has (0, 2), person 2 none."""
    states = np.zeros((3, NUM_DAYS), dtype=np.int8)
    states[1, 5:9] = 1  # person 1: I on days 5..8, R from 9
    states[1, 9:] = 2
    edge = np.zeros((3, 2, 10), dtype=np.float32)
    edge[0, 0] = np.arange(1, 11) / 100
    edge[1, 0], edge[1, 1] = 0.5, 0.25
    return SiloFeatures(
        pids=np.array([7, 8, 9]),
        node=np.arange(30, dtype=np.float32).reshape(3, 10),
        neighbour=np.array([[1, -1], [0, 2], [-1, -1]]),
        edge=edge,
        states=states,
        target=None,
    )


def test_example_vector_values():
    silo = hand_silo()
    lay = silo.layout
    x = silo.examples(np.array([0, 1, 2]), np.array([0, 0, 20]))
    assert x.shape == (3, 11 + 2 * 83) and x.dtype == np.float32
    # ego of person 0: its node features and all-S flag
    np.testing.assert_array_equal(x[0, lay.ego_node], np.arange(10))
    assert x[0, lay.ego_all_s] == 1.0
    # slot 0 of person 0 is person 1: node features 10..19, its day-t state at 3t + state
    np.testing.assert_array_equal(x[0, lay.neighbour_node(0)], np.arange(10, 20))
    hist = x[0, lay.neighbour_history(0)].reshape(21, 3)
    np.testing.assert_array_equal(hist.argmax(1), [0] * 5 + [1] * 4 + [2] * 12)
    np.testing.assert_array_equal(hist.sum(1), np.ones(21))
    np.testing.assert_allclose(x[0, lay.neighbour_edge(0)], np.arange(1, 11) / 100)
    # the empty slot is all zeros
    assert not x[0, lay.neighbour(1)].any()
    # person 1 is not all-S in days 0..20; person 2 has no neighbours at all
    assert x[1, lay.ego_all_s] == 0.0
    assert not x[2, lay.ego_all_s + 1 :].any() and x[2, lay.ego_all_s] == 1.0
    # window start 20 for person 1's history as a neighbour of person 0: days 20..40 are all R
    h20 = silo.examples(np.array([0]), 20)[0, lay.neighbour_history(0)].reshape(21, 3)
    np.testing.assert_array_equal(h20[:, 2], np.ones(21))


def test_window_start_out_of_range():
    silo = hand_silo()
    with pytest.raises(ValueError, match="0..36"):
        silo.examples(np.array([0]), 37)
    with pytest.raises(ValueError, match="0..28"):
        silo.labels(np.array([0]), 29)


def test_label_rule_hand_built_history():
    """Window = days s..s+20 (s = 2: days 2..22), prediction = days 23..29."""
    states = np.zeros((5, NUM_DAYS), dtype=np.int8)
    states[0, 25:] = 1  # S through the window, I on day 25 -> 1
    states[1, 10:] = 1  # I inside the window -> 0 (not susceptible)
    # person 2 stays S -> 0
    states[3, 23:] = 2  # reported R on day 23 (first day after the window) -> 1
    states[4, 30:] = 1  # infected on day 30, after the 7 days -> 0
    np.testing.assert_array_equal(window_labels(states, np.full(5, 2)), [1, 0, 0, 1, 0])
    # with s = 0 (prediction days 21..27) person 0 (day 25) and person 3 (day 23) are still 1, person 1 is not
    np.testing.assert_array_equal(window_labels(states, np.zeros(5, dtype=int)), [1, 0, 0, 1, 0])
    # s = 3 (window 3..23, prediction 24..30): person 3's R on day 23 is now inside the window, person 4's day 30 is the last prediction day
    np.testing.assert_array_equal(window_labels(states, np.full(5, 3)), [1, 0, 0, 0, 1])
    # s = 10: every change happens inside the window
    np.testing.assert_array_equal(window_labels(states, np.full(5, 10)), [0, 0, 0, 0, 0])


def test_node_and_contact_features_of_hand_made_tables(tiny):
    silo = build_silo_features(tiny, num_neighbours=20)
    node = silo.node
    # degree (contacts incl. the repeated pair 10-20): 3, 2, 1, 2 -> MinMax
    np.testing.assert_allclose(node[:, 0], [1.0, 0.5, 0.0, 0.5])
    assert node[:, 1].min() == 0.0 and node[:, 1].max() == 1.0 and node[0, 1] == 1.0  # PageRank, MinMax
    np.testing.assert_allclose(node[:, 2], np.array([-10, 10, -30, 30]) / math.sqrt(500), rtol=1e-6)  # age standardised
    np.testing.assert_array_equal(node[:, 3], [-0.5, 0.5, -0.5, 0.5])  # sex - 1.5
    assert node[0, 4] == node[1, 4] > node[2, 4] == node[3, 4]  # Box-Cox of hh_size 2, 2, 1, 1
    np.testing.assert_array_equal(node[:, 5:9], [  # worked, schooled, shopped, home only
        [0.5, -0.5, -0.5, -0.5], [-0.5, -0.5, -0.5, 0.5], [-0.5, 0.5, -0.5, -0.5], [-0.5, -0.5, 0.5, -0.5]])
    np.testing.assert_allclose(node[:, 9], [1 / 3, 0.0, 0.25, 1800 / 86400], rtol=1e-6)  # out_time in days

    # person 10's three contacts (20 at home twice, 40 at the work place), in a seed-0 order
    order = np.random.default_rng(seed=0).choice(3, 3, replace=False)
    incident = [(1, 0), (3, 1), (1, 3)]  # (neighbour node, network row) in network-row order
    np.testing.assert_array_equal(silo.neighbour[0, :3], [incident[i][0] for i in order])
    assert (silo.neighbour[0, 3:] == -1).all() and not silo.edge[0, 3:].any()
    std = math.sqrt(4.375 / 6)  # population std of the six longitudes (and of the six latitudes)
    at_work = [0.375, 3600 / 86400, (-80.5 + 79.25) / std, (37.5 - 38.25) / std, 1, 0, 0, 0, 0, 0]
    at_home = [0.75, 36000 / 86400, (-80 + 79.25) / std, (37 - 38.25) / std, 0, 0, 0, 0, 0, 0]
    rows = {incident[i][1]: silo.edge[0, slot] for slot, i in enumerate(order)}
    np.testing.assert_allclose(rows[1], at_work, rtol=1e-5)
    np.testing.assert_allclose(rows[0], at_home, rtol=1e-5)


def test_occurrence_bound_is_the_observed_maximum_or_the_a_priori_cap(tiny):
    """Samples: 10 -> {20, 40}, 20 -> {10}, 30 -> {40}, 40 -> {10, 30}, so persons 10 and 40 are in
    their own and two others' neighbourhoods (3). With a cap of 5 the sample is the same, but
    Theorem 2.4.4 gets the cap, a constant fixed before seeing the data."""
    free = build_silo_features(tiny, num_neighbours=20)
    assert free.max_occurrences() == free.occurrence_bound() == 3
    capped = build_silo_features(tiny, num_neighbours=20, max_occurrences=5)
    assert capped.max_occurrences() == 3 and capped.occurrence_bound() == 5


def test_test_labels_use_last_window_and_hidden_week(tiny):
    silo = build_silo_features(tiny, num_neighbours=5)
    np.testing.assert_array_equal(silo.test_labels(), [1, 0, 0, 0])
    silo.target = None
    with pytest.raises(ValueError, match="hidden week"):
        silo.test_labels()
