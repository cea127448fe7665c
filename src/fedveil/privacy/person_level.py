"""Person-level epsilon when one person may own up to ``k`` records (``privacy.records_per_person``).

Record-level DP protects one record. A person with ``k`` records changes up to ``k`` of them,
so each release is re-accounted with ``k``-fold sensitivity (tighter than converting the
final (epsilon, delta) by group privacy, which gives ``(k eps, k e^{(k-1) eps} delta)``):

* a Gaussian over the whole data set or one shuffled epoch (zero-out neighbours): the k
  records move the released sums by at most ``k C`` in total (``sqrt(sum_j c_j^2) <= k`` for
  ``c_j`` of them in batch ``j``), so ``GaussianDpEvent(z)`` becomes ``GaussianDpEvent(z / k)``;
* a Poisson-subsampled Gaussian (add/remove neighbours): the batch holds ``j ~ Bin(k, q)`` of
  the k records and moves by at most ``j C <= k C``. The output is ``(1 - q') P_0 + q' P'``
  with ``q' = 1 - (1 - q)^k`` and ``P'`` a mixture of Gaussians shifted by at most ``k C``;
  both Renyi divergences and every hockey-stick divergence are convex in ``P'``, so the
  worst case is one Gaussian shifted by exactly ``k C``:
  ``PoissonSampledDpEvent(q, Gaussian(z))`` becomes ``PoissonSampledDpEvent(q', Gaussian(z / k))``;
* a zCDP release (report-noisy-max, rho = eps_sel^2 / 8): group privacy of the underlying
  pure eps_sel-DP selection, ``k eps_sel``, i.e. ``rho k^2``.

Fixed-size sampling without replacement has no such rule here and is refused.
"""
from __future__ import annotations

import dataclasses

from dp_accounting import dp_event

from .events import Release
from .ledger import PrivacyLedger, Subject


def person_event(event: dp_event.DpEvent, k: int) -> dp_event.DpEvent:
    """``event`` re-stated for a person owning up to ``k`` of the records (module doc)."""
    if k == 1:
        return event
    if isinstance(event, dp_event.GaussianDpEvent):
        return dp_event.GaussianDpEvent(event.noise_multiplier / k)
    if isinstance(event, dp_event.PoissonSampledDpEvent) and isinstance(event.event, dp_event.GaussianDpEvent):
        q = 1.0 - (1.0 - event.sampling_probability) ** k
        return dp_event.PoissonSampledDpEvent(q, dp_event.GaussianDpEvent(event.event.noise_multiplier / k))
    if isinstance(event, dp_event.ZCDpEvent):
        return dp_event.ZCDpEvent(event.rho * k * k)
    raise ValueError(
        f"records_per_person > 1 cannot account {type(event).__name__}; use Poisson sampling "
        "(privacy.batch_sampling / federation.sampling = \"poisson\") or shuffled batches"
    )


def person_releases(releases: list[Release], k: int) -> list[Release]:
    return [dataclasses.replace(r, event=person_event(r.event, k)) for r in releases]


def person_epsilon(ledger: PrivacyLedger, subject: Subject, k: int, delta: float) -> float:
    """Epsilon of ``subject``'s recorded releases for a person with up to ``k`` records."""
    return ledger.epsilon_of(person_releases(ledger.releases(subject), k), delta)
