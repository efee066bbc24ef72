"""InformedCluster: the store's lists, in its order, kept current by change notifications, without copies; never
wrong for long (tombstones, no older version over a newer one, staleness reported and acted on)."""

from __future__ import annotations

import queue
import time
import urllib.error
import urllib.request
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

import kubegpu.kube.informer as informer_module
from kubegpu.clock import VirtualClock
from kubegpu.kube import ApiError, Gone, MemoryCluster, NotFound, WatchEvent
from kubegpu.kube.informer import InformedCluster, cache_trusted
from kubegpu.kube.patching import clone
from kubegpu.metrics import serve_metrics


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


# --------------------------------------------------------------------------------------------- never wrong for long

def claim(name: str, version: int | str, finalizers: tuple[str, ...] = ()) -> dict[str, Any]:
    return {"apiVersion": "kubegpu.io/v1", "kind": "NodeClaim",
            "metadata": {"name": name, "resourceVersion": str(version), "finalizers": list(finalizers)}}


class Scripted:
    """An API server the test scripts: what its list answers, the events its watch streams (an exception in the
    queue is raised from the watch), what each write answers, and whether its watches fail outright."""

    def __init__(self, items: list[dict[str, Any]], version: str) -> None:
        self.listing = (items, version)
        self.events: queue.Queue[WatchEvent | Exception] = queue.Queue()
        self.responses: list[dict[str, Any]] = []
        self.failing = False
        self.lists = 0

    def list_with_version(self, kind: str, *args: Any) -> tuple[list[dict[str, Any]], str]:
        self.lists += 1
        items, version = self.listing
        return [clone(item) for item in items], version

    def watch(self, kind: str, namespace: str | None = None, label_selector: str | None = None,
              field_selector: str | None = None, resource_version: str | None = None,
              timeout: float | None = None, bookmarks: bool = False) -> Any:
        if self.failing:
            raise ApiError(f"watch {kind}: connection refused", code=503)
        return self._stream(timeout or 0.05)

    def _stream(self, timeout: float) -> Any:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                item = self.events.get(timeout=0.005)
            except queue.Empty:
                continue
            if isinstance(item, Exception):
                raise item
            yield item

    def patch(self, kind: str, name: str, *args: Any, **kwargs: Any) -> dict[str, Any]:
        return self.responses.pop(0)

    def get(self, kind: str, name: str, namespace: str | None = None) -> dict[str, Any]:
        raise NotFound(f"get {kind} {name}: not found")


def versions(informed: InformedCluster, kind: str = "NodeClaim") -> list[tuple[str, str]]:
    return [(o["metadata"]["name"], o["metadata"]["resourceVersion"]) for o in informed.list(kind)]


def test_a_write_response_never_brings_back_what_the_watch_deleted() -> None:
    api = Scripted([claim("a", 5, ("kubegpu.io/termination",))], "5")
    informed = InformedCluster(api, ("NodeClaim",), watch_window=0.05)
    try:
        api.events.put(WatchEvent("DELETED", claim("a", 7)))
        _eventually(lambda: versions(informed) == [])
        api.responses.append(claim("a", 6))  # the patch that removed the last finalizer, answered after the watch
        informed.patch("NodeClaim", "a", {"metadata": {"finalizers": None}})
        assert versions(informed) == []
        with pytest.raises(NotFound):
            informed.get("NodeClaim", "a")
        api.events.put(WatchEvent("ADDED", claim("a", 9)))  # only the watch brings the name back
        _eventually(lambda: versions(informed) == [("a", "9")])
    finally:
        informed.stop()


def test_a_tombstone_holds_where_versions_do_not_compare_and_a_relist_clears_it() -> None:
    api = Scripted([claim("a", "x1")], "x1")
    informed = InformedCluster(api, ("NodeClaim",), watch_window=0.05)
    try:
        api.events.put(WatchEvent("DELETED", claim("a", "x3")))
        _eventually(lambda: versions(informed) == [])
        api.responses.append(claim("a", "x2"))
        informed.patch("NodeClaim", "a", {"metadata": {"finalizers": None}})
        assert versions(informed) == []
        assert list(informed._caches["NodeClaim"].tombstones) == [("", "a")]
        api.listing = ([], "x4")
        api.events.put(Gone("too old resource version"))
        _eventually(lambda: informed.list_counts()["NodeClaim"] == 2)
        assert informed._caches["NodeClaim"].tombstones == {}  # the list supersedes them
    finally:
        informed.stop()


