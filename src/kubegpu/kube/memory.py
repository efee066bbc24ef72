"""An in-memory API server: the store the simulator runs controllers on, and the fake behind unit tests.

It keeps the API server's rules that controllers depend on: uid, creationTimestamp, generation, one global
monotonically increasing resourceVersion, 409 Conflict on a stale resourceVersion, AlreadyExists, merge / JSON /
strategic merge patches, status-subresource isolation, finalizers with deletionTimestamp, label and field selectors,
and watches that start from a resourceVersion (410 Gone when it is older than the kept history).

Time: timestamps come from the injected `Clock` (virtual in the simulator). A watch's ``timeout`` is wall time spent
waiting in a thread; ``timeout=0`` yields what has already happened and returns without waiting — the simulator
drains events that way. For the hottest paths, `subscribe` calls back synchronously on every change instead.

Evictions (`evict`, the `pods/eviction` subresource) keep the API server's PodDisruptionBudget rule: the budget is
computed the way the disruption controller does (`kubegpu.kube.eviction.desired_healthy`) from the pods stored at
that instant, under the store's lock, so concurrent evictions spend it one at a time and the one that finds it spent
gets 429. The expected count behind `maxUnavailable` and percentages is the replicas of the pods' controllers where
the store holds them (spec.replicas, followed up the controller chain), otherwise one per selected pod, and one per
pod evicted under the budget until a newer pod replaces it (as a ReplicaSet's scale would keep counting it).

Simplifications: a delete takes effect at once (no kubelet grace period for Pods; finalizers still hold it), objects
are not validated against their schemas, and there is no server-side apply.

Thread-safe: one re-entrant lock guards the store; watches wait on a condition and yield outside the lock.
Stored objects are never mutated in place (every write stores a new dict), so watch history and subscribers can
share them; everything returned to callers is a copy. `add` and `update` (create and merge-patch for callers
that need no answer) return nothing and take over what they are given instead of copying it.
"""

from __future__ import annotations

import builtins
import re
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from kubegpu.clock import Clock, RealClock
from kubegpu.kube.cluster import PATCH_TYPES, Cluster, WatchEvent, format_timestamp
from kubegpu.kube.errors import ApiError, BadRequest, Conflict, Gone, Invalid, NotFound
from kubegpu.kube.eviction import TOO_MANY_REQUESTS, budget_ignored, controller_of, covering_pdbs, refusal, unreplaced
from kubegpu.kube.patching import clone, json_patch, merge_patch, strategic_merge_patch
from kubegpu.kube.resources import ResourceKind, resource_kind
from kubegpu.kube.selectors import FieldSelector, LabelSelector, parse_field_selector, parse_label_selector

_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")
_SYSTEM_METADATA = ("uid", "creationTimestamp", "generation", "deletionTimestamp", "deletionGracePeriodSeconds")
_NOT_SPEC = frozenset({"metadata", "status", "apiVersion", "kind"})

Subscriber = Callable[[WatchEvent], None]


@dataclass(frozen=True, slots=True)
class _Record:
    """One change, as the watch history keeps it (``old``: the object before, for selector transitions)."""

    rv: int
    kind: str
    type: str
    obj: dict[str, Any]
    old: dict[str, Any] | None


@dataclass(frozen=True)
class _Filter:
    kind: str
    namespace: str | None
    labels: LabelSelector
    fields: FieldSelector

    def matches(self, obj: dict[str, Any]) -> bool:
        metadata = obj["metadata"]
        if self.namespace is not None and metadata.get("namespace") != self.namespace:
            return False
        return self.labels.matches(metadata.get("labels")) and self.fields.matches(obj)


