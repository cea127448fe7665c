"""``selection.png`` of an ECOS job: what the cloud's pool holds and what ECOS picked from it,
per domain (the client's own domain marked), and the noisy coverage counts the client
uploaded, the only thing it sent (Alg. 5.1)."""
from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

DPI = 110


def domain_counts(
    pool_domains: np.ndarray, chosen_domains: np.ndarray, client_domain: int,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(domains, pool rows per domain, selected rows per domain), the client's domain included."""
    domains = np.union1d(np.unique(pool_domains), [client_domain]).astype(int)
    pool = np.array([(pool_domains == d).sum() for d in domains])
    picked = np.array([(chosen_domains == d).sum() for d in domains])
    return domains, pool, picked


def plot_selection(
    pool_domains: np.ndarray, chosen_domains: np.ndarray, client_domain: int, domain_names: Sequence[str] | None,
    scores: Sequence[float] | None, path: Path, title: str,
) -> Path:
    """Pool and selected rows per domain (left) and the uploaded noisy counts, largest first
    (right, when the method uploads any); written to ``path``."""
    domains, pool, picked = domain_counts(pool_domains, chosen_domains, client_domain)
    names = [domain_names[d] if domain_names and d < len(domain_names) else f"domain {d}" for d in domains]
    fig = Figure(figsize=(12 if scores else 6.5, 4.2))
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, 2 if scores else 1)
    left = axes[0] if scores else axes
    x = np.arange(len(domains))
    left.bar(x - 0.2, pool, 0.4, color="0.8", label="cloud pool")
    bars = left.bar(x + 0.2, picked, 0.4, color="C0", label="selected")
    bars[int(np.flatnonzero(domains == client_domain)[0])].set_color("C3")
    left.set_xticks(x, [f"{n}\n(client's)" if d == client_domain else n for d, n in zip(domains, names)], fontsize=8)
    share = picked[domains == client_domain].sum() / max(picked.sum(), 1)
    left.set(ylabel="rows", title=f"rows per domain: {share:.0%} of the selection from the client's domain (red)")
    left.legend(fontsize=8)
    left.grid(alpha=0.3, axis="y")
    if scores:
        right = axes[1]
        ordered = np.sort(np.asarray(scores, dtype=float))[::-1]
        right.bar(np.arange(len(ordered)), ordered, color="C1")
        right.axhline(0.0, color="0.3", lw=0.8)
        right.set(xlabel="cloud centroid (largest count first)", ylabel="noisy coverage count",
                  title=f"the client's upload: {len(ordered)} noisy counts")
        right.grid(alpha=0.3, axis="y")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    return Path(path)
