"""NodePool status as Karpenter writes it: `ValidationSucceeded`, `NodeClassReady`, the root `Ready` and
`status.resources`; a pool whose NodeClass is not ready launches nothing and says why, and recovers when it is."""

from __future__ import annotations

from typing import Any

from kubegpu.autoscaler.api import NodePool
from kubegpu.autoscaler.pool_status import pool_conditions
from tests.autoscaler.builders import Harness, instance_type, nodepool, pod

TYPES = [instance_type("cpu.4", 4, 16, 0.2)]


def conditions(h: Harness, name: str) -> dict[str, dict[str, Any]]:
    raw = h.cluster.get("NodePool", name)
    return {c["type"]: c for c in (raw.get("status") or {}).get("conditions") or []}


def test_a_pool_whose_nodeclass_is_not_ready_launches_nothing_and_its_status_says_why() -> None:
    h = Harness(TYPES, registration_delay=2.0)
    why: list[str | None] = ["nodepool gpu: EC2NodeClass default is not ready: SubnetsReady=False: no subnet "
                             "matches subnetSelectorTerms [{'tags': {'team': 'x'}}]"]

    def not_ready(pool: NodePool) -> str | None:
        return why[0] if pool.name == "gpu" else None

    h.provider.pool_not_ready = not_ready  # type: ignore[attr-defined]   # as the aws provider offers it
    h.add(nodepool("gpu"))
    h.add(pod("job", cpu="1"))
    h.run(5)
    assert h.claims() == []
    conds = conditions(h, "gpu")
    assert conds["NodeClassReady"]["status"] == "False"
    assert conds["NodeClassReady"]["reason"] == "NodeClassNotReady"
    assert "no subnet matches subnetSelectorTerms" in conds["NodeClassReady"]["message"]
    assert conds["Ready"]["status"] == "False" and conds["Ready"]["reason"] == "UnhealthyDependents"
    assert conds["Ready"]["message"].startswith("NodeClassReady=False: nodepool gpu: EC2NodeClass default")
    assert conds["ValidationSucceeded"]["status"] == "True"

    why[0] = None   # the class becomes ready: the pool launches and its status turns Ready
    h.run(10)
    assert len(h.claims()) == 1
    conds = conditions(h, "gpu")
    assert conds["NodeClassReady"]["status"] == "True" and conds["Ready"]["status"] == "True"
    assert h.cluster.get("NodePool", "gpu")["status"]["resources"]["nodes"] == "1"


def test_an_invalid_pool_is_not_ready_and_a_good_one_is() -> None:
    h = Harness(TYPES, registration_delay=2.0)
    h.add(nodepool("broken", requirements=[{"key": "x", "operator": "In", "values": []}]))
    h.add(nodepool("good"))
    h.run(2)
    broken, good = conditions(h, "broken"), conditions(h, "good")
    assert broken["ValidationSucceeded"]["status"] == "False"
    assert "spec.template.spec.requirements[0]" in broken["ValidationSucceeded"]["message"]
    assert broken["Ready"]["status"] == "False"
    assert good["Ready"]["status"] == "True" and good["NodeClassReady"]["status"] == "True"   # kwok: no class


def test_conditions_keep_their_transition_time_while_unchanged() -> None:
    first = pool_conditions([], None, "EC2NodeClass x not found", 100.0, generation=3)
    assert {c["type"]: c["reason"] for c in first} == {"ValidationSucceeded": "ValidationSucceeded",
                                                        "NodeClassReady": "NodeClassNotFound",
                                                        "Ready": "UnhealthyDependents"}
    assert all(c["observedGeneration"] == 3 for c in first)
    again = pool_conditions(first, None, "EC2NodeClass x not found", 200.0)
    assert [c["lastTransitionTime"] for c in again] == [c["lastTransitionTime"] for c in first]
    healed = {c["type"]: c for c in pool_conditions(again, None, None, 300.0)}
    assert healed["Ready"]["status"] == "True" and healed["Ready"]["lastTransitionTime"] != first[2][
        "lastTransitionTime"]
