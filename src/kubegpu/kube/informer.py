"""Informers: list each kind once, then keep it current from a watch, so a controller's pass reads memory.

A controller that re-lists every kind on every pass puts load on the API server for nothing while the cluster is
idle (issue 27: an idle autoscaler made ~11 LIST/s). `InformedCluster` wraps any `Cluster` and serves `list` and
`get` of the kinds it informs from a cache:

- **Real API servers** (`LightkubeCluster`): one thread per kind lists once, then watches from the list's
  resourceVersion in windows of `watch_window` seconds, each resuming from the last version seen (bookmarks keep it
  fresh on quiet kinds). Only a 410 Gone (the server no longer remembers that version) makes it list again. A kind
  the server does not serve yet (CRDs not installed) reads as `NotFound`, as from the server, and is retried.
- **The in-memory store** (`MemoryCluster`): fed synchronously through `MemoryCluster.subscribe`, so the simulator
  and unit tests stay deterministic and pay no copies for change delivery.

Writes go to the wrapped cluster; what a create or patch returns is written through to the cache (unless the cache
already holds a newer version), so a controller reads its own writes on its next pass rather than a watch later.
Lists come back sorted by (namespace, name), as from the stores. By default they are copies, so a caller may
modify what it gets; `copy=False` hands out the cached objects, which callers then must not modify (the
simulator's hot path).

`changes(kind, since)` is what client-go's event handlers give a controller: the objects that changed (or went)
since the caller's last token, so a controller that derives facts per object keeps them current without
re-reading every object on every pass (the partitioner at fleet scale, issue 28). The journal behind it is bounded;
a caller too far behind, or one whose kind was listed again (410 Gone), is told to start over from a full list.
"""

from __future__ import annotations

import builtins
import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from kubegpu.kube.cluster import Cluster, WatchEvent
from kubegpu.kube.errors import Gone, NotFound
from kubegpu.kube.patching import clone
from kubegpu.kube.selectors import parse_label_selector

LOG = logging.getLogger("kubegpu.kube.informer")
_Key = tuple[str, str]
WATCH_WINDOW_S = 60.0
RETRY_MIN_S, RETRY_MAX_S = 0.5, 30.0
JOURNAL_LIMIT = 50_000  # changed keys a kind's journal keeps (halved when full; a caller behind it relists)
MIN_WATCH_S = 1.0   # the shortest time between two watch requests of one kind


