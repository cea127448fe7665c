"""Reproductions of the seed papers' experiments (``fedveil reproduce``)."""
from .registry import EXPERIMENTS, ExperimentContext, ExperimentReport, ResultRow, write_results
from . import fedavg_mnist  # noqa: F401  (registers)
from . import dp_schedules  # noqa: F401
from . import pets_pandemic  # noqa: F401
from . import mrmtl_mean_estimation  # noqa: F401
from . import mrmtl_school  # noqa: F401
from . import mrmtl_vehicle  # noqa: F401
from . import mrmtl_mnist  # noqa: F401
from . import mrmtl_costs  # noqa: F401
from . import mrmtl_cifar  # noqa: F401
from . import fade_adult  # noqa: F401
from . import fade_digits  # noqa: F401
from . import fade_office  # noqa: F401
from . import splitmix_digits  # noqa: F401
from . import splitmix_cifar  # noqa: F401
from . import splitmix_robust  # noqa: F401
from . import splitmix_ablation  # noqa: F401
from . import splitmix_variants  # noqa: F401
from . import adds_tables  # noqa: F401
from . import fedfed_tables  # noqa: F401
from . import ecos_tables  # noqa: F401
from . import ecos_domainnet  # noqa: F401
from . import ecos_labelling  # noqa: F401
from . import ecos_sweeps  # noqa: F401

__all__ = ["EXPERIMENTS", "ExperimentContext", "ExperimentReport", "ResultRow", "write_results"]
