"""The controller derives each object's facts once per resourceVersion (fleet scale)."""

from __future__ import annotations

from typing import Any

from kubegpu.clock import VirtualClock
from kubegpu.gpu.catalog import get_model
from kubegpu.gpu.geometry import PlacedInstance
from kubegpu.kube import MemoryCluster, NotFound
from kubegpu.kube.informer import InformedCluster
from kubegpu.partitionagent.annotations import (
    PARTITIONING_LABEL as PARTITIONING,
)
from kubegpu.partitionagent.annotations import (
    ReportedGpu,
    replace_family,
    status_annotations,
)
from kubegpu.partitioner.controller import PartitionerController, VersionMemo

P1G = get_model("A100-SXM4-80GB").profile("1g.10gb").profile_id


def pod(name: str, limits: dict[str, str] | None = None) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "default"},
            "spec": {"containers": [{"name": "c", "resources": {"limits": limits or {}}}]},
            "status": {"phase": "Pending"}}


def counting_memo() -> tuple[VersionMemo[str], list[str]]:
    derived: list[str] = []

    def derive(obj: dict[str, Any]) -> str:
        derived.append(obj["metadata"]["name"])
        return f"{obj['metadata']['name']}@{obj['metadata'].get('resourceVersion')}"

    return VersionMemo(derive), derived


def test_facts_are_derived_again_only_for_changed_objects_through_shared_or_copied_lists() -> None:
    store = MemoryCluster(VirtualClock(0))
    for name in ("a", "b", "c"):
        store.create(pod(name))
    for cluster in (InformedCluster(store, ("Pod",), copy=False), InformedCluster(store, ("Pod",)), store):
        memo, derived = counting_memo()
        first = memo.of(cluster.list("Pod"))
        assert derived == ["a", "b", "c"]
        assert memo.of(cluster.list("Pod")) == first and derived == ["a", "b", "c"]  # nothing changed
        store.patch("Pod", "b", {"metadata": {"labels": {"x": "1"}}})
        version = store.get("Pod", "b")["metadata"]["resourceVersion"]
        assert memo.of(cluster.list("Pod")) == [first[0], f"b@{version}", first[2]]
        assert derived == ["a", "b", "c", "b"]
        store.delete("Pod", "b")
        store.create(pod("b"))  # the same name again is a new object (new uid)
        memo.of(cluster.list("Pod"))
        assert derived == ["a", "b", "c", "b", "b"]


def test_objects_without_a_version_are_derived_every_time_and_gone_ones_forgotten() -> None:
    memo, derived = counting_memo()
    loose = pod("loose")
    memo.of([loose])
    memo.of([loose])
    assert derived == ["loose", "loose"]
    kept = dict(pod("kept"), metadata={"name": "kept", "namespace": "default", "uid": "u1", "resourceVersion": "7"})
    memo.of([kept])
    memo.of([])  # gone from the cluster: forgotten
    memo.of([dict(kept, metadata=dict(kept["metadata"]))])  # a copy of the same version, after it was forgotten
    assert derived == ["loose", "loose", "kept", "kept"]


def _node(name: str, label: str = "mig") -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": {PARTITIONING: label}},
            "status": {"allocatable": {"cpu": "64", "memory": "512Gi", "pods": "110"}}}


def _report(cluster: MemoryCluster, name: str, used: int, plan_id: str | None = None) -> None:
    """The agent's report: one A100 cut into seven 1g.10gb instances, the first `used` of them in use."""
    gpu = ReportedGpu(0, "A100-SXM4-80GB", tuple((PlacedInstance(P1G, start), start < used) for start in range(7)))
    current = cluster.get("Node", name)["metadata"].get("annotations") or {}
    patch = replace_family(current, status_annotations("mig", [gpu], plan_id), "status")
    cluster.patch("Node", name, {"metadata": {"annotations": patch}})


def _script(cluster: MemoryCluster, step: int) -> None:
    """Step `step` of a day in miniature: nodes join (one with a bad label), report, pods come, bind and go."""
    if step == 0:
        for name in ("n1", "n2", "n3"):
            cluster.create(_node(name))
            _report(cluster, name, used=2)
        cluster.create(_node("typo", label="MIG"))
    if step % 3 == 1:
        cluster.create(pod(f"p{step}", {"nvidia.com/mig-2g.20gb": "1"}))
        cluster.create(pod(f"q{step}", {"nvidia.com/mig-1g.10gb": "1"}))
    if step % 3 == 2:
        cluster.patch("Pod", f"q{step - 1}", {"spec": {"nodeName": "n2"}})
        _report(cluster, "n2", used=3)
    if step == 9:
        cluster.delete("Pod", "p7")
        cluster.delete("Node", "n3")
    for name in ("n1", "n2", "n3"):  # the agent reports every plan handled
        try:
            annotations = cluster.get("Node", name)["metadata"].get("annotations") or {}
        except NotFound:
            continue
        spec = annotations.get("kubegpu.io/spec-plan")
        if spec is not None and annotations.get("kubegpu.io/status-plan") != spec:
            _report(cluster, name, used=2, plan_id=spec)


def test_a_controller_reading_changes_through_an_informer_decides_as_one_listing_everything() -> None:
    """The informer's change journal (what changed since the last pass) gives the controller the same view as a
    full list each pass: the same plans, Events and desired layouts, step by step."""
    runs = []
    for informed in (False, True):
        store = MemoryCluster(VirtualClock(0))
        cluster = InformedCluster(store, ("Node", "Pod"), copy=False) if informed else store
        controller = PartitionerController(cluster, batch_timeout=20, batch_idle=10)
        ticks = []
        for step in range(14):
            _script(store, step)
            result = controller.tick(step * 5.0)
            ticks.append((result.planned, result.written, sorted(result.plan.assignments.items())
                          if result.plan else None, sorted(controller.batcher.items)))
        nodes = [(n["metadata"]["name"], n["metadata"].get("annotations")) for n in store.list("Node")]
        events = sorted((e["reason"], e["message"]) for e in store.list("Event", namespace="default"))
        runs.append((ticks, nodes, events))
    assert runs[0] == runs[1]
    ticks, _, events = runs[1]
    assert sum(planned for planned, *_ in ticks) >= 2 and any(written for _, written, *_ in ticks)
    assert any(reason == "PartitioningSkipped" for reason, _ in events)  # the bad label, seen through changes


def test_reports_read_with_a_memo_read_as_without_and_reuse_unchanged_gpus() -> None:
    from kubegpu.partitioner.facts import ReportMemo, reported_gpus

    def node_with(used: int, bad_gpu: bool = False) -> dict[str, Any]:
        gpus = [ReportedGpu(i, "A100-SXM4-80GB", tuple((PlacedInstance(P1G, s), s < (used if i == 0 else 1))
                                                       for s in range(7))) for i in range(3)]
        annotations = status_annotations("mig", gpus, "7")
        if bad_gpu:
            annotations["kubegpu.io/status-gpu-2-layout"] = "9z.99gb@0"
        return {"metadata": {"name": "n", "annotations": annotations}}

    memo = ReportMemo()
    first = reported_gpus(node_with(2), "mig", memo)
    assert first == reported_gpus(node_with(2), "mig")
    second = reported_gpus(node_with(3, bad_gpu=True), "mig", memo)
    assert second == reported_gpus(node_with(3, bad_gpu=True), "mig") and len(second[1]) == 1
    assert second[0][1] is first[0][1] and second[0][0] is not first[0][0]  # GPU 1 unchanged, GPU 0 read again
    assert reported_gpus(node_with(3, bad_gpu=True), "mig", memo) == second  # the error remembered as well
