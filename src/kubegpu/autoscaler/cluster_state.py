"""The autoscaler's cluster state, as Karpenter's `state.Cluster`: the objects a pass reads, from informers, plus
what this replica decided that the API does not show yet.

Every kind a pass reads (NodePools, NodeClaims, Nodes, Pods, DaemonSets, PodDisruptionBudgets, and what the provider
adds, e.g. EC2NodeClasses) comes from one `kubegpu.kube.informer.InformedCluster`: listed once, then kept current
by watches, so an idle autoscaler sends the API server no LIST at all. A `Snapshot` is one consistent
read of that memory.

What lives here rather than in the API is only what is safe to lose on a leader change:
- **nominations**: pending pods the last provisioning pass meant for a node or an in-flight NodeClaim (they keep
  disruption away from capacity about to be used; a new leader re-plans within a batch window);
- **in-flight launches**: NodeClaims created or being launched by this replica whose result the informer has not
  delivered yet, so a pass does not launch or count them twice;
- **marked for deletion**: NodeClaims whose deletion this replica requested but whose `deletionTimestamp` the
  informer has not shown yet. Termination itself is driven by that `deletionTimestamp` and the
  `kubegpu.io/termination` finalizer, which any replica that becomes leader finds in the API.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from kubegpu.autoscaler.api import NodePool, parse_nodepool
from kubegpu.autoscaler.objects import name_of, pods_by_node
from kubegpu.errors import KubegpuError
from kubegpu.kube import NotFound
from kubegpu.kube.informer import InformedCluster

if TYPE_CHECKING:
    from kubegpu.clock import Clock
    from kubegpu.kube import Cluster

AUTOSCALER_KINDS = ("NodePool", "NodeClaim", "Node", "Pod", "DaemonSet", "PodDisruptionBudget")


@dataclass
class Snapshot:
    """What one pass reads from the cluster: the informers' objects themselves, not copies, so nothing that reads a
    snapshot may modify an object in it (build a new dict, or patch through the cluster); the lists are the
    snapshot's own."""

    pools: list[NodePool]
    pool_errors: dict[str, str]
    nodeclaims: list[dict[str, Any]]
    nodes: dict[str, dict[str, Any]]
    pods: list[dict[str, Any]]
    daemonsets: list[dict[str, Any]]
    pdbs: list[dict[str, Any]] = field(default_factory=list)
    _pods_on: tuple[int, dict[str, list[dict[str, Any]]]] | None = field(default=None, repr=False, compare=False)

    @property
    def pods_on(self) -> dict[str, list[dict[str, Any]]]:
        """Pods by node name, grouped once per snapshot (again only if a drain took pods out of `pods`)."""
        cached = self._pods_on
        if cached is None or cached[0] != len(self.pods):
            cached = self._pods_on = (len(self.pods), pods_by_node(self.pods))
        return cached[1]


def _list(cluster: Cluster, kind: str) -> list[dict[str, Any]]:
    """A kind the API server does not serve (no PDBs, CRDs not installed yet) reads as empty; any other failure
    (403 from missing RBAC, a broken connection) is raised, so a pass never acts on a silently partial view.
    From informers, the cached objects themselves (see `Snapshot`)."""
    try:
        if isinstance(cluster, InformedCluster):
            return cluster.list_shared(kind)
        return cluster.list(kind)
    except NotFound:
        return []


PoolMemo = dict[str, tuple[str, "NodePool | str"]]


def _parse_pools(raws: list[dict[str, Any]], memo: PoolMemo | None) -> tuple[list[NodePool], dict[str, str]]:
    """NodePools parsed (validated) once per resourceVersion when a memo is kept; errors by pool name."""
    pools: list[NodePool] = []
    errors: dict[str, str] = {}
    seen: PoolMemo = {}
    for raw in raws:
        meta = raw.get("metadata") or {}
        if meta.get("deletionTimestamp"):
            continue
        name, version = name_of(raw), str(meta.get("resourceVersion") or "")
        hit = memo.get(name) if memo is not None and version else None
        parsed: NodePool | str
        if hit is not None and hit[0] == version:
            parsed = hit[1]
        else:
            try:
                parsed = parse_nodepool(raw)
            except KubegpuError as exc:
                parsed = str(exc)
        if version:
            seen[name] = (version, parsed)
        if isinstance(parsed, str):
            errors[name] = parsed
        else:
            pools.append(parsed)
    if memo is not None:
        memo.clear()
        memo.update(seen)
    return pools, errors


