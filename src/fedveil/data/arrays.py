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


def packed(parts: list[ArrayDataset]) -> list[ArrayDataset]:
    """``parts`` with their ``x``, ``y`` and groups copied end to end into one tensor per field,
    each part's fields becoming row views of it (values, dtypes and ``info`` unchanged).

    A stacked training step then gathers the batches of many clients with one
    ``index_select`` per field (:func:`shared_rows`). Parts whose fields disagree in
    trailing shape, dtype, device or group names are returned as they are.
    """
    if len(parts) < 2:
        return list(parts)
    first = parts[0]
    names = sorted(first.groups)

    def fields(p: ArrayDataset) -> list[torch.Tensor]:
        return [p.x, p.y, *(p.groups[g] for g in names)]

    def kind(t: torch.Tensor) -> tuple:
        return t.shape[1:], t.dtype, t.device

    kinds = [kind(t) for t in fields(first)]
    if any(sorted(p.groups) != names or [kind(t) for t in fields(p)] != kinds for p in parts):
        return list(parts)
    joined = [torch.cat(column) for column in zip(*(fields(p) for p in parts))]
    out, start = [], 0
    for p in parts:
        n = len(p)
        views = [t.narrow(0, start, n) for t in joined]
        out.append(ArrayDataset(views[0], views[1], dict(zip(names, views[2:])), p.info))
        start += n
    return out


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


def own_storage(data: ArrayDataset) -> ArrayDataset:
    """``data`` with every field in a storage of its own: a row view of a :func:`packed`
    tensor would otherwise take the whole pack along when pickled (shipping to a worker)."""

    def own(t: torch.Tensor) -> torch.Tensor:
        return t if t._base is None else t.clone()

    return ArrayDataset(own(data.x), own(data.y), {k: own(v) for k, v in data.groups.items()}, data.info)
