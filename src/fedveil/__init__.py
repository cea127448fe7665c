"""fedveil: privacy-preserving federated learning with correct DP accounting."""

__version__ = "0.1.0"