def take_snapshot(cluster: Cluster, pool_memo: PoolMemo | None = None) -> Snapshot:
    pools, errors = _parse_pools(_list(cluster, "NodePool"), pool_memo)
    return Snapshot(
        pools=pools,
        pool_errors=errors,
        nodeclaims=_list(cluster, "NodeClaim"),
        nodes={name_of(n): n for n in _list(cluster, "Node")},
        pods=_list(cluster, "Pod"),
        daemonsets=_list(cluster, "DaemonSet"),
        pdbs=_list(cluster, "PodDisruptionBudget"),
    )


def informed(cluster: Cluster, extra_kinds: Iterable[str] = ()) -> InformedCluster:
    """`cluster` behind informers for every kind the autoscaler reads (itself when it already is one)."""
    if isinstance(cluster, InformedCluster):
        return cluster
    return InformedCluster(cluster, (*AUTOSCALER_KINDS, *extra_kinds))


class ClusterState:
    """Informer-fed objects plus this replica's nominations, in-flight launches and deletions (module doc)."""

    def __init__(self, cluster: InformedCluster, clock: Clock, nomination_window: float) -> None:
        self.cluster = cluster
        self.clock = clock
        self.nomination_window = nomination_window
        self._lock = threading.RLock()
        self.nominated: dict[str, float] = {}        # node or NodeClaim name → when pods were last nominated to it
        self.nominations: dict[str, set[str]] = {}   # node or NodeClaim name → keys of the pods nominated to it
        self.launching: set[str] = set()             # NodeClaims whose provider launch is under way
        self.deleting: dict[str, float] = {}          # NodeClaims whose deletion was requested → when
        self._pools: PoolMemo = {}                    # NodePool name → (resourceVersion, parsed pool or error)

    def snapshot(self) -> Snapshot:
        snap = take_snapshot(self.cluster, self._pools)
        seen = {name_of(c): c for c in snap.nodeclaims}
        with self._lock:  # forget requested deletions the informer now shows (or that are gone)
            for name in list(self.deleting):
                claim = seen.get(name)
                if claim is None or (claim.get("metadata") or {}).get("deletionTimestamp"):
                    del self.deleting[name]
        return snap

    # -- nominations ---------------------------------------------------------------------------------------------
    def nominate(self, target: str, pod_keys: Iterable[str], now: float) -> None:
        with self._lock:
            self.nominated[target] = now
            self.nominations[target] = set(pod_keys)

    def reset_nominations(self) -> None:
        """A provisioning pass replaces the previous pass's nominations (their times stay for `is_nominated`)."""
        with self._lock:
            self.nominations = {}

    def is_nominated(self, *names: str) -> bool:
        """Whether pending pods were recently nominated to this node/NodeClaim (then it must not be disrupted)."""
        now = self.clock.now()
        with self._lock:
            return any(now - self.nominated.get(name, -1e18) < self.nomination_window for name in names)

    def nominations_view(self) -> Mapping[str, set[str]]:
        with self._lock:
            return {k: set(v) for k, v in self.nominations.items()}

    # -- launches and deletions ----------------------------------------------------------------------------------
    def begin_launch(self, name: str) -> bool:
        """Claim the launch of `name` for this pass; False when one is already under way."""
        with self._lock:
            if name in self.launching:
                return False
            self.launching.add(name)
            return True

    def end_launch(self, name: str) -> None:
        with self._lock:
            self.launching.discard(name)

    def mark_for_deletion(self, name: str) -> None:
        with self._lock:
            self.deleting[name] = self.clock.now()

    def is_deleting(self, claim: Mapping[str, Any]) -> bool:
        """Deleted in the API (`deletionTimestamp`), or its deletion requested by this replica."""
        if (claim.get("metadata") or {}).get("deletionTimestamp"):
            return True
        with self._lock:
            return name_of(claim) in self.deleting
