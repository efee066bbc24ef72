"""Holding a new node for the pods it was bought for (`autoscaler/nomination.py`, `reservations.py`): the reservation
taint and its tolerations, when the taint is lifted, and which `status.nominatedNodeName` writes a pass sends."""

from __future__ import annotations

from typing import Any

from kubegpu.autoscaler.labels import RESERVED_TAINT_KEY
from kubegpu.autoscaler.nomination import (
    by_pod,
    node_names,
    nomination_writes,
    reservation_taint,
    reservation_tokens,
    reservation_toleration,
    reservations_to_lift,
    tolerations_due,
    without_reservation,
)
from kubegpu.scheduling import fits, node_info
from tests.autoscaler.builders import Harness, instance_type, nodepool, pod

A100 = "A100-SXM4-80GB"
TAINT = {"key": "team", "value": "a", "effect": "NoSchedule"}


def claim(name: str, token: str | None = None, node: str = "") -> dict[str, Any]:
    taints = [TAINT, *([reservation_taint(token)] if token else [])]
    return {"metadata": {"name": name}, "spec": {"taints": taints}, "status": {"nodeName": node} if node else {}}


def node(name: str, token: str | None = None) -> dict[str, Any]:
    return {"metadata": {"name": name}, "spec": {"taints": [reservation_taint(token)] if token else []},
            "status": {"allocatable": {"cpu": "8", "memory": "64Gi", "pods": "110", "nvidia.com/gpu": "4"}}}


def gpu_pod(name: str, gpus: int = 1, nominated: str = "", tolerations: list[dict[str, Any]] | None = None,
            ) -> dict[str, Any]:
    made = pod(name, cpu="1", memory="1Gi", limits={"nvidia.com/gpu": gpus},
               **({"spec": {"tolerations": tolerations}} if tolerations else {}))
    if nominated:
        made["status"]["nominatedNodeName"] = nominated
    return made


def test_only_the_pods_planned_onto_a_reserved_node_tolerate_it_and_the_planner_looks_past_the_taint() -> None:
    reserved = node("n1", "tok1")
    planned = gpu_pod("planned", tolerations=[reservation_toleration("tok1")])
    other = gpu_pod("other", tolerations=[reservation_toleration("tok2")])   # held for another node
    assert fits(planned, node_info(reserved, [])).ok
    assert not fits(other, node_info(reserved, [])).ok
    assert not fits(gpu_pod("plain"), node_info(reserved, [])).ok
    # the planner's own view: the reservation is gone, every other taint stays
    seen = without_reservation({**claim("c1", "tok1")})
    assert seen["spec"]["taints"] == [TAINT]
    assert claim("c1", "tok1")["spec"]["taints"][1]["key"] == RESERVED_TAINT_KEY   # the original is not changed


def test_a_pod_planned_onto_a_reserved_claim_or_node_is_given_its_toleration_once() -> None:
    claims = [claim("c1", "tok1"), claim("c2", "tok2", node="n2"), claim("c3")]   # c3: not reserved
    tokens = reservation_tokens(claims, {"n2": node("n2", "tok2")})
    assert tokens == {"c1": "tok1", "c2": "tok2", "n2": "tok2"}
    nominations = {"c1": {"default/a"}, "n2": {"default/b"}, "nodeclaim/c3": {"default/c"}}
    per_pod = by_pod(nominations, tokens)
    assert per_pod == {"default/a": "tok1", "default/b": "tok2"}
    a, b, c = gpu_pod("a"), gpu_pod("b", tolerations=[reservation_toleration("tok2")]), gpu_pod("c")
    assert [(p["metadata"]["name"], t) for p, t in tolerations_due([a, b, c], per_pod)] == [("a", "tok1")]


