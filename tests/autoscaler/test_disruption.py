"""Disruption as Karpenter does it: emptiness, consolidation delete and replace, budgets, do-not-disrupt, PDBs,
expiry and the drain order."""

from __future__ import annotations

import itertools
from typing import Any

from kubegpu.autoscaler.disruption import pod_disruption_cost
from kubegpu.autoscaler.objects import drain_group, is_true
from tests.autoscaler.builders import Harness, instance_type, nodepool, pod

TYPES = [instance_type("small", 2, 8, 0.10), instance_type("medium", 4, 16, 0.20),
         instance_type("large", 8, 32, 0.40)]


def node_of(h: Harness, pod_name: str) -> str | None:
    for p in h.cluster.list("Pod"):
        if p["metadata"]["name"] == pod_name:
            return p["spec"].get("nodeName")
    return None


def pod_names(h: Harness) -> set[str]:
    return {p["metadata"]["name"] for p in h.cluster.list("Pod")}


def run_until(h: Harness, done: Any, seconds: float = 120) -> None:
    for _ in range(int(seconds)):
        h.run(1)
        if done():
            return
    raise AssertionError("condition not reached")


def provisioned(h: Harness, *pods: dict[str, Any], seconds: float = 30) -> None:
    for p in pods:
        h.add(p)
    h.run(seconds)


def test_empty_nodes_go_within_budget() -> None:
    h = Harness(TYPES, registration_delay=2.0)
    h.add(nodepool("cpu", disruption={"budgets": [{"nodes": "1"}]}))
    anti = {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
        {"topologyKey": "kubernetes.io/hostname", "labelSelector": {"matchLabels": {"app": "x"}}}]}}
    provisioned(h, *[pod(f"p{i}", cpu="1", metadata={"labels": {"app": "x"}}, spec={"affinity": anti})
                     for i in range(3)], seconds=10)
    assert len(h.nodes()) == 3
    for i in range(3):
        h.finish(f"p{i}")
    counts = [3]
    for _ in range(150):
        h.run(1)
        counts.append(len(h.nodes()))
    assert counts[-1] == 0
    assert all(a - b <= 1 for a, b in itertools.pairwise(counts))   # budget: one node at a time


def test_budget_zero_blocks_and_do_not_disrupt_node_is_kept() -> None:
    h = Harness(TYPES, registration_delay=2.0, validation_delay=0.0)
    h.add(nodepool("frozen", disruption={"budgets": [{"nodes": "0"}]}))
    provisioned(h, pod("a", cpu="1"), seconds=10)
    h.finish("a")
    h.run(60)
    assert len(h.nodes()) == 1

    h2 = Harness(TYPES, registration_delay=2.0, validation_delay=0.0)
    h2.add(nodepool("cpu"))
    provisioned(h2, pod("a", cpu="1"), seconds=10)
    [node] = h2.nodes()
    h2.cluster.patch("Node", node["metadata"]["name"],
                     {"metadata": {"annotations": {"kubegpu.io/do-not-disrupt": "true"}}})
    h2.finish("a")
    h2.run(60)
    assert len(h2.nodes()) == 1


def test_consolidation_deletes_a_node_whose_pods_fit_elsewhere() -> None:
    h = Harness(TYPES, registration_delay=2.0, validation_delay=0.0)
    h.add(nodepool("cpu"))
    pinned = {"metadata": {"annotations": {"kubegpu.io/do-not-disrupt": "true"}}}
    provisioned(h, pod("big-b", cpu="3"), pod("small", cpu="500m"), seconds=10)
    provisioned(h, pod("big-a", cpu="3", **pinned), seconds=10)
    assert len(h.nodes()) == 2
    node_a, node_b = node_of(h, "big-a"), node_of(h, "big-b")
    assert node_a != node_b and node_of(h, "small") == node_b
    h.finish("big-b")          # node B now holds only `small`, which fits next to big-a
    run_until(h, lambda: len(h.nodes()) == 1)
    assert {n["metadata"]["name"] for n in h.nodes()} == {node_a}
    assert "small" not in pod_names(h)        # evicted (its controller would recreate it)
    assert any("delete" in line and "(Underutilized)" in line for line in h.lines)


