"""Split-Mix's model: an ensemble of independent narrow base nets (spec 000 part 2, A.2-A.3).

A width-``R`` Split-Mix model is ``R / r`` base nets of width ``r`` sharing no parameters;
its prediction is the arithmetic mean of the bases' LOGITS (Alg. 4.1 line 11).
"""
from __future__ import annotations

import copy
from typing import Callable, Sequence

import torch
from torch import nn

OUTPUTS = ("mean", "stack")


class BaseEnsemble(nn.Module):
    """Base nets ``bases.0 .. bases.{M-1}`` of width ``base_width`` each. ``output="mean"``
    returns the mean of their logits ``(N, C)``; ``"stack"`` returns them per base,
    ``(N, M, C)`` (for per-base losses, Alg. 4.3)."""

    def __init__(self, bases: Sequence[nn.Module], base_width: float, output: str = "mean") -> None:
        super().__init__()
        bases = list(bases)
        if not bases:
            raise ValueError("a BaseEnsemble needs at least one base net")
        if output not in OUTPUTS:
            raise ValueError(f"output must be one of {OUTPUTS}, got {output!r}")
        self.bases = nn.ModuleList(bases)
        self.base_width = float(base_width)
        self.output = output

    @property
    def num_bases(self) -> int:
        """M, the number of base nets."""
        return len(self.bases)

    @property
    def width(self) -> float:
        """The ensemble's width: ``num_bases * base_width``."""
        return self.num_bases * self.base_width

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The bases' logits: their mean ``(N, C)`` or, with ``output="stack"``, all of them ``(N, M, C)``."""
        logits = torch.stack([base(x) for base in self.bases], dim=1)
        return logits.mean(dim=1) if self.output == "mean" else logits

    def with_bases(self, n: int, output: str | None = None) -> "BaseEnsemble":
        """A new ensemble of deep copies of the first ``n`` bases (a width ``n * base_width``
        model; its parameters are named ``bases.0 .. bases.{n-1}`` like the first ``n`` here),
        with ``output`` (default: this one's)."""
        if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= self.num_bases:
            raise ValueError(f"n must be an int in [1, {self.num_bases}], got {n!r}")
        bases = [copy.deepcopy(base) for base in list(self.bases)[:n]]
        return BaseEnsemble(bases, self.base_width, self.output if output is None else output)

    def extra_repr(self) -> str:
        """``base_width`` and ``output`` in the module's printout."""
        return f"base_width={self.base_width:g}, output={self.output!r}"


def ensemble_or_net(make_base: Callable[[float], nn.Module], width: float, bases: int) -> nn.Module:
    """The builders' ``bases`` option: ``make_base(width)`` for ``bases == 1``, else a
    :class:`BaseEnsemble` of ``bases`` independently initialised nets of width ``width / bases``
    (so ``width=1, bases=8`` is Split-Mix x1 with 8 bases of width 0.125). Options are
    checked by the caller (:func:`fedveil.models.scalable.split_width`)."""
    if bases == 1:
        return make_base(width)
    base_width = width / bases
    return BaseEnsemble([make_base(base_width) for _ in range(bases)], base_width)
