"""The simulator knows strategies only through its registry: built-ins register themselves, components offer theirs
as `kubegpu.sim.strategies` entry points, and nothing in `kubegpu.sim` names a component."""

from __future__ import annotations

import subprocess
import sys
from importlib.metadata import EntryPoint
from pathlib import Path

import pytest

import kubegpu.sim
from kubegpu.errors import ConfigError
from kubegpu.sim import strategies
from kubegpu.sim.strategies import ENTRY_POINT_GROUP, Exclusive, available_strategies, get_strategy

SIM = Path(kubegpu.sim.__file__).parent
COMPONENTS = ("kubegpu.partitioner", "kubegpu.autoscaler", "kubegpu/partitioner", "kubegpu/autoscaler")


def make_fake(argument: str | None) -> Exclusive:
    return Exclusive(f"fake:{argument}")


def test_no_sim_module_names_a_component() -> None:
    """Not even as a string for a dynamic import: the only way in is the registry."""
    for path in sorted(SIM.glob("*.py")):
        text = path.read_text()
        assert not [name for name in COMPONENTS if name in text], path.name


def test_simulating_a_built_in_strategy_imports_no_component() -> None:
    code = ("import sys\n"
            "from kubegpu.sim.runner import run_scenario\n"
            "from kubegpu.sim.scenario import default_scenario\n"
            "from kubegpu.sim.strategies import available_strategies\n"
            "scenario = default_scenario().model_copy(update={'duration': 3600.0})\n"
            "assert 'dynamic-mig' in available_strategies()\n"
            "run_scenario(scenario, ['exclusive', 'time-slicing:4'])\n"
            "loaded = [m for m in sys.modules if m.startswith(('kubegpu.partitioner', 'kubegpu.autoscaler'))]\n"
            "print(loaded)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert out.stdout.strip() == "[]"


def test_components_offer_their_strategies_as_entry_points() -> None:
    assert {"dynamic-mig", "dynamic-mps", "autoscaler"} <= set(available_strategies())
    assert type(get_strategy("dynamic-mps")).__module__ == "kubegpu.partitioner.sim_strategy"
    assert get_strategy("autoscaler:time-slicing-4").name == "autoscaler:time-slicing-4"


def test_an_entry_point_is_loaded_only_when_its_name_is_asked_for(monkeypatch: pytest.MonkeyPatch) -> None:
    point = EntryPoint("fake", f"{__name__}:make_fake", ENTRY_POINT_GROUP)
    monkeypatch.setattr(strategies, "_plugins", lambda: {"fake": point})
    monkeypatch.setattr(strategies, "_REGISTRY", dict(strategies._REGISTRY))
    assert "fake" in available_strategies() and "fake" not in strategies._REGISTRY
    assert get_strategy("fake:7").name == "fake:7"
    with pytest.raises(ConfigError, match=r"^unknown strategy 'nope'; available: .*exclusive, fake, "):
        get_strategy("nope")


def test_an_entry_point_whose_module_is_gone_is_an_unknown_strategy(monkeypatch: pytest.MonkeyPatch) -> None:
    point = EntryPoint("gone", "kubegpu_removed_component.sim:factory", ENTRY_POINT_GROUP)
    monkeypatch.setattr(strategies, "_plugins", lambda: {"gone": point})
    monkeypatch.setattr(strategies, "_REGISTRY", dict(strategies._REGISTRY))
    with pytest.raises(ConfigError, match=r"^unknown strategy 'gone'"):
        get_strategy("gone")
