"""`kubegpu place` on the in-memory API: pending pods with `schedulerName: kubegpu` get the node and GPUs the
placement core picks (the same answer as running the core over the same sequence), their claims allocated like
kube-scheduler allocates shares (consumedCapacity, shareID, node selector, reservedFor) before the pod is bound;
claims held by others count; shapes it does not place are reported, never guessed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from kubegpu.clock import VirtualClock
from kubegpu.dra.classes import shipped_class_objects
from kubegpu.dra.devices import gpu_offers, read_node
from kubegpu.dra.slices import build_slices
from kubegpu.gpu.simulated import SimulatedBackend
from kubegpu.kube.memory import MemoryCluster
from kubegpu.placement.controller import PlacementController
from kubegpu.placement.objects import build_state, cpu_request, inventory, pod_claim_names, pod_request
from kubegpu.scheduling.placement import choose, make_policy

NODES = {"gpu-a": "2xA100-SXM4-80GB", "gpu-b": "1xA100-SXM4-80GB"}


class BindingCluster(MemoryCluster):
    """The in-memory API plus what the API server does with a Binding: set the pod's nodeName."""

    def create(self, obj: dict[str, Any]) -> dict[str, Any]:
        if obj.get("kind") == "Binding":
            meta = obj["metadata"]
            pod = self.get("Pod", meta["name"], meta["namespace"])
            if (pod.get("spec") or {}).get("nodeName"):
                from kubegpu.kube.errors import Conflict
                raise Conflict(f"pod {meta['name']} is already bound")
            return self.patch("Pod", meta["name"], {"spec": {"nodeName": obj["target"]["name"]}}, meta["namespace"])
        return super().create(obj)


def claim(name: str, thousandths: int | None, count: int = 1, cls: str = "fraction.gpu.kubegpu.io",
          **extra: Any) -> dict[str, Any]:
    exactly: dict[str, Any] = {"deviceClassName": cls, "count": count, **extra}
    if thousandths is not None:
        exactly["capacity"] = {"requests": {"compute": str(thousandths)}}
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": "ml"},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}}}


def pod(name: str, created: str, scheduler: str = "kubegpu") -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "ml", "creationTimestamp": created},
            "spec": {"schedulerName": scheduler, "resourceClaims": [{"name": "gpu", "resourceClaimName": name}],
                     "containers": [{"name": "c", "image": "x", "resources": {"requests": {"cpu": "1"}}}]}}


@pytest.fixture
def cluster(tmp_path: Path) -> BindingCluster:
    api = BindingCluster(VirtualClock(1000.0))
    for node, gpus in NODES.items():
        api.create({"apiVersion": "v1", "kind": "Node", "metadata": {"name": node},
                    "status": {"allocatable": {"cpu": "16", "memory": "64Gi"}}})
        backend = SimulatedBackend.create(tmp_path / f"{node}.json", gpus=gpus, node_name=node)
        for item in build_slices(node, gpu_offers(read_node(backend), dynamic_mig=False, fractional=True)):
            api.create(item)
    for device_class in shipped_class_objects():
        api.create(device_class)
    return api


SEQUENCE = [("p1", 300, 1), ("p2", 700, 1), ("p3", 500, 1), ("p4", None, 2), ("p5", 600, 1), ("p6", 400, 1)]


def test_pods_land_where_the_placement_core_puts_them(cluster: BindingCluster) -> None:
    for i, (name, share, count) in enumerate(SEQUENCE):
        cluster.create(claim(name, share, count))
        cluster.create(pod(name, f"2026-01-01T00:00:{i:02d}Z"))
    cluster.create(pod("theirs", "2026-01-01T00:00:00Z", scheduler="default-scheduler"))
    # the prediction: the same policy over the same state and sequence, without any API
    state = build_state(cluster.list("Node"), inventory(cluster.list("ResourceSlice")), [], [])
    policy = make_policy("kubegpu")
    predicted = {}
    for name, *_ in SEQUENCE:
        ask = pod_request(cluster.get("Pod", name, "ml"), cluster.get("ResourceClaim", name, "ml"))
        placement = choose(ask.request, state, policy)
        if placement is not None:
            state.apply(ask.request, placement)
            node = state.names[placement.node]
            predicted[f"ml/{name}"] = (node, tuple(f"gpu-{g}" for g in placement.gpus))
    controller = PlacementController(cluster, make_policy("kubegpu"), leader_elect=False)
    result = controller.tick(1000.0)
    assert {d.pod: (d.node, d.devices) for d in result.bound} == predicted
    assert len(predicted) == 5 and result.pending == 1  # 3.8 of 3 GPUs asked: one share finds no room
    for key, (node, devices) in predicted.items():
        name = key.split("/")[1]
        assert cluster.get("Pod", name, "ml")["spec"]["nodeName"] == node
        got = cluster.get("ResourceClaim", name, "ml")
        allocation = got["status"]["allocation"]
        assert [r["device"] for r in allocation["devices"]["results"]] == list(devices)
        assert all(r["pool"] == node and r["shareID"] for r in allocation["devices"]["results"])
        assert allocation["nodeSelector"]["nodeSelectorTerms"][0]["matchFields"][0]["values"] == [node]
        uid = cluster.get("Pod", name, "ml")["metadata"]["uid"]
        assert got["status"]["reservedFor"] == [{"resource": "pods", "name": name, "uid": uid}]
        assert "resource.kubernetes.io/delete-protection" in got["metadata"]["finalizers"]
    assert "nodeName" not in cluster.get("Pod", "theirs", "ml")["spec"]  # kube-scheduler's pod: not ours


