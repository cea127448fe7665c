"""The contact graph of one silo: incidence lists, centralities, deterministic neighbour sampling.

Spec 002 §4.3 ([C2] ``graph_utils.py``): the graph is the undirected contact *multigraph*
(every ``population_network`` row is an edge; two people met at two places are joined
twice). Nodes are the rows of the person table in their order (node index ``i`` is the
``i``-th person), which also seeds each node's neighbour sample.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp
from tqdm.auto import tqdm

from .tables import Table, index_of

PLACEHOLDER = -1  # an empty neighbour slot (its features are zero)


@dataclass(frozen=True)
class ContactGraph:
    """Undirected contact multigraph in CSR incidence form.

    Node ``u``'s incident contacts, in the order of the network table, are
    ``neighbour[indptr[u]:indptr[u+1]]`` (the other person) and ``edge[...]`` (the row of the
    network table the contact came from).
    """

    num_nodes: int
    indptr: np.ndarray
    neighbour: np.ndarray
    edge: np.ndarray

    @property
    def degree(self) -> np.ndarray:
        """Total degree (number of incident contacts) of every node."""
        return np.diff(self.indptr)

    def adjacency(self) -> sp.csr_matrix:
        """Symmetric ``(n, n)`` matrix of contact counts between every two people."""
        rows = np.repeat(np.arange(self.num_nodes), self.degree)
        ones = np.ones(len(rows))
        return sp.csr_matrix((ones, (rows, self.neighbour)), shape=(self.num_nodes, self.num_nodes))


def contact_graph(pids: np.ndarray, network: Table) -> ContactGraph:
    """The multigraph of ``network`` over the people ``pids`` (node ``i`` = ``pids[i]``).

    Contacts with someone outside ``pids`` (cut at a silo border) and self-contacts are dropped.
    """
    pid1, pid2 = network["pid1"], network["pid2"]
    inside = np.isin(pid1, pids) & np.isin(pid2, pids) & (pid1 != pid2)
    rows = np.flatnonzero(inside)
    a = index_of(pids, pid1[rows], "population_network", "pid1")
    b = index_of(pids, pid2[rows], "population_network", "pid2")
    ends = np.concatenate([a, b])
    others = np.concatenate([b, a])
    edge = np.concatenate([rows, rows])
    order = np.lexsort((edge, ends))  # by node, then by network row
    indptr = np.zeros(len(pids) + 1, dtype=np.int64)
    np.cumsum(np.bincount(ends, minlength=len(pids)), out=indptr[1:])
    return ContactGraph(len(pids), indptr, others[order], edge[order])


def pagerank(graph: ContactGraph, damping: float = 0.85, tol: float = 1e-12, max_iter: int = 1000) -> np.ndarray:
    """Undirected PageRank (each contact walkable both ways, parallel contacts counted).

    Power iteration of ``r = (1 - d)/n + d (A D^-1 r + (sum of dangling r)/n)``: isolated
    people spread their rank uniformly (graph-tool and networkx do the same). Sums to 1.
    """
    if not 0 < damping < 1:
        raise ValueError(f"damping must lie in (0, 1), got {damping}")
    n = graph.num_nodes
    if n == 0:
        return np.zeros(0)
    deg = graph.degree.astype(float)
    dangling = deg == 0
    walk = graph.adjacency() @ sp.diags(np.where(dangling, 0.0, 1.0 / np.maximum(deg, 1)))
    rank = np.full(n, 1.0 / n)
    for _ in range(max_iter):
        new = (1 - damping) / n + damping * (walk @ rank + rank[dangling].sum() / n)
        done = np.abs(new - rank).sum() < tol
        rank = new
        if done:
            return rank
    raise RuntimeError(f"pagerank did not converge in {max_iter} iterations")


def sample_neighbours(
    graph: ContactGraph, num_neighbours: int, progress: bool = False, max_occurrences: int | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Deterministic 1-hop sample (spec 002 §4.3, [C2] ``sample_neighborhood_with_edgefeats``).

    For node ``u`` with degree ``deg``: ``rng = numpy.random.default_rng(seed=u)``,
    ``rng.choice(deg, min(S, deg), replace=False)`` picks incident contacts; the rest of
    the ``S`` slots hold :data:`PLACEHOLDER`. Returns ``(neighbour, edge)``, both ``(n, S)``:
    the sampled person's node index and the network row of the contact. The same node always
    gets the same sample (a fixed pruning of the graph that can be cached across epochs).

    ``max_occurrences`` caps how many neighbourhoods (own included, see :func:`occurrences`)
    any person ends up in, which [C2] does not (spec §8) and Theorem 2.4.4 assumes: nodes are
    visited in index order, ``u``'s contacts in the order of ``rng.permutation(deg)``, and a
    contact is skipped while its person already fills the cap (a second contact with someone
    already in ``u``'s sample is free). Without a cap the sample is [C2]'s.

    Neither sample confines one person's influence to the neighbourhoods that hold them, as
    the theorem's premise needs: a node's draw depends on its degree, so changing a person's
    contacts re-draws the samples of all those contacts (the index seeds shift too if a person
    is added or removed); and with a cap, which contacts a node skips depends on the picks of
    every node visited before it, so one change cascades through the rest of the graph.
    """
    if num_neighbours < 1:
        raise ValueError(f"the number of sampled neighbours S must be >= 1, got {num_neighbours}")
    if max_occurrences is not None and max_occurrences < 1:
        raise ValueError(f"max_occurrences must be >= 1 (a person's own example), got {max_occurrences}")
    n = graph.num_nodes
    neighbour = np.full((n, num_neighbours), PLACEHOLDER, dtype=np.int64)
    edge = np.full((n, num_neighbours), PLACEHOLDER, dtype=np.int64)
    deg = graph.degree
    held = np.ones(n, dtype=np.int64)  # neighbourhoods each person is in: its own so far
    for u in tqdm(np.flatnonzero(deg), desc="sampling neighbours", unit="node", disable=not progress, mininterval=1.0):
        d = int(deg[u])
        rng = np.random.default_rng(seed=int(u))
        if max_occurrences is None:
            pick = graph.indptr[u] + rng.choice(d, min(num_neighbours, d), replace=False)
        else:
            pick = graph.indptr[u] + _capped_pick(graph.neighbour[graph.indptr[u]:graph.indptr[u + 1]],
                                                  rng.permutation(d), num_neighbours, held, max_occurrences)
        neighbour[u, : len(pick)] = graph.neighbour[pick]
        edge[u, : len(pick)] = graph.edge[pick]
    return neighbour, edge


