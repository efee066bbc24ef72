"""Removing a pod: the Eviction API for everyone who takes a running pod away (the autoscaler's drains, the guard,
the quota controller's reclaim, the operator's driver upgrades), and the one deliberate bypass.

An eviction (not a delete) is what lets PodDisruptionBudgets hold: the API server checks the budget and spends
one disruption of it in the same step, so any number of callers evicting at once can never take more pods than the
budget allows — a caller's own count of what it already spent could not promise that. When the budget allows no
more the server answers 429; `evict` then returns the server's reason and the caller waits and tries again later
(never deletes instead). A pod already gone (404) counts as evicted.

`delete_past_grace` is the bypass, kept here so every removal of a pod reads in one module: a NodeClaim's
`terminationGracePeriod` has run out, and, as in Karpenter, what is left on the node is deleted whatever its
budget says.

The pure part is the disruption controller's arithmetic (`disruptions_allowed`), which the in-memory store uses
to answer evictions the way the API server does, and which the autoscaler uses to choose candidates that can be
drained at all.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from kubegpu.errors import KubegpuError
from kubegpu.kube.errors import ApiError, NotFound
from kubegpu.kube.selectors import selects

TOO_MANY_REQUESTS = 429
_FINISHED = frozenset({"Succeeded", "Failed"})


# ---------------------------------------------------------------------------------------------- the budget's sums
def covering_pdbs(pod: Mapping[str, Any], pdbs: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The PodDisruptionBudgets of the pod's namespace whose selector selects it (a null selector selects nothing,
    an empty one everything, as in policy/v1)."""
    meta = pod.get("metadata") or {}
    namespace, labels = meta.get("namespace", "default"), meta.get("labels") or {}
    return [p for p in pdbs if (p.get("metadata") or {}).get("namespace", "default") == namespace
            and selects((p.get("spec") or {}).get("selector"), labels,
                        f"pdb {(p.get('metadata') or {}).get('name', '')}: spec.selector")]


def is_healthy(pod: Mapping[str, Any]) -> bool:
    """Counted healthy by the disruption controller: not being deleted and Ready. A pod that carries no conditions
    at all (the simulator's) is judged by its phase Running instead."""
    if (pod.get("metadata") or {}).get("deletionTimestamp"):
        return False
    status = pod.get("status") or {}
    conditions = status.get("conditions")
    if conditions:
        return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)
    return status.get("phase") == "Running"


def _scaled(value: Any, total: int) -> int:
    if isinstance(value, str) and value.endswith("%"):
        return math.ceil(total * int(value[:-1]) / 100)
    return int(value)


def desired_healthy(pdb: Mapping[str, Any], selected: int, expected: int | None = None) -> int:
    """How many selected pods the budget wants healthy. `selected`: the pods it selects; `expected`: the replicas
    their controllers want (None: the selected pods), which an integer `minAvailable` does not need."""
    spec = pdb.get("spec") or {}
    scale = selected if expected is None else expected
    if spec.get("maxUnavailable") is not None:
        return max(0, scale - _scaled(spec["maxUnavailable"], scale))
    if spec.get("minAvailable") is not None:
        value = spec["minAvailable"]
        return _scaled(value, scale) if isinstance(value, str) else int(value)
    return 0


def disruptions_allowed(pdb: Mapping[str, Any], pods: Sequence[Mapping[str, Any]],
                        expected: int | None = None) -> int:
    """The disruption controller's `status.disruptionsAllowed`: healthy selected pods beyond what the budget wants
    kept (never below 0). `pods`: any pods (those of other namespaces or selectors are ignored)."""
    selected = [p for p in pods if covering_pdbs(p, [pdb])]
    healthy = sum(1 for p in selected if is_healthy(p))
    return max(0, healthy - desired_healthy(pdb, len(selected), expected))


def refusal(pod: Mapping[str, Any], pdb: Mapping[str, Any], selected: Sequence[Mapping[str, Any]],
            expected: int | None = None) -> str | None:
    """Why the API server answers 429 to evicting `pod` under `pdb` right now (None: it may go). A healthy pod needs
    a disruption to spare; an unready one goes while the budget is met (`unhealthyPodEvictionPolicy`
    IfHealthyBudget, the default) or always (AlwaysAllow)."""
    healthy = sum(1 for p in selected if is_healthy(p))
    desired = desired_healthy(pdb, len(selected), expected)
    if is_healthy(pod):
        refused = healthy - desired <= 0
    else:
        policy = (pdb.get("spec") or {}).get("unhealthyPodEvictionPolicy", "IfHealthyBudget")
        refused = policy != "AlwaysAllow" and healthy < desired
    if not refused:
        return None
    return (f"Cannot evict pod as it would violate the pod's disruption budget. The disruption budget "
            f"{(pdb.get('metadata') or {}).get('name', '')} needs {desired} healthy pods and has {healthy} currently")