def test_claims_allocated_by_others_count(cluster: BindingCluster) -> None:
    held = claim("held", 900)
    held["status"] = {"allocation": {"devices": {"results": [
        {"request": "gpu", "driver": "gpu.nvidia.com", "pool": "gpu-b", "device": "gpu-0",
         "shareID": "0b6a5b2e-2f0a-4f0e-9a51-6b0d3c1f2e11", "consumedCapacity": {"compute": "900"}}]}}}
    cluster.create(held)
    cluster.create(claim("small", 200))
    cluster.create(pod("small", "2026-01-01T00:00:00Z"))
    [decision] = PlacementController(cluster, make_policy("bestfit"), leader_elect=False).tick(1000.0).bound
    assert (decision.node, decision.devices) != ("gpu-b", ("gpu-0",))  # only 100 left there


def test_unplaced_shapes_are_reported_once_and_left_pending(cluster: BindingCluster) -> None:
    cluster.create(claim("picky", 300, selectors=[{"cel": {"expression": "true"}}]))
    cluster.create(pod("picky", "2026-01-01T00:00:00Z"))
    controller = PlacementController(cluster, make_policy("kubegpu"), leader_elect=False)
    for now in (1000.0, 1001.0):
        assert controller.tick(now).bound == []
    [event] = [e for e in cluster.list("Event") if e.get("reason") == "FailedScheduling"]
    assert "selectors" in event["message"] and "picky" in event["message"]
    assert event.get("count", 1) == 1
    assert "allocation" not in (cluster.get("ResourceClaim", "picky", "ml").get("status") or {})


def test_a_claim_written_but_not_bound_is_bound_next_pass(cluster: BindingCluster) -> None:
    """Record before act: a pass that wrote the allocation but whose bind failed leaves the claim reserved for the
    pod; the next pass binds the pod to that node instead of placing it again."""
    cluster.create(claim("p", 300))
    cluster.create(pod("p", "2026-01-01T00:00:00Z"))
    controller = PlacementController(cluster, make_policy("kubegpu"), leader_elect=False)
    original = controller._bind
    controller._bind = lambda p, node: False  # type: ignore[method-assign]
    assert controller.tick(1000.0).bound == []
    written = cluster.get("ResourceClaim", "p", "ml")["status"]["allocation"]["devices"]["results"]
    controller._bind = original  # type: ignore[method-assign]
    [decision] = controller.tick(1001.0).bound
    assert decision.node == written[0]["pool"] and decision.devices == (written[0]["device"],)
    assert cluster.get("ResourceClaim", "p", "ml")["status"]["allocation"]["devices"]["results"] == written
    assert pod_claim_names(cluster.get("Pod", "p", "ml")) == ["p"]


def test_node_filters_other_than_resources_still_apply(cluster: BindingCluster) -> None:
    """A pod pinned by nodeSelector goes there even where the policy would rather not; a tainted node takes only
    pods that tolerate the taint."""
    cluster.patch("Node", "gpu-a", {"metadata": {"labels": {"pool": "a"}},
                                    "spec": {"taints": [{"key": "team", "value": "x", "effect": "NoSchedule"}]}})
    cluster.create(claim("pinned", 300))
    pinned = pod("pinned", "2026-01-01T00:00:00Z")
    pinned["spec"]["nodeSelector"] = {"pool": "a"}
    pinned["spec"]["tolerations"] = [{"key": "team", "operator": "Exists"}]
    cluster.create(pinned)
    for i in range(3):
        cluster.create(claim(f"free{i}", 300))
        cluster.create(pod(f"free{i}", f"2026-01-01T00:00:0{i + 1}Z"))
    result = PlacementController(cluster, make_policy("kubegpu"), leader_elect=False).tick(1000.0)
    where = {d.pod: d.node for d in result.bound}
    assert where["ml/pinned"] == "gpu-a"
    assert {where[f"ml/free{i}"] for i in range(3)} == {"gpu-b"}  # gpu-a's taint is not tolerated


