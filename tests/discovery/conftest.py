"""Shared helpers for the discovery tests: simulated nodes in a given MIG layout, and golden-file parsing."""

from __future__ import annotations

from pathlib import Path

import pytest

from kubegpu.config.deviceplugin import parse_device_plugin_config
from kubegpu.config.migparted import default_mig_parted_config
from kubegpu.gpu.simulated import SimulatedBackend, parse_gpu_spec
from kubegpu.sharing.migapply import execute, plan_apply, read_state

GOLDEN = Path(__file__).parent / "golden"
NOW = 1755600000.0


def sim_node(gpus: str, mig_config: str | None = None) -> SimulatedBackend:
    """An in-memory node, with a default mig-parted config applied when named."""
    backend = SimulatedBackend.create(None, gpus)
    if mig_config is not None:
        config = default_mig_parted_config(parse_gpu_spec(gpus))
        execute(plan_apply(config, mig_config, read_state(backend)), backend)
    return backend


def plugin_config(data: dict[str, object]) -> object:
    return parse_device_plugin_config({"version": "v1", **data}, "test config")


def read_golden(name: str) -> dict[str, str]:
    """`key=value` lines of an expected-labels file; `#` lines are comments."""
    labels: dict[str, str] = {}
    for line in (GOLDEN / name).read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            key, _, value = line.partition("=")
            assert key not in labels, f"{name}: {key} listed twice"
            labels[key] = value
    return labels


@pytest.fixture
def tmp_features(tmp_path: Path) -> Path:
    return tmp_path / "features.d" / "gfd"
