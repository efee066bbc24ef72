"""Termination, driven by the API: deleting a NodeClaim (by a controller or a user) starts it, the
`kubegpu.io/termination` finalizer holds the object until it is done.

Every NodeClaim carries the finalizer from its creation. Once it has a `deletionTimestamp`: the node is cordoned
with `kubegpu.io/disrupted:NoSchedule` and drained in Karpenter's order — non-critical non-daemon, non-critical
daemon, critical non-daemon, critical daemon pods, each group only once the one before it is gone. Every pod goes
through the Eviction API (`kubegpu.kube.eviction`): the API server checks its PodDisruptionBudget and spends the
disruption in one step, so any number of claims drain at once and together never take more than a budget allows.
A 429 (the budget allows no more now) is a wait: that pod is tried again after a backoff of its own (0.5 s doubling
to 5 s), never counted as a failure and never deleted instead. A pod annotated `karpenter.sh/do-not-disrupt` or
`kubegpu.io/do-not-disrupt` is not evicted at all. Once the NodeClaim's `terminationGracePeriod` (counted from the
deletionTimestamp) has run out, what is left is deleted: the only way past a budget, as in Karpenter. Then the
instance is deleted through the cloud provider until the provider confirms it is gone, the Node is deleted and its
finalizer removed, and last the NodeClaim's finalizer. Why a claim is terminated is the annotation
`kubegpu.io/termination-reason`. Nothing of this lives in memory but backoffs, so any replica that becomes leader
finishes what the previous one left.

The Node is the claim's `status.nodeName`, else the Node whose `spec.providerID` is the instance's, else the one
labelled `kubegpu.io/nodeclaim` with the claim's name: a claim deleted before its registration was recorded still
has its Node drained and deleted. A claim with no providerID may still have an instance (the process that launched
it died before recording it): the provider is asked to find one by what the launch marked it with (`find`), and one
it finds is recorded on the claim, then terminated like any other.

Taints and finalizers are shared lists (the node lifecycle controller taints nodes too, a user may hold a NodeClaim
with a finalizer of their own): they are written with `kubegpu.kube.patching.update_lists`, which adds or removes
only kubegpu's entries from a fresh read under a resourceVersion precondition.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from kubegpu.autoscaler import labels as L
from kubegpu.autoscaler.api import parse_duration
from kubegpu.autoscaler.fanout import each_at_once
from kubegpu.autoscaler.objects import drain_group, has_taint, is_mirror, name_of
from kubegpu.autoscaler.provider import NodeClaimNotFoundError
from kubegpu.errors import KubegpuError
from kubegpu.kube import NotFound, parse_timestamp
from kubegpu.kube.eviction import covering_pdbs, delete_past_grace, disruptions_allowed, evict
from kubegpu.kube.patching import ListEdit, taint_identity, update_lists

if TYPE_CHECKING:
    from kubegpu.autoscaler.cluster_state import ClusterState, Snapshot
    from kubegpu.autoscaler.provider import CloudProvider
    from kubegpu.clock import Clock
    from kubegpu.kube import Cluster
    from kubegpu.metrics import AutoscalerMetrics

DO_NOT_DISRUPT = ("karpenter.sh/do-not-disrupt", L.DO_NOT_DISRUPT_ANNOTATION)


def matching_pdbs(pod: Mapping[str, Any], pdbs: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    return covering_pdbs(pod, pdbs)


def eviction_blocker(pod: Mapping[str, Any], pdbs: Sequence[Mapping[str, Any]],
                     pods: Sequence[Mapping[str, Any]]) -> str | None:
    """Why the API server would refuse to evict `pod` as the snapshot stands (None when it may go): for choosing
    disruption candidates, which must be drainable at all. A drain itself never decides on this; it asks the API
    server. More than one PDB blocks, as in Karpenter and the Eviction API."""
    found = covering_pdbs(pod, pdbs)
    if not found:
        return None
    if len(found) > 1:
        return f"pod {name_of(pod)} is covered by more than one PodDisruptionBudget"
    pdb = found[0]
    status = pdb.get("status") or {}
    left = int(status["disruptionsAllowed"]) if "disruptionsAllowed" in status else disruptions_allowed(pdb, pods)
    if left <= 0:
        return f"pdb {name_of(pdb)} allows no more disruptions"
    return None


def held_by_annotation(pod: Mapping[str, Any]) -> bool:
    """`karpenter.sh/do-not-disrupt: "true"` or kubegpu's own: the pod is not evicted, only deleted past grace."""
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    return any(annotations.get(key) == "true" for key in DO_NOT_DISRUPT)


