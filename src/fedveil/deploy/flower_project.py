"""The Flower app folder ``flwr run`` ships to the SuperLink and every SuperNode
(``fedveil deploy app``).

It holds only a ``pyproject.toml``: the components are fedveil's own
(:mod:`fedveil.deploy.flower_app`), installed on every machine, and the run's config
travels inside the app's config as JSON, so the server and every silo run exactly the
same config (each silo checks it against the one its folder was prepared for).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..config import RunConfig

APP_NAME = "fedveil-deployment"


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    return json.dumps(str(value))  # a JSON string is a valid TOML basic string


def write_flower_app(
    out: str | Path, config: RunConfig, federation: str | Path, server_out: str | Path, timeout: float = 120.0,
) -> Path:
    """Write the app folder ``out`` for ``config``; the server reads ``federation``
    (``federation.json``) and writes its run directory to ``server_out``. Both paths are
    the server machine's; ``--run-config 'out=... resume=true'`` overrides them per run."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    settings = {
        "config": json.dumps(config.model_dump(mode="json"), sort_keys=True),
        "federation": str(Path(federation).resolve()),
        "out": str(Path(server_out).resolve()),
        "resume": False,
        "timeout": float(timeout),
    }
    lines = [
        "# Written by `fedveil deploy app`: the Flower app of one fedveil run (docs/deployment.md).",
        "[build-system]",
        'requires = ["hatchling"]',
        'build-backend = "hatchling.build"',
        "",
        "[project]",
        f'name = "{APP_NAME}"',
        'version = "1.0.0"',
        'description = "A fedveil run deployed with Flower"',
        'license = "Apache-2.0"',
        'dependencies = ["fedveil[flower]"]',
        "",
        "[tool.hatch.build.targets.wheel]",
        'packages = ["."]',
        "",
        "[tool.flwr.app]",
        'publisher = "fedveil"',
        "",
        "[tool.flwr.app.components]",
        'serverapp = "fedveil.deploy.flower_app:server_app"',
        'clientapp = "fedveil.deploy.flower_client:client_app"',
        "",
        "[tool.flwr.app.config]",
        *(f"{key} = {_toml_value(value)}" for key, value in settings.items()),
        "",
    ]
    (out / "pyproject.toml").write_text("\n".join(lines))
    return out
