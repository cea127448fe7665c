"""A ledger that checks itself: after every round, each subject has spent what was planned.

The privacy plan calibrates the noise before round 1 from the releases it expects each
subject (a silo, or the client population) to make in each round. The ledger records what
the mechanisms actually released: the noise they actually added, the sampling they
actually used, one release per local training. After every round :class:`LedgerCheck`
compares the two and raises :class:`PrivacyCheckError` when

* a subject's accounted epsilon exceeds the plan's epsilon through that round (relative
  ``1e-6``): a mechanism released more than the budget allows; or
* the ledger holds less than the plan expected for a round the subject took part in: a
  release went unrecorded or was merged into a cheaper one, so the reported epsilon would
  under-state the true cost (every planned release of fedveil is always carried out).

Cost: each recorded release is matched against the planned releases of its subject. A
release *dominated* by planned ones (same kind of event and sampling, at least as much
noise, at most the same sampling rate; :func:`dominates`) cannot add more privacy loss
than the planned releases it uses up, so no epsilon needs computing while every record
is matched and every planned release used. A subject whose records do not match the plan
that way is compared by epsilon (both directions), then and in every later round.
"""
from __future__ import annotations

from collections import defaultdict

from dp_accounting import dp_event

from .events import Release
from .skellam import SkellamDpEvent
from .ledger import PrivacyLedger, Subject

RELATIVE_TOLERANCE = 1e-6  # accounted and planned epsilon may differ by this relative amount
_MATCH_TOLERANCE = 1e-9  # noise multipliers / rates within this relative distance count as equal


class PrivacyCheckError(RuntimeError):
    """A subject's ledger disagrees with the privacy plan (over-spent or under-recorded)."""


def dominates(planned: dp_event.DpEvent, recorded: dp_event.DpEvent) -> bool:
    """Whether ``recorded`` leaks at most what ``planned`` does, by the events' parameters alone:
    the same mechanism and sampling, a noise multiplier no smaller, a sampling probability no
    larger (the subsampled Gaussian's privacy loss grows with q and falls with z)."""
    if type(planned) is not type(recorded):
        return False
    if isinstance(planned, dp_event.GaussianDpEvent):
        return recorded.noise_multiplier >= planned.noise_multiplier * (1 - _MATCH_TOLERANCE)
    if isinstance(planned, dp_event.PoissonSampledDpEvent):
        return (
            recorded.sampling_probability <= planned.sampling_probability * (1 + _MATCH_TOLERANCE)
            and dominates(planned.event, recorded.event)
        )
    if isinstance(planned, dp_event.SampledWithoutReplacementDpEvent):
        return (
            recorded.source_dataset_size == planned.source_dataset_size
            and recorded.sample_size == planned.sample_size
            and dominates(planned.event, recorded.event)
        )
    if isinstance(planned, dp_event.ZCDpEvent):
        return recorded.rho <= planned.rho * (1 + _MATCH_TOLERANCE)
    if isinstance(planned, SkellamDpEvent):  # more noise, no larger sensitivities: no larger RDP bound
        return (
            recorded.variance >= planned.variance * (1 - _MATCH_TOLERANCE)
            and recorded.l2_sensitivity <= planned.l2_sensitivity * (1 + _MATCH_TOLERANCE)
            and recorded.l1_sensitivity <= planned.l1_sensitivity * (1 + _MATCH_TOLERANCE)
        )
    return planned == recorded


class LedgerCheck:
    """The plan's releases, round by round, and the check of a ledger against them."""

    def __init__(self, ledger: PrivacyLedger, delta: float, describe=str) -> None:
        self.ledger, self.delta, self.describe = ledger, delta, describe
        self._planned: dict[Subject, list[Release]] = defaultdict(list)  # everything planned so far
        self._unused: dict[Subject, list[list]] = defaultdict(list)  # [event, count] planned, not yet matched
        self._by_epsilon: set[Subject] = set()  # subjects compared by epsilon from now on
        self._expected: set[Subject] = set()  # subjects with planned releases since the last check
        self._checked = 0  # ledger records already matched

    def expect(self, subject: Subject, releases: list[Release]) -> None:
        """Add the releases the plan calibrated for ``subject`` in the round about to be checked."""
        self._planned[subject].extend(releases)
        for release in releases:
            self._unused[subject].append([release.event, release.count])
        self._expected.add(subject)

    def check(self) -> None:
        """Match the records made since the last check against the plan; raise
        :class:`PrivacyCheckError` naming the subject and both epsilons on a mismatch."""
        records = self.ledger.records_since(self._checked)
        self._checked += len(records)
        for subject, release in records:
            if subject not in self._by_epsilon and not self._use_up(subject, release):
                self._by_epsilon.add(subject)
        touched = {s for s, _ in records} | self._expected
        self._expected = set()
        for subject in sorted(touched, key=str):
            if subject in self._by_epsilon:
                self._compare(subject)
            else:
                self._unused[subject] = [entry for entry in self._unused[subject] if entry[1]]
                if self._unused[subject]:
                    self._fail(subject, "under-recorded: a planned release is missing from the ledger, so the "
                               "reported epsilon would under-state the true cost")

    def _use_up(self, subject: Subject, release: Release) -> bool:
        """Use up planned releases dominating ``release`` (all of its count, or nothing)."""
        takes, need = [], release.count
        for entry in self._unused[subject]:
            if need and entry[1] and dominates(entry[0], release.event):
                take = min(need, entry[1])
                takes.append((entry, take))
                need -= take
        if need:
            return False
        for entry, take in takes:
            entry[1] -= take
        return True

    def _compare(self, subject: Subject) -> None:
        accounted = self.ledger.epsilon(subject, self.delta)
        planned = self.ledger.epsilon_of(self._planned[subject], self.delta)
        if accounted > planned * (1 + RELATIVE_TOLERANCE):
            self._fail(subject, "over-spent", accounted, planned)
        if accounted < planned * (1 - RELATIVE_TOLERANCE):
            self._fail(subject, "under-recorded: the ledger holds less than the plan expected", accounted, planned)

    def _fail(self, subject: Subject, why: str, accounted: float | None = None, planned: float | None = None) -> None:
        if accounted is None:
            accounted = self.ledger.epsilon(subject, self.delta)
        if planned is None:
            planned = self.ledger.epsilon_of(self._planned[subject], self.delta)
        raise PrivacyCheckError(
            f"privacy check failed for {self.describe(subject)}: ledger epsilon={accounted:.6g}, plan epsilon="
            f"{planned:.6g} through this round (delta={self.delta:g}); {why}; the run is stopped"
        )