def test_a_reservation_is_lifted_once_no_pending_pod_is_planned_onto_the_node() -> None:
    nodes = {"n1": node("n1", "t1"), "n2": node("n2", "t2"), "n3": node("n3"), "n4": node("n4", "t4")}
    node_of_claim = {"c1": "n1", "c2": "n2"}
    # n1's pod (nominated through its claim) still waits; n2's pod is bound (no longer pending); n3 holds no
    # reservation; n4 was reserved by a previous leader whose plan this replica does not have
    nominations = {"c1": {"default/a"}, "nodeclaim/c2": {"default/b"}}
    assert reservations_to_lift(nodes, node_of_claim, nominations, ["default/a"]) == ["n2", "n4"]
    assert reservations_to_lift(nodes, node_of_claim, nominations, ["default/a", "default/b"]) == ["n4"]


def test_a_pod_is_nominated_to_its_node_once_and_only_our_stale_nominations_are_cleared() -> None:
    names = node_names([claim("c1", node="n1"), claim("c2")], ["n9"])   # c2 not launched: no node name yet
    assert names == {"n9": "n9", "c1": "n1"}
    wanted = by_pod({"c1": {"default/a", "default/b"}, "c2": {"default/c"}}, names)
    assert wanted == {"default/a": "n1", "default/b": "n1"}
    a = gpu_pod("a")                           # not nominated yet: written
    b = gpu_pod("b", nominated="n1")           # already carries it
    c = gpu_pod("c", nominated="n7")           # ours, from an earlier plan: its node is not where it goes now
    d = gpu_pod("d", nominated="n8")           # kube-scheduler's (a preemption): not ours to clear
    writes = nomination_writes([a, b, c, d], wanted, {"default/c": "n7"})
    assert [(p["metadata"]["name"], n) for p, n in writes] == [("a", "n1"), ("c", None)]
    # kube-scheduler 1.37 clears a nomination after a failed attempt; written once, it is not fought over
    assert nomination_writes([gpu_pod("a")], wanted, {"default/a": "n1"}) == []


def test_a_burst_holds_each_new_node_for_its_pods_and_lets_the_leftover_room_go_once_they_are_bound() -> None:
    h = Harness([instance_type("g.x4", 32, 256, 4.0, gpus=4, model=A100)], registration_delay=0.0,
                batch_idle=1.0, batch_max=2.0)
    h.add(nodepool("gpu", disruption={"consolidateAfter": "Never"}))
    for i in range(2):
        h.add(pod(f"p{i}", cpu="1", memory="1Gi", limits={"nvidia.com/gpu": 3}))   # one 4-GPU node each
    h.run(3, bind=False)
    claims = h.claims()
    tokens = {c["metadata"]["name"]: next(t["value"] for t in c["spec"]["taints"] if t["key"] == RESERVED_TAINT_KEY)
              for c in claims}
    assert len(claims) == 2 and len(set(tokens.values())) == 2
    nodes = {n["metadata"]["name"]: n for n in h.nodes()}
    held = {n: next(t["value"] for t in node["spec"]["taints"] if t["key"] == RESERVED_TAINT_KEY)
            for n, node in nodes.items()}
    for p in h.cluster.list("Pod"):   # each pod tolerates one reservation, and is nominated to the node holding it
        [tolerated] = [t["value"] for t in p["spec"]["tolerations"] if t.get("key") == RESERVED_TAINT_KEY]
        assert held[p["status"]["nominatedNodeName"]] == tolerated
    late = h.add(pod("late", cpu="1", memory="1Gi", limits={"nvidia.com/gpu": 1}))   # not planned onto them
    assert not any(fits(late, node_info(n, [])).ok for n in nodes.values())   # held: it cannot take their room
    h.writer.delete("Pod", "late", namespace="default")
    h.run(3)   # kube-scheduler binds the two; their nodes' reservations are lifted
    assert all(p["spec"].get("nodeName") for p in h.cluster.list("Pod"))
    assert all(t["key"] != RESERVED_TAINT_KEY for n in h.nodes() for t in n["spec"].get("taints") or [])
