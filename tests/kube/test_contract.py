"""One contract, two implementations: MemoryCluster and LightkubeCluster over HTTP against kmock (+ compat).

What reference/deps.md lists as kmock 0.8's gaps (selectors ignored, no watch resume, lists replaced by strategic
merge, no status isolation) is checked here on MemoryCluster alone (the `memory` fixture), and the same checks run
against the real API server through LightkubeCluster in tests/controlplane/test_contract_real.py.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

import pytest

from kubegpu.clock import VirtualClock
from kubegpu.errors import NotFoundError
from kubegpu.kube import KINDS, ApiError, Cluster, Conflict, Invalid, MemoryCluster, NotFound, WatchEvent, record_event
from tests.fakes.apiserver import ApiServer


@pytest.fixture(params=["memory", "kmock"])
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def cluster(backend: str, request: pytest.FixtureRequest) -> Iterator[Cluster]:
    if backend == "memory":
        yield MemoryCluster(VirtualClock(1_700_000_000.0))
        return
    server: ApiServer = request.getfixturevalue("apiserver")
    server.reset()
    adapter = server.cluster()
    yield adapter
    adapter.client.close()


@pytest.fixture
def memory() -> Cluster:
    """MemoryCluster alone, for behaviour kmock lacks (the real API server's side: tests/controlplane/)."""
    return MemoryCluster(VirtualClock(1_700_000_000.0))


def node(name: str, labels: dict[str, str] | None = None, **extra: Any) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels or {}}, **extra}


def pod(name: str, namespace: str = "default", labels: dict[str, str] | None = None, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": labels or {}},
        "spec": {"containers": [{"name": "main", "image": "busybox"}], **spec},
    }


def rv(obj: dict[str, Any]) -> int:
    return int(obj["metadata"]["resourceVersion"])


def names(objs: list[dict[str, Any]]) -> list[str]:
    return [obj["metadata"]["name"] for obj in objs]


def take(events: Iterator[WatchEvent], count: int) -> list[tuple[str, str]]:
    """The first ``count`` events as (type, name); the watch's own timeout ends it early if fewer arrive."""
    return [(event.type, event.object["metadata"]["name"]) for event in itertools.islice(events, count)]


# ---------------------------------------------------------------- create / get / delete
def test_create_fills_in_server_fields(cluster: Cluster) -> None:
    created = cluster.create(node("n1", {"gpu": "h100"}))
    metadata = created["metadata"]
    assert metadata["uid"] and metadata["creationTimestamp"].endswith("Z")
    assert metadata["generation"] == 1
    assert rv(created) > 0
    assert "namespace" not in metadata
    assert cluster.get("Node", "n1") == created


