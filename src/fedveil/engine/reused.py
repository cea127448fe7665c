"""Buffers a stacked computation reuses from one round to the next.

A cohort's stacked parameters are large (100 MLP clients: 80 MB) and freshly allocated
memory is slow to write on a CPU: every page faults on first touch, so stacking into a
new tensor took 20 ms where stacking into one already written took 2. A buffer is
handed out again only when nothing else holds its memory: the results of the last
computation are views into it, and an algorithm may keep them (a client's personal
model, its BatchNorm statistics); then a fresh buffer is allocated, as before.
"""
from __future__ import annotations

import threading
from typing import Callable, Hashable

import torch


def _storage_use_count() -> Callable[[torch.Tensor], int] | None:
    """How many tensors share a tensor's memory (torch's own count of references to its
    storage), or None when this torch does not say: then nothing is reused."""
    count = getattr(torch._C, "_storage_Use_Count", None)
    if count is None:
        return None
    return lambda t: count(t.untyped_storage()._cdata)


_USE_COUNT = _storage_use_count()
_ALONE = None if _USE_COUNT is None else _USE_COUNT(torch.empty(1))  # a tensor nothing else shares


def held_elsewhere(t: torch.Tensor) -> bool:
    """True when a tensor other than ``t`` (a view, a result kept by a caller) may hold
    ``t``'s memory; always True when torch cannot tell."""
    return _USE_COUNT is None or _USE_COUNT(t) > _ALONE


class ReusedBuffers:
    """Tensors by key, each handed out again while no one else holds the previous one."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held: dict[Hashable, torch.Tensor] = {}

    def take(self, key: Hashable, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        """An uninitialised tensor of that shape, dtype and device: the one kept under ``key``
        when nothing else holds it any more, else a new one (kept from now on)."""
        shape = tuple(shape)
        with self._lock:
            buf = self._held.get(key)
            fits = buf is not None and (tuple(buf.shape), buf.dtype, buf.device) == (shape, dtype, torch.device(device))
            if not fits or held_elsewhere(buf):
                buf = self._held[key] = torch.empty(shape, dtype=dtype, device=device)
            return buf.view(shape)  # a view: the buffer counts as held until the caller lets it go

    def stack(self, key: Hashable, tensors: list[torch.Tensor]) -> torch.Tensor:
        """``torch.stack(tensors)`` written into the buffer under ``key``."""
        first = tensors[0]
        out = self.take(key, (len(tensors), *first.shape), first.dtype, first.device)
        with torch.no_grad():  # parameters may require grad; the stack is a copy of their values
            return torch.stack(tensors, out=out)


__all__ = ["ReusedBuffers", "held_elsewhere"]
