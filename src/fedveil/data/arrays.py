"""In-memory tensors for one data set: the common return type of every loader."""
from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class ArrayDataset:
    """Features ``x``, targets ``y`` and optional per-row metadata, all aligned on dim 0.

    ``groups`` holds a natural grouping (speaking role, school, domain, sensitive
    attribute...) that partitioners and fairness metrics may use; ``info`` holds
    free-form facts (class names, feature names, task kind).
    """

    x: torch.Tensor
    y: torch.Tensor
    groups: dict[str, torch.Tensor] = field(default_factory=dict)
    info: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        n = len(self.x)
        if len(self.y) != n:
            raise ValueError(f"x has {n} rows but y has {len(self.y)}")
        for name, g in self.groups.items():
            if len(g) != n:
                raise ValueError(f"group '{name}' has {len(g)} rows, expected {n}")

    def __len__(self) -> int:
        return len(self.x)

    def __getstate__(self) -> dict:
        """Pickled with every field in a storage of its own: a row view of a :func:`packed`
        tensor would otherwise take the whole pack along (shipping one client to a worker)."""

        def own(t: torch.Tensor) -> torch.Tensor:
            return t if t._base is None else t.clone()

        return {**self.__dict__, "x": own(self.x), "y": own(self.y), "groups": {k: own(v) for k, v in self.groups.items()}}

    def subset(self, index: torch.Tensor) -> "ArrayDataset":
        """Rows ``index`` (a LongTensor or bool mask) as a new data set."""
        return ArrayDataset(
            self.x[index],
            self.y[index],
            {k: v[index] for k, v in self.groups.items()},
            dict(self.info),
        )

    @staticmethod
    def concat(parts: list["ArrayDataset"]) -> "ArrayDataset":
        """Rows of all ``parts`` in order (groups kept where every part has them)."""
        if not parts:
            raise ValueError("cannot concatenate zero data sets")
        keys = set.intersection(*(set(p.groups) for p in parts))
        return ArrayDataset(
            torch.cat([p.x for p in parts]),
            torch.cat([p.y for p in parts]),
            {k: torch.cat([p.groups[k] for p in parts]) for k in sorted(keys)},
            dict(parts[0].info),
        )


def packed(parts: list[ArrayDataset], device: torch.device | None = None) -> list[ArrayDataset]:
    """``parts`` (on ``device``, default where they are) with their ``x``, ``y`` and groups
    held end to end in one tensor per field, each part's fields becoming row views of it
    (values, dtypes and ``info`` unchanged).

    A stacked training step then gathers the batches of many clients with one
    ``index_select`` per field (:func:`shared_rows`). Parts that already share their rows
    (:func:`packed_rows` builds them so) are only moved, one tensor per field. Parts whose
    fields disagree in trailing shape, dtype, device or group names are moved one by one.
    """
    if not parts:
        return []
    names = list(parts[0].groups)

    def fields(p: ArrayDataset) -> list[torch.Tensor]:
        return [p.x, p.y, *(p.groups[g] for g in names)]

    def kind(t: torch.Tensor) -> tuple:
        return t.shape[1:], t.dtype, t.device

    kinds = [kind(t) for t in fields(parts[0])]
    if any(sorted(p.groups) != sorted(names) or [kind(t) for t in fields(p)] != kinds for p in parts):
        return [_moved(p, device) for p in parts]
    shared = [shared_rows(list(column)) for column in zip(*(fields(p) for p in parts))]
    if all(s is not None for s in shared) and len({tuple(s[1]) for s in shared}) == 1:
        bases, starts = [s[0] for s in shared], shared[0][1]
    elif len(parts) == 1:
        return [_moved(parts[0], device)]
    else:
        bases = [torch.cat(column) for column in zip(*(fields(p) for p in parts))]
        starts = [sum(len(p) for p in parts[:i]) for i in range(len(parts))]
    if device is not None:
        bases = [b.to(device) for b in bases]
    return [_rows_of(bases, names, start, len(p), p.info) for p, start in zip(parts, starts)]


def packed_rows(data: ArrayDataset, indices: list[torch.Tensor]) -> list[ArrayDataset]:
    """The rows ``indices[k]`` of ``data`` for each part ``k``, copied once into one
    tensor per field of which the parts are row views (:func:`packed`, without a second copy)."""
    whole = data.subset(torch.cat(indices)) if indices else data.subset(torch.zeros(0, dtype=torch.long))
    names = list(whole.groups)
    bases = [whole.x, whole.y, *(whole.groups[g] for g in names)]
    starts = [sum(len(i) for i in indices[:k]) for k in range(len(indices))]
    return [_rows_of(bases, names, start, len(idx), dict(data.info)) for idx, start in zip(indices, starts)]


def _rows_of(bases: list[torch.Tensor], names: list[str], start: int, n: int, info: dict) -> ArrayDataset:
    """Rows ``[start, start + n)`` of the fields ``bases`` (x, y, then the groups ``names``) as views."""
    views = [b.narrow(0, start, n) for b in bases]
    return ArrayDataset(views[0], views[1], dict(zip(names, views[2:])), info)


def _moved(p: ArrayDataset, device: torch.device | None) -> ArrayDataset:
    if device is None:
        return p
    return ArrayDataset(p.x.to(device), p.y.to(device), {k: v.to(device) for k, v in p.groups.items()}, p.info)


def shared_rows(tensors: list[torch.Tensor]) -> tuple[torch.Tensor, list[int]] | None:
    """When every tensor is a row block (``narrow`` on dim 0) of one contiguous tensor, as
    :func:`packed` makes them: that tensor and each block's first row in it; else ``None``."""
    base = tensors[0]._base
    if base is None or not base.is_contiguous() or base.dim() == 0:
        return None
    row = base.stride(0) if base.shape[0] > 1 else max(1, base[0].numel())
    starts = []
    for t in tensors:
        if t._base is not base or (t.dim() > 0 and t.shape[0] > 1 and t.stride() != base.stride()):
            return None
        offset = t.storage_offset() - base.storage_offset()
        if offset % row:
            return None
        starts.append(offset // row)
    return base, starts