def test_namespaced_objects_default_to_namespace_default(cluster: Cluster) -> None:
    created = cluster.create({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cm"}, "data": {"a": "1"}})
    assert created["metadata"]["namespace"] == "default"
    assert cluster.get("ConfigMap", "cm")["data"] == {"a": "1"}
    assert cluster.get("ConfigMap", "cm", "default")["data"] == {"a": "1"}


def test_resource_versions_increase_with_every_write(cluster: Cluster) -> None:
    first = cluster.create(node("n1"))
    second = cluster.create(node("n2"))
    patched = cluster.patch("Node", "n1", {"metadata": {"labels": {"a": "b"}}})
    assert rv(first) < rv(second) < rv(patched)


def test_create_existing_name_is_conflict_already_exists(cluster: Cluster) -> None:
    cluster.create(node("n1"))
    with pytest.raises(Conflict) as caught:
        cluster.create(node("n1"))
    assert caught.value.code == 409
    assert caught.value.reason == "AlreadyExists"


def test_generate_name(cluster: Cluster) -> None:
    created = cluster.create({"apiVersion": "v1", "kind": "Pod", "metadata": {"generateName": "job-"},
                              "spec": {"containers": [{"name": "c", "image": "x"}]}})
    name = created["metadata"]["name"]
    assert name.startswith("job-") and len(name) > len("job-")
    assert cluster.get("Pod", name)["metadata"]["uid"] == created["metadata"]["uid"]


def test_get_and_delete_missing_are_not_found(cluster: Cluster) -> None:
    with pytest.raises(NotFound) as caught:
        cluster.get("Node", "ghost")
    assert caught.value.code == 404
    with pytest.raises(NotFound):
        cluster.delete("Pod", "ghost", "default")
    with pytest.raises(NotFound):
        cluster.patch("Node", "ghost", {"metadata": {"labels": {"a": "b"}}})


def test_delete_removes(cluster: Cluster) -> None:
    cluster.create(pod("p1"))
    cluster.delete("Pod", "p1", "default")
    with pytest.raises(NotFound):
        cluster.get("Pod", "p1", "default")
    assert cluster.list("Pod") == []


def test_unknown_kind_names_it(cluster: Cluster) -> None:
    with pytest.raises(NotFoundError, match="resource kind 'Deployment' is not known"):
        cluster.get("Deployment", "x")


# ---------------------------------------------------------------- list
def test_list_all_namespaces_or_one(cluster: Cluster) -> None:
    cluster.create(pod("a", "team-a"))
    cluster.create(pod("b", "team-b"))
    cluster.create(pod("c", "team-a"))
    assert names(cluster.list("Pod")) == ["a", "c", "b"]  # sorted by namespace, then name
    assert names(cluster.list("Pod", "team-a")) == ["a", "c"]
    items, version = cluster.list_with_version("Pod", "team-b")
    assert names(items) == ["b"]
    assert int(version) >= rv(items[0])


# Nodes a100 {gpu: a100, mig: "true"}, h100 {gpu: h100} and cpu {}: what each selector lists (also run against the
# real API server by tests/controlplane/test_contract_real.py).
LABEL_SELECTOR_CASES = {
    "gpu=a100": ["a100"],
    "gpu==h100": ["h100"],
    "gpu!=a100": ["cpu", "h100"],
    "gpu in (a100,h100)": ["a100", "h100"],
    "gpu notin (a100)": ["cpu", "h100"],
    "mig": ["a100"],
    "!mig": ["cpu", "h100"],
    "gpu,!mig": ["h100"],
}


def test_label_selectors(memory: Cluster) -> None:
    memory.create(node("a100", {"gpu": "a100", "mig": "true"}))
    memory.create(node("h100", {"gpu": "h100"}))
    memory.create(node("cpu"))
    for selector, expected in {**LABEL_SELECTOR_CASES, "": ["a100", "cpu", "h100"]}.items():
        assert names(memory.list("Node", label_selector=selector)) == expected, selector


def test_field_selectors(memory: Cluster) -> None:
    memory.create(pod("bound", nodeName="n1"))
    memory.create(pod("pending"))
    memory.create(pod("other", "elsewhere", nodeName="n1"))
    assert names(memory.list("Pod", field_selector="spec.nodeName=n1")) == ["bound", "other"]
    assert names(memory.list("Pod", "default", field_selector="spec.nodeName=")) == ["pending"]
    assert names(memory.list("Pod", field_selector="spec.nodeName!=n1")) == ["pending"]
    assert names(memory.list("Pod", field_selector="metadata.name=bound,metadata.namespace==default")) == ["bound"]
    assert names(memory.list("Node", field_selector="metadata.name=nothing")) == []


# ---------------------------------------------------------------- patch
def test_merge_patch_adds_and_removes_keys(cluster: Cluster) -> None:
    cluster.create(node("n1", {"keep": "1", "drop": "2"}))
    patched = cluster.patch("Node", "n1", {"metadata": {"labels": {"drop": None, "new": "3"}}})
    assert patched["metadata"]["labels"] == {"keep": "1", "new": "3"}
    assert cluster.get("Node", "n1")["metadata"]["labels"] == {"keep": "1", "new": "3"}


def test_patch_with_stale_resource_version_is_conflict(cluster: Cluster) -> None:
    created = cluster.create(node("n1"))
    cluster.patch("Node", "n1", {"metadata": {"labels": {"a": "1"}}})
    stale = created["metadata"]["resourceVersion"]
    with pytest.raises(Conflict) as caught:
        cluster.patch("Node", "n1", {"metadata": {"resourceVersion": stale, "labels": {"a": "2"}}})
    assert caught.value.code == 409
    current = cluster.get("Node", "n1")
    assert current["metadata"]["labels"] == {"a": "1"}
    fresh = current["metadata"]["resourceVersion"]
    assert cluster.patch("Node", "n1", {"metadata": {"resourceVersion": fresh, "labels": {"a": "2"}}})["metadata"][
        "labels"] == {"a": "2"}


def test_json_patch(cluster: Cluster) -> None:
    cluster.create(node("n1", {"a": "1"}))
    patched = cluster.patch("Node", "n1", [
        {"op": "test", "path": "/metadata/labels/a", "value": "1"},
        {"op": "replace", "path": "/metadata/labels/a", "value": "2"},
        {"op": "add", "path": "/metadata/labels/b", "value": "3"},
    ], patch_type="json")
    assert patched["metadata"]["labels"] == {"a": "2", "b": "3"}


def test_failed_json_patch_test_is_invalid(cluster: Cluster) -> None:
    cluster.create(node("n1", {"a": "1"}))
    with pytest.raises(Invalid) as caught:
        cluster.patch("Node", "n1", [{"op": "test", "path": "/metadata/labels/a", "value": "9"},
                                     {"op": "remove", "path": "/metadata/labels/a"}], patch_type="json")
    assert caught.value.code == 422
    assert cluster.get("Node", "n1")["metadata"]["labels"] == {"a": "1"}


def test_strategic_merge_patch_merges_maps(cluster: Cluster) -> None:
    cluster.create(pod("p1", labels={"a": "1"}))
    patched = cluster.patch("Pod", "p1", {"metadata": {"labels": {"b": "2"}}}, "default", patch_type="strategic")
    assert patched["metadata"]["labels"] == {"a": "1", "b": "2"}


def test_strategic_merge_patch_merges_containers_by_name(memory: Cluster) -> None:
    memory.create(pod("p1"))
    patched = memory.patch("Pod", "p1", {"spec": {"containers": [{"name": "sidecar", "image": "envoy"}]}},
                            "default", patch_type="strategic")
    assert [(c["name"], c["image"]) for c in patched["spec"]["containers"]] == [("main", "busybox"),
                                                                               ("sidecar", "envoy")]


def test_strategic_merge_patch_is_refused_for_custom_resources(cluster: Cluster) -> None:
    cluster.create({"apiVersion": "kubegpu.io/v1", "kind": "NodePool", "metadata": {"name": "gpu"}, "spec": {}})
    with pytest.raises(ApiError) as caught:
        cluster.patch("NodePool", "gpu", {"spec": {"limits": {"nvidia.com/gpu": 8}}}, patch_type="strategic")
    assert caught.value.code == 415


def test_generation_counts_spec_changes_only(cluster: Cluster) -> None:
    cluster.create({"apiVersion": "kubegpu.io/v1", "kind": "NodeClaim", "metadata": {"name": "c1"},
                    "spec": {"nodeClassRef": {"name": "default"}}})
    assert cluster.patch("NodeClaim", "c1", {"metadata": {"labels": {"a": "b"}}})["metadata"]["generation"] == 1
    assert cluster.patch("NodeClaim", "c1", {"status": {"nodeName": "n1"}}, subresource="status")["metadata"][
        "generation"] == 1
    assert cluster.patch("NodeClaim", "c1", {"spec": {"expireAfter": "720h"}})["metadata"]["generation"] == 2


def test_status_subresource_patch(memory: Cluster) -> None:
    memory.create(pod("p1"))
    patched = memory.patch("Pod", "p1", {"status": {"phase": "Running"}}, "default", subresource="status")
    assert patched["status"]["phase"] == "Running"
    assert memory.get("Pod", "p1")["status"]["phase"] == "Running"
    after_main = memory.patch("Pod", "p1", {"status": {"phase": "Failed"}, "metadata": {"labels": {"x": "y"}}})
    assert after_main["status"]["phase"] == "Running"
    assert after_main["metadata"]["labels"] == {"x": "y"}
    after_status = memory.patch("Pod", "p1", {"spec": {"nodeName": "n9"}, "status": {"phase": "Succeeded"}},
                                 "default", subresource="status")
    assert "nodeName" not in after_status["spec"]
    assert after_status["status"]["phase"] == "Succeeded"


def test_kinds_without_status_subresource_refuse_status_patches(cluster: Cluster) -> None:
    cluster.create({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cm"}})
    with pytest.raises(NotFound):
        cluster.patch("ConfigMap", "cm", {"status": {"x": 1}}, subresource="status")


def test_custom_resources_round_trip(cluster: Cluster) -> None:
    for kind in ("NodePool", "NodeClaim", "ClusterPolicy"):
        created = cluster.create({"apiVersion": "kubegpu.io/v1", "kind": kind, "metadata": {"name": "x"},
                                  "spec": {"field": [1, 2]}})
        assert created["apiVersion"] == "kubegpu.io/v1"
        assert cluster.patch(kind, "x", {"status": {"ready": True}}, subresource="status")["status"] == {"ready": True}
        assert names(cluster.list(kind)) == ["x"]
        cluster.delete(kind, "x")
        assert cluster.list(kind) == []


# ---------------------------------------------------------------- finalizers
def test_finalizers_hold_deletion_until_removed(cluster: Cluster) -> None:
    cluster.create({"apiVersion": "kubegpu.io/v1", "kind": "NodeClaim",
                    "metadata": {"name": "c1", "finalizers": ["kubegpu.io/termination"]}, "spec": {}})
    before = cluster.get("NodeClaim", "c1")
    cluster.delete("NodeClaim", "c1")
    marked = cluster.get("NodeClaim", "c1")
    assert marked["metadata"]["deletionTimestamp"]
    assert rv(marked) > rv(before)
    cluster.patch("NodeClaim", "c1", {"metadata": {"finalizers": None}})
    with pytest.raises(NotFound):
        cluster.get("NodeClaim", "c1")


# ---------------------------------------------------------------- watch
def test_watch_lists_existing_objects_then_streams_changes(cluster: Cluster) -> None:
    cluster.create(node("n1"))
    events = cluster.watch("Node", timeout=2)
    assert take(events, 1) == [("ADDED", "n1")]  # the watch is established now
    cluster.patch("Node", "n1", {"metadata": {"labels": {"a": "b"}}})
    cluster.create(node("n2"))
    cluster.delete("Node", "n1")
    assert take(events, 3) == [("MODIFIED", "n1"), ("ADDED", "n2"), ("DELETED", "n1")]


def test_watch_in_one_namespace(cluster: Cluster) -> None:
    cluster.create(pod("mine", "team-a"))
    events = cluster.watch("Pod", namespace="team-a", timeout=2)
    assert take(events, 1) == [("ADDED", "mine")]
    cluster.create(pod("theirs", "team-b"))
    cluster.create(pod("second", "team-a"))
    assert take(events, 1) == [("ADDED", "second")]


def test_watch_event_carries_the_new_object(cluster: Cluster) -> None:
    cluster.create(node("n1"))
    events = cluster.watch("Node", timeout=2)
    next(events)
    patched = cluster.patch("Node", "n1", {"metadata": {"labels": {"gpu": "h100"}}})
    event = next(events)
    assert event.type == "MODIFIED"
    assert event.object["metadata"]["labels"] == {"gpu": "h100"}
    assert event.object["metadata"]["resourceVersion"] == patched["metadata"]["resourceVersion"]


def test_watch_timeout_ends_an_idle_watch(cluster: Cluster) -> None:
    assert list(cluster.watch("ConfigMap", timeout=0.2)) == []


def test_watch_timeout_zero_yields_what_is_there_and_returns(cluster: Cluster) -> None:
    cluster.create(node("n1"))
    cluster.create(node("n2"))
    assert take(cluster.watch("Node", timeout=0), 10) == [("ADDED", "n1"), ("ADDED", "n2")]


def test_watch_from_resource_version_skips_older_events(memory: Cluster) -> None:
    memory.create(node("old"))
    _, version = memory.list_with_version("Node")
    memory.create(node("new"))
    memory.patch("Node", "old", {"metadata": {"labels": {"a": "b"}}})
    assert take(memory.watch("Node", resource_version=version, timeout=0), 10) == [("ADDED", "new"),
                                                                                    ("MODIFIED", "old")]


def test_watch_with_label_selector(memory: Cluster) -> None:
    memory.create(node("gpu", {"gpu": "true"}))
    memory.create(node("cpu"))
    assert take(memory.watch("Node", label_selector="gpu=true", timeout=0), 10) == [("ADDED", "gpu")]


# ---------------------------------------------------------------- events
def test_record_event_creates_and_folds_repeats(cluster: Cluster) -> None:
    target = cluster.create(node("n1"))
    record_event(cluster, target, "MigReconfigured", "layout all-balanced applied", "Normal", "kubegpu-mig-manager")
    record_event(cluster, target, "MigReconfigured", "layout all-balanced applied", "Normal", "kubegpu-mig-manager")
    record_event(cluster, target, "MigFailed", "GPU 3 busy")
    events = sorted(cluster.list("Event", "default"), key=lambda event: event["reason"])
    assert [(e["reason"], e["count"], e["type"]) for e in events] == [("MigFailed", 1, "Warning"),
                                                                      ("MigReconfigured", 2, "Normal")]
    involved = events[1]["involvedObject"]
    assert (involved["kind"], involved["name"], involved["uid"]) == ("Node", "n1", target["metadata"]["uid"])
    assert events[1]["source"] == {"component": "kubegpu-mig-manager"}


MINIMAL_BODIES: dict[str, dict[str, Any]] = {
    "Node": {},
    "Pod": {"spec": {"containers": [{"name": "c", "image": "x"}]}},
    "ConfigMap": {"data": {"k": "v"}},
    "Event": {"involvedObject": {"kind": "Node", "name": "n1"}, "reason": "Test", "message": "m", "type": "Normal"},
    "DaemonSet": {"spec": {"selector": {"matchLabels": {"app": "a"}}, "template": {
        "metadata": {"labels": {"app": "a"}}, "spec": {"containers": [{"name": "c", "image": "x"}]}}}},
    "Lease": {"spec": {"holderIdentity": "agent-1", "leaseDurationSeconds": 15}},
    "PodDisruptionBudget": {"spec": {"maxUnavailable": 1, "selector": {"matchLabels": {"app": "a"}}}},
    "NodePool": {"spec": {"limits": {"nvidia.com/gpu": 64}}},
    "NodeClaim": {"spec": {"nodeClassRef": {"name": "default"}}},
    "ClusterPolicy": {"spec": {"devicePlugin": {"enabled": True}}},
}


@pytest.mark.parametrize("kind", sorted(MINIMAL_BODIES))
def test_every_registered_kind_round_trips(cluster: Cluster, kind: str) -> None:
    spec = KINDS[kind]
    created = cluster.create({"apiVersion": spec.api_version, "kind": kind, "metadata": {"name": "x"},
                              **MINIMAL_BODIES[kind]})
    assert (created["apiVersion"], created["kind"]) == (spec.api_version, kind)
    assert ("namespace" in created["metadata"]) is spec.namespaced
    patched = cluster.patch(kind, "x", {"metadata": {"labels": {"k": "v"}}})
    assert patched["metadata"]["labels"] == {"k": "v"}
    assert names(cluster.list(kind)) == ["x"]
    cluster.delete(kind, "x")
    assert cluster.list(kind) == []


def test_kinds_cover_the_contract() -> None:
    assert set(MINIMAL_BODIES) <= set(KINDS)
    assert {kind for kind, spec in KINDS.items() if spec.group == "kubegpu.io"} >= {"NodePool", "NodeClaim",
                                                                                    "ClusterPolicy"}
