"""B.8's client / cloud splits of a training set whose rows carry a domain id (spec 000
part 2, B.8; Hong, dissertation ch. 5, Tables 5.1 and 5.2).

``"OoD"`` (the default split): the client holds its whole domain, the cloud every other
domain; ``"ID+OoD"`` (Table 5.1's split): the client holds a random half of its domain, the
cloud the other half plus every other domain; ``"ID"`` (Table 5.1's first row): the same
client half, the cloud only the other half of the client's domain.
"""
from __future__ import annotations

import numpy as np

__all__ = ["CLOUDS", "SPLITS", "split_rows"]

CLOUDS = ("ID+OoD", "OoD")  # the clouds of Table 5.2's protocol
SPLITS = ("ID", *CLOUDS)  # B.8's client / cloud splits (Table 5.1 adds an in-distribution-only cloud)


def split_rows(
    domain: np.ndarray, client_domain: int, cloud: str, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """B.8: sorted (client rows, cloud rows) of a training set whose rows belong to ``domain``.
    ``"OoD"``: the client holds its domain, the cloud every other row; ``"ID+OoD"``: the client
    holds a random half (rounded down) of its domain, the cloud the rest of the rows; ``"ID"``
    (Table 5.1's first row): the same half, the cloud only the other half of the domain."""
    if cloud not in SPLITS:
        raise ValueError(f"unknown cloud setting {cloud!r}; choose one of {SPLITS}.")
    own = np.flatnonzero(np.asarray(domain) == client_domain)
    if own.size < 2:
        raise ValueError(f"client domain {client_domain} has {own.size} rows; the split needs at least 2.")
    client = own if cloud == "OoD" else np.sort(rng.permutation(own)[: own.size // 2])
    rest = own if cloud == "ID" else np.arange(len(domain))
    return client, np.setdiff1d(rest, client)