class MemoryCluster(Cluster):
    """The Cluster interface over an in-memory store (see the module docstring).

    ``history_limit``: how many recent changes watches can resume from (older resourceVersions get 410 Gone), the
    counterpart of the API server's watch cache window.
    """

    def __init__(self, clock: Clock | None = None, history_limit: int = 20_000) -> None:
        self.clock: Clock = clock or RealClock()
        self._history_limit = max(1, history_limit)
        self._lock = threading.RLock()
        self._changed = threading.Condition(self._lock)
        self._objects: dict[str, dict[tuple[str, str], dict[str, Any]]] = {}
        self._rv = 0
        self._log: builtins.list[_Record] = []
        self._log_first_rv = 1  # resourceVersion of self._log[0]
        self._subscribers: dict[str, builtins.list[Subscriber]] = {}
        self._uids = 0
        self._evicted: dict[str, builtins.list[int]] = {}   # PDB uid → uid serials at evictions not yet replaced

    # ------------------------------------------------------------------ reads
    @property
    def resource_version(self) -> str:
        """The store's current resourceVersion (what a list taken now would report)."""
        with self._lock:
            return str(self._rv)

    def get(self, kind: str, name: str, namespace: str | None = None) -> dict[str, Any]:
        spec = resource_kind(kind)
        key = (self._namespace(spec, namespace), name)
        with self._lock:
            found = self._objects.get(kind, {}).get(key)
            if found is None:
                raise NotFound(f"{kind} {_describe(key)} not found")
            return clone(found)

    def list_with_version(
        self,
        kind: str,
        namespace: str | None = None,
        label_selector: str | None = None,
        field_selector: str | None = None,
    ) -> tuple[builtins.list[dict[str, Any]], str]:
        """Matching objects sorted by namespace and name, and the resourceVersion to start a watch from."""
        where = self._filter(kind, namespace, label_selector, field_selector)
        with self._lock:
            matching = sorted((key, obj) for key, obj in self._objects.get(kind, {}).items() if where.matches(obj))
            items = [clone(obj) for _, obj in matching]
            return items, str(self._rv)

    # ------------------------------------------------------------------ writes
    def create(self, obj: dict[str, Any]) -> dict[str, Any]:
        return clone(self._created(obj))

    def add(self, obj: dict[str, Any]) -> None:
        """A create whose result the caller does not need: no copy of the stored object is handed back, and `obj`
        is not copied beyond its metadata, so the caller hands it over and must not modify it afterwards (the
        simulator's hot path: one Pod per job)."""
        self._created(obj, copy=False)

    def _created(self, obj: dict[str, Any], copy: bool = True) -> dict[str, Any]:
        """Create; the stored object (not a copy: callers must not modify it)."""
        if not isinstance(obj, dict) or not obj.get("kind"):
            raise Invalid(f"object to create: kind: Required value (got {type(obj).__name__})")
        if copy or not isinstance(obj.get("metadata"), dict):
            new = clone(obj)
        else:  # the store changes only the metadata in place; everything else it replaces, never modifies
            new = {**obj, "metadata": dict(obj["metadata"])}
        spec = resource_kind(str(new["kind"]))
        if new.get("apiVersion", spec.api_version) != spec.api_version:
            raise Invalid(f"{spec.kind}: apiVersion {new.get('apiVersion')!r} is not {spec.api_version!r}")
        new = {"apiVersion": spec.api_version, "kind": spec.kind,
               **{key: value for key, value in new.items() if key not in ("apiVersion", "kind")}}
        metadata = new.get("metadata")
        if not isinstance(metadata, dict):
            raise Invalid(f"{spec.kind}: metadata: Required value")
        if metadata.get("resourceVersion"):
            raise Invalid(f"{spec.kind} {metadata.get('name')}: metadata.resourceVersion must not be set on create")
        if spec.namespaced:
            metadata["namespace"] = metadata.get("namespace") or "default"
        else:
            metadata.pop("namespace", None)
        with self._lock:
            name = metadata.get("name") or self._generate_name(spec, metadata)
            if not isinstance(name, str) or not _NAME.match(name) or len(name) > 253:
                raise Invalid(f"{spec.kind} {name!r}: metadata.name must be a lowercase DNS subdomain")
            metadata["name"] = name
            key = (metadata.get("namespace", ""), name)
            if key in self._objects.get(spec.kind, {}):
                raise Conflict(f"{spec.kind} {_describe(key)} already exists", reason="AlreadyExists")
            self._uids += 1
            metadata["uid"] = str(uuid.UUID(int=self._uids))
            metadata["creationTimestamp"] = format_timestamp(self.clock.now())
            metadata["generation"] = 1
            metadata.pop("deletionTimestamp", None)
            metadata.pop("deletionGracePeriodSeconds", None)
            self._commit(spec.kind, key, "ADDED", new, None)
            return new

    def patch(
        self,
        kind: str,
        name: str,
        patch: dict[str, Any] | builtins.list[Any],
        namespace: str | None = None,
        patch_type: str = "merge",
        subresource: str | None = None,
    ) -> dict[str, Any]:
        with self._lock:
            return clone(self._patched(kind, name, patch, namespace, patch_type, subresource))

    def update(self, kind: str, name: str, patch: dict[str, Any], namespace: str | None = None,
               subresource: str | None = None) -> None:
        """A merge `patch` whose result the caller does not need: no copy of the stored object is handed back,
        which is most of a patch's cost on a large object (the simulator's hot path: agents' reports, bindings).
        Nor is `patch` copied: the caller hands it over and must not modify it afterwards."""
        self._patched(kind, name, patch, namespace, "merge", subresource, copy_patch=False)

    def _patched(self, kind: str, name: str, patch: dict[str, Any] | builtins.list[Any], namespace: str | None,
                 patch_type: str, subresource: str | None, copy_patch: bool = True) -> dict[str, Any]:
        """Apply a patch; the stored object after it (not a copy: callers must not modify it)."""
        spec = resource_kind(kind)
        self._check_patch_request(spec, patch_type, subresource)
        key = (self._namespace(spec, namespace), name)
        body = clone(patch) if copy_patch else patch
        with self._lock:
            current = self._objects.get(kind, {}).get(key)
            if current is None:
                raise NotFound(f"{kind} {_describe(key)} not found")
            patched = self._apply(spec, current, body, patch_type)
            wanted_rv = (patched.get("metadata") or {}).get("resourceVersion")
            if wanted_rv is not None and str(wanted_rv) != current["metadata"]["resourceVersion"]:
                raise Conflict(
                    f"Operation cannot be fulfilled on {spec.plural} {_describe(key)}: the object has been modified; "
                    "please apply your changes to the latest version and try again"
                )
            new = self._updated(spec, current, patched, subresource, key)
            if new == current:
                return current
            if new["metadata"].get("deletionTimestamp") and not new["metadata"].get("finalizers"):
                self._commit(kind, key, "DELETED", new, current)
            else:
                self._commit(kind, key, "MODIFIED", new, current)
            return new

    def delete(self, kind: str, name: str, namespace: str | None = None) -> None:
        spec = resource_kind(kind)
        key = (self._namespace(spec, namespace), name)
        with self._lock:
            current = self._objects.get(kind, {}).get(key)
            if current is None:
                raise NotFound(f"{kind} {_describe(key)} not found")
            if not current["metadata"].get("finalizers"):
                self._commit(kind, key, "DELETED", dict(current, metadata=dict(current["metadata"])), current)
            elif not current["metadata"].get("deletionTimestamp"):
                metadata = dict(current["metadata"], deletionTimestamp=format_timestamp(self.clock.now()),
                                deletionGracePeriodSeconds=0)
                self._commit(kind, key, "MODIFIED", dict(current, metadata=metadata), current)

    def evict(self, namespace: str, name: str) -> None:
        """The `pods/eviction` subresource: delete the pod unless a PodDisruptionBudget allows no more disruptions
        now (429 TooManyRequests), or more than one budget covers it (500, which the API server does not support)."""
        key = (namespace or "default", name)
        with self._lock:
            pod = self._objects.get("Pod", {}).get(key)
            if pod is None:
                raise NotFound(f"Pod {_describe(key)} not found")
            pdbs = covering_pdbs(pod, builtins.list(self._objects.get("PodDisruptionBudget", {}).values()))
            if len(pdbs) > 1:
                raise ApiError("This pod has more than one PodDisruptionBudget, which the eviction subresource does "
                               "not support.")
            if pdbs and not budget_ignored(pod):
                pdb = dict(pdbs[0])
                selected = [p for (ns, _), p in self._objects.get("Pod", {}).items()
                            if ns == key[0] and covering_pdbs(p, [pdb])]
                why = refusal(pod, pdb, selected, self._expected_scale(pdb, selected))
                if why is not None:
                    raise ApiError(why, code=TOO_MANY_REQUESTS, reason="TooManyRequests")
                if self._controller_scale(pod) is None:   # its slot stays expected until a newer pod fills it
                    self._evicted.setdefault(pdb["metadata"]["uid"], []).append(self._uids)
            self.delete("Pod", name, key[0])

    def _controller_scale(self, pod: dict[str, Any]) -> tuple[str, int] | None:
        """(uid, spec.replicas) of the top of the pod's controller chain the store holds (a ReplicaSet's
        Deployment), or None when it holds none."""
        namespace, owner, top = pod["metadata"].get("namespace", ""), controller_of(pod), None
        while owner is not None:
            found = self._objects.get(str(owner.get("kind")), {}).get((namespace, str(owner.get("name"))))
            if found is None:
                break
            top, owner = found, controller_of(found)
        return None if top is None else (top["metadata"]["uid"], int((top.get("spec") or {}).get("replicas", 1)))

    def _expected_scale(self, pdb: dict[str, Any], pods: builtins.list[dict[str, Any]]) -> int:
        """The pods the budget's workloads want, as the disruption controller reads them: the replicas of each
        controller the store holds, once; any other pod counts itself, and so does each such pod evicted under
        this budget until a pod created after its eviction has taken its place (the store runs no controllers, so
        without that an eviction would shrink the count it is checked against)."""
        total, counted, serials = 0, set(), builtins.list[int]()
        for pod in pods:
            scale = self._controller_scale(pod)
            if scale is None:
                total += 1
                serials.append(uuid.UUID(pod["metadata"]["uid"]).int)
            elif scale[0] not in counted:
                counted.add(scale[0])
                total += scale[1]
        uid = pdb["metadata"]["uid"]
        self._evicted[uid] = unreplaced(self._evicted.get(uid, []), serials)
        return total + len(self._evicted[uid])

    # ------------------------------------------------------------------ watches
    def watch(
        self,
        kind: str,
        namespace: str | None = None,
        label_selector: str | None = None,
        field_selector: str | None = None,
        resource_version: str | None = None,
        timeout: float | None = None,
        bookmarks: bool = False,
    ) -> Iterator[WatchEvent]:
        """Changes after ``resource_version``; without one (or "0"), first an ADDED for every current object.

        Raises Gone (410) when ``resource_version`` is older than the kept history. ``timeout``: None waits forever,
        0 returns once caught up, otherwise returns when that many seconds pass without the watch ending earlier.
        """
        where = self._filter(kind, namespace, label_selector, field_selector)
        with self._lock:
            if resource_version in (None, "", "0"):
                initial = [WatchEvent("ADDED", clone(obj)) for _, obj in sorted(self._objects.get(kind, {}).items())
                           if where.matches(obj)]
                start = self._rv
            else:
                start = _parse_rv(resource_version)
                self._check_not_expired(start)
                initial = []
        return self._stream(where, initial, start, timeout)

    def subscribe(self, kind: str, callback: Subscriber) -> Callable[[], None]:
        """Call ``callback`` synchronously (under the store's lock) after every change to ``kind``.

        The fast path for the simulator: no copies, no threads. The event's object is the stored one and must not be
        modified; the callback may call back into the store. Returns a function that unsubscribes.
        """
        resource_kind(kind)
        with self._lock:
            self._subscribers.setdefault(kind, []).append(callback)

        def unsubscribe() -> None:
            with self._lock:
                callbacks = self._subscribers.get(kind, [])
                if callback in callbacks:
                    callbacks.remove(callback)

        return unsubscribe

    # ------------------------------------------------------------------ internals
    def _stream(self, where: _Filter, initial: builtins.list[WatchEvent], start: int, timeout: float | None
                ) -> Iterator[WatchEvent]:
        yield from initial
        deadline = None if timeout is None else time.monotonic() + timeout
        position = start
        while True:
            with self._changed:
                while position >= self._rv:
                    remaining = None if deadline is None else deadline - time.monotonic()
                    if remaining is not None and remaining <= 0:
                        return
                    self._changed.wait(remaining)
                self._check_not_expired(position)
                records = self._log[position + 1 - self._log_first_rv: self._rv + 1 - self._log_first_rv]
                position = self._rv
            for record in records:
                event = _as_seen_through(record, where)
                if event is not None:
                    yield event

    def _commit(self, kind: str, key: tuple[str, str], type_: str, new: dict[str, Any],
                old: dict[str, Any] | None) -> None:
        """Store a change (``new`` must be a fresh dict with its own metadata dict) and tell watchers."""
        self._rv += 1
        new["metadata"]["resourceVersion"] = str(self._rv)
        objects = self._objects.setdefault(kind, {})
        if type_ == "DELETED":
            objects.pop(key, None)
        else:
            objects[key] = new
        self._log.append(_Record(self._rv, kind, type_, new, old))
        if len(self._log) > 2 * self._history_limit:
            dropped = len(self._log) - self._history_limit
            del self._log[:dropped]
            self._log_first_rv += dropped
        self._changed.notify_all()
        for callback in tuple(self._subscribers.get(kind, ())):
            callback(WatchEvent(type_, new))

    def _check_not_expired(self, rv: int) -> None:
        if rv < self._log_first_rv - 1:
            raise Gone(f"too old resource version: {rv} ({self._log_first_rv - 1})")

    def _apply(self, spec: ResourceKind, current: dict[str, Any], body: Any, patch_type: str) -> dict[str, Any]:
        if patch_type == "json":
            return json_patch(current, body)
        if not isinstance(body, dict):
            raise BadRequest(f"a {patch_type} patch must be an object, got {type(body).__name__}")
        if patch_type == "strategic":
            return strategic_merge_patch(current, body, spec.kind)
        patched = merge_patch(current, body)
        return patched if isinstance(patched, dict) else {}

    def _updated(self, spec: ResourceKind, current: dict[str, Any], patched: dict[str, Any],
                 subresource: str | None, key: tuple[str, str]) -> dict[str, Any]:
        """The object to store after a patch: status isolation, system fields kept, generation bumped on spec change."""
        if subresource == "status":
            new = dict(current)
            _set_or_drop(new, "status", patched.get("status"))
            new["metadata"] = dict(current["metadata"])
            return new
        new = dict(patched)
        if spec.status_subresource:
            _set_or_drop(new, "status", current.get("status"))
        new["apiVersion"], new["kind"] = current["apiVersion"], current["kind"]
        metadata = new.get("metadata")
        if not isinstance(metadata, dict):
            raise Invalid(f"{spec.kind} {_describe(key)}: metadata: Required value")
        metadata = dict(metadata)
        old_metadata = current["metadata"]
        for field in ("name", "namespace"):
            if metadata.get(field) != old_metadata.get(field):
                raise Invalid(f"{spec.kind} {_describe(key)}: metadata.{field}: field is immutable")
        for field in _SYSTEM_METADATA:
            _set_or_drop(metadata, field, old_metadata.get(field))
        metadata["resourceVersion"] = old_metadata["resourceVersion"]
        if old_metadata.get("deletionTimestamp"):
            added = set(metadata.get("finalizers") or ()) - set(old_metadata.get("finalizers") or ())
            if added:
                raise Invalid(f"{spec.kind} {_describe(key)}: metadata.finalizers: no new finalizers can be added "
                              "if the object is being deleted")
        new["metadata"] = metadata
        if _spec_of(new) != _spec_of(current):
            metadata["generation"] = int(old_metadata.get("generation") or 0) + 1
        return new

    @staticmethod
    def _check_patch_request(spec: ResourceKind, patch_type: str, subresource: str | None) -> None:
        if patch_type not in PATCH_TYPES:
            raise BadRequest(f"patch type {patch_type!r} is not one of {', '.join(PATCH_TYPES)}")
        if subresource not in (None, "status"):
            raise NotFound(f"{spec.kind} has no subresource {subresource!r}")
        if subresource == "status" and not spec.status_subresource:
            raise NotFound(f"{spec.kind} has no status subresource")
        if patch_type == "strategic" and not spec.strategic_merge:
            raise ApiError(f"strategic merge patch is not supported for {spec.kind} (a custom resource)",
                           code=415, reason="UnsupportedMediaType")

    @staticmethod
    def _namespace(spec: ResourceKind, namespace: str | None) -> str:
        return (namespace or "default") if spec.namespaced else ""

    @staticmethod
    def _filter(kind: str, namespace: str | None, label_selector: str | None, field_selector: str | None) -> _Filter:
        spec = resource_kind(kind)
        return _Filter(kind, namespace if spec.namespaced else None, parse_label_selector(label_selector),
                       parse_field_selector(field_selector, kind))

    def _generate_name(self, spec: ResourceKind, metadata: dict[str, Any]) -> str:
        prefix = metadata.get("generateName")
        if not prefix:
            raise Invalid(f"{spec.kind}: metadata.name: Required value (or metadata.generateName)")
        suffix = self._uids + 1
        alphabet = "bcdfghjklmnpqrstvwxz2456789"
        chars = []
        for _ in range(5):
            suffix, digit = divmod(suffix, len(alphabet))
            chars.append(alphabet[digit])
        return f"{prefix}{''.join(chars)}"


