"""End to end on the in-memory cluster: pending GPU pods → NodeClaim → simulated Node → device-plugin accounting →
pods schedulable → pods finish → node consolidated away. Plus bad input while the controller keeps serving."""

from __future__ import annotations

from typing import Any

import pytest

from kubegpu.autoscaler.objects import is_true
from kubegpu.autoscaler.provisioner import take_snapshot
from kubegpu.kube import ApiError
from tests.autoscaler.builders import Harness, instance_type, nodepool, pod

A100 = "A100-SXM4-80GB"
TYPES = [instance_type("a100.x1", 8, 64, 4.0, gpus=1, model=A100),
         instance_type("a100.x2", 16, 128, 8.5, gpus=2, model=A100),
         instance_type("cpu.4", 4, 16, 0.2)]


def events(h: Harness, reason: str) -> list[dict[str, Any]]:
    return [e for e in h.cluster.list("Event", "default") if e.get("reason") == reason]


def test_gpu_pods_walk_the_whole_lifecycle() -> None:
    h = Harness(TYPES, registration_delay=20.0)
    h.add(nodepool("mig", labels={"nvidia.com/mig.config": "all-1g.10gb"},
                   disruption={"consolidateAfter": "30s"}))
    for i in range(7):
        h.add(pod(f"infer-{i}", cpu="1", limits={"nvidia.com/mig-1g.10gb": 1}))

    h.run(4)   # batch window closes after 1 s idle; NodeClaim created, launched, registered
    [claim] = h.claims()
    assert claim["metadata"]["labels"]["kubegpu.io/nodepool"] == "mig"
    assert claim["spec"]["resources"]["requests"]["nvidia.com/mig-1g.10gb"] == "7"
    assert is_true(claim, "Launched") and is_true(claim, "Registered") and not is_true(claim, "Initialized")
    [node] = h.nodes()
    assert "nvidia.com/mig-1g.10gb" not in node["status"]["allocatable"]    # kubelet zeroes it until the plugin
    assert "kubegpu.io/termination" in node["metadata"]["finalizers"]
    assert node["metadata"]["labels"]["kubegpu.io/registered"] == "true"
    assert not any(t["key"] == "kubegpu.io/unregistered" for t in node["spec"].get("taints", []))
    assert len(events(h, "Nominated")) == 7
    assert not any(p["spec"].get("nodeName") for p in h.cluster.list("Pod"))

    h.run(25)  # registration delay passes: device plugin accounting publishes 7 MIG devices, claim initializes
    [node] = h.nodes()
    assert node["status"]["allocatable"]["nvidia.com/mig-1g.10gb"] == "7"
    assert node["metadata"]["labels"]["kubegpu.io/initialized"] == "true"
    assert is_true(h.claims()[0], "Initialized")
    assert all(p["spec"].get("nodeName") == node["metadata"]["name"] for p in h.cluster.list("Pod"))
    assert len(h.claims()) == 1   # the in-flight claim absorbed the pods: no second node

    for i in range(7):
        h.finish(f"infer-{i}")
    h.run(20)
    assert h.nodes()                      # consolidateAfter 30s has not passed yet
    h.run(40)
    assert not h.nodes() and not h.claims()
    assert any("delete" in line and "(Empty)" in line for line in h.lines)
    registry = h.autoscaler.metrics.registry
    assert registry.get_sample_value("karpenter_nodeclaims_created_total",
                                     {"reason": "provisioned", "nodepool": "mig", "min_values_relaxed": "false"}) == 1
    assert registry.get_sample_value("karpenter_nodes_created_total",
                                     {"nodepool": "mig", "zone": "zone-a"}) == 1
    assert registry.get_sample_value("karpenter_nodeclaims_disrupted_total",
                                     {"reason": "empty", "nodepool": "mig", "capacity_type": "on-demand"}) == 1
    assert registry.get_sample_value("karpenter_nodes_terminated_total", {"nodepool": "mig", "zone": "zone-a"}) == 1
    assert registry.get_sample_value("kubegpu_autoscaler_decisions_total", {"decision": "launch"}) == 1
    assert registry.get_sample_value("kubegpu_autoscaler_decisions_total", {"decision": "empty"}) == 1


def test_in_flight_claim_takes_later_pods() -> None:
    h = Harness(TYPES, registration_delay=60.0)
    h.add(nodepool("cpu"))
    h.add(pod("first", cpu="1"))
    h.run(3)
    h.add(pod("second", cpu="1"))
    h.run(5)
    assert len(h.claims()) == 1


def test_bad_nodepool_and_unservable_pod_do_not_stop_the_rest() -> None:
    h = Harness(TYPES)
    h.add(nodepool("broken", weight=90, requirements=[{"key": "x", "operator": "In", "values": []}]))
    h.add(nodepool("good"))
    h.add(pod("ok", cpu="1"))
    h.add(pod("fpga", limits={"example.com/fpga": 1}))
    h.add(pod("garbled", cpu="lots"))
    h.add(pod("negative", limits={"nvidia.com/gpu": "-1"}))
    h.run(3)
    assert [c["metadata"]["labels"]["kubegpu.io/nodepool"] for c in h.claims()] == ["good"]
    assert sum("NodePool broken: spec.template.spec.requirements[0]" in line for line in h.lines) == 1
    [invalid] = events(h, "InvalidNodePool")
    assert invalid["involvedObject"]["name"] == "broken"
    failed = {e["involvedObject"]["name"]: e["message"] for e in events(h, "FailedScheduling")}
    assert set(failed) == {"fpga", "garbled", "negative"}
    assert "spec.containers[0].resources.nvidia.com/gpu: must not be negative" in failed["negative"]
    assert "example.com/fpga" in failed["fpga"]
    assert "spec.containers[0].resources.requests.cpu: invalid quantity 'lots'" in failed["garbled"]
    h.run(5)
    assert len(events(h, "FailedScheduling")) == 3     # reported once each, not every pass