def quiet_http_logs() -> None:
    """The HTTP client logs every request at INFO: a controller's own log drowns in it. Warnings still show."""
    for noisy in ("httpx", "httpx2", "httpcore"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def _key(obj: dict[str, Any]) -> _Key:
    meta = obj.get("metadata") or {}
    return str(meta.get("namespace") or ""), str(meta.get("name") or "")


def _version(obj: dict[str, Any]) -> int | None:
    raw = (obj.get("metadata") or {}).get("resourceVersion")
    try:
        return int(raw) if raw is not None else None
    except (TypeError, ValueError):
        return None


def newer_or_same(candidate: dict[str, Any], current: dict[str, Any] | None) -> bool:
    """Whether `candidate` may replace `current` in a cache. resourceVersions are opaque by contract, but every
    API server we talk to (etcd's revision, the memory store's counter) makes them integers; when one does not
    parse, the newer arrival wins."""
    if current is None:
        return True
    new, old = _version(candidate), _version(current)
    return new is None or old is None or new >= old


@dataclass
class _KindCache:
    kind: str
    objects: dict[_Key, dict[str, Any]] = field(default_factory=dict)
    ordered: builtins.list[dict[str, Any]] | None = None
    keys: builtins.list[_Key] | None = None  # sorted; None when an object came or went since
    version: str = ""
    synced: threading.Event = field(default_factory=threading.Event)
    served: bool = True        # False while the API server answers NotFound for the kind (CRD not installed)
    lists: int = 0             # how often the kind was listed (1 after the initial sync, while nothing expires)
    error: str = ""
    journal: builtins.list[_Key] = field(default_factory=builtins.list)  # keys changed, oldest first
    journal_start: int = 1     # the change number of journal[0]; a relist starts a new journal


class InformedCluster(Cluster):
    """`Cluster` with `list`/`get` of `kinds` served from a watch-fed cache (see the module doc)."""

    def __init__(self, store: Cluster, kinds: Iterable[str], *, copy: bool = True,
                 watch_window: float = WATCH_WINDOW_S, log: Callable[[str], None] | None = None,
                 sync_timeout: float | None = 60.0) -> None:
        self.store = store
        self.clock = getattr(store, "clock", None)
        self.copy = copy
        self.watch_window = watch_window
        self.log = log or LOG.warning
        self._lock = threading.RLock()
        self._caches: dict[str, _KindCache] = {kind: _KindCache(kind) for kind in dict.fromkeys(kinds)}
        self._stop = threading.Event()
        self._threads: builtins.list[threading.Thread] = []
        subscribe = getattr(store, "subscribe", None)
        self._subscribed = subscribe is not None
        if subscribe is not None:
            for cache in self._caches.values():
                subscribe(cache.kind, self._subscriber(cache))
                with contextlib.suppress(NotFound):
                    self._relist(cache)
        else:
            for cache in self._caches.values():
                thread = threading.Thread(target=self._run, args=(cache,), name=f"informer-{cache.kind}",
                                          daemon=True)
                thread.start()
                self._threads.append(thread)
            if sync_timeout is not None:
                self.wait_synced(sync_timeout)

    # ------------------------------------------------------------------ lifecycle
    @property
    def kinds(self) -> builtins.list[str]:
        return builtins.list(self._caches)

    def wait_synced(self, timeout: float | None = None) -> bool:
        """Whether every kind finished its first list (or was found not served) within `timeout` seconds."""
        deadline = None if timeout is None else time.monotonic() + timeout
        for cache in self._caches.values():
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not cache.synced.wait(remaining):
                return False
        return True

    def stop(self) -> None:
        """Let the watch threads end at their next event or window end (they are daemons: exit never waits)."""
        self._stop.set()

    def list_counts(self) -> dict[str, int]:
        """How many LISTs each kind took so far: 1 after the initial sync, more only after a 410 or a missing kind."""
        return {kind: cache.lists for kind, cache in self._caches.items()}

    # ------------------------------------------------------------------ feeding
    def _subscriber(self, cache: _KindCache) -> Callable[[WatchEvent], None]:
        def changed(event: WatchEvent) -> None:
            self._apply(cache, event.type, event.object)
            cache.version = str((event.object.get("metadata") or {}).get("resourceVersion") or cache.version)

        return changed

    def _relist(self, cache: _KindCache) -> None:
        try:
            items, version = self.store.list_with_version(cache.kind)
        except NotFound:
            with self._lock:
                cache.served, cache.objects, cache.ordered, cache.version = False, {}, None, ""
                cache.keys = None
                cache.journal_start += len(cache.journal) + 1
                cache.journal = []
                cache.lists += 1
            cache.synced.set()
            raise
        with self._lock:
            cache.objects = {_key(obj): obj for obj in items}
            cache.keys = None
            cache.journal_start += len(cache.journal) + 1  # every object may have changed: callers start over
            cache.journal = []
            cache.ordered, cache.version, cache.served, cache.error = None, version, True, ""
            cache.lists += 1
        cache.synced.set()

    def _apply(self, cache: _KindCache, type_: str, obj: dict[str, Any]) -> None:
        key = _key(obj)
        with self._lock:
            current = cache.objects.get(key)
            if type_ == "DELETED":
                if cache.objects.pop(key, None) is not None:
                    cache.keys = None
            elif newer_or_same(obj, current):
                cache.objects[key] = obj
                if current is None:
                    cache.keys = None
            else:
                return
            cache.ordered = None  # a change keeps the order of the others: only a new or gone key sorts again
            journal = cache.journal
            journal.append(key)
            if len(journal) > JOURNAL_LIMIT:
                dropped = len(journal) - JOURNAL_LIMIT // 2
                del journal[:dropped]
                cache.journal_start += dropped

    def _run(self, cache: _KindCache) -> None:
        """List once; watch in windows resuming from the last version; list again only on 410 Gone."""
        must_list, delay = True, RETRY_MIN_S
        while not self._stop.is_set():
            try:
                if must_list:
                    self._relist(cache)
                    must_list = False
                started = time.monotonic()
                for event in self.store.watch(cache.kind, resource_version=cache.version or None,
                                              timeout=self.watch_window, bookmarks=True):
                    version = (event.object.get("metadata") or {}).get("resourceVersion")
                    if event.type != "BOOKMARK":
                        self._apply(cache, event.type, event.object)
                    if version:
                        cache.version = str(version)
                    if self._stop.is_set():
                        return
                delay = RETRY_MIN_S
                # a server that ends watches at once (a test double, a proxy) must not turn this into a busy loop
                self._stop.wait(max(0.0, min(MIN_WATCH_S, self.watch_window) - (time.monotonic() - started)))
                continue
            except Gone:
                must_list = True  # the server forgot our version: only a fresh list gives a consistent view
                continue
            except NotFound:
                must_list = True  # not served (yet): try again after a while
            except Exception as exc:
                cache.error = f"{type(exc).__name__}: {exc}"
                self.log(f"informer {cache.kind}: {cache.error}; retrying in {delay:.1f}s")
            self._stop.wait(delay)
            delay = min(RETRY_MAX_S, delay * 2)

    # ------------------------------------------------------------------ reads
    def _cache_for(self, kind: str) -> _KindCache | None:
        cache = self._caches.get(kind)
        if cache is None or not cache.synced.is_set():
            return None
        return cache

    def _out(self, obj: dict[str, Any]) -> dict[str, Any]:
        return clone(obj) if self.copy else obj

    def _ordered(self, cache: _KindCache) -> tuple[builtins.list[dict[str, Any]], str]:
        if not cache.served:
            raise NotFound(f"list {cache.kind}: the server could not find the requested resource")
        with self._lock:
            if cache.ordered is None:
                if cache.keys is None:
                    cache.keys = sorted(cache.objects)
                objects = cache.objects
                cache.ordered = [objects[key] for key in cache.keys]
            return cache.ordered, cache.version

    def list_shared(self, kind: str) -> builtins.list[dict[str, Any]]:
        """Every object of `kind`, sorted, as the cache holds them — never copied, whatever `copy` says — so the
        caller must not modify them (build new dicts, or patch through the cluster). A controller that reads the
        whole cluster every pass (the autoscaler's snapshot) would otherwise spend most of its time copying.
        Cached objects are replaced, never changed in place, so a list taken once stays one consistent read."""
        cache = self._cache_for(kind)
        if cache is None:
            return self.store.list(kind)
        return builtins.list(self._ordered(cache)[0])

    def list_with_version(self, kind: str, namespace: str | None = None, label_selector: str | None = None,
                          field_selector: str | None = None) -> tuple[builtins.list[dict[str, Any]], str]:
        cache = self._cache_for(kind)
        if cache is None or field_selector:
            return self.store.list_with_version(kind, namespace, label_selector, field_selector)
        ordered, version = self._ordered(cache)
        if namespace or label_selector:
            selector = parse_label_selector(label_selector)
            ordered = [obj for obj in ordered if (not namespace or _key(obj)[0] == namespace)
                       and selector.matches((obj.get("metadata") or {}).get("labels"))]
        return ([self._out(obj) for obj in ordered] if self.copy else builtins.list(ordered)), version

    def changes(self, kind: str, since: int | None
                ) -> tuple[int, builtins.list[tuple[_Key, dict[str, Any] | None]] | None]:
        """What changed in `kind` after the token `since`: a new token, and each changed (namespace, name) once, in
        the order of its last change, with its object now (None: gone). The list is None when the caller must read
        everything again (`since` is None, too old for the journal, or from before a relist, or the kind is not
        informed here): then `list` gives the state as of the new token."""
        cache = self._caches.get(kind)
        with self._lock:
            if cache is None:
                return 0, None
            token = cache.journal_start + len(cache.journal) - 1
            if since is None or not cache.synced.is_set() or since < cache.journal_start - 1 or since > token:
                return token, None
            keys = dict.fromkeys(reversed(cache.journal[since + 1 - cache.journal_start:]))
            objects = cache.objects
            changed = [(key, objects.get(key)) for key in reversed(keys)]
        return token, [(key, None if obj is None else self._out(obj)) for key, obj in changed]

    def get(self, kind: str, name: str, namespace: str | None = None) -> dict[str, Any]:
        cache = self._cache_for(kind)
        if cache is not None:
            from kubegpu.kube.resources import resource_kind

            ns = (namespace or "default") if resource_kind(kind).namespaced else ""
            with self._lock:
                found = cache.objects.get((ns, name))
            if found is not None:
                return self._out(found)
        return self.store.get(kind, name, namespace)  # not seen yet (or not informed): ask the server

    # ------------------------------------------------------------------ writes (through, and into the cache)
    def _written(self, obj: dict[str, Any]) -> dict[str, Any]:
        cache = self._caches.get(str(obj.get("kind") or ""))
        if cache is not None and not self._subscribed and cache.synced.is_set() and obj.get("metadata"):
            self._apply(cache, "MODIFIED", clone(obj) if self.copy else obj)
        return obj

    def create(self, obj: dict[str, Any]) -> dict[str, Any]:
        created = self.store.create(obj)
        return self._written({"kind": obj.get("kind"), **created})

    def patch(self, kind: str, name: str, patch: dict[str, Any] | builtins.list[Any], namespace: str | None = None,
              patch_type: str = "merge", subresource: str | None = None) -> dict[str, Any]:
        patched = self.store.patch(kind, name, patch, namespace, patch_type, subresource)
        return self._written({"kind": kind, **patched})

    def delete(self, kind: str, name: str, namespace: str | None = None) -> None:
        self.store.delete(kind, name, namespace)  # the watch reports the deletionTimestamp or the removal

    def watch(self, kind: str, namespace: str | None = None, label_selector: str | None = None,
              field_selector: str | None = None, resource_version: str | None = None,
              timeout: float | None = None, bookmarks: bool = False) -> Iterator[WatchEvent]:
        return self.store.watch(kind, namespace, label_selector, field_selector, resource_version, timeout,
                                bookmarks=bookmarks)
