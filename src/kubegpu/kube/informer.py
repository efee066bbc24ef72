"""Informers: list each kind once, then keep it current from a watch, so a controller's pass reads memory.

A controller that re-lists every kind on every pass puts load on the API server for nothing while the cluster is
idle (an idle autoscaler once made ~11 LIST/s). `InformedCluster` wraps any `Cluster` and serves `list` and
`get` of the kinds it informs from a cache:

- **Real API servers** (`LightkubeCluster`): one thread per kind lists once, then watches from the list's
  resourceVersion in windows of `watch_window` seconds, each resuming from the last version seen (bookmarks keep it
  fresh on quiet kinds). Only a 410 Gone (the server no longer remembers that version) makes it list again. A kind
  the server does not serve yet (CRDs not installed) reads as `NotFound`, as from the server, and is retried.
- **The in-memory store** (`MemoryCluster`): fed synchronously through `MemoryCluster.subscribe`, so the simulator
  and unit tests stay deterministic and pay no copies for change delivery.

Writes go to the wrapped cluster; what a create or patch returns is written through to the cache, so a controller
reads its own writes on its next pass rather than a watch later. The watch stays the authority (client-go's rules):

- **Nothing older replaces newer.** resourceVersions compare as integers where they parse (etcd's revisions and the
  memory store's counter do). A response the watch has already passed (its version at or below the kind's last
  seen version) is dropped: the watch delivered that change, or a later one, already. A relist keeps a cached
  object the list is older than (a write answered while the list was in flight).
- **Tombstones.** A DELETED event leaves the key and its deletion resourceVersion; a write's response (e.g. the
  patch that removed the last finalizer, answered after the watch reported the deletion) never re-inserts it. Only
  the watch (an ADDED at a later version) or a list brings the name back. Tombstones are bounded: a relist clears
  them (the list supersedes them), and they expire after `TOMBSTONE_TTL_S` or beyond `TOMBSTONE_LIMIT`.
- **Staleness is visible.** When a kind's watch (or relist) has been failing for longer than `stale_after`
  seconds, `stale_kinds()` names it, `trusted()` is False (logged once per episode), and the
  `kubegpu_informer_synced` gauge (`register_metrics`) reads 0. Every cluster-side controller checks
  `cache_trusted(cluster)` at the start of its pass and skips the pass meanwhile: better no action than one on a
  view that may be minutes old. After a failure the next watch runs a short window (`PROBE_WINDOW_S`), so a
  repaired connection clears the state within seconds even on a quiet kind.
Lists come back sorted by (namespace, name), as from the stores. By default they are copies, so a caller may
modify what it gets; `copy=False` hands out the cached objects, which callers then must not modify (the
simulator's hot path).

`changes(kind, since)` is what client-go's event handlers give a controller: the objects that changed (or went)
since the caller's last token, so a controller that derives facts per object keeps them current without
re-reading every object on every pass (the partitioner at fleet scale). The journal behind it is bounded;
a caller too far behind, or one whose kind was listed again (410 Gone), is told to start over from a full list.

`selectors` narrows a kind to the objects a controller owns (a label selector sent with the list and the watch),
so the operator informs its own ConfigMaps, Services and RBAC without caching every one in the cluster.
"""

from __future__ import annotations

import builtins
import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from kubegpu.kube.cluster import Cluster, WatchEvent
from kubegpu.kube.errors import Gone, NotFound
from kubegpu.kube.patching import clone
from kubegpu.kube.selectors import LabelSelector, parse_label_selector

if TYPE_CHECKING:
    from prometheus_client.registry import CollectorRegistry

LOG = logging.getLogger("kubegpu.kube.informer")
_Key = tuple[str, str]
WATCH_WINDOW_S = 60.0
RETRY_MIN_S, RETRY_MAX_S = 0.5, 30.0
JOURNAL_LIMIT = 50_000  # changed keys a kind's journal keeps (halved when full; a caller behind it relists)
MIN_WATCH_S = 1.0   # the shortest time between two watch requests of one kind
STALE_AFTER_S = 30.0    # a kind whose watch has failed this long is stale: controllers stop acting on it
PROBE_WINDOW_S = 5.0    # the watch window after a failure, so a repaired watch proves itself soon
TOMBSTONE_TTL_S = 300.0  # far longer than any write's round trip: what a tombstone guards against is in flight
TOMBSTONE_LIMIT = 10_000