def test_a_pod_that_does_not_fit_is_asked_about_again_only_once_the_cluster_changed(cluster: BindingCluster) -> None:
    """The kubegpu policy learns its popularity model from the requests it is asked about: a pending pod re-asked on
    every pass would count as demand again and again."""
    asked: list[str] = []
    inner = make_policy("kubegpu")

    class Counting:
        def choose(self, request: Any, state: Any) -> Any:
            asked.append(f"{request.gpu_count}x{request.gpu_milli}")
            return inner.choose(request, state)

    cluster.create(claim("huge", None, count=4))  # 4 whole GPUs: 3 exist
    cluster.create(pod("huge", "2026-01-01T00:00:00Z"))
    controller = PlacementController(cluster, Counting(), leader_elect=False)
    for now in (1000.0, 1001.0, 1002.0):
        assert controller.tick(now).bound == []
    assert asked == ["4x1000"]
    cluster.create(claim("small", 100))
    cluster.create(pod("small", "2026-01-01T00:00:01Z"))
    assert [d.pod for d in controller.tick(1003.0).bound] == ["ml/small"]
    assert asked == ["4x1000", "1x100"]  # "huge" came first, before anything changed
    for now in (1004.0, 1005.0):
        controller.tick(now)
    assert asked == ["4x1000", "1x100", "4x1000"]  # the state changed (a share was taken): asked once more


def test_a_pod_without_claims_is_placed_by_cpu_and_memory(cluster: BindingCluster) -> None:
    cpu_only = pod("cpu", "2026-01-01T00:00:00Z")
    del cpu_only["spec"]["resourceClaims"]
    cpu_only["spec"]["containers"][0]["resources"]["requests"] = {"cpu": "15", "memory": "1Gi"}
    cluster.create(cpu_only)
    state = build_state(cluster.list("Node"), inventory(cluster.list("ResourceSlice")), [], [])
    predicted = choose(cpu_request(cluster.get("Pod", "cpu", "ml")).request, state, make_policy("kubegpu"))
    assert predicted is not None
    [decision] = PlacementController(cluster, make_policy("kubegpu"), leader_elect=False).tick(1000.0).bound
    assert (decision.node, decision.devices) == (state.names[predicted.node], ())
    cluster.create(claim("gpu", None, count=1))
    gpu_pod = pod("gpu", "2026-01-01T00:00:01Z")
    gpu_pod["spec"]["containers"][0]["resources"]["requests"] = {"cpu": "2"}
    cluster.create(gpu_pod)
    [decision] = PlacementController(cluster, make_policy("kubegpu"), leader_elect=False).tick(1001.0).bound
    assert decision.node != state.names[predicted.node]  # the bound CPU-only pod left 1 CPU there


def test_a_pod_bound_but_not_yet_seen_bound_holds_its_place(cluster: BindingCluster) -> None:
    """The informer shows a bind only once its watch delivers it: until then the pod still looks pending. It is
    neither placed again nor forgotten — its CPU and memory stay taken on its node for the next pods."""
    bindings: list[str] = []
    original = cluster.create

    def lagging(obj: dict[str, Any]) -> dict[str, Any]:
        if obj.get("kind") == "Binding":  # accepted, but the pod's view is not updated (yet)
            bindings.append(f"{obj['metadata']['name']}->{obj['target']['name']}")
            return obj
        return original(obj)

    cluster.create = lagging  # type: ignore[method-assign]
    first = pod("first", "2026-01-01T00:00:00Z")
    del first["spec"]["resourceClaims"]
    first["spec"]["containers"][0]["resources"]["requests"] = {"cpu": "10"}
    original(first)
    controller = PlacementController(cluster, make_policy("kubegpu"), leader_elect=False)
    [placed] = controller.tick(1000.0).bound
    second = pod("second", "2026-01-01T00:00:01Z")
    del second["spec"]["resourceClaims"]
    second["spec"]["containers"][0]["resources"]["requests"] = {"cpu": "10"}
    original(second)
    [then] = controller.tick(1001.0).bound
    assert then.pod == "ml/second" and then.node != placed.node  # 16 CPUs a node: both cannot share one
    assert bindings == [f"first->{placed.node}", f"second->{then.node}"]  # "first" was not bound twice
