"""The papers' numbers as data: each reproduction reads the figures it compares against from
``paper/<module>.toml`` beside this file, so a reader finds every number a paper reports in
one place, apart from the hyper-parameters of the runs."""
from __future__ import annotations

import functools
import tomllib
from importlib.resources import files
from typing import Any


@functools.cache
def paper_numbers(module: str) -> dict[str, Any]:
    """The paper's numbers for reproduction module ``module`` (its ``__name__`` or last part)."""
    name = module.rsplit(".", 1)[-1]
    return tomllib.loads((files(__package__) / "paper" / f"{name}.toml").read_text())