def quiet_http_logs() -> None:
    """The HTTP client logs every request at INFO: a controller's own log drowns in it. Warnings still show."""
    for noisy in ("httpx", "httpx2", "httpcore"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def _key(obj: dict[str, Any]) -> _Key:
    meta = obj.get("metadata") or {}
    return str(meta.get("namespace") or ""), str(meta.get("name") or "")


def _int(raw: object) -> int | None:
    try:
        return int(str(raw)) if raw is not None and raw != "" else None
    except (TypeError, ValueError):
        return None


def _version(obj: dict[str, Any]) -> int | None:
    return _int((obj.get("metadata") or {}).get("resourceVersion"))


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
    selector: str | None = None   # label selector sent with the list and the watch (None: every object)
    objects: dict[_Key, dict[str, Any]] = field(default_factory=dict)
    ordered: builtins.list[dict[str, Any]] | None = None
    keys: builtins.list[_Key] | None = None  # sorted; None when an object came or went since
    version: str = ""
    synced: threading.Event = field(default_factory=threading.Event)
    served: bool = True        # False while the API server answers NotFound for the kind (CRD not installed)
    lists: int = 0             # how often the kind was listed (1 after the initial sync, while nothing expires)
    error: str = ""
    broken_since: float | None = None   # when the watch (or list) started failing; None while it works
    journal: builtins.list[_Key] = field(default_factory=builtins.list)  # keys changed, oldest first
    journal_start: int = 1     # the change number of journal[0]; a relist starts a new journal
    tombstones: dict[_Key, tuple[str, float]] = field(default_factory=dict)  # key → (deletion version, when)


class InformedCluster(Cluster):
    """`Cluster` with `list`/`get` of `kinds` served from a watch-fed cache (see the module doc)."""

    def __init__(self, store: Cluster, kinds: Iterable[str], *, copy: bool = True,
                 watch_window: float = WATCH_WINDOW_S, log: Callable[[str], None] | None = None,
                 sync_timeout: float | None = 60.0, selectors: Mapping[str, str] | None = None,
                 stale_after: float = STALE_AFTER_S, now: Callable[[], float] = time.monotonic) -> None:
        self.store = store
        self.clock = getattr(store, "clock", None)
        self.copy = copy
        self.watch_window = watch_window
        self.stale_after = stale_after
        self.now = now   # staleness and tombstone ages (a fake in tests)
        self.log = log or LOG.warning
        self._lock = threading.RLock()
        self._caches: dict[str, _KindCache] = {
            kind: _KindCache(kind, (selectors or {}).get(kind) or None) for kind in dict.fromkeys(kinds)}
        self._stop = threading.Event()
        self._threads: builtins.list[threading.Thread] = []
        self._untrusted: tuple[str, ...] = ()   # the stale kinds last reported by `trusted` (logged once)
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

    @property
    def client(self) -> Any:
        """The store's API client, where it has one: `kubegpu.kube.eviction.evict_pod` evicts through it (the
        Eviction API, PDBs honoured); without it, it would delete the pod as it does on the in-memory store."""
        return getattr(self.store, "client", None)

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

    # ------------------------------------------------------------------ staleness
    def broken(self) -> dict[str, float]:
        """Kinds whose watch (or relist) is failing now, with the seconds since it started failing."""
        now = self.now()
        return {kind: now - cache.broken_since for kind, cache in self._caches.items()
                if cache.broken_since is not None}

    def stale_kinds(self) -> builtins.list[str]:
        """Kinds whose cache may be wrong by now: their watch has been failing for longer than `stale_after`."""
        return [kind for kind, seconds in self.broken().items() if seconds >= self.stale_after]

    def trusted(self) -> bool:
        """Whether a controller may act on this cache now (no kind stale). The change either way is logged once,
        naming the kinds and the last error, so a controller skipping its passes says why without repeating it."""
        stale = tuple(self.stale_kinds())
        if stale != self._untrusted:
            if stale:
                errors = "; ".join(f"{kind}: {self._caches[kind].error or 'failing'}" for kind in stale)
                self.log(f"informer: watch broken for more than {self.stale_after:.0f}s ({errors}); "
                         "not acting on the cache until it recovers")
            else:
                LOG.info("informer: watches recovered; acting on the cache again")
            self._untrusted = stale
        return not stale

    def sync_states(self) -> builtins.list[tuple[str, bool]]:
        """(kind, usable) for each kind: synced and not stale — what `kubegpu_informer_synced` reports."""
        stale = set(self.stale_kinds())
        return [(kind, cache.synced.is_set() and kind not in stale) for kind, cache in self._caches.items()]

    def register_metrics(self, registry: CollectorRegistry, component: str) -> None:
        """Report `kubegpu_informer_synced{component,kind}` on `registry` (the one the component serves)."""
        from kubegpu.metrics import InformerCollector  # prometheus_client only where metrics are served

        registry.register(InformerCollector(component, self.sync_states))

    def _failing(self, cache: _KindCache, error: str) -> None:
        cache.error = error
        if cache.broken_since is None:
            cache.broken_since = self.now()

    def _working(self, cache: _KindCache) -> None:
        cache.broken_since = None
        cache.error = ""

    # ------------------------------------------------------------------ feeding
    def _subscriber(self, cache: _KindCache) -> Callable[[WatchEvent], None]:
        selector = parse_label_selector(cache.selector) if cache.selector else None

        def changed(event: WatchEvent) -> None:
            version = str((event.object.get("metadata") or {}).get("resourceVersion") or cache.version)
            type_ = event.type
            if selector is not None and not _selected(selector, event.object):
                type_ = "DELETED"  # out of the selection: gone as far as this cache is concerned
            self._apply(cache, type_, event.object, version)

        return changed

    def _relist(self, cache: _KindCache) -> None:
        try:
            # the selector only when there is one: test doubles and older stores take the kind alone
            items, version = (self.store.list_with_version(cache.kind, None, cache.selector) if cache.selector
                              else self.store.list_with_version(cache.kind))
        except NotFound:
            with self._lock:
                cache.served, cache.objects, cache.ordered, cache.version = False, {}, None, ""
                cache.keys = None
                cache.journal_start += len(cache.journal) + 1
                cache.journal = []
                cache.tombstones = {}
                cache.lists += 1
            cache.synced.set()
            raise
        listed_at = _int(version)
        with self._lock:
            fresh = {_key(obj): obj for obj in items}
            if listed_at is not None:
                # a write answered while the list was in flight is newer than the list: keep it (the watch from
                # the list's version delivers whatever happens to it next, deletion included)
                for key, obj in cache.objects.items():
                    seen = _version(obj)
                    if seen is not None and seen > listed_at and newer_or_same(obj, fresh.get(key)):
                        fresh[key] = obj
            cache.objects = fresh
            cache.keys = None
            cache.journal_start += len(cache.journal) + 1  # every object may have changed: callers start over
            cache.journal = []
            cache.tombstones = {}  # the list supersedes them
            cache.ordered, cache.version, cache.served = None, version, True
            cache.lists += 1
        self._working(cache)
        cache.synced.set()

    def _apply(self, cache: _KindCache, type_: str, obj: dict[str, Any], version: str | None = None,
               written: bool = False) -> None:
        """One change into the cache under the rules of the module doc. `version`: the kind's position in its
        watch after this event (set under the same lock, so a write's response never slips between the two);
        `written`: `obj` is a write's response, not a watch event."""
        key = _key(obj)
        with self._lock:
            if version:
                cache.version = version
            current = cache.objects.get(key)
            if type_ == "DELETED":
                if cache.objects.pop(key, None) is not None:
                    cache.keys = None
                self._bury(cache, key, obj)
            else:
                if written and not self._news(cache, key, obj):
                    return
                if not newer_or_same(obj, current):
                    return
                cache.tombstones.pop(key, None)
                cache.objects[key] = obj
                if current is None:
                    cache.keys = None
            cache.ordered = None  # a change keeps the order of the others: only a new or gone key sorts again
            journal = cache.journal
            journal.append(key)
            if len(journal) > JOURNAL_LIMIT:
                dropped = len(journal) - JOURNAL_LIMIT // 2
                del journal[:dropped]
                cache.journal_start += dropped

    def _news(self, cache: _KindCache, key: _Key, obj: dict[str, Any]) -> bool:
        """Whether a write's response tells the cache something the watch has not: it is newer than the watch's
        position, and than the key's tombstone. Without parsable versions a tombstone always wins: only the watch
        may bring a deleted name back."""
        written, position = _version(obj), _int(cache.version)
        if written is not None and position is not None and written <= position:
            return False  # the watch already delivered this change (or a later one, its deletion included)
        tomb = cache.tombstones.get(key)
        if tomb is None:
            return True
        if self.now() - tomb[1] > TOMBSTONE_TTL_S:
            del cache.tombstones[key]
            return True
        buried = _int(tomb[0])
        return written is not None and buried is not None and written > buried

    def _bury(self, cache: _KindCache, key: _Key, obj: dict[str, Any]) -> None:
        """Remember a deletion (bounded: the oldest go first, and those older than the TTL on the way)."""
        tombstones, now = cache.tombstones, self.now()
        tombstones.pop(key, None)
        tombstones[key] = (str((obj.get("metadata") or {}).get("resourceVersion") or ""), now)
        while tombstones:
            oldest = next(iter(tombstones))
            if len(tombstones) <= TOMBSTONE_LIMIT and now - tombstones[oldest][1] <= TOMBSTONE_TTL_S:
                break
            del tombstones[oldest]

    def _run(self, cache: _KindCache) -> None:
        """List once; watch in windows resuming from the last version; list again only on 410 Gone."""
        must_list, delay = True, RETRY_MIN_S
        while not self._stop.is_set():
            try:
                if must_list:
                    self._relist(cache)
                    must_list = False
                started = time.monotonic()
                window = self.watch_window if cache.broken_since is None else min(self.watch_window,
                                                                                  PROBE_WINDOW_S)
                selection = {"label_selector": cache.selector} if cache.selector else {}
                for event in self.store.watch(cache.kind, resource_version=cache.version or None, timeout=window,
                                              bookmarks=True, **selection):
                    version = str((event.object.get("metadata") or {}).get("resourceVersion") or "")
                    if event.type != "BOOKMARK":
                        self._apply(cache, event.type, event.object, version)
                    elif version:
                        cache.version = version
                    if cache.broken_since is not None:
                        self._working(cache)
                    if self._stop.is_set():
                        return
                self._working(cache)  # a window that ended as the server ends it: the watch works
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
                self._failing(cache, f"{type(exc).__name__}: {exc}")
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
                       and _selected(selector, obj)]
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
    def observe(self, obj: dict[str, Any]) -> None:
        """Take `obj`, read elsewhere (a write's response, another watch's event, a GET), into the cache under the
        rules for a write's response: only if the watch has not passed it and no tombstone covers it."""
        cache = self._caches.get(str(obj.get("kind") or ""))
        if cache is None or self._subscribed or not cache.synced.is_set() or not obj.get("metadata"):
            return
        if cache.selector and not _selected(parse_label_selector(cache.selector), obj):
            return
        self._apply(cache, "MODIFIED", clone(obj) if self.copy else obj, written=True)

    def create(self, obj: dict[str, Any]) -> dict[str, Any]:
        created = self.store.create(obj)
        self.observe({"kind": obj.get("kind"), **created})
        return created

    def patch(self, kind: str, name: str, patch: dict[str, Any] | builtins.list[Any], namespace: str | None = None,
              patch_type: str = "merge", subresource: str | None = None) -> dict[str, Any]:
        patched = self.store.patch(kind, name, patch, namespace, patch_type, subresource)
        self.observe({"kind": kind, **patched})
        return patched

    def delete(self, kind: str, name: str, namespace: str | None = None) -> None:
        self.store.delete(kind, name, namespace)  # the watch reports the deletionTimestamp or the removal

    def watch(self, kind: str, namespace: str | None = None, label_selector: str | None = None,
              field_selector: str | None = None, resource_version: str | None = None,
              timeout: float | None = None, bookmarks: bool = False) -> Iterator[WatchEvent]:
        return self.store.watch(kind, namespace, label_selector, field_selector, resource_version, timeout,
                                bookmarks=bookmarks)


def _selected(selector: LabelSelector, obj: dict[str, Any]) -> bool:
    return selector.matches((obj.get("metadata") or {}).get("labels"))


def cache_trusted(source: object) -> bool:
    """The check every cluster-side controller makes at the start of its pass: False while `source` (an
    `InformedCluster`, or anything reading through informers that has a `trusted()`) has a stale kind; True for
    anything else, which reads the API server live."""
    trusted = getattr(source, "trusted", None)
    return trusted is None or bool(trusted())
