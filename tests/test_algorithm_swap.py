"""An example config's method-only settings do not break ``algorithm.name=<baseline>``
(issue 36, item 6: docs/adds.md's FedDrop command failed with "Extra inputs are not permitted")."""
from __future__ import annotations

from pathlib import Path

import pytest

from fedveil.config import load_config
from fedveil.errors import ConfigError

ADDS_EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "adds_digits.toml"


def test_swapping_the_algorithm_drops_the_files_settings_the_new_one_does_not_take():
    with pytest.warns(UserWarning, match=r"left out the file's adds settings it does not take: alpha_init, arch_lr, eps0"):
        config = load_config(ADDS_EXAMPLE, ["algorithm.name=feddrop"])
    assert config.algorithm.name == "feddrop"
    assert not {"eps0", "alpha_init", "arch_lr"} & set(config.algorithm.params_dict())


def test_a_setting_given_on_the_command_line_is_still_checked():
    with pytest.raises(ConfigError, match="eps0"):
        load_config(ADDS_EXAMPLE, ["algorithm.name=feddrop", "algorithm.eps0=0.5"])


def test_the_files_own_algorithm_keeps_every_setting():
    config = load_config(ADDS_EXAMPLE, ["algorithm.eps0=0.5"])
    assert config.algorithm.params_dict()["eps0"] == 0.5 and config.algorithm.params_dict()["arch_lr"] == 0.01
