"""MemoryCluster behaviour beyond the shared contract: history limits, selector transitions, threads, subscribe."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kubegpu.clock import VirtualClock
from kubegpu.kube import BadRequest, Conflict, Gone, Invalid, MemoryCluster, NotFound, WatchEvent, record_event


def node(name: str, labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels or {}}}


def seen(events: Any) -> list[tuple[str, str]]:
    return [(event.type, event.object["metadata"]["name"]) for event in events]


def test_timestamps_come_from_the_clock() -> None:
    clock = VirtualClock(86_400.0)
    cluster = MemoryCluster(clock)
    assert cluster.create(node("n1"))["metadata"]["creationTimestamp"] == "1970-01-02T00:00:00Z"
    cluster.create({"apiVersion": "v1", "kind": "ConfigMap",
                    "metadata": {"name": "cm", "finalizers": ["kubegpu.io/keep"]}})
    clock.advance(90)
    cluster.delete("ConfigMap", "cm")
    assert cluster.get("ConfigMap", "cm")["metadata"]["deletionTimestamp"] == "1970-01-02T00:01:30Z"


def test_uids_are_deterministic() -> None:
    first, second = MemoryCluster(VirtualClock()), MemoryCluster(VirtualClock())
    assert first.create(node("a"))["metadata"]["uid"] == second.create(node("a"))["metadata"]["uid"]


def test_watch_from_a_forgotten_resource_version_is_gone() -> None:
    cluster = MemoryCluster(VirtualClock(), history_limit=3)
    start = cluster.create(node("first"))["metadata"]["resourceVersion"]  # "0" would mean "any version"
    for index in range(8):
        cluster.create(node(f"n{index}"))
    with pytest.raises(Gone) as caught:
        cluster.watch("Node", resource_version=start, timeout=0)
    assert caught.value.code == 410
    recent = str(int(cluster.resource_version) - 2)
    assert seen(cluster.watch("Node", resource_version=recent, timeout=0)) == [("ADDED", "n6"), ("ADDED", "n7")]


def test_lagging_watch_gets_gone_when_history_is_trimmed_under_it() -> None:
    cluster = MemoryCluster(VirtualClock(), history_limit=2)
    start = cluster.create(node("first"))["metadata"]["resourceVersion"]
    events = cluster.watch("Node", resource_version=start, timeout=0)
    for index in range(6):
        cluster.create(node(f"n{index}"))
    with pytest.raises(Gone):
        next(events)


def test_bad_resource_version_is_bad_request() -> None:
    with pytest.raises(BadRequest, match="resourceVersion 'abc'"):
        MemoryCluster().watch("Node", resource_version="abc")


def test_label_changes_turn_into_added_and_deleted_for_selected_watches() -> None:
    cluster = MemoryCluster(VirtualClock())
    cluster.create(node("n1"))
    start = cluster.resource_version
    cluster.patch("Node", "n1", {"metadata": {"labels": {"gpu": "true"}}})
    cluster.patch("Node", "n1", {"metadata": {"labels": {"zone": "a"}}})
    cluster.patch("Node", "n1", {"metadata": {"labels": {"gpu": None}}})
    events = list(cluster.watch("Node", label_selector="gpu=true", resource_version=start, timeout=0))
    assert [event.type for event in events] == ["ADDED", "MODIFIED", "DELETED"]
    assert events[2].object["metadata"]["labels"] == {"gpu": "true", "zone": "a"}  # the last state that matched
    assert events[2].object["metadata"]["resourceVersion"] == cluster.resource_version


def test_field_selected_watch_follows_pod_binding() -> None:
    cluster = MemoryCluster(VirtualClock())
    start = cluster.create(node("n1"))["metadata"]["resourceVersion"]
    cluster.create({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": {"containers": []}})
    cluster.patch("Pod", "p", {"spec": {"nodeName": "n1"}})
    cluster.delete("Pod", "p")
    watch = cluster.watch("Pod", field_selector="spec.nodeName=n1", resource_version=start, timeout=0)
    assert seen(watch) == [("ADDED", "p"), ("DELETED", "p")]


def test_watch_in_a_thread_wakes_on_change() -> None:
    cluster = MemoryCluster(VirtualClock())
    start_version = cluster.create(node("early"))["metadata"]["resourceVersion"]
    received: list[str] = []
    started = threading.Event()

    def consume() -> None:
        events = cluster.watch("Node", resource_version=start_version, timeout=5)
        started.set()
        for event in events:
            received.append(event.object["metadata"]["name"])
            return

    thread = threading.Thread(target=consume)
    thread.start()
    started.wait(5)
    cluster.create(node("late"))
    thread.join(5)
    assert received == ["late"]


def test_concurrent_read_modify_write_with_conflict_retries_loses_nothing() -> None:
    cluster = MemoryCluster(VirtualClock())
    cluster.create({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "counter"}, "data": {"n": "0"}})
    conflicts = []

    def increment(times: int) -> None:
        for _ in range(times):
            while True:
                current = cluster.get("ConfigMap", "counter")
                value = int(current["data"]["n"]) + 1
                try:
                    cluster.patch("ConfigMap", "counter", {"metadata": {"resourceVersion": current["metadata"][
                        "resourceVersion"]}, "data": {"n": str(value)}})
                    break
                except Conflict:
                    conflicts.append(1)

    threads = [threading.Thread(target=increment, args=(50,)) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert cluster.get("ConfigMap", "counter")["data"]["n"] == "200"


def test_subscribe_calls_back_on_every_change_until_unsubscribed() -> None:
    cluster = MemoryCluster(VirtualClock())
    received: list[WatchEvent] = []
    unsubscribe = cluster.subscribe("Node", received.append)
    cluster.create(node("n1"))
    cluster.create({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "other-kind"}})
    cluster.patch("Node", "n1", {"metadata": {"labels": {"a": "b"}}})
    cluster.delete("Node", "n1")
    unsubscribe()
    cluster.create(node("n2"))
    assert seen(received) == [("ADDED", "n1"), ("MODIFIED", "n1"), ("DELETED", "n1")]


def test_no_op_patch_keeps_resource_version_and_sends_nothing() -> None:
    cluster = MemoryCluster(VirtualClock())
    created = cluster.create(node("n1", {"a": "b"}))
    assert cluster.patch("Node", "n1", {"metadata": {"labels": {"a": "b"}}}) == created
    assert seen(cluster.watch("Node", resource_version=created["metadata"]["resourceVersion"], timeout=0)) == []


def test_returned_objects_are_copies() -> None:
    cluster = MemoryCluster(VirtualClock())
    given = node("n1", {"a": "b"})
    created = cluster.create(given)
    given["metadata"]["labels"]["a"] = "changed"
    created["metadata"]["labels"]["a"] = "changed"
    cluster.get("Node", "n1")["metadata"]["labels"]["a"] = "changed"
    assert cluster.get("Node", "n1")["metadata"]["labels"] == {"a": "b"}


@pytest.mark.parametrize(
    ("patch", "message"),
    [
        ({"metadata": {"name": "renamed"}}, "metadata.name: field is immutable"),
        ({"metadata": None}, "metadata: Required value"),
    ],
)
def test_identity_fields_cannot_be_patched(patch: dict[str, Any], message: str) -> None:
    cluster = MemoryCluster(VirtualClock())
    cluster.create(node("n1"))
    with pytest.raises(Invalid, match=message):
        cluster.patch("Node", "n1", patch)


def test_system_fields_survive_patches() -> None:
    cluster = MemoryCluster(VirtualClock())
    created = cluster.create(node("n1"))
    patched = cluster.patch("Node", "n1", {"metadata": {"uid": "forged", "creationTimestamp": None,
                                                        "labels": {"a": "b"}}})
    assert patched["metadata"]["uid"] == created["metadata"]["uid"]
    assert patched["metadata"]["creationTimestamp"] == created["metadata"]["creationTimestamp"]


def test_no_new_finalizers_while_deleting() -> None:
    cluster = MemoryCluster(VirtualClock())
    cluster.create({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cm", "finalizers": ["a"]}})
    cluster.delete("ConfigMap", "cm")
    with pytest.raises(Invalid, match="no new finalizers"):
        cluster.patch("ConfigMap", "cm", {"metadata": {"finalizers": ["a", "b"]}})
    cluster.delete("ConfigMap", "cm")  # a second delete while marked changes nothing
    assert cluster.get("ConfigMap", "cm")["metadata"]["finalizers"] == ["a"]


@pytest.mark.parametrize(
    ("obj", "error", "message"),
    [
        ({"kind": "Node", "metadata": {"name": "Bad_Name"}}, Invalid, "lowercase DNS subdomain"),
        ({"metadata": {"name": "n"}}, Invalid, "kind: Required value"),
        ({"kind": "Node", "metadata": {}}, Invalid, "metadata.name: Required value"),
        ({"kind": "Node"}, Invalid, "metadata: Required value"),
        ({"kind": "Node", "apiVersion": "v2", "metadata": {"name": "n"}}, Invalid, "apiVersion 'v2'"),
        ({"kind": "Node", "metadata": {"name": "n", "resourceVersion": "5"}}, Invalid, "must not be set on create"),
    ],
)
def test_bad_creates_name_the_field(obj: dict[str, Any], error: type[Exception], message: str) -> None:
    with pytest.raises(error, match=message):
        MemoryCluster().create(obj)


def test_bad_patch_requests() -> None:
    cluster = MemoryCluster()
    cluster.create(node("n1"))
    with pytest.raises(BadRequest, match="patch type 'apply'"):
        cluster.patch("Node", "n1", {}, patch_type="apply")
    with pytest.raises(NotFound, match="no subresource 'scale'"):
        cluster.patch("Node", "n1", {}, subresource="scale")
    with pytest.raises(BadRequest, match="must be an object"):
        cluster.patch("Node", "n1", [{"op": "add"}])
    with pytest.raises(BadRequest, match="must be a list of operations"):
        cluster.patch("Node", "n1", {"op": "add"}, patch_type="json")


def test_strategic_merge_reaches_daemonset_pod_template() -> None:
    cluster = MemoryCluster()
    cluster.create({"apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": {"name": "plugin", "namespace": "gpu"},
                    "spec": {"template": {"spec": {"containers": [
                        {"name": "plugin", "image": "v1", "env": [{"name": "A", "value": "1"}]}]}}}})
    patched = cluster.patch("DaemonSet", "plugin", {"spec": {"template": {"spec": {"containers": [
        {"name": "plugin", "image": "v2", "env": [{"name": "B", "value": "2"}]}]}}}}, "gpu", patch_type="strategic")
    container = patched["spec"]["template"]["spec"]["containers"][0]
    assert container["image"] == "v2"
    assert container["env"] == [{"name": "A", "value": "1"}, {"name": "B", "value": "2"}]


def test_events_for_namespaced_objects_stay_in_their_namespace() -> None:
    clock = VirtualClock(0.0)
    cluster = MemoryCluster(clock)
    target = cluster.create({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "train", "namespace": "ml"},
                             "spec": {"containers": []}})
    record_event(cluster, target, "OOMKilled", "needs 40 GiB, slice has 10")
    clock.advance(60)
    record_event(cluster, target, "OOMKilled", "needs 40 GiB, slice has 10")
    (event,) = cluster.list("Event", "ml")
    assert event["involvedObject"]["namespace"] == "ml"
    assert (event["count"], event["firstTimestamp"], event["lastTimestamp"]) == (
        2, "1970-01-01T00:00:00Z", "1970-01-01T00:01:00Z")
    assert cluster.list("Event", "default") == []


OPERATIONS = st.lists(
    st.tuples(st.sampled_from(["create", "label", "unlabel", "delete", "finalize", "release"]),
              st.sampled_from(["a", "b", "c"])),
    max_size=25,
)


@settings(max_examples=40, deadline=None)
@given(OPERATIONS, st.sampled_from(["", "gpu=true", "!gpu", "gpu notin (true)"]))
def test_replaying_a_watch_rebuilds_the_selected_list(operations: list[tuple[str, str]], selector: str) -> None:
    """Whatever happens, ADDED/MODIFIED/DELETED seen through a selector reproduce exactly what list() selects."""
    cluster = MemoryCluster(VirtualClock())
    start = cluster.create({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "seed"}})
    for operation, name in operations:
        try:
            if operation == "create":
                cluster.create(node(name))
            elif operation in ("label", "unlabel"):
                cluster.patch("Node", name, {"metadata": {"labels": {"gpu": "true" if operation == "label" else None}}})
            elif operation == "delete":
                cluster.delete("Node", name)
            elif operation == "finalize":
                cluster.patch("Node", name, {"metadata": {"finalizers": ["kubegpu.io/hold"]}})
            else:
                cluster.patch("Node", name, {"metadata": {"finalizers": None}})
        except (NotFound, Conflict, Invalid):
            pass
    replayed: dict[str, dict[str, Any]] = {}
    for event in cluster.watch("Node", label_selector=selector, resource_version=start["metadata"]["resourceVersion"],
                               timeout=0):
        name = event.object["metadata"]["name"]
        if event.type == "DELETED":
            assert name in replayed
            del replayed[name]
        else:
            assert (name in replayed) is (event.type == "MODIFIED")
            replayed[name] = event.object
    listed = cluster.list("Node", label_selector=selector)
    assert [replayed[name] for name in sorted(replayed)] == listed


def test_update_patches_like_patch_without_handing_a_copy_back() -> None:
    cluster = MemoryCluster(VirtualClock(0))
    cluster.create(node("n1", {"a": "1"}))
    seen_events: list[WatchEvent] = []
    cluster.subscribe("Node", seen_events.append)
    body = {"metadata": {"labels": {"a": None, "b": "2"}}}
    assert cluster.update("Node", "n1", body) is None
    stored = cluster.get("Node", "n1")
    assert stored["metadata"]["labels"] == {"b": "2"} and [e.type for e in seen_events] == ["MODIFIED"]
    body["metadata"]["labels"]["b"] = "changed later"  # the body was copied: the store is not affected
    assert cluster.get("Node", "n1")["metadata"]["labels"] == {"b": "2"}
    cluster.update("Node", "n1", {"status": {"capacity": {"cpu": "1"}}}, subresource="status")
    assert cluster.get("Node", "n1")["status"] == {"capacity": {"cpu": "1"}}
    with pytest.raises(NotFound):
        cluster.update("Node", "gone", {"metadata": {"labels": {}}})


def test_add_creates_like_create_without_handing_a_copy_back() -> None:
    cluster = MemoryCluster(VirtualClock(0))
    seen_events: list[WatchEvent] = []
    cluster.subscribe("Node", seen_events.append)
    given = node("n1", {"a": "1"})
    assert cluster.add(given) is None
    stored = cluster.get("Node", "n1")
    assert stored["metadata"]["uid"] and stored["metadata"]["resourceVersion"] == cluster.resource_version
    assert "uid" not in given["metadata"]  # the caller's metadata is not the stored one
    assert stored["metadata"]["labels"] == {"a": "1"} and [e.type for e in seen_events] == ["ADDED"]
    with pytest.raises(Conflict):
        cluster.add(node("n1"))
    with pytest.raises(Invalid):
        cluster.add({"metadata": {"name": "no-kind"}})
