"""Controller and agent on the in-memory cluster, a virtual clock and a simulated node."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from kubegpu.clock import VirtualClock
from kubegpu.gpu.catalog import get_model
from kubegpu.gpu.simulated import SimulatedBackend
from kubegpu.kube import MemoryCluster
from kubegpu.metrics import PartitionerMetrics
from kubegpu.partitionagent import annotations as ann
from kubegpu.partitionagent.agent import PartitionAgent
from kubegpu.partitioner.controller import PartitionerController
from kubegpu.sharing.attribution import ContainerDevices
from kubegpu.sharing.mps import read_slices as read_slices_file

A100 = get_model("A100-SXM4-80GB")
P1G, P2G = A100.profile("1g.10gb").profile_id, A100.profile("2g.20gb").profile_id


def node_obj(name: str, mode: str = "mig") -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": {ann.PARTITIONING_LABEL: mode}},
            "status": {"allocatable": {"cpu": "64", "memory": "512Gi", "pods": "110"}}}


def pending_pod(name: str, resource: str, node_selector: dict[str, str] | None = None) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "default"},
            "spec": {"nodeSelector": node_selector or {},
                     "containers": [{"name": "c", "resources": {"limits": {resource: "1"}}}]},
            "status": {"phase": "Pending",
                       "conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}]}}


def all_1g_node(cluster: MemoryCluster, clock: VirtualClock, used: tuple[int, ...] = (0, 1, 2)
                ) -> tuple[SimulatedBackend, PartitionAgent]:
    """One A100 cut all-1g.10gb, a process on the 1g at each start in `used`, agent reporting."""
    backend = SimulatedBackend.create(None, "1xA100-SXM4-80GB", node_name="gpu-node", clock=clock)
    if backend.set_mig_mode(0, True):
        backend.reset_gpu(0)  # Ampere: the mode change waits for a reset
    for start in range(7):
        mig = backend.create_mig_device(0, P1G, start)
        if start in used:
            backend.add_process(0, 100 + start, 1000, gi_id=mig.gi_id)
    cluster.create(node_obj("gpu-node"))
    agent = PartitionAgent(cluster, backend, "gpu-node")
    agent.tick()
    return backend, agent


def placements(backend: SimulatedBackend) -> list[tuple[int, int]]:
    return sorted((m.profile_id, m.start) for m in backend.mig_devices(0))


def test_agent_reports_layout_and_usage() -> None:
    clock = VirtualClock(1000)
    cluster = MemoryCluster(clock)
    all_1g_node(cluster, clock)
    annotations = cluster.get("Node", "gpu-node")["metadata"]["annotations"]
    assert annotations["kubegpu.io/status-gpu-0-1g.10gb-used"] == "3"
    assert annotations["kubegpu.io/status-gpu-0-1g.10gb-free"] == "4"
    assert annotations["kubegpu.io/status-gpu-0-model"] == "A100-SXM4-80GB"
    assert annotations["kubegpu.io/status-gpu-0-layout-used"] == "1g.10gb@0,1g.10gb@1,1g.10gb@2"


def test_pending_2g_pod_gets_a_recut_without_touching_used_instances() -> None:
    clock = VirtualClock(1000)
    cluster = MemoryCluster(clock)
    backend, agent = all_1g_node(cluster, clock)
    before_used = {(m.profile_id, m.start, m.uuid) for m in backend.mig_devices(0) if m.start in (0, 1, 2)}
    cluster.create(pending_pod("wants-2g", "nvidia.com/mig-2g.20gb"))
    controller = PartitionerController(cluster, batch_timeout=60, batch_idle=10)
    assert not controller.tick(1000).planned  # the batch window is open
    result = controller.tick(1010)  # idle for 10 s: plan
    assert result.planned and result.written == ["gpu-node"]
    node = cluster.get("Node", "gpu-node")["metadata"]["annotations"]
    assert node[ann.SPEC_PLAN] == result.plan_id
    assert node["kubegpu.io/spec-gpu-0-2g.20gb"] == "1"
    report = agent.tick()
    assert report is not None and report.refused == []
    assert (P2G, 4) in placements(backend) or (P2G, 2) in placements(backend)
    after_used = {(m.profile_id, m.start, m.uuid) for m in backend.mig_devices(0) if m.start in (0, 1, 2)}
    assert after_used == before_used  # same instances, same UUIDs: nothing in use was touched
    status = cluster.get("Node", "gpu-node")["metadata"]["annotations"]
    assert status[ann.STATUS_PLAN] == result.plan_id
    assert status["kubegpu.io/status-gpu-0-2g.20gb-free"] == "1"


def test_plans_and_pods_made_schedulable_are_counted() -> None:
    clock = VirtualClock(1000)
    cluster = MemoryCluster(clock)
    all_1g_node(cluster, clock)
    cluster.create(pending_pod("wants-2g", "nvidia.com/mig-2g.20gb"))
    registry = CollectorRegistry()
    controller = PartitionerController(cluster, batch_idle=10, metrics=PartitionerMetrics.create(registry))
    controller.tick(1000)
    assert controller.tick(1010).written == ["gpu-node"]
    assert registry.get_sample_value("kubegpu_partitioner_plans_total", {"result": "applied"}) == 1
    assert registry.get_sample_value("kubegpu_partitioner_pods_made_schedulable_total") == 1
    assert registry.get_sample_value("kubegpu_partitioner_last_plan_duration_seconds") >= 0


def test_controller_waits_for_the_node_to_report_before_replanning_it() -> None:
    clock = VirtualClock(1000)
    cluster = MemoryCluster(clock)
    _backend, agent = all_1g_node(cluster, clock)
    cluster.create(pending_pod("wants-2g", "nvidia.com/mig-2g.20gb"))
    controller = PartitionerController(cluster, batch_timeout=60, batch_idle=10)
    controller.tick(1000)
    first = controller.tick(1010)
    cluster.create(pending_pod("wants-3g", "nvidia.com/mig-3g.40gb"))
    controller.tick(1020)
    second = controller.tick(1030)  # the node has not reported plan 1: it is left out
    assert second.written == []
    assert cluster.get("Node", "gpu-node")["metadata"]["annotations"][ann.SPEC_PLAN] == first.plan_id
    agent.tick()  # applies and reports plan 1
    controller.tick(1040)
    third = controller.tick(1050)
    assert third.planned and third.plan is not None
    assert third.plan.assignments["default/wants-2g"] == "gpu-node"  # now served by the 2g plan 1 created
    assert "default/wants-3g" in {**third.plan.assignments, **third.plan.unschedulable}


def test_two_replicas_never_both_act() -> None:
    clock = VirtualClock(1000)
    cluster = MemoryCluster(clock)
    all_1g_node(cluster, clock)
    cluster.create(pending_pod("wants-2g", "nvidia.com/mig-2g.20gb"))
    a = PartitionerController(cluster, identity="a", lease_duration=15)
    b = PartitionerController(cluster, identity="b", lease_duration=15)
    leaders = []
    for t in range(1000, 1100, 5):
        results = [a.tick(t), b.tick(t)]
        assert sum(r.leader for r in results) == 1
        leaders.append("a" if results[0].leader else "b")
    assert set(leaders) == {"a"}  # a renews in time, so b never takes over
    for t in range(1100, 1130, 5):  # a stops; b takes over once the lease has expired
        result = b.tick(t)
        assert result.leader == (t >= 1095 + 15)


def test_impossible_profile_and_unknown_model_become_events_not_crashes() -> None:
    clock = VirtualClock(1000)
    cluster = MemoryCluster(clock)
    all_1g_node(cluster, clock)
    strange = node_obj("strange-node")
    strange["metadata"]["annotations"] = {"kubegpu.io/status-gpu-0-model": "Z9000",
                                          "kubegpu.io/status-gpu-0-layout": ""}
    cluster.create(strange)
    cluster.create(pending_pod("wants-5g", "nvidia.com/mig-5g.50gb"))
    controller = PartitionerController(cluster)
    controller.tick(1000)
    result = controller.tick(1010)
    assert result.written == []  # nothing changed anywhere
    events = cluster.list("Event")
    messages = {e["involvedObject"]["name"]: e["message"] for e in events}
    assert messages["wants-5g"] == "no partitionable GPU offers nvidia.com/mig-5g.50gb"
    assert "Z9000" in messages["strange-node"]


def test_misspelt_partitioning_label_is_an_event_and_the_node_is_left_alone() -> None:
    clock = VirtualClock(1000)
    cluster = MemoryCluster(clock)
    all_1g_node(cluster, clock)
    cluster.create(node_obj("typo-node", mode="MIG"))
    cluster.create(pending_pod("wants-2g", "nvidia.com/mig-2g.20gb"))
    controller = PartitionerController(cluster)
    controller.tick(1000)
    result = controller.tick(1010)
    assert result.written == ["gpu-node"]  # the other node is still served
    [event] = [e for e in cluster.list("Event") if e["involvedObject"]["name"] == "typo-node"]
    assert event["reason"] == "PartitioningSkipped"
    assert event["message"] == "label kubegpu.io/gpu-partitioning: must be mig or mps, not 'MIG'; node left alone"
    assert "annotations" not in cluster.get("Node", "typo-node")["metadata"]
    controller.tick(1100)
    assert len([e for e in cluster.list("Event") if e["involvedObject"]["name"] == "typo-node"]) == 1


def test_agent_refuses_to_destroy_an_instance_in_use() -> None:
    clock = VirtualClock(1000)
    cluster = MemoryCluster(clock)
    backend, agent = all_1g_node(cluster, clock, used=(4,))
    before = placements(backend)
    spec = ann.spec_annotations("mig", [(0, A100, [])], "42")  # the 2g would cover the 1g in use at 4
    spec["kubegpu.io/spec-gpu-0-layout"] = "1g.10gb@0,1g.10gb@1,1g.10gb@2,1g.10gb@3,2g.20gb@4,1g.10gb@6"
    cluster.patch("Node", "gpu-node", {"metadata": {"annotations": spec}})
    report = agent.tick()
    assert report is not None and report.refused and "in use" in report.refused[0]
    assert placements(backend) == before
    assert cluster.get("Node", "gpu-node")["metadata"]["annotations"][ann.STATUS_PLAN] == "42"
    assert any(e["reason"] == "PartitioningRefused" for e in cluster.list("Event"))


def test_malformed_spec_annotation_is_refused_in_one_line() -> None:
    clock = VirtualClock(1000)
    cluster = MemoryCluster(clock)
    backend, agent = all_1g_node(cluster, clock)
    before = placements(backend)
    cluster.patch("Node", "gpu-node", {"metadata": {"annotations": {
        ann.SPEC_PLAN: "7", "kubegpu.io/spec-gpu-0-layout": "2g.20gb-at-4"}}})
    report = agent.tick()
    assert report is not None
    assert report.refused == ["annotation kubegpu.io/spec-gpu-0-layout: '2g.20gb-at-4' is not <profile>@<start>"]
    assert placements(backend) == before


def test_mps_agent_writes_the_slices_file_and_keeps_used_slices(tmp_path: Path) -> None:
    clock = VirtualClock(1000)
    cluster = MemoryCluster(clock)
    backend = SimulatedBackend.create(None, "1xA100-SXM4-80GB", node_name="mps-node", clock=clock)
    slices = tmp_path / "slices.json"
    slices.write_text('{"0": [20, 20]}')
    cluster.create(node_obj("mps-node", "mps"))
    running = pending_pod("running", "nvidia.com/gpu-20gb")
    running["spec"]["nodeName"] = "mps-node"
    running["status"] = {"phase": "Running"}
    cluster.create(running)
    agent = PartitionAgent(cluster, backend, "mps-node", slices)
    agent.tick()
    status = cluster.get("Node", "mps-node")["metadata"]["annotations"]
    assert status["kubegpu.io/status-gpu-0-20gb-used"] == "1"
    assert status["kubegpu.io/status-gpu-0-20gb-free"] == "1"
    cluster.create(pending_pod("wants-50", "nvidia.com/gpu-50gb"))
    controller = PartitionerController(cluster)
    controller.tick(1000)
    result = controller.tick(1010)
    assert result.written == ["mps-node"]
    agent.tick()
    assert sorted(read_slices_file(slices)[0]) == [20, 50]  # the free 20gb made room for the 50gb


@pytest.mark.parametrize("bad", ["", "x", "-1gb,"])
def test_mps_spec_with_bad_sizes_is_refused(tmp_path: Path, bad: str) -> None:
    clock = VirtualClock(0)
    cluster = MemoryCluster(clock)
    backend = SimulatedBackend.create(None, "1xA100-SXM4-80GB", node_name="m", clock=clock)
    cluster.create(node_obj("m", "mps"))
    cluster.patch("Node", "m", {"metadata": {"annotations": {ann.SPEC_PLAN: "1",
                                                             "kubegpu.io/spec-gpu-0-layout": bad or "0gb"}}})
    report = PartitionAgent(cluster, backend, "m", tmp_path / "s.json").tick()
    assert report is not None and report.refused
    assert not (tmp_path / "s.json").exists()


def test_corrupt_slices_file_is_rebuilt_from_the_plan(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Issue #18: a torn slices file is recoverable state, not a reason to refuse every plan until someone fixes it."""
    clock = VirtualClock(0)
    cluster = MemoryCluster(clock)
    backend = SimulatedBackend.create(None, "1xA100-SXM4-80GB", node_name="m", clock=clock)
    cluster.create(node_obj("m", "mps"))
    slices = tmp_path / "s.json"
    slices.write_text("{not json")
    cluster.patch("Node", "m", {"metadata": {"annotations": {ann.SPEC_PLAN: "1",
                                                             "kubegpu.io/spec-gpu-0-layout": "20gb"}}})
    with caplog.at_level("WARNING", logger="kubegpu.partition-agent"):
        report = PartitionAgent(cluster, backend, "m", slices).tick()
    assert report is not None and report.refused == []
    assert read_slices_file(slices) == {0: [20]}
    [line] = [r.getMessage() for r in caplog.records if "rebuilt" in r.getMessage()]
    assert line.startswith(f"{slices}: cannot read MPS slices") and "rebuilt it from the plan on Node m" in line


