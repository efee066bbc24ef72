"""What a new leader's first pass finds and puts right (recovery.py), and the kwok provider after a restart: it
finds its instances in the Nodes and removes no finalizer it did not put there."""

from __future__ import annotations

from typing import Any

import pytest

from kubegpu.autoscaler import labels as L
from kubegpu.autoscaler.controller import Autoscaler, Options
from kubegpu.autoscaler.provider import NodeClaimNotFoundError, SimulatedProvider
from kubegpu.autoscaler.recovery import DISRUPTED_REASON_ANNOTATION, UNUSED
from kubegpu.autoscaler.termination import REASON_ANNOTATION
from tests.autoscaler.builders import Harness, instance_type, nodepool, pod

TYPES = [instance_type("small", 2, 8, 0.10)]
OTHER_TAINT = {"key": "example.com/maintenance", "effect": "NoSchedule"}


def one_node() -> tuple[Harness, dict[str, Any], str]:
    h = Harness(TYPES, registration_delay=2.0, disruption=False)
    h.add(nodepool("cpu"))
    h.add_replicated(pod("a", cpu="1"))
    h.run(10)
    [claim] = h.claims()
    return h, claim, claim["status"]["nodeName"]


def new_leader(h: Harness) -> Autoscaler:
    """A fresh replica on the same cluster: fresh provider, informers and memory."""
    h.autoscaler.close()
    provider = SimulatedProvider(h.cluster, TYPES, h.clock, registration_delay=2.0)
    return Autoscaler(h.cluster, provider, h.clock, Options(validation_delay=15.0, disruption=False),
                      log=h.lines.append)


def taints(h: Harness, node: str) -> list[str]:
    return [t["key"] for t in h.cluster.get("Node", node)["spec"].get("taints") or []]


def test_an_orphan_disrupted_taint_is_lifted_and_other_taints_stay() -> None:
    h, _, node = one_node()
    current = h.cluster.get("Node", node)["spec"].get("taints") or []
    h.cluster.patch("Node", node, {"spec": {"taints": [*current, dict(L.DISRUPTED_TAINT), OTHER_TAINT]}})
    scaler = new_leader(h)   # the leader that laid the taint died before recording why
    scaler.step()
    assert taints(h, node) == [OTHER_TAINT["key"]] and scaler.recovery.lifted == [node]
    assert h.cluster.list("NodeClaim") and h.cluster.get("Pod", "a")["spec"]["nodeName"] == node


def test_a_recorded_taint_is_not_orphan() -> None:
    h, _, node = one_node()
    h.cluster.patch("Node", node, {"metadata": {"annotations": {DISRUPTED_REASON_ANNOTATION: UNUSED}},
                                   "spec": {"taints": [dict(L.DISRUPTED_TAINT)]}})
    scaler = new_leader(h)
    scaler.step()   # a surplus cordon: the provisioner takes it over (the pod on it: uncordoned, not orphan-lifted)
    assert scaler.recovery.lifted == [] and L.DISRUPTED_TAINT["key"] not in taints(h, node)
    assert any("in use after all" in line for line in h.lines)


def test_a_recorded_termination_is_finished() -> None:
    h, claim, node = one_node()
    name = claim["metadata"]["name"]
    h.cluster.patch("NodeClaim", name, {"metadata": {"annotations": {REASON_ANNOTATION: "expired"}}})
    scaler = new_leader(h)   # the old leader recorded why, then died before deleting the claim
    for _ in range(10):
        h.clock.advance(1)
        scaler.step()
    assert name not in {c["metadata"]["name"] for c in h.cluster.list("NodeClaim")}
    assert scaler.recovery.resumed == [name]
    assert all(n["metadata"]["name"] != node for n in h.cluster.list("Node"))


def test_the_kwok_provider_finds_its_instances_after_a_restart_and_keeps_others_finalizers() -> None:
    h, claim, node = one_node()
    pid = claim["status"]["providerID"]
    restarted = SimulatedProvider(h.cluster, TYPES, h.clock, registration_delay=2.0)   # nothing in memory
    assert restarted.get(pid)["metadata"]["name"] == node   # running, not "gone"
    assert [n["spec"]["providerID"] for n in restarted.list()] == [pid]   # its Nodes are its instances
    finalizers = h.cluster.get("Node", node)["metadata"]["finalizers"]
    h.cluster.patch("Node", node, {"metadata": {"finalizers": [*finalizers, "example.com/keep"]}})
    restarted.delete(claim)
    left = h.cluster.get("Node", node)["metadata"]
    assert left.get("deletionTimestamp") and sorted(left["finalizers"]) == sorted([*finalizers, "example.com/keep"])
    with pytest.raises(NodeClaimNotFoundError):   # its Node is being deleted: the instance is gone
        restarted.get(pid)
