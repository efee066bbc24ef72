"""The in-memory store seen as a remote API server, for controllers' informer tests: no synchronous change
notifications (so `InformedCluster` lists and watches from threads, as against a real server), LISTs counted by
kind, and watches that fail while `down` (a broken connection) — with `eventually`, the bounded wait on a condition
those threads bring about."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from kubegpu.kube import ApiError, MemoryCluster


class RemoteStore:
    def __init__(self, store: MemoryCluster) -> None:
        self.store = store
        self.lists: list[str] = []
        self.down = False

    def list_with_version(self, kind: str, *args: Any, **kwargs: Any) -> tuple[list[dict[str, Any]], str]:
        self.lists.append(kind)
        return self.store.list_with_version(kind, *args, **kwargs)

    def list(self, kind: str, *args: Any, **kwargs: Any) -> list[dict[str, Any]]:
        return self.list_with_version(kind, *args, **kwargs)[0]

    def watch(self, kind: str, *args: Any, **kwargs: Any) -> Any:
        if self.down:
            raise ApiError(f"watch {kind}: connection refused", code=503)
        return self.store.watch(kind, *args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        if name == "subscribe":
            raise AttributeError(name)
        return getattr(self.store, name)


def eventually(check: Callable[[], object], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.01)
