"""The fast engine: K clients' models trained as one stacked computation."""
from .stacked import StackedModel, UnsupportedModelError, stack_params  # noqa: F401
