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
