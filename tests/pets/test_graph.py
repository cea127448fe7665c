"""Contact multigraph, PageRank, deterministic neighbour sampling, occurrence counts."""
from __future__ import annotations

import numpy as np
import pytest

from fedveil.pets.graph import ContactGraph, contact_graph, occurrences, pagerank, sample_neighbours


def star(leaves: int) -> ContactGraph:
    pids = np.arange(100, 101 + leaves)
    net = {"pid1": np.full(leaves, 100), "pid2": pids[1:]}
    return contact_graph(pids, net)


def test_sampling_is_deterministic_and_seeded_by_node_index():
    g = star(30)
    nb1, e1 = sample_neighbours(g, 20)
    nb2, e2 = sample_neighbours(g, 20)
    np.testing.assert_array_equal(nb1, nb2)
    np.testing.assert_array_equal(e1, e2)
    # hub = node 0: its 30 contacts are rows 0..29 (leaf i + 1), sampled with default_rng(seed=0)
    pick = np.random.default_rng(seed=0).choice(30, 20, replace=False)
    np.testing.assert_array_equal(nb1[0], pick + 1)
    np.testing.assert_array_equal(e1[0], pick)
    # each leaf has one contact: the hub, then 19 placeholders
    assert (nb1[1:, 0] == 0).all() and (nb1[1:, 1:] == -1).all() and (e1[1:, 1:] == -1).all()


def test_isolated_node_and_bad_s():
    g = contact_graph(np.array([1, 2, 3]), {"pid1": np.array([1]), "pid2": np.array([2])})
    nb, _ = sample_neighbours(g, 4)
    assert (nb[2] == -1).all()
    with pytest.raises(ValueError, match="S must be >= 1"):
        sample_neighbours(g, 0)


def test_contacts_outside_the_silo_and_self_contacts_are_dropped():
    net = {"pid1": np.array([1, 1, 2, 5]), "pid2": np.array([2, 1, 3, 1])}
    g = contact_graph(np.array([1, 2, 3]), net)
    np.testing.assert_array_equal(g.degree, [1, 2, 1])
    np.testing.assert_array_equal(g.neighbour[g.indptr[1] : g.indptr[2]], [0, 2])
    np.testing.assert_array_equal(g.edge[g.indptr[1] : g.indptr[2]], [0, 2])


def test_pagerank_matches_networkx_on_a_multigraph_with_an_isolated_node():
    nx = pytest.importorskip("networkx")
    pids = np.arange(6)
    net = {"pid1": np.array([0, 0, 0, 1, 2, 3, 0]), "pid2": np.array([1, 2, 3, 2, 3, 4, 1])}  # 0-1 twice, 5 isolated
    ours = pagerank(contact_graph(pids, net))
    graph = nx.MultiGraph()
    graph.add_nodes_from(pids.tolist())
    graph.add_edges_from(zip(net["pid1"].tolist(), net["pid2"].tolist()))
    theirs = nx.pagerank(graph, alpha=0.85, tol=1e-12)
    np.testing.assert_allclose(ours, [theirs[i] for i in pids], atol=1e-9)
    assert ours.sum() == pytest.approx(1.0)


def test_occurrences_count_neighbourhoods_not_slots():
    neighbour = np.array([[1, 1, 2], [0, -1, -1], [1, 0, -1], [-1, -1, -1]])
    # node 0: own + rows 1, 2 -> 3; node 1: own + rows 0 (twice, counted once), 2 -> 3; node 2: own + row 0 -> 2; node 3: own
    np.testing.assert_array_equal(occurrences(neighbour), [3, 3, 2, 1])


def test_occurrence_cap_on_a_star_worked_by_hand():
    g = star(5)  # hub 0 with leaves 1..5, one contact each
    nb, edge = sample_neighbours(g, 1, max_occurrences=2)
    # hub first: the first contact of default_rng(0).permutation(5) -> that leaf is now in 2 neighbourhoods
    first = int(np.random.default_rng(seed=0).permutation(5)[0])
    assert nb[0, 0] == first + 1 and edge[0, 0] == first
    # leaf 1 takes the hub (hub: own + leaf 1 = 2, full); leaves 2..5 find it full and stay empty
    np.testing.assert_array_equal(nb[1:, 0], [0, -1, -1, -1, -1])
    assert occurrences(nb).max() == 2
    uncapped, _ = sample_neighbours(g, 1)
    assert occurrences(uncapped).max() == 6  # the hub is in every leaf's sample


def test_occurrence_cap_holds_on_a_random_multigraph_and_a_repeat_contact_is_free():
    rng = np.random.default_rng(3)
    pids = np.arange(60)
    net = {"pid1": rng.integers(0, 60, 900), "pid2": rng.integers(0, 60, 900)}
    g = contact_graph(pids, net)
    for cap in (3, 8):
        nb, _ = sample_neighbours(g, 5, max_occurrences=cap)
        assert occurrences(nb).max() <= cap
    # cap above any possible count: u's sample is the first S contacts of its permutation
    nb, edge = sample_neighbours(g, 5, max_occurrences=len(pids) + 1)
    u = 7
    order = np.random.default_rng(seed=u).permutation(int(g.degree[u]))[:5]
    np.testing.assert_array_equal(edge[u], g.edge[g.indptr[u] + order])
    # two contacts with the same person (multigraph) use one occurrence: a cap of 2 still lets
    # node 0 keep both contacts with node 1
    g2 = contact_graph(np.array([0, 1]), {"pid1": np.array([0, 0]), "pid2": np.array([1, 1])})
    nb2, _ = sample_neighbours(g2, 2, max_occurrences=2)
    np.testing.assert_array_equal(nb2[0], [1, 1])
    with pytest.raises(ValueError, match="max_occurrences must be >= 1"):
        sample_neighbours(g2, 2, max_occurrences=0)