def test_consolidation_replaces_with_a_strictly_cheaper_node_only_after_it_initializes() -> None:
    h = Harness(TYPES, registration_delay=20.0, validation_delay=0.0)
    h.add(nodepool("cpu"))
    h.add(pod("big", cpu="6"))
    h.add_replicated(pod("small", cpu="500m"))
    h.run(30)
    [old] = h.nodes()
    assert old["metadata"]["labels"]["node.kubernetes.io/instance-type"] == "large"
    h.finish("big")
    run_until(h, lambda: any("replace" in line for line in h.lines))
    assert any("replace" in line and "with small" in line for line in h.lines)
    claims = {c["metadata"]["name"]: c for c in h.claims()}
    assert len(claims) == 2
    old_node = h.cluster.get("Node", old["metadata"]["name"])
    assert any(t["key"] == "kubegpu.io/disrupted" for t in old_node["spec"]["taints"])
    assert "small" in pod_names(h)            # nothing deleted before the replacement is Initialized
    h.run(30)
    [new] = h.nodes()
    assert new["metadata"]["labels"]["node.kubernetes.io/instance-type"] == "small"
    assert all(is_true(c, "Initialized") for c in h.claims())
    assert node_of(h, "small") == new["metadata"]["name"]     # the recreated pod runs on the replacement


