"""The one training door (DESIGN idea 7): local SGD / DP-SGD on one client
(:class:`LocalTrainer`) and its stacked twin for a whole cohort (:func:`train_stacked`).

Algorithms call the trainer; executors decide whether calls run one by one or stacked.
This package sits below ``algorithms`` and above ``engine`` and ``privacy``.
"""
from .cohort import TrainRequest, train_stacked
from .local import GradHook, LocalStats, LocalTrainer, SGDSettings, task_loss

__all__ = ["GradHook", "LocalStats", "LocalTrainer", "SGDSettings", "TrainRequest", "task_loss", "train_stacked"]
