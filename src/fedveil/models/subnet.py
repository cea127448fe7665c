"""Subnets of a supernet given by unit index maps (ADDS §3.4; spec 001 §1.5-1.6).

A supernet lists, for each parameter, the axes its sampleable units index
(:meth:`~fedveil.models.supernet.SampledNet.unit_axes`: ``(axis, layer, repeat)``, the
entries ``[c * repeat, (c + 1) * repeat)`` of the axis belong to unit c of the layer). A
subnet keeps some units of each layer (one bool vector per layer; concatenated, they are
the index map I of length J). An entry of a parameter belongs to the subnet when every
unit it connects is kept: the element mask is the outer product of the unit maps on the
parameter's axes. Parameters with no unit axes belong to every subnet whole.
"""
from __future__ import annotations

from typing import Sequence

import torch

from ..params import Params
from .supernet import UnitAxes


def axis_keep(keep: Sequence[torch.Tensor], layer: int, repeat: int) -> torch.Tensor:
    """The kept entries of an axis indexed by ``layer``'s units, ``repeat`` entries per unit."""
    return keep[layer].repeat_interleave(repeat)


def element_mask(shape: Sequence[int], axes: list[tuple[int, int, int]], keep: Sequence[torch.Tensor]) -> torch.Tensor:
    """Bool mask of the entries of a tensor of ``shape`` inside the subnet."""
    mask = torch.ones(shape, dtype=torch.bool, device=keep[0].device)
    for axis, layer, repeat in axes:
        view = [1] * len(shape)
        view[axis] = shape[axis]
        mask = mask & axis_keep(keep, layer, repeat).view(view)
    return mask


def extract(params: Params, axes: UnitAxes, keep: Sequence[torch.Tensor]) -> Params:
    """θ_i: the subnet's entries of each parameter named in ``params``, as dense smaller
    tensors (rows/columns of dropped units removed)."""
    out = {}
    for name, value in params.items():
        sub = value
        for axis, layer, repeat in axes.get(name, []):
            sub = sub.index_select(axis, torch.nonzero(axis_keep(keep, layer, repeat)).flatten())
        out[name] = sub
    return out


def embed(sub: torch.Tensor, like: torch.Tensor, axes: list[tuple[int, int, int]], keep: Sequence[torch.Tensor]) -> torch.Tensor:
    """The inverse of :func:`extract` for one tensor: ``sub``'s entries at their places in a
    zero tensor shaped like ``like``."""
    out = torch.zeros_like(like)
    out[element_mask(like.shape, axes, keep)] = sub.flatten().to(like.dtype)
    return out


def split_index_map(index_map: torch.Tensor, counts: Sequence[int]) -> list[torch.Tensor]:
    """The concatenated index map I (length J) as one bool vector per layer."""
    if index_map.numel() != sum(counts):
        raise ValueError(f"index map of length {index_map.numel()} does not match the {sum(counts)} sampleable units")
    return list(torch.split(index_map.bool(), list(counts)))
