"""Show how labels are spread over clients: a text table and a PNG heat map of the
(num_clients, num_classes) count matrix from :meth:`FederatedDataset.label_counts`. The
figure stays at most ``MAX_WIDTH`` x ``MAX_HEIGHT`` inches whatever the number of clients
and classes."""
from __future__ import annotations

import math
import os
from collections.abc import Sequence

import numpy as np
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.image import AxesImage
from matplotlib.ticker import MaxNLocator

ANNOTATE_MAX_CELLS = 400
MAX_TICKS = 40  # a tick for every client up to this many (and per-cell counts up to this many classes)
MAX_CLASS_TICKS = 64  # a name for every class up to this many, every k-th beyond
MAX_WIDTH, MAX_HEIGHT = 16.0, 10.0
SIZE_PANEL_WIDTH = 1.6


def check_counts(counts: np.ndarray, class_names: Sequence[str] | None) -> tuple[np.ndarray, list[str]]:
    """``counts`` as a non-negative ``(num_clients, num_classes)`` array
    and one name per class (default ``0..C-1``); a ValueError otherwise."""
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


def client_order(counts: np.ndarray) -> np.ndarray:
    """Clients grouped by their most frequent class, the most skewed first within a group."""
    rows = np.maximum(counts.sum(axis=1, keepdims=True), 1)
    share = counts / rows
    main = share.argmax(axis=1)
    return np.lexsort((-share[np.arange(len(share)), main], main))


def draw_client_sizes(ax: Axes, sizes: np.ndarray) -> None:
    """Each client's row count as a horizontal bar (one outline when they are many)."""
    y = np.arange(len(sizes))
    if len(sizes) <= MAX_TICKS:
        ax.barh(y, sizes, height=0.8, color="0.5")
    else:
        ax.fill_betweenx(y, 0, sizes, step="mid", color="0.5", lw=0)
    ax.set(xlabel="training rows", title="client size")
    ax.set_xlim(left=0)
    ax.tick_params(labelleft=False)
    ax.xaxis.set_major_locator(MaxNLocator(nbins=2, integer=True))


def annotate(ax: Axes, counts: np.ndarray, image: AxesImage, share: np.ndarray) -> None:
    """Write each cell's count in it, dark on bright cells."""
    for (i, j), value in np.ndenumerate(counts):
        bright = image.norm(share[i, j]) > 0.6
        ax.text(j, i, str(value), ha="center", va="center", fontsize=7, color="black" if bright else "white")


def label_distribution_figure(
    counts: np.ndarray, title: str = "Label distribution over clients", class_names: Sequence[str] | None = None
) -> Figure:
    """Heat map of each client's label proportions (clients on y, classes on x) beside each
    client's row count. Small matrices carry the counts in their cells; more than
    ``MAX_TICKS`` clients are sorted by their most frequent class."""
    counts, names = check_counts(counts, class_names)
    n_clients, n_classes = counts.shape
    order = client_order(counts) if n_clients > MAX_TICKS else np.arange(n_clients)
    counts = counts[order]
    share = counts / np.maximum(counts.sum(axis=1, keepdims=True), 1)
    size = (min(4 + 0.3 * n_classes, MAX_WIDTH), min(max(3.0, 1.8 + 0.3 * n_clients), MAX_HEIGHT))
    fig = Figure(figsize=size, layout="constrained")
    FigureCanvasAgg(fig)
    ax, ax_rows = fig.subplots(1, 2, sharey=True, width_ratios=[size[0] - SIZE_PANEL_WIDTH, SIZE_PANEL_WIDTH])
    image = ax.imshow(share, aspect="auto", cmap="viridis", vmin=0, interpolation="antialiased")
    fig.colorbar(image, ax=ax, label="share of the client's rows", aspect=40)
    ticks = range(0, n_classes, math.ceil(n_classes / MAX_CLASS_TICKS))
    ax.set_xticks(ticks, [names[j] for j in ticks], rotation=90 if max(map(len, names)) > 3 else 0,
                  fontsize=7 if n_classes > 20 else None)
    if n_clients <= MAX_TICKS:
        ax.set_yticks(range(n_clients))
        ax.set_ylabel("client")
    else:
        ax.yaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_ylabel(f"{n_clients} clients, grouped by their most frequent class")
    ax.set(xlabel="class", title="labels of each client")
    if counts.size <= ANNOTATE_MAX_CELLS and n_clients <= MAX_TICKS and n_classes <= MAX_TICKS:
        annotate(ax, counts, image, share)
    draw_client_sizes(ax_rows, counts.sum(axis=1))
    fig.suptitle(title)
    return fig


def plot_label_distribution(
    counts: np.ndarray,
    path: str | os.PathLike,
    title: str = "Label distribution over clients",
    class_names: Sequence[str] | None = None,
) -> None:
    """Write :func:`label_distribution_figure` to ``path``."""
    label_distribution_figure(counts, title, class_names).savefig(path, dpi=100)
