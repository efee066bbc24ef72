"""The Cluster interface: the API operations kubegpu's controllers and agents need, and nothing more.

Two implementations keep the same contract (one shared test suite checks both): `MemoryCluster`, an in-memory API
server for tests and the simulator, and `LightkubeCluster`, lightkube against a real API server. Objects are plain
dicts in their JSON shape; namespaced kinds default to namespace "default" when none is given.
"""

from __future__ import annotations

import builtins
import hashlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

from kubegpu.clock import Clock, RealClock
from kubegpu.kube.errors import Conflict
from kubegpu.kube.resources import resource_kind


@dataclass
class WatchEvent:
    type: str  # "ADDED" | "MODIFIED" | "DELETED" | "BOOKMARK" (only when asked for)
    object: dict[str, Any]


class Cluster(Protocol):
    """What controllers need from the API. `MemoryCluster` and `LightkubeCluster` subclass it to share `list`."""

    def get(self, kind: str, name: str, namespace: str | None = None) -> dict[str, Any]: ...

    def list(
        self,
        kind: str,
        namespace: str | None = None,
        label_selector: str | None = None,
        field_selector: str | None = None,
    ) -> builtins.list[dict[str, Any]]:
        return self.list_with_version(kind, namespace, label_selector, field_selector)[0]

    def list_with_version(
        self,
        kind: str,
        namespace: str | None = None,
        label_selector: str | None = None,
        field_selector: str | None = None,
    ) -> tuple[builtins.list[dict[str, Any]], str]:
        """The list plus the resourceVersion to start a watch from so that no change is missed."""
        ...

    def create(self, obj: dict[str, Any]) -> dict[str, Any]: ...

    def patch(
        self,
        kind: str,
        name: str,
        patch: dict[str, Any] | builtins.list[Any],
        namespace: str | None = None,
        patch_type: str = "merge",
        subresource: str | None = None,
    ) -> dict[str, Any]: ...

    def delete(self, kind: str, name: str, namespace: str | None = None) -> None: ...

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
        """Changes after `resource_version`. `bookmarks`: also yield BOOKMARK events (an object carrying only a
        newer metadata.resourceVersion) where the server sends them, so a watcher of a quiet kind can resume from a
        version the server still remembers; a store without them sends none."""
        ...


PATCH_TYPES = ("merge", "json", "strategic")


def format_timestamp(seconds: float, micro: bool = False) -> str:
    """RFC 3339 in UTC as the API server writes it: metav1.Time to the second, metav1.MicroTime (a Lease's
    acquire/renew times) to the microsecond."""
    return datetime.fromtimestamp(seconds, tz=UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ" if micro else "%Y-%m-%dT%H:%M:%SZ")


def parse_timestamp(text: str | None) -> float | None:
    """Seconds since the epoch from a metav1.Time or MicroTime; None when absent or unreadable (a controller then
    treats the object as having no such time, never crashes on it)."""
    if not text:
        return None
    try:
        parsed = datetime.fromisoformat(text)
    except ValueError:
        return None
    return (parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=UTC)).timestamp()


def record_event(
    cluster: Cluster,
    obj: Mapping[str, Any],
    reason: str,
    message: str,
    type_: str = "Warning",
    component: str = "kubegpu",
) -> None:
    """Record a core/v1 Event about ``obj`` so that `kubectl describe` shows what kubegpu did and why.

    Like client-go's event recorder, repeats of the same event (same object, reason, message, type) are folded into
    one Event whose ``count`` grows, so a controller retrying in a loop does not flood the API server. Events for
    cluster-scoped objects (Nodes, NodeClaims) go to namespace "default", as Kubernetes does.
    """
    clock: Clock = getattr(cluster, "clock", None) or RealClock()
    now = format_timestamp(clock.now())
    metadata = obj.get("metadata") or {}
    kind = str(obj.get("kind", ""))
    namespace = metadata.get("namespace") if resource_kind(kind).namespaced else None
    event_namespace = namespace or "default"
    digest = hashlib.sha1(
        "\0".join([kind, str(namespace), str(metadata.get("name")), str(metadata.get("uid")), reason, message,
                   type_, component]).encode(),
        usedforsecurity=False,
    ).hexdigest()[:16]
    name = f"{metadata.get('name', 'unnamed')}.{digest}"
    event = {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": name, "namespace": event_namespace},
        "involvedObject": {
            key: value
            for key, value in {
                "apiVersion": obj.get("apiVersion"),
                "kind": kind,
                "name": metadata.get("name"),
                "namespace": namespace,
                "uid": metadata.get("uid"),
                "resourceVersion": metadata.get("resourceVersion"),
            }.items()
            if value
        },
        "reason": reason,
        "message": message,
        "type": type_,
        "source": {"component": component},
        "reportingComponent": component,
        "firstTimestamp": now,
        "lastTimestamp": now,
        "count": 1,
    }
    try:
        cluster.create(event)
    except Conflict as exc:
        if exc.reason != "AlreadyExists":
            raise
        existing = cluster.get("Event", name, event_namespace)
        cluster.patch(
            "Event",
            name,
            {"count": int(existing.get("count") or 1) + 1, "lastTimestamp": now},
            event_namespace,
        )
