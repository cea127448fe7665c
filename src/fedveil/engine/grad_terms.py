"""Gradient terms algorithms add to the local gradient, in a form the engine can stack.

Most methods add an affine function of the weights: FedProx ``mu (w - w_g)``,
SCAFFOLD ``c - c_i``, Ditto and MR-MTL ``lambda (w - w_ref)``. Written as
:class:`AffineGradTerm` they run on K clients at once; any other callable
``(w, g) -> g`` still works, applied client by client.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..params import Params


@dataclass(frozen=True)
class AffineGradTerm:
    """``g + scale * w + offset`` (``offset`` may name a subset of the parameters).

    ``clipped``: under DP-SGD the term is the gradient of an example-independent part of
    every example's objective (MR-MTL's ``lambda/2 ||w - w_bar||^2``), so it is added to
    each per-example gradient *before* clipping and clipped with it (spec 002 §1.2 note,
    [C1] ``privatize_grad_hk``). Otherwise (the default) it is added to the privatised
    gradient, which is post-processing. Without DP both are the same.
    """

    scale: float = 0.0
    offset: Params | None = None
    clipped: bool = False

    def value(self, w: Params) -> Params:
        """The term alone, ``scale * w + offset``, for every parameter of ``w``."""
        return self(w, {k: v.new_zeros(v.shape) for k, v in w.items()})

    def __call__(self, w: Params, g: Params) -> Params:
        out = {}
        for k, v in g.items():
            if self.scale:
                v = v + self.scale * w[k]
            if self.offset is not None and k in self.offset:
                v = v + self.offset[k]
            out[k] = v
        return out
