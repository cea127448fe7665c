"""A run's initial model: fresh from the seed, or loaded from a trained one (``model.init_from``).

Loading is strict: every parameter and buffer of the run's model must be in the file with
the same shape, and the file may hold nothing else, except names under ``model.init_skip``
prefixes, which keep their fresh initialisation (e.g. FADE's UDA phase starts from the
source model with a re-initialised discriminator, spec 004 §1.9). The loaded model carries
the privacy cost of the run that trained it; this run's epsilon does not include it.
"""
from __future__ import annotations

import os
from pathlib import Path

import torch

from ..errors import ConfigError
from ..params import Params
from .run_dir import MODEL_FILE


def model_file(path: str | os.PathLike) -> Path:
    """``path/model.pt`` for a run directory, else ``path`` itself."""
    path = Path(path)
    return path / MODEL_FILE if path.is_dir() else path


def initial_params(fresh: Params, init_from: str | None, skip: list[str]) -> Params:
    """``fresh`` with every name not under a ``skip`` prefix replaced by the saved model's
    value (cast to the fresh tensor's dtype and device); raises :class:`ConfigError` when the
    file is missing, unreadable or does not fit the model."""
    if init_from is None:
        return fresh
    file = model_file(init_from)
    if not file.is_file():
        raise ConfigError(
            f"model.init_from: '{file}' not found; give a finished run directory (holding {MODEL_FILE}) or a .pt file"
        )
    try:
        saved = torch.load(file, weights_only=True, map_location="cpu")
    except Exception as err:  # torch raises several types for a damaged file
        raise ConfigError(f"model.init_from: '{file}' cannot be read ({err})") from None
    if not isinstance(saved, dict) or not all(isinstance(v, torch.Tensor) for v in saved.values()):
        raise ConfigError(f"model.init_from: '{file}' is not a name -> tensor dict")

    def skipped(name: str) -> bool:
        return any(name.startswith(prefix) for prefix in skip)

    missing = sorted(n for n in fresh if not skipped(n) and n not in saved)
    extra = sorted(n for n in saved if n not in fresh and not skipped(n))
    if missing or extra:
        raise ConfigError(
            f"model.init_from: '{file}' does not fit this model (missing: {', '.join(missing[:5]) or 'none'}; "
            f"unknown: {', '.join(extra[:5]) or 'none'}); use the same model and options, or model.init_skip"
        )
    out = dict(fresh)
    for name, value in fresh.items():
        if skipped(name):
            continue
        if saved[name].shape != value.shape:
            raise ConfigError(
                f"model.init_from: '{name}' has shape {tuple(saved[name].shape)} in '{file}' but "
                f"{tuple(value.shape)} in this model"
            )
        out[name] = saved[name].to(dtype=value.dtype, device=value.device)
    return out