def _as_seen_through(record: _Record, where: _Filter) -> WatchEvent | None:
    """The event a watcher with this filter sees: selector transitions turn into ADDED/DELETED, as in Kubernetes."""
    if record.kind != where.kind:
        return None
    if record.type == "DELETED":
        return WatchEvent("DELETED", clone(record.obj)) if where.matches(record.obj) else None
    now_matches = where.matches(record.obj)
    before_matched = record.old is not None and where.matches(record.old)
    if now_matches:
        return WatchEvent("MODIFIED" if before_matched else "ADDED", clone(record.obj))
    if before_matched and record.old is not None:
        gone = clone(record.old)
        gone["metadata"]["resourceVersion"] = record.obj["metadata"]["resourceVersion"]
        return WatchEvent("DELETED", gone)
    return None


def _spec_of(obj: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in obj.items() if key not in _NOT_SPEC}


def _set_or_drop(target: dict[str, Any], key: str, value: Any) -> None:
    if value is None:
        target.pop(key, None)
    else:
        target[key] = value


def _parse_rv(text: str | None) -> int:
    try:
        return int(str(text))
    except ValueError:
        raise BadRequest(f"resourceVersion {text!r} is not a resource version this store issued") from None


def _describe(key: tuple[str, str]) -> str:
    namespace, name = key
    return f"{namespace}/{name}" if namespace else name
