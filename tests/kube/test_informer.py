"""InformedCluster: the store's lists, in its order, kept current by change notifications, without copies."""

from __future__ import annotations

import time
from typing import Any

import pytest

from kubegpu.clock import VirtualClock
from kubegpu.kube import Gone, MemoryCluster, NotFound
from kubegpu.kube.informer import InformedCluster


def pod(name: str, namespace: str = "default") -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": namespace},
            "spec": {}, "status": {"phase": "Pending"}}


def test_lists_follow_every_change_in_the_stores_order() -> None:
    store = MemoryCluster(VirtualClock(0))
    store.create(pod("before"))
    informed = InformedCluster(store, ("Pod", "Node"), copy=False)
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
    informed = InformedCluster(store, ("Pod",), copy=False)
    informed.create(pod("a"))
    first, second = informed.list("Pod"), informed.list("Pod")
    assert first is not second and first[0] is second[0]  # a new list, the same (never modified) object
    store.patch("Pod", "a", {"status": {"phase": "Running"}}, subresource="status")
    assert first[0]["status"]["phase"] == "Pending"  # what was listed stays as it was
    assert informed.list("Pod")[0]["status"]["phase"] == "Running"


def test_other_kinds_and_filtered_lists_go_to_the_store() -> None:
    store = MemoryCluster(VirtualClock(0))
    informed = InformedCluster(store, ("Pod",), copy=False)
    store.create(pod("a", "x"))
    store.create(pod("b", "y"))
    assert [p["metadata"]["name"] for p in informed.list("Pod", namespace="y")] == ["b"]
    store.create({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1", "labels": {"k": "v"}}})
    assert [n["metadata"]["name"] for n in informed.list("Node", label_selector="k=v")] == ["n1"]
    assert informed.get("Pod", "a", "x")["metadata"]["name"] == "a"


def test_changes_name_each_changed_object_once_and_say_when_to_read_everything_again() -> None:
    store = MemoryCluster(VirtualClock(0))
    store.create(pod("a"))
    informed = InformedCluster(store, ("Pod",), copy=False)
    token, changed = informed.changes("Pod", None)
    assert changed is None  # no token yet: read everything
    assert informed.changes("Pod", token) == (token, [])
    store.create(pod("b"))
    store.patch("Pod", "a", {"metadata": {"labels": {"x": "1"}}})
    store.patch("Pod", "b", {"metadata": {"labels": {"x": "2"}}})
    store.delete("Pod", "a")
    later, changed = informed.changes("Pod", token)
    assert changed is not None and [(key, obj is None) for key, obj in changed] == [
        (("default", "b"), False), (("default", "a"), True)]  # each once, in the order of its last change
    assert changed[0][1] is informed.list("Pod")[0]  # the cached object (copy=False)
    assert informed.changes("Pod", later) == (later, [])
    assert informed.changes("Pod", later + 5)[1] is None  # a token this cache never gave
    assert informed.changes("Node", 0) == (0, None)  # not informed here


def test_a_caller_behind_the_journal_or_a_relist_reads_everything_again(monkeypatch: pytest.MonkeyPatch) -> None:
    import kubegpu.kube.informer as informer

    monkeypatch.setattr(informer, "JOURNAL_LIMIT", 4)
    store = MemoryCluster(VirtualClock(0))
    informed = InformedCluster(store, ("Pod",), copy=False)
    token, _ = informed.changes("Pod", None)
    for name in "abcdef":
        store.create(pod(name))
    behind, changed = informed.changes("Pod", token)
    assert changed is None  # the journal no longer reaches back to the token
    store.create(pod("g"))
    assert [key for key, _ in informed.changes("Pod", behind)[1] or []] == [("default", "g")]
    current, _ = informed.changes("Pod", behind)
    informed._relist(informed._caches["Pod"])  # what a 410 Gone does
    assert informed.changes("Pod", current)[1] is None


class Counting:
    """A `Cluster` without `subscribe` (so the informer watches from threads, as against a real API server) that
    counts the LISTs and WATCHes it serves; `expire` makes the next watch answer 410 Gone."""

    def __init__(self, store: MemoryCluster) -> None:
        self.store = store
        self.lists: list[str] = []
        self.watches = 0
        self.expire = False

    def list_with_version(self, kind: str, *args: Any) -> tuple[list[dict[str, Any]], str]:
        self.lists.append(kind)
        return self.store.list_with_version(kind, *args)

    def watch(self, kind: str, namespace: str | None = None, label_selector: str | None = None,
              field_selector: str | None = None, resource_version: str | None = None,
              timeout: float | None = None, bookmarks: bool = False) -> Any:
        self.watches += 1
        if self.expire:
            self.expire = False
            raise Gone("too old resource version")
        return self.store.watch(kind, namespace, label_selector, field_selector, resource_version, timeout)

    def __getattr__(self, name: str) -> Any:
        if name == "subscribe":
            raise AttributeError(name)
        return getattr(self.store, name)


def _eventually(check: Any, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.01)


def test_a_real_servers_kinds_are_listed_once_then_watched_with_resume() -> None:
    store = MemoryCluster(VirtualClock(0))
    store.create(pod("a"))
    api = Counting(store)
    informed = InformedCluster(api, ("Pod", "Node"), watch_window=0.05)
    try:
        assert [p["metadata"]["name"] for p in informed.list("Pod")] == ["a"]
        store.create(pod("b"))
        _eventually(lambda: len(informed.list("Pod")) == 2)
        time.sleep(0.3)  # several watch windows end and resume, none lists again
        assert sorted(api.lists) == ["Node", "Pod"] and api.watches > 4
        assert informed.list_counts() == {"Pod": 1, "Node": 1}
        listed = informed.list("Pod")
        listed[0]["metadata"]["labels"] = {"changed": "by the caller"}  # copies by default: the cache is untouched
        assert "labels" not in informed.list("Pod")[0]["metadata"]
    finally:
        informed.stop()


def test_a_410_gone_relists_and_a_write_is_read_back_at_once() -> None:
    store = MemoryCluster(VirtualClock(0))
    api = Counting(store)
    informed = InformedCluster(api, ("Pod",), watch_window=0.05)
    try:
        api.expire = True
        _eventually(lambda: informed.list_counts()["Pod"] == 2)
        created = informed.create(pod("mine"))
        # read-your-writes: the create's answer is in the cache before any watch event arrives
        assert informed.get("Pod", "mine")["metadata"]["uid"] == created["metadata"]["uid"]
        assert [p["metadata"]["name"] for p in informed.list("Pod")] == ["mine"]
        store.delete("Pod", "mine")
        _eventually(lambda: not informed.list("Pod"))
    finally:
        informed.stop()


def test_a_kind_not_served_reads_as_not_found_until_it_is() -> None:
    store = MemoryCluster(VirtualClock(0))

    class NoCrd(Counting):
        served = False

        def list_with_version(self, kind: str, *args: Any) -> tuple[list[dict[str, Any]], str]:
            self.lists.append(kind)
            if not self.served:
                raise NotFound(f"list {kind}: the server could not find the requested resource")
            return self.store.list_with_version(kind, *args)

    api = NoCrd(store)
    informed = InformedCluster(api, ("Pod",), watch_window=0.05)
    try:
        with pytest.raises(NotFound):
            informed.list("Pod")
        store.create(pod("a"))
        api.served = True

        def listed() -> list[str] | None:
            try:
                return [p["metadata"]["name"] for p in informed.list("Pod")]
            except NotFound:
                return None

        _eventually(lambda: listed() == ["a"])
    finally:
        informed.stop()
