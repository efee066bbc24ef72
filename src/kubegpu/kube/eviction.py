"""The Eviction API, the one call the `Cluster` interface does not have, for everyone who evicts a pod (the guard,
the quota controller's reclaim, the operator's driver upgrades).

An eviction (not a delete) is what lets PodDisruptionBudgets hold: the API server answers 429 when a budget protects
the pod right now, and `evict_pod` then returns False so the caller can fall back (the guard kills only the offending
process; the quota controller and the operator try again later). A pod already gone (404) counts as evicted. The
in-memory store has no subresources, so there the pod is deleted.
"""

from __future__ import annotations

import contextlib
from typing import Any

from kubegpu.errors import KubegpuError
from kubegpu.kube.errors import NotFound


def evict_pod(cluster: Any, namespace: str, name: str) -> bool:
    """Evict `namespace/name` through `policy/v1` Evictions on the cluster's lightkube client (or delete it from an
    in-memory cluster); False when a PodDisruptionBudget says not now."""
    client = getattr(cluster, "client", None)
    if client is None:
        with contextlib.suppress(NotFound):
            cluster.delete("Pod", name, namespace)
        return True
    return evict_with_client(client, namespace, name)


def evict_with_client(client: Any, namespace: str, name: str) -> bool:
    """The same through a lightkube client directly (a component that holds one without a `Cluster`)."""
    from lightkube import ApiError
    from lightkube.models.meta_v1 import ObjectMeta
    from lightkube.resources.core_v1 import Pod

    try:
        client.create(Pod.Eviction(metadata=ObjectMeta(name=name, namespace=namespace)), name, namespace=namespace)
    except ApiError as exc:
        if exc.status.code == 429:  # a PodDisruptionBudget says not now
            return False
        if exc.status.code != 404:
            raise KubegpuError(f"evict pod {namespace}/{name}: {exc.status.message}") from None
    return True
