"""A pass reads the informers' objects themselves, uncopied (`InformedCluster.list_shared`): nothing in the
autoscaler may modify one. Every object a snapshot hands out is recorded with a deep copy beside it, and after a whole
lifecycle (launch, registration, initialization, binding, consolidation, termination, a bad NodePool) each must still
equal its copy."""

from __future__ import annotations

from typing import Any

import pytest

from kubegpu.autoscaler.objects import is_true
from kubegpu.autoscaler.sim_strategy import AutoscalerStrategy
from kubegpu.kube.informer import InformedCluster
from kubegpu.kube.memory import MemoryCluster
from kubegpu.kube.patching import clone
from kubegpu.sim.engine import Simulation
from kubegpu.sim.runner import scenario_jobs
from kubegpu.sim.scenario import parse_scenario
from tests.autoscaler.builders import Harness, instance_type, nodepool, pod
from tests.autoscaler.test_sim_strategy import SCENARIO

A100 = "A100-SXM4-80GB"
TYPES = [instance_type("a100.x1", 8, 64, 4.0, gpus=1, model=A100),
         instance_type("a100.x2", 16, 128, 8.5, gpus=2, model=A100),
         instance_type("cpu.4", 4, 16, 0.2)]


@pytest.fixture
def handed_out(monkeypatch: pytest.MonkeyPatch) -> dict[int, tuple[dict[str, Any], dict[str, Any]]]:
    """id → (object handed out by `list_shared`, a deep copy taken then)."""
    seen: dict[int, tuple[dict[str, Any], dict[str, Any]]] = {}
    real = InformedCluster.list_shared

    def recording(self: InformedCluster, kind: str) -> list[dict[str, Any]]:
        out = real(self, kind)
        for obj in out:
            if id(obj) not in seen or seen[id(obj)][0] is not obj:
                seen[id(obj)] = (obj, clone(obj))
        return out

    monkeypatch.setattr(InformedCluster, "list_shared", recording)
    return seen


def _modified(seen: dict[int, tuple[dict[str, Any], dict[str, Any]]]) -> list[str]:
    return [f"{obj.get('kind')} {obj['metadata'].get('name')}" for obj, copy in seen.values() if obj != copy]


def test_a_whole_lifecycle_modifies_no_object_it_reads(handed_out: dict[int, Any]) -> None:
    h = Harness(TYPES, registration_delay=20.0)
    h.add(nodepool("gpu", disruption={"consolidateAfter": "30s"}))
    h.add(nodepool("broken", requirements=[{"key": "x", "operator": "Bogus"}]))
    for i in range(3):
        h.add(pod(f"train-{i}", cpu="1", limits={"nvidia.com/gpu": 1}))
    h.run(40)
    assert h.claims() and all(is_true(c, "Initialized") for c in h.claims())
    assert all(p["spec"].get("nodeName") for p in h.cluster.list("Pod"))
    for i in range(3):
        h.finish(f"train-{i}")
    h.run(80)
    assert not h.claims() and not h.nodes()     # consolidated and terminated
    assert len(handed_out) > 30                  # object versions read: pools, claims, nodes, pods
    assert _modified(handed_out) == []


def test_the_simulator_strategy_modifies_no_object_it_reads(handed_out: dict[int, Any]) -> None:
    scenario = parse_scenario({**SCENARIO, "duration": "1h"}, "smoke.yaml")
    ours = AutoscalerStrategy("autoscaler:exclusive", None)
    result = Simulation(scenario, ours, scenario_jobs(scenario)).run()
    assert result.pods_completed > 0
    assert len(handed_out) > 50
    assert _modified(handed_out) == []


def test_a_shared_list_is_the_cache_itself_and_a_plain_list_a_copy() -> None:
    store = MemoryCluster()
    store.create({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1"}})
    informed = InformedCluster(store, ("Node",))
    [shared] = informed.list_shared("Node")
    assert informed.list_shared("Node")[0] is shared      # the same object until it changes
    assert informed.list("Node")[0] is not shared and informed.list("Node")[0] == shared
    store.patch("Node", "n1", {"metadata": {"labels": {"a": "b"}}})
    [changed] = informed.list_shared("Node")
    assert changed is not shared and changed["metadata"]["labels"] == {"a": "b"}
    assert "labels" not in shared["metadata"]            # what a pass already read stays as it read it
    assert informed.list_shared("Pod") == []             # not informed: read from the store
