"""The controller derives each object's facts once per resourceVersion (fleet scale: issue 28)."""

from __future__ import annotations

from typing import Any

from kubegpu.clock import VirtualClock
from kubegpu.kube import MemoryCluster
from kubegpu.kube.informer import InformedCluster
from kubegpu.partitioner.controller import VersionMemo


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
