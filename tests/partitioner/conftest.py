"""Helpers shared by the partitioner tests: pods and nodes in the planner's input shape."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from kubegpu.gpu.catalog import get_model
from kubegpu.partitioner.planner import CurrentInstance, GpuInput, MpsSlice, NodeInput

BENCHMARK = Path(__file__).resolve().parents[2] / "benchmarks" / "partitioner_quality.py"


@pytest.fixture(scope="session")
def bench() -> ModuleType:
    """benchmarks/partitioner_quality.py as a module: its generators and reference optimum, for the tests."""
    spec = importlib.util.spec_from_file_location("partitioner_quality", BENCHMARK)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve their module by name
    spec.loader.exec_module(module)
    return module


def make_pod(name: str, resources: dict[str, int], priority: int = 0,
             node_selector: dict[str, str] | None = None, namespace: str = "default") -> dict[str, Any]:
    limits = {k: str(v) for k, v in resources.items()}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"priority": priority, "nodeSelector": node_selector or {},
                 "containers": [{"name": "main", "resources": {"limits": limits}}]},
        "status": {"phase": "Pending"},
    }


def mig_node(name: str, gpus: list[tuple[str, list[tuple[str, int, bool]]]],
             labels: dict[str, str] | None = None) -> NodeInput:
    """gpus: [(model key, [(profile name, start, used), ...]), ...]"""
    inputs = []
    for index, (model_key, instances) in enumerate(gpus):
        model = get_model(model_key)
        inputs.append(GpuInput(index, model.key, model, tuple(
            CurrentInstance(model.profile(p).profile_id, s, u) for p, s, u in instances)))
    node = {"metadata": {"name": name, "labels": dict(labels or {})}, "spec": {}, "status": {}}
    return NodeInput(name, "mig", node, tuple(inputs))


def mps_node(name: str, gpus: list[tuple[str, list[tuple[int, bool]]]]) -> NodeInput:
    inputs = []
    for index, (model_key, slices) in enumerate(gpus):
        model = get_model(model_key)
        inputs.append(GpuInput(index, model.key, model, slices=tuple(MpsSlice(gb, u) for gb, u in slices)))
    return NodeInput(name, "mps", {"metadata": {"name": name, "labels": {}}}, tuple(inputs))


@pytest.fixture(scope="session", name="make_pod")
def make_pod_fixture() -> Callable[..., dict[str, Any]]:
    return make_pod


@pytest.fixture(scope="session", name="mig_node")
def mig_node_fixture() -> Callable[..., NodeInput]:
    return mig_node


@pytest.fixture(scope="session", name="mps_node")
def mps_node_fixture() -> Callable[..., NodeInput]:
    return mps_node
