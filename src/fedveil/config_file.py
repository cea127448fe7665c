"""Reading a TOML config file: one readable error for a missing or malformed file, and data
paths made independent of the working directory (read from the file's own folder)."""
from __future__ import annotations

import os
import tomllib
from pathlib import Path
from typing import Any

from .errors import ConfigError


def read_config_file(path: str | Path) -> dict[str, Any]:
    """The TOML table of config file ``path``, its data paths resolved by
    :func:`file_relative_paths`; a ConfigError of one line when it is missing or not TOML."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file '{path}' does not exist")
    try:
        raw = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as err:
        raise ConfigError(f"config file '{path}' is not valid TOML: {' '.join(str(err).split())}") from None
    return file_relative_paths(raw, path.parent)


# data paths a config file may give; relative ones are read from the file's own folder
FILE_RELATIVE_PATHS = (("data", "root"), ("data", "options", "base_root"), ("data", "dir"))  # data.dir: fedveil pets


def file_relative_paths(raw: dict[str, Any], folder: Path) -> dict[str, Any]:
    """``raw`` (a config file's table) with its data paths made absolute: ``~`` and
    ``$VARS`` (e.g. ``$FEDVEIL_DATA/mnist-10k``) expanded, then a relative path joined to
    ``folder``, so an example config runs from any working directory."""
    for keys in FILE_RELATIVE_PATHS:
        node = raw
        for key in keys[:-1]:
            node = node.get(key) if isinstance(node, dict) else None
        if not isinstance(node, dict) or not isinstance(node.get(keys[-1]), str):
            continue
        value = Path(os.path.expandvars(node[keys[-1]])).expanduser()
        node[keys[-1]] = str(value if value.is_absolute() else (folder.resolve() / value).resolve())
    return raw
