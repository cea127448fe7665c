"""Client sampling schedules, generated in full from the seed before round 1.

``fixed``: m clients uniformly without replacement each round (what privacy accounting
calls fixed-size sampling), or drawn with given per-client ``probabilities`` (FADE's
imbalanced-group protocol: one source and one target user, the target drawn with
probability p). ``poisson``: every client joins independently with
probability q = m / N (cohort size varies, possibly zero). Pre-generating the schedule
makes runs reproducible and resumable, and tells the accountant exactly what happened.
"""
from __future__ import annotations

import numpy as np
import torch

from ..privacy.randomness import RandomSource, permutation, uniform
from ..seeding import numpy_generator


def client_schedule(
    num_clients: int, clients_per_round: int, rounds: int, scheme: str, seed: int,
    probabilities: list[float] | None = None,
) -> list[np.ndarray]:
    """Sorted client ids for each round. With ``probabilities`` (fixed scheme only) each
    round draws its cohort without replacement with those selection weights (numpy's
    ``choice(p=...)``: the first member with probability p, the next from the rest renormalised)."""
    if not 1 <= clients_per_round <= num_clients:
        raise ValueError(f"clients_per_round must be in [1, {num_clients}], got {clients_per_round}")
    rng = numpy_generator(seed, "client-sampling")
    if probabilities is not None:
        p = selection_probabilities(probabilities, num_clients, clients_per_round, scheme)
        return [np.sort(rng.choice(num_clients, clients_per_round, replace=False, p=p)) for _ in range(rounds)]
    if scheme == "fixed":
        return [np.sort(rng.choice(num_clients, clients_per_round, replace=False)) for _ in range(rounds)]
    if scheme == "poisson":
        q = clients_per_round / num_clients
        return [np.flatnonzero(rng.random(num_clients) < q) for _ in range(rounds)]
    raise ValueError(f"unknown sampling scheme '{scheme}'; choose fixed or poisson")


def selection_probabilities(probabilities: list[float], num_clients: int, clients_per_round: int, scheme: str) -> np.ndarray:
    """The per-client selection weights, checked and normalised to sum to 1."""
    if scheme != "fixed":
        raise ValueError("client_probabilities need sampling = \"fixed\" (Poisson sampling is uniform here)")
    p = np.asarray(probabilities, dtype=np.float64)
    if p.shape != (num_clients,):
        raise ValueError(f"client_probabilities has {p.size} entries for {num_clients} clients; give one per client")
    if not np.all(np.isfinite(p)) or (p < 0).any():
        raise ValueError("client_probabilities must be finite and >= 0")
    if np.count_nonzero(p) < clients_per_round:
        raise ValueError(
            f"client_probabilities gives only {np.count_nonzero(p)} clients a chance but clients_per_round={clients_per_round}"
        )
    return p / p.sum()


def secure_cohort(num_clients: int, clients_per_round: int, scheme: str, source: RandomSource) -> np.ndarray:
    """One round's sorted cohort drawn from ``source``, the run's secure stream (client-level DP
    with ``privacy.secure_rng``: who took part must not be recoverable from the seed)."""
    if scheme == "fixed":
        return np.sort(permutation(num_clients, source)[:clients_per_round].numpy())
    if scheme == "poisson":
        return np.flatnonzero((uniform(num_clients, source, torch.float64) < clients_per_round / num_clients).numpy())
    raise ValueError(f"unknown sampling scheme '{scheme}'; choose fixed or poisson")


def sampling_rate(num_clients: int, clients_per_round: int) -> float:
    """q = m / N, the per-round inclusion probability under either scheme."""
    return clients_per_round / num_clients
