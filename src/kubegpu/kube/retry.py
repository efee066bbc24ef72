"""Riding out API-server faults: capped exponential backoff with jitter, and read-modify-write with resourceVersion.

What counts as transient is the API server's own contract: 429 (priority and fairness, "retry later"), 500/502/
503/504 (an apiserver or etcd restart, a proxy in between) and a dropped or refused connection. Everything else
(404, 409, 422, ...) is an answer and goes straight back to the caller.

A write is retried only when repeating it cannot do something twice: reads, deletes (a 404 after a retry means the
first attempt went through), merge and strategic patches (applying the same patch twice gives the same object) and
creates of a fixed name (a retried create that meets `AlreadyExists` returns the object the first attempt made).
A create with `generateName`, or a JSON patch, is retried only on 429, which the server sends before doing anything.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, TypeVar

from kubegpu.kube.errors import ApiError, Conflict

__all__ = ["TRANSIENT_CODES", "RetryPolicy", "is_transient", "update_with_retry"]

TRANSIENT_CODES = frozenset({429, 500, 502, 503, 504})
T = TypeVar("T")


def is_transient(exc: BaseException) -> bool:
    """A 429/5xx ApiError; connection failures are recognised by the adapter that sees them."""
    return isinstance(exc, ApiError) and exc.code in TRANSIENT_CODES


@dataclass
class RetryPolicy:
    """`attempts` tries in all; the n-th wait is uniform in [0, min(cap, base * 2**n)] ("full jitter")."""

    attempts: int = 6
    base_s: float = 0.1
    cap_s: float = 5.0
    sleep: Callable[[float], None] = time.sleep
    rng: random.Random = field(default_factory=random.Random)

    def delays(self) -> Iterator[float]:
        for attempt in range(self.attempts - 1):
            yield self.rng.uniform(0.0, min(self.cap_s, self.base_s * 2**attempt))

    def call(self, fn: Callable[[], T], retry_on: Callable[[BaseException], bool]) -> T:
        """`fn()`, repeated after a backoff while it raises something `retry_on` accepts; the last error escapes."""
        delays = self.delays()
        while True:
            try:
                return fn()
            except Exception as exc:
                if not retry_on(exc):
                    raise
                delay = next(delays, None)
                if delay is None:
                    raise
                self.sleep(delay)


def update_with_retry(
    cluster: Any,
    kind: str,
    name: str,
    mutate: Callable[[dict[str, Any]], dict[str, Any] | None],
    namespace: str | None = None,
    attempts: int = 10,
    subresource: str | None = None,
) -> dict[str, Any] | None:
    """Read-modify-write that never loses a concurrent update: read the object, let `mutate` return a merge patch
    for it (None: nothing to do), send the patch carrying the resourceVersion read, and on 409 Conflict read again.

    The resourceVersion makes the API server refuse the write when anyone changed the object after our read, so the
    patch is always computed from the latest object. The read is a GET at the server even when `cluster` is an
    informer cache (`InformedCluster.store`): a cache lagging behind would only meet 409 after 409. Returns the
    updated object (or None when `mutate` declined).
    """
    last: Conflict | None = None
    server = getattr(cluster, "store", None) or cluster   # through an informer cache: the read is the server's
    for _ in range(attempts):
        current = server.get(kind, name, namespace)
        patch = mutate(current)
        if patch is None:
            return None
        version = (current.get("metadata") or {}).get("resourceVersion")
        metadata = dict(patch.get("metadata") or {})
        if version:
            metadata["resourceVersion"] = version
        body = {**patch, "metadata": metadata}
        try:
            result: dict[str, Any] = cluster.patch(kind, name, body, namespace=namespace, subresource=subresource)
            return result
        except Conflict as exc:
            last = exc
    assert last is not None
    raise last
