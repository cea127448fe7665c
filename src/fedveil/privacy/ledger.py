"""The privacy ledger: every noisy release recorded per subject, and the epsilon it adds up to.

A subject is a silo / client id (example-level, silo-specific DP) or
:attr:`PrivacyLedger.POPULATION` (client-level DP); DESIGN.md idea 3 (every release is
an event in a ledger, epsilon is reported every round and a run stops before a budget
is exceeded).  Composition is :mod:`fedveil.privacy.composition`'s.
"""
from __future__ import annotations

import copy
import dataclasses
import numbers
from collections.abc import Mapping
from typing import Any, Union

import numpy as np
from dp_accounting import dp_event
from dp_accounting.privacy_accountant import NeighboringRelation

from . import checks
from .composition import (
    Accountant,
    admissible_relations,
    as_accountant,
    combined_relation,
    rdp_curve,
    rdp_to_epsilon,
    releases_epsilon,
    unsupported_message,
)
from .events import (
    Release,
    as_releases,
    event_from_dict,
    event_key,
    event_to_dict,
    gaussian_steps_release,
    report_noisy_max_release,
)
from .relations import ALL_RELATIONS, RELATION_PREFERENCE, Sampling, parse_relation, relation_names, resolve_relation

__all__ = ["Subject", "PrivacyLedger"]

Subject = Union[str, int]
RDP_EPSILON_CACHE = 4096  # distinct (RDP curve, delta) conversions a ledger remembers


def check_subject(subject: Any) -> Subject:
    """A subject id: a str (e.g. ``'population'``) or an int (a silo / client id)."""
    if isinstance(subject, bool) or not isinstance(subject, (str, numbers.Integral)):
        raise ValueError(
            f"subject must be a str (e.g. 'population') or an int (a silo / client id); got {subject!r}."
        )
    return subject if isinstance(subject, str) else int(subject)


class _SubjectState:
    __slots__ = ("releases", "keys", "relations", "relation", "rdp", "pld", "eps_cache")

    def __init__(self) -> None:
        self.releases: list[Release] = []
        self.keys: list[str] = []
        self.relations = ALL_RELATIONS
        self.relation = resolve_relation(ALL_RELATIONS)
        self.rdp: np.ndarray | None = None
        self.pld = None
        self.eps_cache: dict[float, float] = {}


