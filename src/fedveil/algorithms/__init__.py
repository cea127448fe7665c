"""Federated algorithms: one module per method, registered by a decorator on import."""
from .base import ALGORITHMS, Algorithm, AlgorithmParams, ClientResult, ClientTask, RunContext
from . import fedavg  # noqa: F401  (registers)
from . import server_opt  # noqa: F401  (registers)
from . import fedprox  # noqa: F401  (registers)
from . import scaffold  # noqa: F401  (registers)
from . import fednova  # noqa: F401  (registers)
from . import local_only  # noqa: F401  (registers)
from . import finetune  # noqa: F401  (registers)
from . import fedavg_then_local  # noqa: F401  (registers)
from . import mean_regularized  # noqa: F401  (registers)
from . import ditto  # noqa: F401  (registers)
from . import mocha  # noqa: F401  (registers)
from . import ifca  # noqa: F401  (registers)
from . import fade  # noqa: F401  (registers)
from . import split_mix  # noqa: F401  (registers)
from . import hetero_fl  # noqa: F401  (registers)
from . import stc  # noqa: F401  (registers)
from . import pfedme  # noqa: F401  (registers)
from . import adds  # noqa: F401  (registers)
from . import feddrop  # noqa: F401  (registers)
from . import fedfed  # noqa: F401  (registers)

__all__ = ["ALGORITHMS", "Algorithm", "AlgorithmParams", "ClientResult", "ClientTask", "RunContext"]