def test_instance_allocated_by_the_kubelet_counts_as_in_use() -> None:
    clock = VirtualClock(1000)
    cluster = MemoryCluster(clock)
    backend, _ = all_1g_node(cluster, clock, used=())
    held = next(m for m in backend.mig_devices(0) if m.start == 4)  # allocated, its process not started yet
    holders = [ContainerDevices("default", "starting", "c", "nvidia.com/mig-1g.10gb", (held.uuid,))]
    agent = PartitionAgent(cluster, backend, "gpu-node", allocations=lambda: holders)
    agent.tick()
    assert cluster.get("Node", "gpu-node")["metadata"]["annotations"][
        "kubegpu.io/status-gpu-0-layout-used"] == "1g.10gb@4"
    layout = "1g.10gb@0,1g.10gb@1,1g.10gb@2,1g.10gb@3,2g.20gb@4,1g.10gb@6"
    cluster.patch("Node", "gpu-node", {"metadata": {"annotations": {
        ann.SPEC_PLAN: "1", "kubegpu.io/spec-gpu-0-layout": layout}}})
    report = agent.tick()
    assert report is not None and report.refused == ["GPU 0: refusing the new layout: instance 1g.10gb@4 is in use"]
    assert held.uuid in {m.uuid for m in backend.mig_devices(0)}