def test_pod_do_not_disrupt_and_pdb_block_consolidation() -> None:
    h = Harness(TYPES, registration_delay=2.0, validation_delay=0.0)
    h.add(nodepool("cpu"))
    provisioned(h, pod("big", cpu="6"), pod("keep", cpu="500m", metadata={
        "annotations": {"kubegpu.io/do-not-disrupt": "true"}}), seconds=10)
    h.finish("big")
    h.run(30)
    assert len(h.claims()) == 1 and "keep" in pod_names(h)

    h2 = Harness(TYPES, registration_delay=2.0, validation_delay=0.0)
    h2.add(nodepool("cpu"))
    h2.add({"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
            "metadata": {"name": "db", "namespace": "default"},
            "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "db"}}}})
    provisioned(h2, pod("big", cpu="6"), pod("db", cpu="500m", metadata={"labels": {"app": "db"}}), seconds=10)
    h2.finish("big")
    h2.run(30)
    assert len(h2.claims()) == 1 and "db" in pod_names(h2)


def test_expiry_ignores_budgets_and_do_not_disrupt_but_drain_honours_pdb_until_grace() -> None:
    h = Harness(TYPES, registration_delay=2.0, validation_delay=0.0)
    h.add(nodepool("cpu", expireAfter="1h", terminationGracePeriod="10m",
                   disruption={"budgets": [{"nodes": "0"}], "consolidateAfter": "Never"}))
    h.add({"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
           "metadata": {"name": "db", "namespace": "default"},
           "spec": {"maxUnavailable": 0, "selector": {"matchLabels": {"app": "db"}}}})
    provisioned(h, pod("db", cpu="1", metadata={"labels": {"app": "db"},
                                                "annotations": {"kubegpu.io/do-not-disrupt": "true"}}),
                seconds=10)
    [claim] = h.claims()
    h.run(3600, step=60, bind=False)
    assert any("terminating (expired)" in line for line in h.lines)
    assert "db" in pod_names(h)                       # do-not-disrupt (and the PDB) hold the drain
    assert any("drain waits: pod default/db: pdb db: annotated do-not-disrupt" in line for line in h.lines)
    h.run(11 * 60, step=60, bind=False)               # terminationGracePeriod over: forced
    assert "db" not in pod_names(h)
    assert claim["metadata"]["name"] not in {c["metadata"]["name"] for c in h.claims()}


def test_drain_order_and_disruption_cost() -> None:
    daemon = pod("d", metadata={"ownerReferences": [{"kind": "DaemonSet", "name": "x"}]})
    critical = pod("c", spec={"priorityClassName": "system-node-critical"})
    critical_daemon = {**daemon, "spec": {**daemon["spec"], "priorityClassName": "system-cluster-critical"}}
    assert [drain_group(p) for p in (pod("a"), daemon, critical, critical_daemon)] == [0, 1, 2, 3]
    assert pod_disruption_cost(pod("a")) == 1.0
    cheap = pod("b", metadata={"annotations": {"controller.kubernetes.io/pod-deletion-cost": str(-2**30)}})
    assert pod_disruption_cost(cheap) == -7.0


def test_drain_evicts_non_critical_before_critical() -> None:
    h = Harness(TYPES, registration_delay=2.0, validation_delay=0.0)
    h.add(nodepool("cpu", expireAfter="1h"))
    provisioned(h, pod("app", cpu="500m"), pod("crit", cpu="500m",
                                               spec={"priorityClassName": "system-node-critical"}), seconds=10)
    assert len(h.nodes()) == 1
    h.clock.advance(3600)
    h.autoscaler.step()          # expiry starts termination and evicts the first group only
    assert pod_names(h) == {"crit"}
    h.autoscaler.step()
    assert pod_names(h) == set()


def test_multi_node_consolidation_replaces_several_nodes_with_one_cheaper() -> None:
    h = Harness(TYPES, registration_delay=2.0, validation_delay=0.0)
    h.add(nodepool("cpu", disruption={"budgets": [{"nodes": "100%"}]}))   # the default 10% allows one at a time
    for i in range(3):   # three medium nodes, each with a big pod and a small replicated one
        h.add(pod(f"big{i}", cpu="3"))
        h.add_replicated(pod(f"small{i}", cpu="500m"))
        h.run(10)
    nodes = {n["metadata"]["name"] for n in h.nodes()}
    assert len(nodes) == 3
    assert len({node_of(h, f"small{i}") for i in range(3)}) == 3
    h.run(30)            # nothing cheaper exists while the big pods run; nominations age out
    assert not any("disruption" in line for line in h.lines)
    for i in range(3):
        h.finish(f"big{i}")
    run_until(h, lambda: any("replace" in line for line in h.lines))
    [line] = [line for line in h.lines if "replace" in line]
    assert line.count("cpu-") == 3 and "with small" in line        # one command for all three candidates
    run_until(h, lambda: len(h.nodes()) == 1)
    [node] = h.nodes()
    assert node["metadata"]["name"] not in nodes
    assert {node_of(h, f"small{i}") for i in range(3)} == {node["metadata"]["name"]}


def test_drifted_node_is_replaced_even_when_not_cheaper() -> None:
    h = Harness(TYPES, registration_delay=2.0, validation_delay=0.0)
    h.add(nodepool("cpu", disruption={"consolidateAfter": "Never"}))
    h.add_replicated(pod("app", cpu="1"))
    h.run(10)
    [old] = h.nodes()
    h.run(30)
    assert not any("disruption" in line for line in h.lines)
    # a new template label: the NodePool hash changes, the NodeClaim is drifted
    h.cluster.patch("NodePool", "cpu", {"spec": {"template": {"metadata": {"labels": {"team": "ml"}}}}})
    run_until(h, lambda: any("(Drifted)" in line for line in h.lines))
    assert any("replace" in line and "(Drifted)" in line for line in h.lines)
    run_until(h, lambda: old["metadata"]["name"] not in {n["metadata"]["name"] for n in h.nodes()})
    [new] = h.nodes()
    assert new["metadata"]["labels"]["team"] == "ml"
    assert node_of(h, "app") == new["metadata"]["name"]