REASON_ANNOTATION = "kubegpu.io/termination-reason"
BACKOFF_BASE_S, BACKOFF_CAP_S = 1.0, 60.0
EVICTION_BACKOFF_BASE_S, EVICTION_BACKOFF_CAP_S = 0.5, 5.0
UNCOUNTED_REASONS = frozenset({"rollback", "registration_timeout", "launch_timeout", "insufficient_capacity"})
FINALIZER_GONE = ListEdit(("metadata", "finalizers"), remove=(L.TERMINATION_FINALIZER,))
FINALIZER_HELD = ListEdit(("metadata", "finalizers"), add=(L.TERMINATION_FINALIZER,))

PodKey = tuple[str, str, str]   # namespace, name, uid: a replacement pod of the same name is another pod


def pod_key(pod: Mapping[str, Any]) -> PodKey:
    meta = pod.get("metadata") or {}
    return meta.get("namespace", "default"), str(meta.get("name", "")), str(meta.get("uid", ""))


@dataclass
class NodeIndex:
    """The pass's Nodes by spec.providerID and by the `kubegpu.io/nodeclaim` label, built once on the pass's thread
    and only read by the workers."""

    by_name: Mapping[str, dict[str, Any]]
    by_provider: dict[str, dict[str, Any]] = field(default_factory=dict)
    by_claim: dict[str, dict[str, Any]] = field(default_factory=dict)

    @classmethod
    def of(cls, nodes: Mapping[str, dict[str, Any]]) -> NodeIndex:
        index = cls(nodes)
        for node in nodes.values():
            if provider_id := (node.get("spec") or {}).get("providerID"):
                index.by_provider[str(provider_id)] = node
            if claim := ((node.get("metadata") or {}).get("labels") or {}).get(L.NODECLAIM_LABEL):
                index.by_claim[str(claim)] = node
        return index

    def node_of(self, claim: Mapping[str, Any], provider_id: str) -> dict[str, Any] | None:
        """The claim's Node: by status.nodeName, else by the instance's providerID, else by the claim's label (only
        a Node of that instance, or any when the claim has no instance to compare)."""
        node = self.by_name.get((claim.get("status") or {}).get("nodeName") or "")
        if node is None and provider_id:
            node = self.by_provider.get(provider_id)
        if node is None:
            labelled = self.by_claim.get(name_of(claim))
            if labelled is not None and (not provider_id or (labelled.get("spec") or {}).get("providerID")
                                         == provider_id):
                node = labelled
        return node


@dataclass
class Pass:
    """What one claim's step did, handed back to the pass's own thread (workers share no mutable state): the
    evictions it asked for (None: the pod went; otherwise why the API server said not now), the error that failed
    it, and whether it finished."""

    refused: dict[PodKey, str | None] = field(default_factory=dict)
    error: str | None = None
    terminated: str | None = None   # the reason, once the claim is done