def test_unanswered_pod_resources_blocks_destroying_but_not_creating() -> None:
    clock = VirtualClock(1000)
    cluster = MemoryCluster(clock)
    backend, _ = all_1g_node(cluster, clock, used=())
    agent = PartitionAgent(cluster, backend, "gpu-node", allocations=lambda: None)
    for start in (4, 5, 6):  # free the top: a pure creation is then safe
        backend.destroy_mig_device(0, next(m.gi_id for m in backend.mig_devices(0) if m.start == start))
    grow = "1g.10gb@0,1g.10gb@1,1g.10gb@2,1g.10gb@3,2g.20gb@4"
    cluster.patch("Node", "gpu-node", {"metadata": {"annotations": {
        ann.SPEC_PLAN: "1", "kubegpu.io/spec-gpu-0-layout": grow}}})
    report = agent.tick()
    assert report is not None and report.refused == [] and report.created == ["gpu0:2g.20gb@4"]
    cluster.patch("Node", "gpu-node", {"metadata": {"annotations": {
        ann.SPEC_PLAN: "2", "kubegpu.io/spec-gpu-0-layout": "1g.10gb@0,1g.10gb@1,1g.10gb@2,2g.20gb@4"}}})
    report = agent.tick()
    assert report is not None and "pod-resources did not answer" in report.refused[0]
    assert len(backend.mig_devices(0)) == 5
