"""The order a simulated GPU node comes up in: no GPU pod may become schedulable in the write that lifts the
`kubegpu.io/unregistered:NoExecute` taint.

kube-controller-manager's taint-eviction controller reads Nodes and Pods through separate informers. If lifting a
NoExecute taint is the last thing a pod waits for, kube-scheduler binds it at once and the controller, whose Node
informer may not have seen the taint go yet, deletes the pod as if it were still there (kubernetes#119862). That is
what made the real-control-plane consolidation test lose a pod now and then: the simulated device plugin published
the node's GPUs on a timer, so a pass slower than the registration delay published them *before* registration,
leaving the taint's removal as the last gate. As on a real GPU node, where the device plugin's DaemonSet pod cannot
run before the node is registered, the GPUs now appear only on a later pass than the one that registered it.
"""

from __future__ import annotations

import copy
from typing import Any

from kubegpu.autoscaler import labels as L
from kubegpu.autoscaler.objects import has_taint
from kubegpu.kube.cluster import WatchEvent
from kubegpu.scheduling import parse_quantity
from tests.autoscaler.builders import Harness, instance_type, nodepool, pod

A100 = "A100-SXM4-80GB"
TYPES = [instance_type("a100.x1", 8, 64, 4.0, gpus=1, model=A100)]


def _unregistered(node: dict[str, Any]) -> bool:
    return has_taint(node, L.UNREGISTERED_TAINT)


def _gpus(node: dict[str, Any]) -> float:
    return parse_quantity(((node.get("status") or {}).get("allocatable") or {}).get("nvidia.com/gpu", 0))


def _bring_up(registration_delay: float) -> tuple[Harness, list[tuple[float, dict[str, Any]]]]:
    h = Harness(TYPES, registration_delay=registration_delay, validation_delay=0.0)
    versions: list[tuple[float, dict[str, Any]]] = []   # (virtual time, Node) after every write to a Node

    def record(event: WatchEvent) -> None:
        versions.append((h.clock.now(), copy.deepcopy(event.object)))

    h.cluster.subscribe("Node", record)
    h.add(nodepool("gpu"))
    h.add(pod("train", limits={"nvidia.com/gpu": 1}))
    h.run(8)
    return h, versions


def test_a_pass_slower_than_the_registration_delay_still_registers_before_the_gpus_appear() -> None:
    # 1 s passes, 0.2 s delay: the pass after the launch finds the delay long over before it registers the node
    h, versions = _bring_up(registration_delay=0.2)
    untainted = [(t, n) for t, n in versions if not _unregistered(n)]
    assert untainted, "the node was never registered"
    lifted_at, first_untainted = untainted[0]
    assert _gpus(first_untainted) == 0   # lifting the NoExecute taint alone never makes a GPU pod schedulable
    assert not any(_gpus(n) for _, n in versions if _unregistered(n))
    published = [t for t, n in versions if _gpus(n) > 0]
    assert published and published[0] > lifted_at   # the device plugin comes up on a later pass
    [train] = h.cluster.list("Pod")
    assert train["spec"].get("nodeName") == first_untainted["metadata"]["name"]   # and the pod still gets the node


def test_a_long_registration_delay_keeps_its_timing() -> None:
    # registration comes long before the delay runs out: the GPUs appear when the delay says, as before
    _, versions = _bring_up(registration_delay=3.0)
    created = versions[0][0]
    published = [t for t, n in versions if _gpus(n) > 0]
    assert published and published[0] - created == 3.0
