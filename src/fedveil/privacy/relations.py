"""Neighbouring relations: which one each sampling scheme is accounted under.

An epsilon is only meaningful together with the relation it protects (add/remove one
example, replace one, or replace one by a null example: ``dp_accounting``'s
``NeighboringRelation``). Poisson and full-batch steps hold under add/remove-one (and
zero-out), fixed-size batches without replacement under replace-one only, shuffled
epochs under zero-out only (:mod:`fedveil.privacy.events` explains why). Releases of one
subject must share a relation; when several remain, the first of
:data:`RELATION_PREFERENCE` is reported.
"""
from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from dp_accounting.privacy_accountant import NeighboringRelation

from . import checks

__all__ = [
    "NeighboringRelation",
    "SAMPLINGS",
    "ALL_RELATIONS",
    "RELATION_PREFERENCE",
    "SAMPLING_RELATIONS",
    "check_sampling",
    "sampling_relation",
    "parse_relation",
    "resolve_relation",
    "relation_names",
]

SAMPLINGS = ("poisson", "fixed", "shuffle", "full")

ALL_RELATIONS = frozenset(NeighboringRelation)
#: When several relations are admissible for a subject, report the first of these.
RELATION_PREFERENCE = (
    NeighboringRelation.ADD_OR_REMOVE_ONE,
    NeighboringRelation.REPLACE_SPECIAL,
    NeighboringRelation.REPLACE_ONE,
)
#: The relations under which each sampling scheme's release is stated correctly.
SAMPLING_RELATIONS = {
    "poisson": frozenset({NeighboringRelation.ADD_OR_REMOVE_ONE, NeighboringRelation.REPLACE_SPECIAL}),
    "full": frozenset({NeighboringRelation.ADD_OR_REMOVE_ONE, NeighboringRelation.REPLACE_SPECIAL}),
    "fixed": frozenset({NeighboringRelation.REPLACE_ONE}),
    "shuffle": frozenset({NeighboringRelation.REPLACE_SPECIAL}),
}

_ALIASES = {
    "add_or_remove_one": NeighboringRelation.ADD_OR_REMOVE_ONE,
    "add_remove": NeighboringRelation.ADD_OR_REMOVE_ONE,
    "replace_special": NeighboringRelation.REPLACE_SPECIAL,
    "zero_out": NeighboringRelation.REPLACE_SPECIAL,
    "replace_one": NeighboringRelation.REPLACE_ONE,
}


def check_sampling(sampling: Any) -> str:
    """``sampling`` if it is one of :data:`SAMPLINGS`."""
    return checks.one_of("sampling", sampling, SAMPLINGS)


def sampling_relation(sampling: str) -> NeighboringRelation:
    """Neighbouring relation under which :func:`fedveil.privacy.composition.epsilon` reports for ``sampling``."""
    return resolve_relation(SAMPLING_RELATIONS[check_sampling(sampling)])


def parse_relation(relation: Any) -> NeighboringRelation:
    """A ``NeighboringRelation`` from itself or a name (``'zero_out'``, ``'replace_one'``, ...)."""
    if isinstance(relation, NeighboringRelation):
        return relation
    if isinstance(relation, str) and relation.strip().lower() in _ALIASES:
        return _ALIASES[relation.strip().lower()]
    raise ValueError(
        f"unknown neighbouring relation {relation!r}; use a dp_accounting NeighboringRelation or one of "
        "'add_or_remove_one', 'replace_special' (zero-out), 'replace_one'."
    )


def resolve_relation(relations: frozenset) -> NeighboringRelation:
    """The preferred relation among ``relations`` (callers check it is not empty)."""
    for rel in RELATION_PREFERENCE:
        if rel in relations:
            return rel
    raise ValueError("no admissible neighbouring relation")


def relation_names(relations: Iterable[NeighboringRelation]) -> str:
    """``{ADD_OR_REMOVE_ONE, REPLACE_ONE}``: the relations in preference order, for messages."""
    names = [r.name for r in RELATION_PREFERENCE if r in set(relations)]
    return "{" + ", ".join(names) + "}"
