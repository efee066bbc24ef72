"""Termination, driven by the API: deleting a NodeClaim (by a controller or a user) starts it, the
`kubegpu.io/termination` finalizer holds the object until it is done.

Every NodeClaim carries the finalizer from its creation. Once it has a `deletionTimestamp`: the node is cordoned
with `kubegpu.io/disrupted:NoSchedule` and drained in Karpenter's order — non-critical non-daemon, non-critical
daemon, critical non-daemon, critical daemon pods, each group only once the one before it is gone; an eviction a
PodDisruptionBudget forbids waits for a later pass unless the NodeClaim's `terminationGracePeriod` (counted from the
deletionTimestamp) has run out. Then the instance is deleted through the cloud provider until the provider confirms
it is gone, the Node is deleted and its finalizer removed, and last the NodeClaim's finalizer. Why a claim is
terminated is the annotation `kubegpu.io/termination-reason`. Nothing of this lives in memory, so any replica that
becomes leader finishes what the previous one left.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from kubegpu.autoscaler import labels as L
from kubegpu.autoscaler.api import parse_duration
from kubegpu.autoscaler.fanout import each_at_once
from kubegpu.autoscaler.objects import drain_group, has_taint, name_of
from kubegpu.autoscaler.provider import NodeClaimNotFoundError
from kubegpu.errors import KubegpuError
from kubegpu.kube import NotFound, parse_timestamp
from kubegpu.kube.selectors import selects
from kubegpu.scheduling import is_finished

if TYPE_CHECKING:
    from kubegpu.autoscaler.cluster_state import ClusterState, Snapshot
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


REASON_ANNOTATION = "kubegpu.io/termination-reason"
BACKOFF_BASE_S, BACKOFF_CAP_S = 1.0, 60.0
UNCOUNTED_REASONS = frozenset({"rollback", "registration_timeout", "launch_timeout", "insufficient_capacity"})


def _without(finalizers: Sequence[str] | None, finalizer: str) -> list[str] | None:
    rest = [f for f in finalizers or [] if f != finalizer]
    return rest or None


class Termination:
    """Finishes every NodeClaim that is being deleted (a `deletionTimestamp` and the `kubegpu.io/termination`
    finalizer), whoever deleted it: cordon, drain, delete the instance through the provider, then the Node, and
    only once the provider says the instance is gone, remove the finalizers. Everything it needs is in the API, so a
    replica that becomes leader finishes what another started. A failing step is retried with exponential backoff
    (per NodeClaim, 1 s doubling to 60 s); it never finishes a claim early."""

    def __init__(self, cluster: Cluster, provider: CloudProvider, clock: Clock,
                 log: Callable[[str], None] | None = None, evict_pods: bool = True,
                 state: ClusterState | None = None, parallelism: int = 1) -> None:
        self.parallelism = max(1, parallelism)   # claims terminated at a time (the command: 16)
        self.evict_pods = evict_pods   # False where deleting the instance evicts its pods (the simulator)
        self.cluster = cluster
        self.provider = provider
        self.clock = clock
        self.log = log or (lambda _line: None)
        self.state = state
        self.terminated: list[tuple[float, str, str]] = []   # (time, nodeclaim, reason)
        self._failures: dict[str, tuple[int, float]] = {}   # nodeclaim → (failed attempts, retry not before)
        self._seen: dict[str, dict[str, Any]] = {}           # the last read of each NodeClaim being deleted
        self.metrics: AutoscalerMetrics | None = None

    def is_terminating(self, claim: str | Mapping[str, Any]) -> bool:
        """Deleted in the API (a deletionTimestamp), or its deletion requested by this replica."""
        name = claim if isinstance(claim, str) else name_of(claim)
        if name in self._seen:
            return True
        if self.state is not None and self.state.is_deleting({"metadata": {"name": name}}):
            return True
        return not isinstance(claim, str) and bool((claim.get("metadata") or {}).get("deletionTimestamp"))

    def start(self, claim: dict[str, Any], reason: str) -> None:
        """Record why, cordon the node and delete the NodeClaim through the API; `reconcile` does the rest."""
        name = name_of(claim)
        if self.is_terminating(claim):
            return
        self.log(f"nodeclaim {name}: terminating ({reason})")
        meta = claim.get("metadata") or {}
        finalizers = sorted({*(meta.get("finalizers") or []), L.TERMINATION_FINALIZER})
        self.cluster.patch("NodeClaim", name, {"metadata": {"annotations": {REASON_ANNOTATION: reason},
                                                            "finalizers": finalizers}})
        node_name = (claim.get("status") or {}).get("nodeName")
        if node_name:
            taint_node(self.cluster, node_name, True)
        try:
            self.cluster.delete("NodeClaim", name)
        except NotFound:
            return
        if self.state is not None:
            self.state.mark_for_deletion(name)
        if self.metrics is not None and reason not in UNCOUNTED_REASONS:
            labels = meta.get("labels") or {}
            self.metrics.nodeclaims_disrupted.labels(reason, labels.get(L.NODEPOOL_LABEL, ""),
                                                     labels.get(L.CAPACITY_TYPE_LABEL, "")).inc()
            self.metrics.decisions.labels(reason).inc()

    def reconcile(self, snapshot: Snapshot) -> None:
        """One pass over every NodeClaim being deleted, and every Node deleted directly (its NodeClaim follows)."""
        deleting = {name_of(c): c for c in snapshot.nodeclaims
                    if (c.get("metadata") or {}).get("deletionTimestamp")
                    and L.TERMINATION_FINALIZER in ((c.get("metadata") or {}).get("finalizers") or [])}
        self._seen = deleting
        self._failures = {k: v for k, v in self._failures.items() if k in deleting}
        now = self.clock.now()
        due = [(name, claim) for name, claim in deleting.items() if now >= self._failures.get(name, (0, 0.0))[1]]

        def one(item: tuple[str, dict[str, Any]]) -> None:
            name, claim = item
            try:
                self._terminate(claim, snapshot)
            except KubegpuError as exc:
                attempts = self._failures.get(name, (0, 0.0))[0]
                delay = min(BACKOFF_CAP_S, BACKOFF_BASE_S * 2 ** attempts)
                self._failures[name] = (attempts + 1, now + delay)
                self.log(f"nodeclaim {name}: termination: {exc} (attempt {attempts + 1}; retrying in {delay:.0f}s)")

        each_at_once(one, due, self.parallelism)   # a burst's unused claims go together, each on its own
        self._follow_deleted_nodes(snapshot)

    def _follow_deleted_nodes(self, snapshot: Snapshot) -> None:
        """A Node deleted directly (kubectl delete node) takes its NodeClaim with it, as in Karpenter; a Node with
        our finalizer and no NodeClaim has nothing left to terminate and is let go."""
        by_node = {(c.get("status") or {}).get("nodeName"): c for c in snapshot.nodeclaims}
        for node in snapshot.nodes.values():
            meta = node.get("metadata") or {}
            if not meta.get("deletionTimestamp") or L.TERMINATION_FINALIZER not in (meta.get("finalizers") or []):
                continue
            claim = by_node.get(name_of(node))
            try:
                if claim is None:
                    self._release_node(node)
                elif not self.is_terminating(claim):
                    self.start(claim, "node_deleted")
            except KubegpuError as exc:
                self.log(f"node {name_of(node)}: termination: {exc}")

    def _terminate(self, claim: dict[str, Any], snapshot: Snapshot) -> None:
        name = name_of(claim)
        node_name = (claim.get("status") or {}).get("nodeName") or ""
        node = snapshot.nodes.get(node_name) if node_name else None
        if node is not None and not has_taint(node, L.DISRUPTED_TAINT) \
                and not (node.get("metadata") or {}).get("deletionTimestamp"):
            taint_node(self.cluster, node_name, True)
        if node is not None and not self._drain(claim, node_name, snapshot):
            return
        if not self._instance_gone(claim):
            return
        if node is not None:
            with contextlib.suppress(NotFound):
                if not (node.get("metadata") or {}).get("deletionTimestamp"):
                    self.cluster.delete("Node", node_name)
            self._release_node(node)
        finalizers = _without((claim.get("metadata") or {}).get("finalizers"), L.TERMINATION_FINALIZER)
        with contextlib.suppress(NotFound):
            self.cluster.patch("NodeClaim", name, {"metadata": {"finalizers": finalizers}})
        reason = ((claim.get("metadata") or {}).get("annotations") or {}).get(REASON_ANNOTATION, "deleted")
        self.log(f"nodeclaim {name}: terminated ({reason})")
        if self.metrics is not None:
            labels = (claim.get("metadata") or {}).get("labels") or {}
            pool, zone = labels.get(L.NODEPOOL_LABEL, ""), labels.get(L.ZONE_LABEL, "")
            self.metrics.nodeclaims_terminated.labels(pool, labels.get(L.CAPACITY_TYPE_LABEL, ""), zone).inc()
            if node_name:
                self.metrics.nodes_terminated.labels(pool, zone).inc()
        self.terminated.append((self.clock.now(), name, reason))

    def _release_node(self, node: dict[str, Any]) -> None:
        meta = node.get("metadata") or {}
        if L.TERMINATION_FINALIZER in (meta.get("finalizers") or []):
            with contextlib.suppress(NotFound):
                self.cluster.patch("Node", name_of(node), {"metadata": {
                    "finalizers": _without(meta.get("finalizers"), L.TERMINATION_FINALIZER)}})

    def _instance_gone(self, claim: dict[str, Any]) -> bool:
        """Ask the provider to delete the instance; True only once it confirms the instance is gone."""
        if self.state is not None and name_of(claim) in self.state.launching:
            return False  # a launch is under way in another stage: its instance must not be missed
        provider_id = (claim.get("status") or {}).get("providerID")
        if not provider_id:
            return True   # never launched
        try:
            self.provider.delete(claim)
        except NodeClaimNotFoundError:
            return True
        try:
            self.provider.get(provider_id)
        except NodeClaimNotFoundError:
            return True
        return False

    def _drain(self, claim: dict[str, Any], node_name: str, snapshot: Snapshot) -> bool:
        """Evict the next group; True once nothing is left on the node."""
        if not self.evict_pods:
            return True
        pods = snapshot.pods
        on_node = [p for p in pods if (p.get("spec") or {}).get("nodeName") == node_name and not is_finished(p)]
        if not on_node:
            return True
        spec = claim.get("spec") or {}
        grace = parse_duration(spec["terminationGracePeriod"]) if spec.get("terminationGracePeriod") else None
        since = parse_timestamp((claim.get("metadata") or {}).get("deletionTimestamp")) or self.clock.now()
        forced = grace is not None and self.clock.now() >= since + grace
        group = min(drain_group(p) for p in on_node)
        spent: dict[str, int] = {}
        for pod in sorted((p for p in on_node if drain_group(p) == group), key=name_of):
            meta = pod.get("metadata") or {}
            if meta.get("deletionTimestamp"):
                continue  # already on its way out: wait for it
            why = None if forced else eviction_blocker(pod, snapshot.pdbs, pods, spent)
            if why:
                self.log(f"nodeclaim {name_of(claim)}: drain waits: {why}")
                continue
            for pdb in matching_pdbs(pod, snapshot.pdbs):
                spent[name_of(pdb)] = spent.get(name_of(pdb), 0) + 1
            with contextlib.suppress(NotFound):
                self.cluster.delete("Pod", name_of(pod), meta.get("namespace", "default"))
            pods.remove(pod)
        return False


def taint_node(cluster: Cluster, node_name: str, disrupted: bool) -> None:
    """Add or remove the `kubegpu.io/disrupted:NoSchedule` taint (cordon for disruption)."""
    try:
        node = cluster.get("Node", node_name)
    except KubegpuError:
        return
    current = (node.get("spec") or {}).get("taints") or []
    taints = [t for t in current if t.get("key") != L.DISRUPTED_TAINT["key"]]
    if has_taint(node, L.DISRUPTED_TAINT) == disrupted and len(current) - len(taints) == int(disrupted):
        return   # already as asked (a surplus claim's node is cordoned before its termination starts)
    if disrupted:
        taints.append(dict(L.DISRUPTED_TAINT))
    cluster.patch("Node", node_name, {"spec": {"taints": taints}})