def controller_of(obj: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The owner reference marked `controller: true` (a pod's ReplicaSet, a ReplicaSet's Deployment), if any."""
    return next((o for o in (obj.get("metadata") or {}).get("ownerReferences") or () if o.get("controller")), None)


def unreplaced(evictions: Sequence[int], serials: Sequence[int]) -> list[int]:
    """Of the evictions (each the store's creation serial at that moment), those no pod created later (`serials`:
    the creation serials of the pods selected now) has replaced; each pod replaces one eviction."""
    left, newer, position = [], sorted(serials), 0
    for mark in sorted(evictions):
        while position < len(newer) and newer[position] <= mark:
            position += 1
        if position < len(newer):
            position += 1
        else:
            left.append(mark)
    return left


def budget_ignored(pod: Mapping[str, Any]) -> bool:
    """Pods the API server evicts without consulting a budget: already being deleted, finished, or not started."""
    phase = (pod.get("status") or {}).get("phase")
    return bool((pod.get("metadata") or {}).get("deletionTimestamp")) or phase in _FINISHED or phase == "Pending"


# ---------------------------------------------------------------------------------------------- the calls
def evict(cluster: Any, namespace: str, name: str) -> str | None:
    """Evict `namespace/name` through `policy/v1` Evictions. None: evicted, or already gone; otherwise the API
    server's reason for "not now" (429: a PodDisruptionBudget allows no more disruptions at this moment), and the
    pod is untouched. Any other refusal is raised as one KubegpuError line naming the pod.

    `cluster`: anything holding a lightkube `client` (a `LightkubeCluster`), the in-memory store (which answers
    evictions as the API server does), or an informer cache in front of either."""
    server = _server(cluster)
    client = getattr(server, "client", None)
    if client is not None:
        return _evict_with_client(client, namespace, name)
    store_evict: Callable[[str, str], None] | None = getattr(server, "evict", None)
    if store_evict is not None:
        try:
            store_evict(namespace, name)
        except NotFound:
            return None
        except ApiError as exc:
            if exc.code == TOO_MANY_REQUESTS:
                return str(exc)
            raise KubegpuError(f"evict pod {namespace}/{name}: {exc}") from None
        return None
    raise KubegpuError(f"evict pod {namespace}/{name}: {type(server).__name__} has no Eviction API")


def evict_pod(cluster: Any, namespace: str, name: str) -> bool:
    """`evict` for callers that only need to know whether the pod went: False when a budget says not now."""
    return evict(cluster, namespace, name) is None


def evict_with_client(client: Any, namespace: str, name: str) -> bool:
    """The same through a lightkube client directly (a component that holds one without a `Cluster`)."""
    return _evict_with_client(client, namespace, name) is None


def delete_past_grace(cluster: Any, namespace: str, name: str) -> None:
    """Delete the pod whatever its budget says: only for a node whose NodeClaim's `terminationGracePeriod` has run
    out (Karpenter's one bypass of PodDisruptionBudgets). A pod already gone is fine."""
    with contextlib.suppress(NotFound):
        cluster.delete("Pod", name, namespace)


def _server(cluster: Any) -> Any:
    """The first of `cluster` and the stores behind it (`InformedCluster.store`) that can evict: one with an API
    client, or the in-memory store's `evict`."""
    for _ in range(8):
        if getattr(cluster, "client", None) is not None or getattr(cluster, "evict", None) is not None:
            return cluster
        behind = getattr(cluster, "store", None)
        if behind is None:
            return cluster
        cluster = behind
    return cluster


def _evict_with_client(client: Any, namespace: str, name: str) -> str | None:
    from lightkube import ApiError as LightkubeApiError
    from lightkube.models.meta_v1 import ObjectMeta
    from lightkube.resources.core_v1 import Pod

    from kubegpu.kube.lightkube_cluster import first_decode

    try:
        first_decode((Pod.Eviction, "one"), lambda: client.create(
            Pod.Eviction(metadata=ObjectMeta(name=name, namespace=namespace)), name, namespace=namespace))
    except LightkubeApiError as exc:
        if exc.status.code == TOO_MANY_REQUESTS:
            causes = [c.message for c in ((exc.status.details.causes or []) if exc.status.details else [])
                      if c.message]
            return " ".join([exc.status.message or "too many requests", *causes])
        if exc.status.code != 404:
            raise KubegpuError(f"evict pod {namespace}/{name}: {exc.status.message}") from None
    return None
