"""Reproductions of the seed papers' experiments, run by ``fedveil reproduce NAME``.

This package sits outside the library: it imports ``fedveil``, and ``fedveil`` finds it only
through the ``fedveil.reproductions`` entry point (pyproject.toml), so no library module
depends on it. Importing it registers every reproduction in ``fedveil.reproduce.REPRODUCTIONS``.
"""
from . import (
    adds_tables,  # noqa: F401
    dp_schedules,  # noqa: F401
    ecos_domainnet,  # noqa: F401
    ecos_labelling,  # noqa: F401
    ecos_sweeps,  # noqa: F401
    ecos_tables,  # noqa: F401
    fade_adult,  # noqa: F401
    fade_digits,  # noqa: F401
    fade_office,  # noqa: F401
    fedavg_mnist,  # noqa: F401  (registers)
    fedfed_tables,  # noqa: F401
    mrmtl_cifar,  # noqa: F401
    mrmtl_costs,  # noqa: F401
    mrmtl_mean_estimation,  # noqa: F401
    mrmtl_mnist,  # noqa: F401
    mrmtl_school,  # noqa: F401
    mrmtl_vehicle,  # noqa: F401
    pets_pandemic,  # noqa: F401
    splitmix_ablation,  # noqa: F401
    splitmix_cifar,  # noqa: F401
    splitmix_digits,  # noqa: F401
    splitmix_robust,  # noqa: F401
    splitmix_variants,  # noqa: F401
)