def test_tombstones_are_bounded_in_number_and_age(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(informer_module, "TOMBSTONE_LIMIT", 2)
    clock = [0.0]
    store = MemoryCluster(VirtualClock(0))
    informed = InformedCluster(store, ("Pod",), copy=False, now=lambda: clock[0])
    for name in "abc":
        store.create(pod(name))
        store.delete("Pod", name)
    assert list(informed._caches["Pod"].tombstones) == [("default", "b"), ("default", "c")]
    clock[0] += informer_module.TOMBSTONE_TTL_S + 1
    store.create(pod("d"))
    store.delete("Pod", "d")
    assert list(informed._caches["Pod"].tombstones) == [("default", "d")]


def test_nothing_older_replaces_what_the_cache_holds_not_even_a_relist() -> None:
    api = Scripted([claim("a", 9)], "9")
    informed = InformedCluster(api, ("NodeClaim",), watch_window=0.05)
    try:
        api.responses.append(claim("a", 8))  # a response older than what the watch delivered
        informed.patch("NodeClaim", "a", {})
        assert versions(informed) == [("a", "9")]
        api.responses.append(claim("a", 12))  # our own write: read back at once
        informed.patch("NodeClaim", "a", {})
        assert versions(informed) == [("a", "12")]
        api.listing = ([claim("a", 11)], "11")  # a relist (410) whose list was taken before our write
        api.events.put(Gone("too old resource version"))
        _eventually(lambda: informed.list_counts()["NodeClaim"] == 2)
        assert versions(informed) == [("a", "12")]
    finally:
        informed.stop()


def test_a_watch_broken_longer_than_the_bound_makes_the_cache_stale_until_it_recovers() -> None:
    clock = [100.0]
    lines: list[str] = []
    api = Scripted([claim("a", 1)], "1")
    informed = InformedCluster(api, ("NodeClaim",), watch_window=0.05, now=lambda: clock[0], stale_after=30.0,
                               log=lines.append)
    registry = CollectorRegistry()
    informed.register_metrics(registry, "test")
    port = serve_metrics("127.0.0.1:0", registry, ready=informed.trusted)

    def synced() -> float | None:
        return registry.get_sample_value("kubegpu_informer_synced", {"component": "test", "kind": "NodeClaim"})

    def readyz() -> int:
        try:
            return int(urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz").status)
        except urllib.error.HTTPError as exc:
            return exc.code

    try:
        assert informed.trusted() and synced() == 1.0 and readyz() == 200
        api.failing = True
        _eventually(lambda: "NodeClaim" in informed.broken())
        clock[0] += 29.0
        assert informed.trusted() and informed.stale_kinds() == [] and synced() == 1.0  # a blip is not stale
        clock[0] += 2.0
        assert informed.stale_kinds() == ["NodeClaim"] and synced() == 0.0 and readyz() == 503
        assert not informed.trusted() and not cache_trusted(informed) and not informed.trusted()
        assert len([line for line in lines if "not acting on the cache" in line]) == 1  # said once
        assert "connection refused" in next(line for line in lines if "not acting on the cache" in line)
        api.failing = False
        _eventually(informed.trusted)
        assert synced() == 1.0 and informed.broken() == {} and readyz() == 200
    finally:
        informed.stop()


def test_a_store_read_live_is_always_trusted() -> None:
    store = MemoryCluster(VirtualClock(0))
    assert cache_trusted(store) and cache_trusted(InformedCluster(store, ("Pod",)))


def test_a_selector_keeps_only_the_selected_objects() -> None:
    store = MemoryCluster(VirtualClock(0))
    store.create({**pod("mine"), "metadata": {"name": "mine", "namespace": "default", "labels": {"owner": "x"}}})
    store.create(pod("other"))
    informed = InformedCluster(store, ("Pod",), selectors={"Pod": "owner=x"})
    assert [p["metadata"]["name"] for p in informed.list("Pod")] == ["mine"]
    store.patch("Pod", "mine", {"metadata": {"labels": {"owner": None}}})
    assert informed.list("Pod") == []  # out of the selection: gone from this cache
    api = Counting(store)
    store.patch("Pod", "other", {"metadata": {"labels": {"owner": "x"}}})
    watched = InformedCluster(api, ("Pod",), selectors={"Pod": "owner=x"}, watch_window=0.05)
    try:
        assert [p["metadata"]["name"] for p in watched.list("Pod")] == ["other"]
    finally:
        watched.stop()


def test_an_eviction_through_an_informer_goes_to_the_eviction_api() -> None:
    """`evict_pod` evicts through the cluster's client (PDBs honoured) and deletes only where there is none (the
    in-memory store): an informer must hand on its store's client, or every eviction through it becomes a delete."""
    from kubegpu.kube.eviction import evict_pod

    class Client:
        def __init__(self) -> None:
            self.evictions: list[tuple[str, str]] = []

        def create(self, obj: Any, name: str, namespace: str) -> None:
            self.evictions.append((namespace, name))

    store = MemoryCluster(VirtualClock(0))
    store.create(pod("a"))
    api = Counting(store)
    api.client = Client()  # type: ignore[attr-defined]
    informed = InformedCluster(api, ("Pod",), watch_window=0.05)
    try:
        assert evict_pod(informed, "default", "a")
        assert api.client.evictions == [("default", "a")]  # type: ignore[attr-defined]
        assert [p["metadata"]["name"] for p in store.list("Pod")] == ["a"]  # not deleted behind the PDB's back
    finally:
        informed.stop()
