"""Name -> object registries for data sets, partitioners, models, algorithms and experiments.

Adding a component is one decorator on it; nothing else needs editing by hand.
"""
from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import Any, Callable, Generic, TypeVar

T = TypeVar("T")


class UnknownNameError(KeyError):
    """A name that is not registered; the message lists what is."""

    def __str__(self) -> str:  # KeyError quotes its message; we want plain text
        return str(self.args[0])


@dataclass(frozen=True)
class Entry(Generic[T]):
    """A registered component: its name, the object and its one-line description."""

    name: str
    obj: T
    description: str


class Registry(Generic[T]):
    """A named collection of components of one kind (e.g. ``"algorithm"``)."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._entries: dict[str, Entry[T]] = {}

    def register(self, name: str, description: str = "") -> Callable[[T], T]:
        """Decorator registering the object under ``name``, described by ``description``
        or its docstring's first line; a name registered twice is a ValueError."""
        def decorate(obj: T) -> T:
            if name in self._entries:
                raise ValueError(f"{self.kind} '{name}' is registered twice")
            doc = description or (getattr(obj, "__doc__", None) or "").strip().split("\n")[0]
            self._entries[name] = Entry(name, obj, doc)
            return obj

        return decorate

    def get(self, name: str) -> T:
        """The object registered under ``name`` (:meth:`entry`'s error when unknown)."""
        return self.entry(name).obj

    def entry(self, name: str) -> Entry[T]:
        """The entry of ``name``; an :class:`UnknownNameError` listing the names (and the nearest one) when unknown."""
        if name not in self._entries:
            hint = difflib.get_close_matches(name, self._entries, n=1)
            did_you_mean = f" (did you mean '{hint[0]}'?)" if hint else ""
            raise UnknownNameError(
                f"unknown {self.kind} '{name}'{did_you_mean}; "
                f"choose one of: {', '.join(sorted(self._entries))}"
            )
        return self._entries[name]

    def names(self) -> list[str]:
        """The registered names, sorted."""
        return sorted(self._entries)

    def entries(self) -> list[Entry[T]]:
        """Every entry, sorted by name."""
        return [self._entries[n] for n in self.names()]

    def __contains__(self, name: Any) -> bool:
        return name in self._entries
