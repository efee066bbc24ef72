"""The quota controller on the in-memory cluster: gates lifted, status written, a bad ElasticQuota reported on itself,
leader election, reads from informers (no LIST while idle, no action on a stale cache); and the CRD's printer
columns (`kubectl get elasticquota` shows used / min / max)."""

from __future__ import annotations

from typing import Any

from kubegpu.clock import VirtualClock
from kubegpu.kube import MemoryCluster
from kubegpu.kube.informer import InformedCluster
from kubegpu.quota.api import elastic_quota_crd
from kubegpu.quota.controller import INFORMED_KINDS, QuotaController, cluster_capacity, has_quota_gate
from tests.fakes.remote_store import RemoteStore, eventually

MEM = "kubegpu.io/gpu-memory"


def _cluster() -> MemoryCluster:
    cluster = MemoryCluster(VirtualClock(1000.0))
    # two A100-80GB: 160Gi held, by GFD's labels; the advertised charge room is the catalog's largest per GPU
    cluster.create({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n", "labels": {
                        "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB", "nvidia.com/gpu.count": "2"}},
                    "status": {"allocatable": {MEM: "360Gi", "nvidia.com/gpu": "2"}}})
    return cluster


def _quota(cluster: MemoryCluster, namespace: str, spec: dict[str, Any]) -> None:
    cluster.create({"apiVersion": "kubegpu.io/v1", "kind": "ElasticQuota",
                    "metadata": {"name": "q", "namespace": namespace}, "spec": spec})


def _pod(cluster: MemoryCluster, namespace: str, name: str, gib: int, created: str) -> None:
    cluster.create({"apiVersion": "v1", "kind": "Pod",
                    "metadata": {"name": name, "namespace": namespace, "creationTimestamp": created},
                    "spec": {"schedulingGates": [{"name": "kubegpu.io/quota"}, {"name": "other"}],
                             "containers": [{"name": "c", "resources": {"limits": {
                                 "nvidia.com/gpu": 1, MEM: f"{gib}Gi"}}}]}})


def test_lifts_within_min_then_borrows_and_writes_status() -> None:
    cluster = _cluster()
    _quota(cluster, "a", {"min": {MEM: "80Gi"}, "max": {MEM: "120Gi"}})
    for i, stamp in enumerate(("2026-01-01T00:00:00Z", "2026-01-01T00:00:01Z", "2026-01-01T00:00:02Z")):
        _pod(cluster, "a", f"p{i}", 40, stamp)
    controller = QuotaController(cluster, leader_elect=False)
    result = controller.tick(1000.0)
    assert result.lifted == 3
    gates = {p["metadata"]["name"]: p["spec"].get("schedulingGates") for p in cluster.list("Pod", "a")}
    assert gates == {f"p{i}": [{"name": "other"}] for i in range(3)}  # only our gate goes
    assert cluster.get("ElasticQuota", "q", "a")["status"]["used"] == {MEM: "120Gi", "nvidia.com/gpu": "3"}
    _pod(cluster, "a", "p3", 40, "2026-01-01T00:00:03Z")  # past max: stays gated
    assert controller.tick(1001.0).lifted == 0
    assert has_quota_gate(cluster.get("Pod", "p3", "a"))
    assert cluster_capacity(cluster.list("Node")) == 160 * 2**30


