"""Theorem 2.4.4's node-level epsilon (spec 002 §4.4, after [37]) of DP-SGD on neighbourhood examples.

**A formula, not a guarantee for** :mod:`fedveil.pets`. The theorem assumes a subgraph of ``n``
nodes gives ``n`` examples (neighbourhoods) and that replacing one node changes at most ``S``
of them (its own and the ``S - 1`` others it was sampled into; [C2] passes ``S = D = S_1 =
20``), ``S`` fixed before seeing the data. The pipeline breaks that premise (global-statistic
features, a data-dependent ``S``, a cascading capped sampler; see :mod:`.pipeline`), so what
:func:`node_epsilon` returns there is "the Theorem 2.4.4 node-level epsilon under the
theorem's assumptions", a figure to compare with the thesis's Table 2.6, which rests on the
same assumptions.

Under them, DP-SGD whose every step draws ``b`` of the ``n`` examples uniformly without
replacement, independently of the other steps (:func:`fedveil.pets.logreg.uniform_batches`),
with clip ``C`` and noise multiplier ``sigma`` (noise std ``sigma C`` on the sum of clipped
gradients) is, per step, ``(alpha, gamma(alpha))``-node-level RDP (one node replaced) with ::

    gamma(alpha) = 1/(alpha - 1) * ln E_rho[ exp(alpha (alpha - 1) c rho^2 / sigma^2) ],
    rho ~ Hypergeometric(population n, S successes, b draws),

``rho`` being the number of the node's ``S`` neighbourhoods that land in the batch, and the
RDP composes over the ``T`` steps.

The constant ``c`` is where the thesis and its code disagree (spec 002 §4.4, §8):

- ``"thesis"`` (Theorem 2.4.4 as printed, ``c = 2``): Gaussian RDP ``alpha Delta^2 / (2 sigma^2 C^2)``
  with sensitivity ``Delta = 2 rho C``. This is the right value under the theorem's premise:
  replacing one node changes *every* neighbourhood that holds it, and a changed example's
  clipped gradient can move by up to ``2C`` (the example stays in the data set with other
  features; it is not removed).
- ``"code"`` ([C2] ``accounting.compute_node_dp``, ``c = 1/2``): sensitivity ``rho C``, i.e.
  one neighbourhood counted like an added/removed example. Four times smaller exponent; it
  reproduces the epsilons the thesis reports (Table 2.6) but under-states the node-level cost.

**Decision**: :func:`node_epsilon` defaults to ``"thesis"``; ``"code"`` is offered to compare
with the thesis's numbers. Note that ``eps_thesis(sigma) = eps_code(sigma / 2)``.
The RDP is converted to ``(epsilon, delta)`` with dp-accounting's ``compute_epsilon`` (the
improved conversion of spec 002 eq. 1.4, as tf-privacy's ``get_privacy_spent`` used by [C2])
over the [C2] orders :data:`C2_ORDERS`. [C2] counts ``epochs * ceil(n / b)`` steps
(:func:`steps_for_epochs`).

**delta** defaults to ``1/n``, the thesis's and [C2]'s choice (Fig 2.8, Table 2.6), kept so the
figures compare with theirs. It is weaker than the usual ``delta << 1/n``: a mechanism that
publishes each person's whole record with probability ``1/n`` (one person in expectation) is
``(0, 1/n)``-DP. Pass a smaller ``delta`` for a figure meant as a privacy statement.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from dp_accounting.rdp import rdp_privacy_accountant
from scipy import special, stats

C2_ORDERS: tuple[float, ...] = (
    (1.01, 1.1, 1.2, 1.25, 1.5, 1.75, 2.0, 2.25, 2.5, 3.0, 3.25, 3.5, 3.75, 4.0, 4.25, 4.5, 4.75)
    + tuple(float(a) for a in np.arange(5, 64, 0.5))
    + (128.0, 256.0, 512.0)
)
EXPONENT = {"thesis": 2.0, "code": 0.5}


@dataclass(frozen=True)
class NodeDP:
    """Theorem 2.4.4's ``(epsilon, delta)``: node-level only under the theorem's assumptions."""

    epsilon: float
    delta: float
    order: float  # the RDP order that gave epsilon
    steps: int
    convention: str


def steps_for_epochs(num_nodes: int, batch_size: int, epochs: int) -> int:
    """``epochs * ceil(n / b)`` ([C2] ``compute_node_dp``)."""
    _check_sizes(num_nodes, 1, batch_size)
    if epochs < 0:
        raise ValueError(f"epochs must be >= 0, got {epochs}")
    return epochs * math.ceil(num_nodes / batch_size)


def node_rdp(
    num_nodes: int,
    max_occurrences: int,
    batch_size: int,
    noise_multiplier: float,
    orders: tuple[float, ...] = C2_ORDERS,
    convention: str = "thesis",
) -> np.ndarray:
    """Per-step node-level RDP ``gamma(alpha)`` at every order (``inf`` for ``sigma = 0``)."""
    _check_sizes(num_nodes, max_occurrences, batch_size)
    if convention not in EXPONENT:
        raise ValueError(f"convention must be one of {sorted(EXPONENT)}, got {convention!r}")
    if noise_multiplier < 0:
        raise ValueError(f"noise_multiplier must be >= 0, got {noise_multiplier}")
    alphas = np.asarray(orders, dtype=float)
    if (alphas <= 1).any():
        raise ValueError("RDP orders must be > 1")
    if noise_multiplier == 0:
        return np.full(len(alphas), np.inf)
    rho = np.arange(max_occurrences + 1)
    log_pmf = stats.hypergeom(num_nodes, max_occurrences, batch_size).logpmf(rho)
    c = EXPONENT[convention]
    exponent = alphas[:, None] * (alphas[:, None] - 1) * c * rho[None, :] ** 2 / noise_multiplier**2
    return special.logsumexp(log_pmf[None, :] + exponent, axis=1) / (alphas - 1)


def node_epsilon(
    num_nodes: int,
    max_occurrences: int,
    batch_size: int,
    noise_multiplier: float,
    steps: int,
    delta: float | None = None,
    convention: str = "thesis",
    orders: tuple[float, ...] = C2_ORDERS,
) -> NodeDP:
    """Theorem 2.4.4's node-level ``(epsilon, delta)`` after ``steps`` DP-SGD steps (``delta``
    defaults to ``1/n`` as the thesis; see the module docstring for why that is weak)."""
    if steps < 0:
        raise ValueError(f"steps must be >= 0, got {steps}")
    delta = 1.0 / num_nodes if delta is None else delta
    if not 0 < delta < 1:
        raise ValueError(f"delta must lie in (0, 1), got {delta}")
    rdp = node_rdp(num_nodes, max_occurrences, batch_size, noise_multiplier, orders, convention) * steps
    if steps == 0:
        rdp = np.zeros(len(orders))
    if np.isinf(rdp).all():
        return NodeDP(math.inf, delta, math.nan, steps, convention)
    eps, order = rdp_privacy_accountant.compute_epsilon(list(orders), list(rdp), delta)
    return NodeDP(float(eps), delta, float(order), steps, convention)


def _check_sizes(num_nodes: int, max_occurrences: int, batch_size: int) -> None:
    if num_nodes < 1:
        raise ValueError(f"the number of nodes must be >= 1, got {num_nodes}")
    if not 1 <= max_occurrences <= num_nodes:
        raise ValueError(f"max_occurrences S must lie in 1..n={num_nodes}, got {max_occurrences}")
    if not 1 <= batch_size <= num_nodes:
        raise ValueError(f"batch size must lie in 1..n={num_nodes}, got {batch_size}")