class Termination:
    """Finishes every NodeClaim that is being deleted (a `deletionTimestamp` and the `kubegpu.io/termination`
    finalizer), whoever deleted it: cordon, drain through the Eviction API, delete the instance through the provider,
    then the Node, and only once the provider says the instance is gone, remove the finalizers. Everything it needs
    is in the API, so a replica that becomes leader finishes what another started. A failing step is retried with
    exponential backoff (per NodeClaim, 1 s doubling to 60 s); it never finishes a claim early. A budget's 429 is
    not a failure: that pod alone waits (0.5 s doubling to 5 s)."""

    def __init__(self, cluster: Cluster, provider: CloudProvider, clock: Clock,
                 log: Callable[[str], None] | None = None, evict_pods: bool = True,
                 state: ClusterState | None = None, parallelism: int = 1) -> None:
        self.parallelism = max(1, parallelism)   # API calls in flight at a time (the command: 16), not a budget
        self.evict_pods = evict_pods   # False where deleting the instance evicts its pods (the simulator)
        self.cluster = cluster
        self.provider = provider
        self.clock = clock
        self.log = log or (lambda _line: None)
        self.state = state
        self.terminated: list[tuple[float, str, str]] = []   # (time, nodeclaim, reason)
        self._failures: dict[str, tuple[int, float]] = {}   # nodeclaim → (failed attempts, retry not before)
        self._refusals: dict[PodKey, tuple[int, float]] = {}   # pod → (429s in a row, evict again not before)
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
        try:
            update_lists(self.cluster, "NodeClaim", name, [FINALIZER_HELD],
                         also={"metadata": {"annotations": {REASON_ANNOTATION: reason}}}, seen=claim)
        except NotFound:
            return
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
        """One pass over every NodeClaim being deleted, and every Node deleted directly (its NodeClaim follows).
        Claims are stepped up to `parallelism` at a time; what each step learnt is merged here, on this thread."""
        deleting = {name_of(c): c for c in snapshot.nodeclaims
                    if (c.get("metadata") or {}).get("deletionTimestamp")
                    and L.TERMINATION_FINALIZER in ((c.get("metadata") or {}).get("finalizers") or [])}
        self._seen = deleting
        self._failures = {k: v for k, v in self._failures.items() if k in deleting}
        live_pods = {pod_key(p) for p in snapshot.pods}
        self._refusals = {k: v for k, v in self._refusals.items() if k in live_pods}
        now = self.clock.now()
        due = [(name, claim) for name, claim in deleting.items() if now >= self._failures.get(name, (0, 0.0))[1]]
        pods_on = snapshot.pods_on   # grouped once here, read-only in the workers
        index = NodeIndex.of(snapshot.nodes) if due else None   # indexed only on a pass that terminates

        def one(item: tuple[str, dict[str, Any]]) -> Pass:
            done = Pass()
            try:
                self._terminate(item[1], snapshot, pods_on, index or NodeIndex(snapshot.nodes), now, done)
            except KubegpuError as exc:
                done.error = str(exc)
            return done

        for (name, claim), done in zip(due, each_at_once(one, due, self.parallelism), strict=True):
            self._merge(name, claim, done, now)
        self._follow_deleted_nodes(snapshot, index)

    def _merge(self, name: str, claim: dict[str, Any], done: Pass, now: float) -> None:
        for key, why in done.refused.items():
            if why is None:
                self._refusals.pop(key, None)
                continue
            count = self._refusals.get(key, (0, 0.0))[0]
            self._refusals[key] = (count + 1, now + min(EVICTION_BACKOFF_CAP_S, EVICTION_BACKOFF_BASE_S * 2 ** count))
        if done.error is not None:
            attempts = self._failures.get(name, (0, 0.0))[0]
            delay = min(BACKOFF_CAP_S, BACKOFF_BASE_S * 2 ** attempts)
            self._failures[name] = (attempts + 1, now + delay)
            self.log(f"nodeclaim {name}: termination: {done.error} (attempt {attempts + 1}; retrying in {delay:.0f}s)")
        if done.terminated is not None:
            self._record(claim, done.terminated)

    def _record(self, claim: dict[str, Any], reason: str) -> None:
        name = name_of(claim)
        self.log(f"nodeclaim {name}: terminated ({reason})")
        if self.metrics is not None:
            labels = (claim.get("metadata") or {}).get("labels") or {}
            pool, zone = labels.get(L.NODEPOOL_LABEL, ""), labels.get(L.ZONE_LABEL, "")
            self.metrics.nodeclaims_terminated.labels(pool, labels.get(L.CAPACITY_TYPE_LABEL, ""), zone).inc()
            if (claim.get("status") or {}).get("nodeName"):
                self.metrics.nodes_terminated.labels(pool, zone).inc()
        self.terminated.append((self.clock.now(), name, reason))

    def _follow_deleted_nodes(self, snapshot: Snapshot, index: NodeIndex | None) -> None:
        """A Node deleted directly (kubectl delete node) takes its NodeClaim with it, as in Karpenter; a Node with
        our finalizer and no NodeClaim has nothing left to terminate and is let go."""
        deleted = [node for node in snapshot.nodes.values() if (node.get("metadata") or {}).get("deletionTimestamp")
                   and L.TERMINATION_FINALIZER in ((node.get("metadata") or {}).get("finalizers") or [])]
        if not deleted:
            return
        index = index or NodeIndex.of(snapshot.nodes)
        by_node: dict[str, dict[str, Any]] = {}
        for each in snapshot.nodeclaims:
            found = index.node_of(each, (each.get("status") or {}).get("providerID") or "")
            if found is not None:
                by_node[name_of(found)] = each
        for node in deleted:
            claim = by_node.get(name_of(node))
            try:
                if claim is None:
                    self._release_node(node)
                elif not self.is_terminating(claim):
                    self.start(claim, "node_deleted")
            except KubegpuError as exc:
                self.log(f"node {name_of(node)}: termination: {exc}")

    def _terminate(self, claim: dict[str, Any], snapshot: Snapshot, pods_on: Mapping[str, list[dict[str, Any]]],
                   index: NodeIndex, now: float, done: Pass) -> None:
        name = name_of(claim)
        provider_id = (claim.get("status") or {}).get("providerID") or ""
        if not provider_id and not self._launching(name):
            provider_id = self._find_instance(claim)
        node = index.node_of(claim, provider_id)
        node_name = name_of(node) if node is not None else ""
        if node is not None and not has_taint(node, L.DISRUPTED_TAINT) \
                and not (node.get("metadata") or {}).get("deletionTimestamp"):
            taint_node(self.cluster, node_name, True)
        if node is not None and not self._drain(claim, pods_on.get(node_name, []), snapshot, now, done):
            return
        if not self._instance_gone(claim, provider_id):
            return
        if node is not None:
            with contextlib.suppress(NotFound):
                if not (node.get("metadata") or {}).get("deletionTimestamp"):
                    self.cluster.delete("Node", node_name)
            self._release_node(node)
        with contextlib.suppress(NotFound):
            update_lists(self.cluster, "NodeClaim", name, [FINALIZER_GONE], seen=claim)
        done.terminated = ((claim.get("metadata") or {}).get("annotations") or {}).get(REASON_ANNOTATION, "deleted")

    def _release_node(self, node: dict[str, Any]) -> None:
        if L.TERMINATION_FINALIZER in ((node.get("metadata") or {}).get("finalizers") or []):
            with contextlib.suppress(NotFound):
                update_lists(self.cluster, "Node", name_of(node), [FINALIZER_GONE], seen=node)

    def _launching(self, name: str) -> bool:
        return self.state is not None and name in self.state.launching

    def _find_instance(self, claim: dict[str, Any]) -> str:
        """The providerID of an instance launched for a claim that recorded none (its launcher died in between),
        recorded on the claim before it is acted on; "" when the provider has none."""
        provider_id = self.provider.find(claim) or ""
        if provider_id:
            self.log(f"nodeclaim {name_of(claim)}: found instance {provider_id}, launched but never recorded")
            self.cluster.patch("NodeClaim", name_of(claim), {"status": {"providerID": provider_id}},
                               subresource="status")
        return provider_id

    def _instance_gone(self, claim: dict[str, Any], provider_id: str) -> bool:
        """Ask the provider to delete the instance; True only once it confirms the instance is gone."""
        if self._launching(name_of(claim)):
            return False  # a launch is under way in another stage: its instance must not be missed
        if not provider_id:
            return True   # never launched: the provider has no instance for it
        if (claim.get("status") or {}).get("providerID") != provider_id:
            claim = {**claim, "status": {**(claim.get("status") or {}), "providerID": provider_id}}
        try:
            self.provider.delete(claim)
        except NodeClaimNotFoundError:
            return True
        try:
            self.provider.get(provider_id)
        except NodeClaimNotFoundError:
            return True
        return False

    def _drain(self, claim: dict[str, Any], on_node: list[dict[str, Any]], snapshot: Snapshot, now: float,
               done: Pass) -> bool:
        """Evict the next group through the Eviction API; True once nothing is left on the node. Past the claim's
        terminationGracePeriod what is left is deleted instead."""
        if not self.evict_pods:
            return True
        pods = [p for p in on_node if not is_mirror(p)]   # a static pod goes with its kubelet
        if not pods:
            return True
        spec = claim.get("spec") or {}
        grace = parse_duration(spec["terminationGracePeriod"]) if spec.get("terminationGracePeriod") else None
        since = parse_timestamp((claim.get("metadata") or {}).get("deletionTimestamp")) or now
        if grace is not None and now >= since + grace:
            for pod in pods:
                if not (pod.get("metadata") or {}).get("deletionTimestamp"):
                    namespace, pod_name, _ = pod_key(pod)
                    self.log(f"nodeclaim {name_of(claim)}: terminationGracePeriod over: deleting pod "
                             f"{namespace}/{pod_name}")
                    delete_past_grace(self.cluster, namespace, pod_name)
            return False
        group = min(drain_group(p) for p in pods)
        for pod in pods:
            if drain_group(pod) != group or (pod.get("metadata") or {}).get("deletionTimestamp"):
                continue   # a later group, or already on its way out: wait for it
            key = pod_key(pod)
            if now < self._refusals.get(key, (0, 0.0))[1]:
                continue   # refused a moment ago: its own backoff
            namespace, pod_name, _ = key
            if held_by_annotation(pod):
                why: str | None = "annotated do-not-disrupt"
            else:
                why = evict(self.cluster, namespace, pod_name)
            done.refused[key] = why
            if why is not None:
                pdbs = "".join(f"pdb {name_of(p)}: " for p in covering_pdbs(pod, snapshot.pdbs))
                self.log(f"nodeclaim {name_of(claim)}: drain waits: pod {namespace}/{pod_name}: {pdbs}{why}")
        return False


def taint_node(cluster: Cluster, node_name: str, disrupted: bool) -> None:
    """Add or remove the `kubegpu.io/disrupted:NoSchedule` taint (cordon for disruption): only that entry of the
    Node's taints, from a fresh read under a resourceVersion precondition, so a taint another controller added in
    the meantime stays. A Node that is gone needs no taint."""
    edit = ListEdit(("spec", "taints"), add=(L.DISRUPTED_TAINT,) if disrupted else (),
                    remove=() if disrupted else (L.DISRUPTED_TAINT,), identity=taint_identity)
    with contextlib.suppress(NotFound):
        update_lists(cluster, "Node", node_name, [edit])