def test_a_pod_changed_between_the_read_and_the_lift_is_lifted_in_the_same_pass() -> None:
    """kube-scheduler writes a gated pod's SchedulingGated status right after it is created, so the copy a pass
    read is often stale by the time the gate is lifted: the lift reads the pod again from the API server (not the
    cache, which may not have the change yet) instead of waiting a pass."""
    cluster = _cluster()
    _quota(cluster, "a", {"min": {MEM: "80Gi"}})
    _pod(cluster, "a", "p0", 40, "2026-01-01T00:00:00Z")
    original = cluster.patch
    controller = QuotaController(cluster, leader_elect=False)
    reads: list[str] = []
    original_get = cluster.get

    def scheduler_writes_first(kind: str, name: str, patch: Any, *args: Any, **kwargs: Any) -> dict[str, Any]:
        if kind == "Pod" and "spec" in patch and not reads:
            original("Pod", "p0", {"status": {"conditions": [
                {"type": "PodScheduled", "status": "False", "reason": "SchedulingGated"}]}}, namespace="a",
                     subresource="status")
        return original(kind, name, patch, *args, **kwargs)

    def get(kind: str, *args: Any, **kwargs: Any) -> dict[str, Any]:
        reads.append(kind)
        return original_get(kind, *args, **kwargs)

    cluster.patch = scheduler_writes_first  # type: ignore[method-assign]
    cluster.get = get  # type: ignore[method-assign]
    assert controller.tick(1000.0).lifted == 1
    assert reads == ["Pod"]  # the one fresh read, from the API server
    assert cluster.get("Pod", "p0", "a")["spec"]["schedulingGates"] == [{"name": "other"}]


def test_a_bad_quota_is_an_event_on_it_and_the_others_go_on() -> None:
    cluster = _cluster()
    _quota(cluster, "bad", {"min": {"cpu": "1"}})
    _quota(cluster, "good", {"min": {MEM: "80Gi"}})
    _pod(cluster, "good", "p", 80, "2026-01-01T00:00:00Z")
    assert QuotaController(cluster, leader_elect=False).tick(1000.0).lifted == 1
    events = [e for e in cluster.list("Event", "bad") if e.get("reason") == "InvalidElasticQuota"]
    assert len(events) == 1 and "spec.min" in events[0]["message"] and "cpu" in events[0]["message"]


def test_only_the_leader_acts() -> None:
    cluster = _cluster()
    one = QuotaController(cluster, identity="one", lease_namespace="kubegpu")
    two = QuotaController(cluster, identity="two", lease_namespace="kubegpu")
    assert one.tick(1000.0).acted and not two.tick(1001.0).acted
    assert two.tick(1000.0 + 16.0).acted  # the holder stopped renewing: taken over after the lease


def test_printer_columns_show_used_min_max() -> None:
    columns = elastic_quota_crd()["spec"]["versions"][0]["additionalPrinterColumns"]
    assert [(c["name"], c["jsonPath"]) for c in columns[:3]] == [
        ("Used", ".status.used.kubegpu\\.io/gpu-memory"), ("Min", ".spec.min.kubegpu\\.io/gpu-memory"),
        ("Max", ".spec.max.kubegpu\\.io/gpu-memory")]


def test_passes_read_informers_so_an_idle_controller_lists_nothing() -> None:
    cluster = _cluster()
    _quota(cluster, "a", {"min": {MEM: "80Gi"}})
    api = RemoteStore(cluster)
    controller = QuotaController(api, leader_elect=False)  # type: ignore[arg-type]
    try:
        assert sorted(api.lists) == sorted(INFORMED_KINDS)  # the informers' initial lists
        _pod(cluster, "a", "p0", 40, "2026-01-01T00:00:00Z")
        eventually(lambda: controller.tick(1000.0).lifted == 1)  # seen through the watch
        for second in range(5):
            controller.tick(1001.0 + second)
        assert sorted(api.lists) == sorted(INFORMED_KINDS)
    finally:
        controller.close()


def test_a_controller_does_not_act_on_a_cache_whose_watch_is_broken() -> None:
    cluster = _cluster()
    _quota(cluster, "a", {"min": {MEM: "80Gi"}})
    api = RemoteStore(cluster)
    clock = [0.0]
    informed = InformedCluster(api, INFORMED_KINDS, watch_window=0.05, now=lambda: clock[0])  # type: ignore[arg-type]
    controller = QuotaController(informed, leader_elect=False)
    try:
        api.down = True
        eventually(lambda: set(informed.broken()) == set(INFORMED_KINDS))
        _pod(cluster, "a", "p0", 40, "2026-01-01T00:00:00Z")
        clock[0] += 60.0
        assert not controller.tick(1000.0).acted
        assert has_quota_gate(cluster.get("Pod", "p0", "a"))
        api.down = False
        eventually(informed.trusted)
        eventually(lambda: controller.tick(1001.0).lifted == 1)
    finally:
        controller.close()
