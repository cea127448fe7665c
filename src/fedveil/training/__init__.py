"""The one training door (DESIGN idea 7): local SGD / DP-SGD on one client
(:class:`LocalTrainer`) and its stacked twin for a whole cohort (:func:`train_stacked`),
both driven by a :class:`TrainRequest` (model variant, objective, mask, private rows).

Algorithms call the trainer; executors decide whether calls run one by one or stacked.
This package sits below ``algorithms`` and above ``engine``, ``models`` and ``privacy``.
"""
from .cohort import stacking_key, train_stacked
from .local import LocalStats, LocalTrainer, SGDSettings, task_loss
from .request import Batch, GradHook, Objective, TaskLoss, TrainRequest

__all__ = [
    "Batch", "GradHook", "LocalStats", "LocalTrainer", "Objective", "SGDSettings", "TaskLoss", "TrainRequest",
    "stacking_key", "task_loss", "train_stacked",
]
