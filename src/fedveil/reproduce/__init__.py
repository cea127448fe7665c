"""Paper reproductions' shape, registry and results files (``fedveil reproduce``); the
reproductions themselves live outside the library, in the ``fedveil_reproductions`` package."""
from .plan import (
    PlannedRun,
    Reproduction,
    ReproductionContext,
    StudyReproduction,
    Summaries,
    run_plan,
)
from .registry import REPRODUCTIONS, load_reproductions
from .report import ReproductionReport, ResultRow, output_folder, write_results

__all__ = [
    "PlannedRun", "REPRODUCTIONS", "Reproduction", "ReproductionContext", "ReproductionReport", "ResultRow",
    "StudyReproduction", "Summaries", "load_reproductions", "output_folder", "run_plan", "write_results",
]
