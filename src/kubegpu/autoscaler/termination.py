"""Termination: cordon with `kubegpu.io/disrupted:NoSchedule`, drain in Karpenter's order, then delete.

Pods leave in four groups — non-critical non-daemon, non-critical daemon, critical non-daemon, critical daemon —
each group only once the one before it is gone. An eviction that a PodDisruptionBudget forbids waits for a later
pass, unless the NodeClaim's `terminationGracePeriod` has run out. Once the node is empty the instance is deleted
through the cloud provider, the node's finalizer removed and the NodeClaim deleted.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kubegpu.autoscaler import labels as L
from kubegpu.autoscaler.api import parse_duration
from kubegpu.autoscaler.provider import NodeClaimNotFoundError
from kubegpu.autoscaler.state import drain_group, name_of
from kubegpu.errors import KubegpuError
from kubegpu.kube.selectors import selects
from kubegpu.scheduling import is_finished

if TYPE_CHECKING:
    from kubegpu.autoscaler.provider import CloudProvider
    from kubegpu.clock import Clock
    from kubegpu.kube import Cluster
    from kubegpu.metrics import AutoscalerMetrics


def matching_pdbs(pod: Mapping[str, Any], pdbs: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    meta = pod.get("metadata") or {}
    namespace, labels = meta.get("namespace", "default"), meta.get("labels") or {}
    return [p for p in pdbs if (p.get("metadata") or {}).get("namespace", "default") == namespace
            and selects((p.get("spec") or {}).get("selector"), labels, f"pdb {name_of(p)}: spec.selector")]


def _scaled(value: Any, total: int) -> int:
    if isinstance(value, str) and value.endswith("%"):
        return math.ceil(total * int(value[:-1]) / 100)
    return int(value)


def disruptions_allowed(pdb: Mapping[str, Any], pods: Sequence[Mapping[str, Any]]) -> int:
    """status.disruptionsAllowed when the PDB controller has set it; otherwise computed from the selected pods."""
    status = pdb.get("status") or {}
    if "disruptionsAllowed" in status:
        return int(status["disruptionsAllowed"])
    spec = pdb.get("spec") or {}
    selected = [p for p in pods if not is_finished(p) and not (p.get("metadata") or {}).get("deletionTimestamp")
                and matching_pdbs(p, [pdb])]
    healthy = sum(1 for p in selected if (p.get("status") or {}).get("phase") == "Running" or
                  (p.get("spec") or {}).get("nodeName"))
    if "minAvailable" in spec:
        return healthy - _scaled(spec["minAvailable"], len(selected))
    if "maxUnavailable" in spec:
        return _scaled(spec["maxUnavailable"], len(selected)) - (len(selected) - healthy)
    return healthy


def eviction_blocker(pod: Mapping[str, Any], pdbs: Sequence[Mapping[str, Any]],
                     pods: Sequence[Mapping[str, Any]], spent: Mapping[str, int] | None = None) -> str | None:
    """Why evicting `pod` now would violate a PDB (None when it may go). More than one PDB blocks, as in Karpenter."""
    found = matching_pdbs(pod, pdbs)
    if not found:
        return None
    if len(found) > 1:
        return f"pod {name_of(pod)} is covered by more than one PodDisruptionBudget"
    pdb = found[0]
    left = disruptions_allowed(pdb, pods) - (spent or {}).get(name_of(pdb), 0)
    if left <= 0:
        return f"pdb {name_of(pdb)} allows no more disruptions"
    return None


@dataclass
class _Terminating:
    claim: str
    reason: str
    since: float


class Termination:
    def __init__(self, cluster: Cluster, provider: CloudProvider, clock: Clock,
                 log: Callable[[str], None] | None = None, evict_pods: bool = True) -> None:
        self.evict_pods = evict_pods   # False where deleting the instance evicts its pods (the simulator)
        self.cluster = cluster
        self.provider = provider
        self.clock = clock
        self.log = log or (lambda _line: None)
        self.terminating: dict[str, _Terminating] = {}
        self.terminated: list[tuple[float, str, str]] = []   # (time, nodeclaim, reason)
        self._finished: set[str] = set()
        self.metrics: AutoscalerMetrics | None = None

    def is_terminating(self, claim_name: str) -> bool:
        """Being drained, or already finished (a snapshot read before the deletion may still list it)."""
        return claim_name in self.terminating or claim_name in self._finished

    def start(self, claim: dict[str, Any], reason: str) -> None:
        name = name_of(claim)
        if name in self.terminating:
            return
        self.log(f"nodeclaim {name}: terminating ({reason})")
        self.terminating[name] = _Terminating(name, reason, self.clock.now())
        if self.metrics is not None and reason not in ("rollback", "registration_timeout", "launch_timeout"):
            labels = (claim.get("metadata") or {}).get("labels") or {}
            self.metrics.nodeclaims_disrupted.labels(reason, labels.get(L.NODEPOOL_LABEL, ""),
                                                     labels.get(L.CAPACITY_TYPE_LABEL, "")).inc()
            self.metrics.decisions.labels(reason).inc()
        node_name = (claim.get("status") or {}).get("nodeName")
        if node_name:
            taint_node(self.cluster, node_name, True)

    def reconcile(self, claims: Mapping[str, dict[str, Any]], pods: list[dict[str, Any]],
                  pdbs: list[dict[str, Any]]) -> None:
        self._finished &= set(claims)   # forget deletions the cluster has caught up with
        for name, entry in list(self.terminating.items()):
            claim = claims.get(name)
            if claim is None:
                del self.terminating[name]
                continue
            try:
                if self._drain(claim, entry, pods, pdbs):
                    self._finish(claim, entry)
            except KubegpuError as exc:
                self.log(f"nodeclaim {name}: termination: {exc}")

    def _drain(self, claim: dict[str, Any], entry: _Terminating, pods: list[dict[str, Any]],
               pdbs: list[dict[str, Any]]) -> bool:
        """Evict the next group; True once nothing is left on the node."""
        node_name = (claim.get("status") or {}).get("nodeName")
        if not self.evict_pods:
            return True
        on_node = [p for p in pods if node_name and (p.get("spec") or {}).get("nodeName") == node_name
                   and not is_finished(p)]
        if not on_node:
            return True
        grace = parse_duration((claim.get("spec") or {}).get("terminationGracePeriod") or "Never") \
            if (claim.get("spec") or {}).get("terminationGracePeriod") else None
        forced = grace is not None and self.clock.now() >= entry.since + grace
        group = min(drain_group(p) for p in on_node)
        spent: dict[str, int] = {}
        for pod in sorted((p for p in on_node if drain_group(p) == group), key=name_of):
            why = None if forced else eviction_blocker(pod, pdbs, pods, spent)
            if why:
                self.log(f"nodeclaim {name_of(claim)}: drain waits: {why}")
                continue
            for pdb in matching_pdbs(pod, pdbs):
                spent[name_of(pdb)] = spent.get(name_of(pdb), 0) + 1
            meta = pod.get("metadata") or {}
            self.cluster.delete("Pod", name_of(pod), meta.get("namespace", "default"))
            pods.remove(pod)
        return False

    def _finish(self, claim: dict[str, Any], entry: _Terminating) -> None:
        with contextlib.suppress(NodeClaimNotFoundError):
            self.provider.delete(claim)
        with contextlib.suppress(KubegpuError):
            self.cluster.delete("NodeClaim", name_of(claim))
        del self.terminating[entry.claim]
        self._finished.add(entry.claim)
        if self.metrics is not None:
            labels = (claim.get("metadata") or {}).get("labels") or {}
            pool, zone = labels.get(L.NODEPOOL_LABEL, ""), labels.get(L.ZONE_LABEL, "")
            self.metrics.nodeclaims_terminated.labels(pool, labels.get(L.CAPACITY_TYPE_LABEL, ""), zone).inc()
            if (claim.get("status") or {}).get("nodeName"):
                self.metrics.nodes_terminated.labels(pool, zone).inc()
        self.terminated.append((self.clock.now(), entry.claim, entry.reason))


def taint_node(cluster: Cluster, node_name: str, disrupted: bool) -> None:
    """Add or remove the `kubegpu.io/disrupted:NoSchedule` taint (cordon for disruption)."""
    try:
        node = cluster.get("Node", node_name)
    except KubegpuError:
        return
    taints = [t for t in (node.get("spec") or {}).get("taints") or []
              if t.get("key") != L.DISRUPTED_TAINT["key"]]
    if disrupted:
        taints.append(dict(L.DISRUPTED_TAINT))
    cluster.patch("Node", node_name, {"spec": {"taints": taints}})
