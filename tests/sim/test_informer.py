"""InformedCluster: the store's lists, in its order, kept current by change notifications, without copies."""

from __future__ import annotations

from typing import Any

from kubegpu.clock import VirtualClock
from kubegpu.kube import MemoryCluster
from kubegpu.sim.informer import InformedCluster


def pod(name: str, namespace: str = "default") -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": namespace},
            "spec": {}, "status": {"phase": "Pending"}}


def test_lists_follow_every_change_in_the_stores_order() -> None:
    store = MemoryCluster(VirtualClock(0))
    store.create(pod("before"))
    informed = InformedCluster(store, ("Pod", "Node"))
    for name, namespace in (("b", "x"), ("a", "y"), ("c", "x")):
        informed.create(pod(name, namespace))
    store.create({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1"}})
    informed.patch("Pod", "b", {"spec": {"nodeName": "n1"}}, namespace="x")
    store.delete("Pod", "c", namespace="x")
    assert informed.list("Pod") == store.list("Pod")
    assert [p["metadata"]["name"] for p in informed.list("Pod")] == ["before", "b", "a"]
    assert informed.list("Pod")[1]["spec"]["nodeName"] == "n1"
    assert informed.list("Node") == store.list("Node")
    assert informed.list_with_version("Pod")[1] == store.resource_version


def test_lists_share_the_stored_objects_until_they_change() -> None:
    store = MemoryCluster(VirtualClock(0))
    informed = InformedCluster(store, ("Pod",))
    informed.create(pod("a"))
    first, second = informed.list("Pod"), informed.list("Pod")
    assert first is not second and first[0] is second[0]  # a new list, the same (never modified) object
    store.patch("Pod", "a", {"status": {"phase": "Running"}}, subresource="status")
    assert first[0]["status"]["phase"] == "Pending"  # what was listed stays as it was
    assert informed.list("Pod")[0]["status"]["phase"] == "Running"


def test_other_kinds_and_filtered_lists_go_to_the_store() -> None:
    store = MemoryCluster(VirtualClock(0))
    informed = InformedCluster(store, ("Pod",))
    store.create(pod("a", "x"))
    store.create(pod("b", "y"))
    assert [p["metadata"]["name"] for p in informed.list("Pod", namespace="y")] == ["b"]
    store.create({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1", "labels": {"k": "v"}}})
    assert [n["metadata"]["name"] for n in informed.list("Node", label_selector="k=v")] == ["n1"]
    assert informed.get("Pod", "a", "x")["metadata"]["name"] == "a"
