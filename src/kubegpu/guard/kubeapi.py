"""The Eviction API for the guard: the one call the `Cluster` interface does not have.

An eviction (not a delete) is what lets PodDisruptionBudgets hold: the API server answers 429 when a budget protects
the pod, and the guard then kills only the offending processes instead. A pod already gone (404) counts as evicted.
"""

from __future__ import annotations

from typing import Any

from kubegpu.errors import KubegpuError


class ApiEvictor:
    """`(namespace, name) → evicted?` through `policy/v1` Evictions on a lightkube client."""

    def __init__(self, client: Any) -> None:
        self.client = client

    def __call__(self, namespace: str, name: str) -> bool:
        from lightkube import ApiError
        from lightkube.models.meta_v1 import ObjectMeta
        from lightkube.resources.core_v1 import Pod

        try:
            self.client.create(Pod.Eviction(metadata=ObjectMeta(name=name, namespace=namespace)), name,
                               namespace=namespace)
        except ApiError as exc:
            if exc.status.code == 429:  # a PodDisruptionBudget says not now
                return False
            if exc.status.code != 404:
                raise KubegpuError(f"evict pod {namespace}/{name}: {exc.status.message}") from None
        return True