class PrivacyLedger:
    """Per-subject record of every noisy release, as dp_accounting DpEvents.

    A *subject* is whoever the guarantee protects: a silo / client id for
    example-level (silo-specific) DP, where each silo's epsilon covers its own
    examples only (spec 002 Def 1.3.1), or :attr:`POPULATION` for client-level
    DP.  Subjects are accounted independently.  Each subject's releases must
    share a neighbouring relation (:mod:`fedveil.privacy.relations`); mixing, e.g., ``"fixed"``
    (replace-one) with ``"poisson"`` (add/remove) raises ``ValueError``.

    RDP ledgers keep each subject's RDP curve as a running sum (one cached
    curve per distinct event), so recording and querying every round is cheap;
    PLD ledgers compose each record into a per-subject ``PLDAccountant``.  The
    state (:meth:`state_dict`) is plain JSON-compatible data; loading it
    rebuilds the same events in the same order and gives identical epsilons.
    ``accountant`` is an :class:`~fedveil.privacy.composition.Accountant` or its kind
    (``"rdp"`` / ``"pld"``, default settings).
    """

    POPULATION = "population"
    STATE_FORMAT = "fedveil.PrivacyLedger"
    STATE_VERSION = 1

    def __init__(self, accountant: Accountant | str = "rdp") -> None:
        self.accountant = as_accountant(accountant)
        self._subjects: dict[Subject, _SubjectState] = {}
        self._rdp_epsilons: dict[tuple[bytes, float], float] = {}  # (RDP curve, delta) -> epsilon
        self._log: list[tuple[Subject, int]] = []  # (subject, index in its releases): global record order

    # ------------------------------------------------------------------ recording

    def record(
        self,
        subject: Subject,
        event: dp_event.DpEvent | Release,
        count: int = 1,
        *,
        relation: Any = None,
        label: str | None = None,
    ) -> None:
        """Record ``event`` (a DpEvent or a :class:`Release`) applied ``count`` times to ``subject``.

        A bare DpEvent's parameters must be stated for the subject's neighbouring
        relation (e.g. a ``GaussianDpEvent``'s noise multiplier is std /
        sensitivity under that relation); ``relation`` restricts the relations
        the event is valid under.
        """
        subject = check_subject(subject)
        count = checks.integer("count", count)
        if isinstance(event, Release):
            release = dataclasses.replace(event, count=event.count * count, label=label or event.label)
        elif isinstance(event, dp_event.DpEvent):
            release = Release(event, count, label=label)
        else:
            raise ValueError(f"record() needs a dp_accounting DpEvent or a Release; got {event!r}.")
        if relation is not None:
            rel = parse_relation(relation)
            if rel not in release.relations:
                raise ValueError(
                    f"{release.label or type(release.event).__name__} is not valid under {rel.name}; "
                    f"valid under {relation_names(release.relations)}."
                )
            release = dataclasses.replace(release, relations=frozenset({rel}))
        self._add(subject, release)

    def record_gaussian_steps(
        self,
        subject: Subject,
        noise_multiplier: float,
        sample_rate: float,
        steps: int,
        sampling: Sampling | str = "poisson",
        *,
        label: str | None = None,
    ) -> None:
        """Record ``steps`` DP-SGD / DP-FedAvg steps (:func:`gaussian_steps_release`)."""
        self.record(subject, gaussian_steps_release(noise_multiplier, sample_rate, steps, sampling), label=label)

    def record_report_noisy_max(self, subject: Subject, epsilon_sel: float, count: int = 1, *, label: str | None = None) -> None:
        """Record ``count`` report-noisy-max selections, each ``epsilon_sel^2/8``-zCDP (RDP only)."""
        self.record(subject, report_noisy_max_release(epsilon_sel, count), label=label)

    def _add(self, subject: Subject, release: Release) -> None:
        state = self._subjects.get(subject)
        new_state = state is None
        if new_state:
            state = _SubjectState()
        key = event_key(release.event)
        adm = admissible_relations(self.accountant.kind, release, key)
        if not adm:
            raise ValueError(unsupported_message(self.accountant.kind, release, release.relations))
        relations = state.relations & adm
        if not relations:
            raise ValueError(
                f"subject {subject!r}: cannot compose {release.label or type(release.event).__name__} (valid under "
                f"{relation_names(adm)}) with its earlier releases (valid only under "
                f"{relation_names(state.relations)}); their epsilons refer to different neighbouring relations. "
                "Use one sampling scheme per subject."
            )
        relation = resolve_relation(relations)
        if relation != state.relation and state.releases:
            self._rebuild(state, relation, extra=(release, key))
        else:
            state.relation = relation
            self._compose_into(state, release, key)
        state.relations = relations
        state.releases.append(release)
        state.keys.append(key)
        state.eps_cache.clear()
        if new_state:
            self._subjects[subject] = state
        self._log.append((subject, len(state.releases) - 1))

    def _compose_into(self, state: _SubjectState, release: Release, key: str) -> None:
        orders = self.accountant.orders
        if self.accountant.kind == "rdp":
            if state.rdp is None:
                state.rdp = np.zeros(len(orders))
            if release.count:
                state.rdp = state.rdp + release.count * rdp_curve(key, state.relation, orders)
        else:
            if state.pld is None:
                state.pld = self.accountant.fresh(state.relation)
            if release.count:
                state.pld.compose(release.event, release.count)

    def _rebuild(self, state: _SubjectState, relation: NeighboringRelation, extra: tuple[Release, str]) -> None:
        fresh = _SubjectState()
        fresh.relation = relation
        for rel, key in [*zip(state.releases, state.keys), extra]:
            self._compose_into(fresh, rel, key)
        state.relation, state.rdp, state.pld = relation, fresh.rdp, fresh.pld

    # ------------------------------------------------------------------ queries

    @property
    def subjects(self) -> list[Subject]:
        """Subjects with at least one record, in first-record order."""
        return list(self._subjects)

    def releases(self, subject: Subject) -> list[Release]:
        """The releases recorded for ``subject`` (empty for an unknown subject)."""
        state = self._subjects.get(check_subject(subject))
        return [] if state is None else list(state.releases)

    def relation(self, subject: Subject) -> NeighboringRelation:
        """Neighbouring relation the subject's epsilon refers to."""
        state = self._subjects.get(check_subject(subject))
        return resolve_relation(ALL_RELATIONS) if state is None else state.relation

    def epsilon(self, subject: Subject, delta: float) -> float:
        """Epsilon spent by ``subject`` at ``delta`` (0.0 if nothing was recorded)."""
        subject = check_subject(subject)
        delta = checks.fraction("delta", delta)
        state = self._subjects.get(subject)
        if state is None:
            return 0.0
        cached = state.eps_cache.get(delta)
        if cached is None:
            if self.accountant.kind == "rdp":  # subjects with equal curves (a cohort's clients) convert once
                key = (state.rdp.tobytes(), delta)
                cached = self._rdp_epsilons.get(key)
                if cached is None:
                    if len(self._rdp_epsilons) >= RDP_EPSILON_CACHE:
                        self._rdp_epsilons.clear()
                    cached = self._rdp_epsilons[key] = rdp_to_epsilon(state.rdp, self.accountant.orders, delta)
            else:
                cached = float(state.pld.get_epsilon(delta))
            state.eps_cache[delta] = cached
        return cached

    def epsilons(self, delta: float) -> dict[Subject, float]:
        """``{subject: epsilon}`` for every subject with records."""
        return {s: self.epsilon(s, delta) for s in self._subjects}

    def epsilon_of(self, releases: Any, delta: float) -> float:
        """Epsilon of ``releases`` (Releases / DpEvents) composed afresh with this ledger's
        accountant configuration, e.g. a plan to compare the ledger with."""
        releases = as_releases(releases)
        if not releases:
            return 0.0
        delta = checks.fraction("delta", delta)
        return releases_epsilon(releases, delta, self.accountant)

    def records_since(self, start: int) -> list[tuple[Subject, Release]]:
        """``(subject, release)`` of every record from the ``start``-th (0-based) on, in record order."""
        return [(subject, self._subjects[subject].releases[idx]) for subject, idx in self._log[start:]]

    def epsilon_with(self, subject: Subject, extra_events: Any, delta: float) -> float:
        """Epsilon ``subject`` would have after also recording ``extra_events`` (Releases / DpEvents)."""
        subject = check_subject(subject)
        delta = checks.fraction("delta", delta)
        extras = as_releases(extra_events)
        state = self._subjects.get(subject)
        releases = ([] if state is None else state.releases) + extras
        if not releases:
            return 0.0
        if state is None:
            return releases_epsilon(releases, delta, self.accountant)
        keys = [event_key(r.event) for r in extras]
        relation = combined_relation(self.accountant.kind, [*state.releases, *extras], [*state.keys, *keys])
        if relation != state.relation:
            return releases_epsilon(releases, delta, self.accountant)
        if self.accountant.kind == "rdp":
            vec = state.rdp
            for rel, key in zip(extras, keys):
                if rel.count:
                    vec = vec + rel.count * rdp_curve(key, relation, self.accountant.orders)
            return rdp_to_epsilon(vec, self.accountant.orders, delta)
        acc = copy.deepcopy(state.pld)
        for rel in extras:
            if rel.count:
                acc.compose(rel.event, rel.count)
        return float(acc.get_epsilon(delta))

    def would_exceed(self, subject: Subject, extra_events: Any, target_epsilon: float, delta: float) -> bool:
        """True if recording ``extra_events`` would push ``subject`` above ``target_epsilon``.

        Call before a step to refuse it (DESIGN idea 3: stop before a budget is exceeded).
        """
        target = checks.positive("target_epsilon", target_epsilon)
        return self.epsilon_with(subject, extra_events, delta) > target

    def __len__(self) -> int:
        return len(self._log)

    def __repr__(self) -> str:
        return f"PrivacyLedger(accountant={self.accountant.kind!r}, subjects={len(self._subjects)}, records={len(self)})"

    # ------------------------------------------------------------------ state

    def state_dict(self) -> dict:
        """Plain JSON-compatible state: config plus ``[subject, event, count, relations, label]`` records."""
        records = []
        for subject, idx in self._log:
            rel = self._subjects[subject].releases[idx]
            records.append(
                [
                    subject,
                    event_to_dict(rel.event),
                    rel.count,
                    [r.name for r in RELATION_PREFERENCE if r in rel.relations],
                    rel.label,
                ]
            )
        return {
            "format": self.STATE_FORMAT,
            "version": self.STATE_VERSION,
            "accountant": self.accountant.kind,
            "orders": list(self.accountant.orders),
            "value_discretization_interval": self.accountant.value_discretization_interval,
            "records": records,
        }

    @classmethod
    def from_state_dict(cls, state: Mapping) -> PrivacyLedger:
        """Build a ledger with the configuration and records stored in ``state``."""
        cls._check_state_header(state)
        ledger = cls(Accountant(state["accountant"], state["orders"], state["value_discretization_interval"]))
        ledger._load_records(state["records"])
        return ledger

    def load_state_dict(self, state: Mapping) -> None:
        """Replace this ledger's records with those in ``state`` (same accountant config required)."""
        self._check_state_header(state)
        mismatches, acc = [], self.accountant
        if state["accountant"] != acc.kind:
            mismatches.append(f"accountant {state['accountant']!r} != {acc.kind!r}")
        if tuple(float(a) for a in state["orders"]) != acc.orders:
            mismatches.append("RDP orders differ")
        if float(state["value_discretization_interval"]) != acc.value_discretization_interval:
            mismatches.append(
                f"value_discretization_interval {state['value_discretization_interval']} != "
                f"{acc.value_discretization_interval}"
            )
        if mismatches:
            raise ValueError(
                "ledger state was saved with a different accountant configuration ("
                + "; ".join(mismatches)
                + "); use PrivacyLedger.from_state_dict(state) to restore it as saved."
            )
        fresh = PrivacyLedger(self.accountant)
        fresh._load_records(state["records"])
        self._subjects, self._log = fresh._subjects, fresh._log

    @classmethod
    def _check_state_header(cls, state: Any) -> None:
        if not isinstance(state, Mapping) or state.get("format") != cls.STATE_FORMAT:
            raise ValueError("not a PrivacyLedger state (missing or wrong 'format' field).")
        if state.get("version") != cls.STATE_VERSION:
            raise ValueError(f"unsupported PrivacyLedger state version {state.get('version')!r}.")
        missing = [k for k in ("accountant", "orders", "value_discretization_interval", "records") if k not in state]
        if missing:
            raise ValueError(f"PrivacyLedger state lacks field(s) {missing}.")

    def _load_records(self, records: Any) -> None:
        for i, rec in enumerate(records):
            if not isinstance(rec, (list, tuple)) or len(rec) != 5:
                raise ValueError(f"ledger record {i} is malformed: {rec!r}.")
            subject, event, count, relations, label = rec
            release = Release(event_from_dict(event), count, frozenset(parse_relation(r) for r in relations), label)
            self._add(check_subject(subject), release)
