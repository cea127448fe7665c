"""Show how labels are spread over clients: a text table and a PNG heat map of the
(num_clients, num_classes) count matrix from :meth:`FederatedDataset.label_counts`."""
from __future__ import annotations

import os
from typing import Sequence

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

ANNOTATE_MAX_CELLS = 400


def check_counts(counts: np.ndarray, class_names: Sequence[str] | None) -> tuple[np.ndarray, list[str]]:
    counts = np.asarray(counts)
    if counts.ndim != 2 or (counts < 0).any():
        raise ValueError(
            f"counts must be a (num_clients, num_classes) matrix of non-negative counts, got shape {counts.shape}"
        )
    names = [str(c) for c in range(counts.shape[1])] if class_names is None else [str(c) for c in class_names]
    if len(names) != counts.shape[1]:
        raise ValueError(f"got {len(names)} class names for {counts.shape[1]} classes")
    return counts, names


def label_distribution_table(counts: np.ndarray, class_names: Sequence[str] | None = None) -> str:
    """One row per client (its count of each class and its total) and a final ``total`` row."""
    counts, names = check_counts(counts, class_names)
    header = ["client", *names, "total"]
    rows = [[str(i), *map(str, row), str(row.sum())] for i, row in enumerate(counts)]
    rows.append(["total", *map(str, counts.sum(axis=0)), str(counts.sum())])
    widths = [max(len(r[j]) for r in [header, *rows]) for j in range(len(header))]

    def fmt(cells: list[str]) -> str:
        return "  ".join(cell.rjust(w) for cell, w in zip(cells, widths))

    rule = "-" * len(fmt(header))
    return "\n".join([fmt(header), rule, *map(fmt, rows[:-1]), rule, fmt(rows[-1])])


def plot_label_distribution(
    counts: np.ndarray,
    path: str | os.PathLike,
    title: str = "Label distribution over clients",
    class_names: Sequence[str] | None = None,
) -> None:
    """Write a heat map PNG to ``path``: clients on y, classes on x, colour = row count;
    cells carry their count when the matrix has at most 400 cells."""
    counts, names = check_counts(counts, class_names)
    n_clients, n_classes = counts.shape
    fig = Figure(figsize=(min(2 + 0.45 * n_classes, 20), min(1.5 + 0.35 * n_clients, 20)))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    image = ax.imshow(counts, aspect="auto", cmap="viridis", interpolation="nearest")
    fig.colorbar(image, ax=ax, label="rows")
    ax.set_xlabel("class")
    ax.set_ylabel("client")
    ax.set_title(title)
    if n_classes <= 40:
        ax.set_xticks(range(n_classes), names, rotation=90 if max(map(len, names)) > 3 else 0)
    if n_clients <= 40:
        ax.set_yticks(range(n_clients))
    if counts.size <= ANNOTATE_MAX_CELLS:
        bright = counts > counts.max() / 2
        for (i, j), value in np.ndenumerate(counts):
            ax.text(j, i, str(value), ha="center", va="center", fontsize=7, color="black" if bright[i, j] else "white")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
