"""A controller's cached view of the simulator's in-memory cluster, as an informer gives a controller on a real one.

A controller run by a strategy lists every Pod and Node on each pass (every few simulated seconds, thousands of
times a day); `MemoryCluster.list` deep-copies each object, which would cost more than the simulation itself.
`InformedCluster` keeps the listed kinds in a cache fed by the store's change notifications
(`MemoryCluster.subscribe`) and lists from it without copying. That is safe because the store never modifies an
object once stored (every change stores a fresh one), and it is the informer contract: callers must not modify
what a list returns. Lists come back in the store's order (namespace, name); reads of other kinds, lists with a
namespace or selector, and every write go to the store itself.
"""

from __future__ import annotations

import builtins
from collections.abc import Iterable, Iterator
from typing import Any

from kubegpu.kube.cluster import WatchEvent
from kubegpu.kube.memory import MemoryCluster

_Key = tuple[str, str]


class InformedCluster:
    """`MemoryCluster`'s interface, with `list` of `kinds` served from a change-fed cache (see the module doc)."""

    def __init__(self, store: MemoryCluster, kinds: Iterable[str]) -> None:
        self.store = store
        self._cache: dict[str, dict[_Key, dict[str, Any]]] = {}
        self._sorted: dict[str, builtins.list[dict[str, Any]] | None] = {}
        for kind in kinds:
            self._cache[kind] = {}
            self._sorted[kind] = None
            store.subscribe(kind, self._watcher(kind))
            for obj in store.list(kind):  # copies, taken once; changes from now on arrive through the watcher
                self._cache[kind][_key(obj)] = obj

    def _watcher(self, kind: str) -> Any:
        def changed(event: WatchEvent) -> None:
            key = _key(event.object)
            if event.type == "DELETED":
                self._cache[kind].pop(key, None)
            else:
                self._cache[kind][key] = event.object
            self._sorted[kind] = None

        return changed

    def list(self, kind: str, namespace: str | None = None, label_selector: str | None = None,
             field_selector: str | None = None) -> builtins.list[dict[str, Any]]:
        return self.list_with_version(kind, namespace, label_selector, field_selector)[0]

    def list_with_version(self, kind: str, namespace: str | None = None, label_selector: str | None = None,
                          field_selector: str | None = None) -> tuple[builtins.list[dict[str, Any]], str]:
        if kind not in self._cache or namespace or label_selector or field_selector:
            return self.store.list_with_version(kind, namespace, label_selector, field_selector)
        ordered = self._sorted[kind]
        if ordered is None:
            ordered = self._sorted[kind] = [obj for _, obj in sorted(self._cache[kind].items())]
        return list(ordered), self.store.resource_version

    def get(self, kind: str, name: str, namespace: str | None = None) -> dict[str, Any]:
        return self.store.get(kind, name, namespace)

    def create(self, obj: dict[str, Any]) -> dict[str, Any]:
        return self.store.create(obj)

    def patch(self, kind: str, name: str, patch: dict[str, Any] | builtins.list[Any], namespace: str | None = None,
              patch_type: str = "merge", subresource: str | None = None) -> dict[str, Any]:
        return self.store.patch(kind, name, patch, namespace, patch_type, subresource)

    def delete(self, kind: str, name: str, namespace: str | None = None) -> None:
        self.store.delete(kind, name, namespace)

    def watch(self, kind: str, namespace: str | None = None, label_selector: str | None = None,
              field_selector: str | None = None, resource_version: str | None = None,
              timeout: float | None = None) -> Iterator[WatchEvent]:
        return self.store.watch(kind, namespace, label_selector, field_selector, resource_version, timeout)


def _key(obj: dict[str, Any]) -> _Key:
    meta = obj.get("metadata") or {}
    return str(meta.get("namespace") or ""), str(meta.get("name") or "")