def test_startup_taints_block_initialization_until_removed() -> None:
    h = Harness(TYPES, registration_delay=5.0)
    h.add(nodepool("cpu", startupTaints=[{"key": "example.com/agent-not-ready", "effect": "NoSchedule"}]))
    h.add(pod("a", cpu="1"))
    h.run(10)
    [claim] = h.claims()
    assert not is_true(claim, "Initialized")
    assert claim["status"]["conditions"][-1]["reason"] == "StartupTaintsExist"
    [node] = h.nodes()
    h.cluster.patch("Node", node["metadata"]["name"], {"spec": {"taints": []}})
    h.run(2)
    assert is_true(h.claims()[0], "Initialized")


def test_unregistered_claim_is_deleted_after_15_minutes() -> None:
    h = Harness(TYPES, registration_delay=5.0)
    # a cloud instance whose kubelet has not registered its Node: the lifecycle is not handed the Node at launch
    # (the kwok provider's Node exists at once and is registered in the launching pass otherwise)
    h.provider.launched_node = lambda _provider_id: None  # type: ignore[method-assign]
    h.add(nodepool("cpu"))
    h.add(pod("a", cpu="1"))
    h.run(3, bind=False)   # launched: the Node exists but has not registered yet
    [node] = h.nodes()
    h.cluster.delete("Node", node["metadata"]["name"])   # not registered: no finalizer of ours holds it yet
    h.provider.instances.clear()
    h.run(60 * 14, step=60, bind=False)
    names = {c["metadata"]["name"] for c in h.claims()}
    assert len(names) >= 1
    h.run(120, step=60, bind=False)
    assert not names & {c["metadata"]["name"] for c in h.claims()}
    assert any("not registered within 15m" in line for line in h.lines)


def test_lifecycle_over_http_against_kmock(apiserver: Any) -> None:
    """The same walk through a real LightkubeCluster talking HTTP to the kmock-backed API server."""
    apiserver.reset()
    h = Harness(TYPES, registration_delay=6.0, cluster=apiserver.cluster(), validation_delay=0.0)
    try:
        _walk_over_http(h)
    finally:
        h.autoscaler.close()   # its informers' watches end with it


def _walk_over_http(h: Harness) -> None:
    h.add(nodepool("kmock-mig", labels={"nvidia.com/mig.config": "all-1g.10gb"}))
    for i in range(3):
        h.add(pod(f"kmock-{i}", cpu="1", limits={"nvidia.com/mig-1g.10gb": 1}))
    h.run(4)
    [claim] = h.claims()
    assert claim["spec"]["resources"]["requests"]["nvidia.com/mig-1g.10gb"] == "3"
    h.run(9, step=3)
    [node] = h.nodes()
    assert node["status"]["allocatable"]["nvidia.com/mig-1g.10gb"] == "7"
    assert is_true(h.claims()[0], "Initialized")
    assert all(p["spec"].get("nodeName") == node["metadata"]["name"] for p in h.cluster.list("Pod"))
    for i in range(3):
        h.finish(f"kmock-{i}")
    h.run(30, step=5)
    assert not h.nodes() and not h.claims()


class _ForbiddenPdbs:
    """A cluster whose RBAC lacks PodDisruptionBudgets: that list is refused with 403."""

    def __init__(self, cluster: Any) -> None:
        self.cluster = cluster

    def list(self, kind: str, *args: Any, **kwargs: Any) -> list[dict[str, Any]]:
        if kind == "PodDisruptionBudget":
            raise ApiError("poddisruptionbudgets is forbidden", code=403, reason="Forbidden")
        return list(self.cluster.list(kind, *args, **kwargs))


def test_a_forbidden_list_is_raised_not_read_as_empty() -> None:
    """Reading 403 as "no PDBs" would let consolidation drain through every PDB without a word."""
    h = Harness(TYPES)
    with pytest.raises(ApiError, match="forbidden"):
        take_snapshot(_ForbiddenPdbs(h.cluster))  # type: ignore[arg-type]
    assert take_snapshot(h.cluster).pdbs == []  # not served / none: empty


def test_a_long_nodepool_name_still_gives_a_valid_hostname_label() -> None:
    """The node name is also the `kubernetes.io/hostname` label, whose values stop at 63 characters (the real API
    server rejects the Node otherwise)."""
    h = Harness(TYPES, registration_delay=1.0)
    h.add(nodepool("gpu-pool-for-the-research-platform-team-in-eu-west-with-a-long-name"))
    h.add(pod("train", cpu="1", limits={"nvidia.com/gpu": 1}))
    h.run(4)
    [node] = h.nodes()
    name = node["metadata"]["name"]
    assert len(name) <= 63 and node["metadata"]["labels"]["kubernetes.io/hostname"] == name
