"""GPU-aware disruption: running Job pods and do-not-disrupt keep consolidation away; fatal-XID nodes are repaired."""

from __future__ import annotations

from typing import Any

from kubegpu.autoscaler import labels as L
from kubegpu.autoscaler.disruption import not_safe_to_move
from kubegpu.autoscaler.lifecycle import Lifecycle
from kubegpu.clock import VirtualClock
from kubegpu.kube import MemoryCluster
from tests.autoscaler.builders import pod, pool


def job_pod(name: str, phase: str = "Running") -> dict[str, Any]:
    p = pod(name, metadata={"ownerReferences": [{"kind": "Job", "name": "train", "apiVersion": "batch/v1",
                                                 "uid": "u"}]}, spec={"nodeName": "n1"})
    p["status"] = {"phase": phase}
    return p


def test_running_job_pods_and_karpenter_do_not_disrupt_block_consolidation() -> None:
    plain = pool("gpu")
    assert not_safe_to_move(job_pod("t"), plain) == "pod t is a running Job pod"
    assert not_safe_to_move(job_pod("done", "Succeeded"), plain) is None
    web = pod("web", spec={"nodeName": "n1"}, metadata={"ownerReferences": [{"kind": "ReplicaSet"}]})
    assert not_safe_to_move(web, plain) is None
    held = pod("h", metadata={"annotations": {"karpenter.sh/do-not-disrupt": "true"}})
    assert not_safe_to_move(held, plain) == "pod h has karpenter.sh/do-not-disrupt"
    opted = pool("gpu")
    opted.metadata.__pydantic_extra__ = {"annotations": {"kubegpu.io/disrupt-running-jobs": "true"}}
    assert not_safe_to_move(job_pod("t"), opted) is None
    assert not_safe_to_move(held, opted) is not None   # do-not-disrupt is never overridden by the pool


def claim_and_node(i: int, healthy: bool) -> tuple[dict[str, Any], dict[str, Any]]:
    claim = {"apiVersion": "kubegpu.io/v1", "kind": "NodeClaim",
             "metadata": {"name": f"c{i}", "labels": {L.NODEPOOL_LABEL: "gpu"}},
             "status": {"nodeName": f"n{i}"}}
    conditions = [{"type": "Ready", "status": "True"},
                  {"type": "AcceleratedHardwareReady", "status": "True" if healthy else "False",
                   "reason": "XID79" if not healthy else "Healthy"}]
    node = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": f"n{i}"}, "status": {"conditions": conditions}}
    return claim, node


def test_fatal_xid_nodes_are_replaced_after_ten_minutes_unless_too_many_are_sick() -> None:
    clock = VirtualClock(0.0)
    terminated: list[tuple[str, str]] = []
    record = lambda c, r: terminated.append((c["metadata"]["name"], r))  # noqa: E731
    life = Lifecycle(MemoryCluster(clock), None, clock, record)  # type: ignore[arg-type]
    pairs = [claim_and_node(i, healthy=i != 0) for i in range(10)]
    claims, nodes = [c for c, _ in pairs], {n["metadata"]["name"]: n for _, n in pairs}
    assert life.repair(claims, nodes) == []
    clock.advance(599)
    assert life.repair(claims, nodes) == []
    clock.advance(1)
    assert life.repair(claims, nodes) == ["c0"] and terminated == [("c0", "unhealthy")]
    # three of ten sick at once (> 20 %): an outage, nothing is replaced
    sick = [claim_and_node(i, healthy=i >= 3) for i in range(10)]
    life2 = Lifecycle(MemoryCluster(clock), None, clock, record)  # type: ignore[arg-type]
    claims2, nodes2 = [c for c, _ in sick], {n["metadata"]["name"]: n for _, n in sick}
    life2.repair(claims2, nodes2)
    clock.advance(700)
    assert life2.repair(claims2, nodes2) == []
    # a node that recovers restarts its clock
    healthy0 = claim_and_node(0, healthy=True)[1]
    life.repair(claims, {**nodes, "n0": healthy0})
    assert "c0" not in life._unhealthy_since
