"""Neighbouring relations: which one each sampling scheme is accounted under.

An epsilon is only meaningful together with the relation it protects (add/remove one
example, replace one, or replace one by a null example: ``dp_accounting``'s
``NeighboringRelation``). Poisson and full-batch steps hold under add/remove-one (and
zero-out), fixed-size batches without replacement under replace-one only, shuffled
epochs under zero-out only (:mod:`fedveil.privacy.events` explains why). Releases of one
subject must share a relation; when several remain, the first of
:data:`RELATION_PREFERENCE` is reported. A :class:`Sampling` is one scheme with the
population it draws from.
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from dp_accounting.privacy_accountant import NeighboringRelation

from . import checks

__all__ = [
    "NeighboringRelation",
    "SAMPLINGS",
    "ALL_RELATIONS",
    "RELATION_PREFERENCE",
    "SAMPLING_RELATIONS",
    "Sampling",
    "as_sampling",
    "check_sampling",
    "sampling_relation",
    "parse_relation",
    "resolve_relation",
    "relation_names",
]

SAMPLINGS = ("poisson", "fixed", "shuffle", "full")
#: Schemes whose batch size is ``sample_rate * population_size``.
NEEDS_POPULATION = ("fixed", "shuffle")

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


@dataclass(frozen=True)
class Sampling:
    """How each step's batch is drawn (:mod:`fedveil.privacy.events` accounts each scheme).

    ``scheme``: one of :data:`SAMPLINGS`; ``population_size``: the number of examples ``n``
    the batches are drawn from (``"fixed"`` and ``"shuffle"`` need it); ``drop_last``:
    whether a shuffling loader drops the last partial batch.
    """

    scheme: str = "poisson"
    population_size: int | None = None
    drop_last: bool = True

    def __post_init__(self) -> None:
        check_sampling(self.scheme)
        if self.population_size is not None:
            object.__setattr__(self, "population_size", checks.integer("population_size", self.population_size, minimum=1))
        elif self.scheme in NEEDS_POPULATION:
            raise ValueError(
                f"sampling={self.scheme!r} needs population_size (the number of examples n the batches are drawn "
                "from); the batch size is sample_rate * population_size."
            )
        if self.drop_last not in (True, False):
            raise ValueError(f"drop_last must be True or False; got {checks.shown(self.drop_last)}.")
        object.__setattr__(self, "drop_last", bool(self.drop_last))


def as_sampling(sampling: Sampling | str) -> Sampling:
    """``sampling`` itself, or the scheme it names without a population."""
    return sampling if isinstance(sampling, Sampling) else Sampling(sampling)


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