def _capped_pick(others: np.ndarray, order: np.ndarray, slots: int, held: np.ndarray, cap: int) -> np.ndarray:
    """Positions (into ``others``) of up to ``slots`` contacts taken in ``order``, skipping
    people already in ``cap`` neighbourhoods; updates ``held`` for the people taken."""
    taken: list[int] = []
    chosen: set[int] = set()
    for position in order:
        if len(taken) == slots:
            break
        v = int(others[position])
        if v not in chosen:
            if held[v] >= cap:
                continue
            held[v] += 1
            chosen.add(v)
        taken.append(int(position))
    return np.asarray(taken, dtype=np.int64)


def occurrences(neighbour: np.ndarray) -> np.ndarray:
    """How many neighbourhoods (examples) contain each node: its own plus the sampled
    neighbourhoods of other nodes that hold it (once per neighbourhood, however many slots).
    Its maximum is the smallest ``S`` Theorem 2.4.4 could be given for this sample (spec 002 §4.4)."""
    n = len(neighbour)
    rows = np.sort(neighbour, axis=1)
    first = np.ones_like(rows, dtype=bool)
    first[:, 1:] = rows[:, 1:] != rows[:, :-1]
    held = rows[first & (rows != PLACEHOLDER)]
    return 1 + np.bincount(held, minlength=n)
