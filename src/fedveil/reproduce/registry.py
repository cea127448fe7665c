"""The reproductions ``fedveil reproduce`` can run, found through the ``fedveil.reproductions``
entry-point group: an installed package lists a module there, and importing that module
registers its reproductions in :data:`REPRODUCTIONS`. The library itself imports none.

A package of your own joins the same way, in its ``pyproject.toml``::

    [project.entry-points."fedveil.reproductions"]
    mine = "my_package.reproductions"
"""
from __future__ import annotations

from importlib.metadata import entry_points
from typing import Callable

from ..registry import Registry
from .plan import ReproductionContext
from .report import ReproductionReport

ENTRY_POINT_GROUP = "fedveil.reproductions"

ReproductionFn = Callable[[ReproductionContext], ReproductionReport]
REPRODUCTIONS: Registry[ReproductionFn] = Registry("reproduction")


def load_reproductions() -> Registry[ReproductionFn]:
    """Import every module listed under the entry-point group (once) and return the registry."""
    for point in entry_points(group=ENTRY_POINT_GROUP):
        point.load()
    return REPRODUCTIONS
