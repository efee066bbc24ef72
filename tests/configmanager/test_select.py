"""Which config a node runs (NVIDIA config-manager's rules), as a pure function."""

from __future__ import annotations

import pytest

from kubegpu.configmanager.select import (
    EMPTY,
    available_configs,
    parse_fallbacks,
    select_config,
)
from kubegpu.errors import ConfigError

CONFIGS = ["mps", "time-slicing", "whole"]


def test_the_label_names_the_config() -> None:
    chosen = select_config("mps", CONFIGS, default="whole")
    assert chosen.name == "mps" and "nvidia.com/device-plugin.config=mps" in chosen.why


def test_no_label_or_an_empty_one_takes_the_default() -> None:
    assert select_config(None, CONFIGS, default="whole").name == "whole"
    assert select_config("", CONFIGS, default="whole").name == "whole"


def test_a_label_naming_no_config_is_one_line_naming_label_and_choices() -> None:
    with pytest.raises(ConfigError) as caught:
        select_config("mpss", CONFIGS, default="whole")
    message = str(caught.value)
    assert message == "node label nvidia.com/device-plugin.config=mpss: no such config " \
                      "(available: mps, time-slicing, whole)"


def test_a_default_naming_no_config_is_an_error_not_a_silent_fallback() -> None:
    with pytest.raises(ConfigError, match="default config 'gone': no such config"):
        select_config(None, CONFIGS, default="gone", fallbacks=("empty",))


@pytest.mark.parametrize(("available", "fallbacks", "expected"), [
    (["default", "mps"], ("named", "single"), "default"),
    (["mps"], ("named", "single"), "mps"),
    (["mps", "whole"], ("named", "single", "empty"), EMPTY),
    (["mps"], ("empty", "single"), EMPTY),  # in the order given
])
def test_fallbacks_in_order(available: list[str], fallbacks: tuple[str, ...], expected: str) -> None:
    assert select_config(None, available, fallbacks=fallbacks).name == expected


def test_no_label_no_default_no_fallback_is_an_error() -> None:
    with pytest.raises(ConfigError, match=r"no fallback applies \(fallbacks: named, single; available: mps, whole\)"):
        select_config(None, ["mps", "whole"], fallbacks=("named", "single"))


def test_a_configmap_volumes_own_entries_are_not_configs() -> None:
    assert available_configs(["..data", "..2026_11_27_03_00_00.123", "whole", "mps"]) == ["mps", "whole"]


def test_fallback_strategies_parse_like_the_env_var() -> None:
    assert parse_fallbacks("named, single,empty") == ("named", "single", "empty")
    assert parse_fallbacks("") == ()
    with pytest.raises(ConfigError, match="unknown strategy 'first'"):
        parse_fallbacks("named,first")
