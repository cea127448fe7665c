"""ECOS: pick open-source cloud samples that match a client's private data from a few hundred
bytes of noisy cluster-coverage counts (spec 000 part 2, PART B; Hong, dissertation ch. 5).

A pipeline of its own, outside the federated runtime.  Modules: :mod:`.features` (fixed
feature extractors phi: simplified HOG, HOG with per-cell colour statistics, pooled
pixels), :mod:`.coverage` (client side: cloud centroids, nearest-centroid coverage counts,
their noisy upload and its privacy release; Alg. 5.1 lines 1-6, B.4), :mod:`.selection`
(cloud side: per-cluster budgets, per-cluster K-Center, and the random / K-Center /
proximity-only baselines; lines 8-16).
"""
from .coverage import (
    CoverageSummary,
    assign_clusters,
    cloud_centroids,
    coverage_counts,
    coverage_release,
    private_coverage,
)
from .features import EXTRACTORS, extract, hog_color_features, hog_features, pixel_features
from .selection import (
    CAPS,
    cluster_budgets,
    ecos_select,
    k_center_greedy,
    k_center_select,
    proximity_only_select,
    random_select,
)

__all__ = [
    "CAPS", "EXTRACTORS", "CoverageSummary", "assign_clusters", "cloud_centroids", "cluster_budgets", "coverage_counts",
    "coverage_release", "ecos_select", "extract", "hog_color_features", "hog_features", "k_center_greedy", "k_center_select",
    "pixel_features", "private_coverage", "proximity_only_select", "random_select",
]
