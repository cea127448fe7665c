"""Reproductions of the seed papers' experiments, run by ``fedveil reproduce NAME``.

This package sits outside the library: it imports ``fedveil``, and ``fedveil`` finds it only
through the ``fedveil.reproductions`` entry point (pyproject.toml), so no library module
depends on it. Importing it registers every reproduction in ``fedveil.reproduce.REPRODUCTIONS``.
"""
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
