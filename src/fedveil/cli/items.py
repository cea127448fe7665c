"""Command-line items: one optional config file among ``key=value`` overrides."""
from __future__ import annotations

from ..errors import ConfigError


def split_items(items: list[str]) -> tuple[str | None, list[str]]:
    """(the config file or None, the overrides) of a command's positional items."""
    configs = [i for i in items if "=" not in i]
    if len(configs) > 1:
        raise ConfigError(f"give at most one config file, got {', '.join(configs)}")
    return (configs[0] if configs else None), [i for i in items if "=" in i]
