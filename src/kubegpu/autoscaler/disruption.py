"""Disruption: emptiness, drift, multi-node and single-node consolidation, under budgets, PDBs, do-not-disrupt.

Methods run in Karpenter's order — emptiness, drift, multi-node, then single-node consolidation — and only the
first that finds something acts in a pass. A decision waits `validation_delay` (15 s) and is dropped if the
candidates' pods changed meanwhile. A replacement (a strictly cheaper node for one or more candidates) is launched
first; the candidates are deleted only once it is Initialized, and it is rolled back (deleted, candidates
untainted) if that takes longer than `replacement_timeout`.

Commands are carried out by `commands.Orchestrator`, recorded in the API before they act, so a new leader finishes
or undoes whatever a previous one left (`recovery.py`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from kubegpu.autoscaler import labels as L
from kubegpu.autoscaler.api import NodePool, parse_duration, template_hash
from kubegpu.autoscaler.cluster_state import Snapshot
from kubegpu.autoscaler.commands import Command, Orchestrator
from kubegpu.autoscaler.objects import (
    condition,
    created_at,
    do_not_disrupt,
    is_reschedulable,
    is_true,
    name_of,
    parse_timestamp,
)
from kubegpu.autoscaler.requirements import Requirements
from kubegpu.autoscaler.scheduler import ClaimPlan, SchedulingResult
from kubegpu.autoscaler.termination import eviction_blocker

if TYPE_CHECKING:
    from kubegpu.autoscaler.provider import CloudProvider
    from kubegpu.autoscaler.provisioner import Provisioner
    from kubegpu.autoscaler.termination import Termination
    from kubegpu.clock import Clock
    from kubegpu.kube import Cluster
    from kubegpu.metrics import AutoscalerMetrics

MAX_MULTI_CANDIDATES = 100
KARPENTER_DO_NOT_DISRUPT = "karpenter.sh/do-not-disrupt"
DISRUPT_RUNNING_JOBS_ANNOTATION = "kubegpu.io/disrupt-running-jobs"
EMPTY, UNDERUTILIZED, DRIFTED = "Empty", "Underutilized", "Drifted"
DISRUPTION_ANNOTATION = L.DISRUPTION_ANNOTATION


@dataclass
class Candidate:
    claim: dict[str, Any]
    node: dict[str, Any]
    pool: NodePool
    pods: list[dict[str, Any]]
    price: float
    cost: float
    consolidatable: bool = True
    drifted: str = ""

    @property
    def name(self) -> str:
        return name_of(self.claim)


def not_safe_to_move(pod: dict[str, Any], pool: NodePool) -> str | None:
    """Why voluntary disruption must leave the pod's node alone, or None (GPU-aware: training is not restartable
    for free). A running pod owned by a Job, or one carrying Karpenter's `karpenter.sh/do-not-disrupt`, blocks
    consolidation and drift of its node unless the NodePool opts in with the annotation
    `kubegpu.io/disrupt-running-jobs: "true"` (Karpenter would evict a Job's pod and let it restart)."""
    meta = pod.get("metadata") or {}
    if ((meta.get("annotations") or {}).get(KARPENTER_DO_NOT_DISRUPT)) == "true":
        return f"pod {meta.get('name')} has {KARPENTER_DO_NOT_DISRUPT}"
    pool_annotations = (pool.metadata.model_extra or {}).get("annotations") or {}
    if pool_annotations.get(DISRUPT_RUNNING_JOBS_ANNOTATION) == "true":
        return None
    running = (pod.get("status") or {}).get("phase") in ("Running", None) and (pod.get("spec") or {}).get("nodeName")
    if running and any(ref.get("kind") == "Job" for ref in meta.get("ownerReferences") or []):
        return f"pod {meta.get('name')} is a running Job pod"
    return None


def pod_disruption_cost(pod: dict[str, Any]) -> float:
    """Karpenter's per-pod cost: 1 + deletion-cost/2^27 + priority/2^25, clamped to [-10, 10]."""
    raw = ((pod.get("metadata") or {}).get("annotations") or {}).get(L.POD_DELETION_COST_ANNOTATION, "0")
    try:
        deletion = float(raw)
    except ValueError:
        deletion = 0.0
    priority = float((pod.get("spec") or {}).get("priority") or 0)
    return max(-10.0, min(10.0, 1.0 + deletion / 2**27 + priority / 2**25))


class Disruption:
    def __init__(self, cluster: Cluster, provider: CloudProvider, provisioner: Provisioner,
                 termination: Termination, clock: Clock, validation_delay: float = 15.0,
                 replacement_timeout: float = 600.0, log: Callable[[str], None] | None = None) -> None:
        self.cluster = cluster
        self.provider = provider
        self.provisioner = provisioner
        self.termination = termination
        self.clock = clock
        self.validation_delay = validation_delay
        self.replacement_timeout = replacement_timeout
        self.log = log or (lambda _line: None)
        self.pending: Command | None = None
        self.orchestrator = Orchestrator(cluster, provisioner, termination, clock, replacement_timeout, self.log)
        self._pod_signature: dict[str, tuple[str, float]] = {}
        self._pool_memo: dict[int, tuple[NodePool, str, Requirements]] = {}
        self._pods_seen: dict[str, list[dict[str, Any]]] = {}   # node → its pods as the last pass read them
        self.metrics: AutoscalerMetrics | None = None

    # -- the pass ---------------------------------------------------------------------------------------------
    def reconcile(self, snapshot: Snapshot) -> Command | None:
        now = self.clock.now()
        self._track_pod_events(snapshot, now)
        self.orchestrator.progress(snapshot, now)
        if self.orchestrator.in_flight:
            return None
        if self.pending is not None:
            if now < self.pending.decided_at + self.validation_delay:
                return None
            waiting, self.pending = self.pending, None
            if self._still_valid(waiting, snapshot):
                self.orchestrator.execute(waiting, snapshot)
                return waiting
            self.log(f"disruption: abandoned {waiting.describe()}: pods changed during validation")
            return None
        command = self.decide(snapshot)
        if command is None:
            return None
        command.decided_at = now
        if self.validation_delay <= 0:
            self.orchestrator.execute(command, snapshot)
            return command
        self.pending = command
        return None

    def decide(self, snapshot: Snapshot) -> Command | None:
        candidates = self.candidates(snapshot)
        if not candidates:
            return None
        budgets = self.budgets(snapshot)
        consolidatable = [c for c in candidates if c.consolidatable]
        for method, among in ((self._emptiness, consolidatable), (self._drift, candidates),
                              (self._multi_node, consolidatable), (self._single_node, consolidatable)):
            command = method(among, budgets, snapshot)
            if command is not None:
                return command
        return None

    # -- candidates and budgets -------------------------------------------------------------------------------
    def _track_pod_events(self, snapshot: Snapshot, now: float) -> None:
        """lastPodEventTime: when a pod last arrived on or left the node. A node whose pods are the very objects of
        the last pass (snapshots hand out the informers' objects) has had no pod event: its names are not read."""
        on = snapshot.pods_on
        last, self._pods_seen = self._pods_seen, {}
        for node in snapshot.nodes:
            pods = on.get(node, [])
            self._pods_seen[node] = pods
            before = last.get(node)
            if before is not None and len(before) == len(pods) and all(
                    a is b for a, b in zip(before, pods, strict=True)) and node in self._pod_signature:
                continue
            signature = ",".join(sorted(name_of(p) for p in pods))
            seen = self._pod_signature.get(node)
            if seen is None or seen[0] != signature:
                self._pod_signature[node] = (signature, now if seen is not None or pods else -math.inf)

    def _consolidatable(self, claim: dict[str, Any], node_name: str, pool: NodePool) -> bool:
        after = parse_duration(pool.spec.disruption.consolidateAfter)
        if after is None:
            return False
        initialized = parse_timestamp((condition(claim, "Initialized") or {}).get("lastTransitionTime")) or 0.0
        last_event = self._pod_signature.get(node_name, ("", -math.inf))[1]
        return self.clock.now() - max(initialized, last_event) >= after

    def candidates(self, snapshot: Snapshot) -> list[Candidate]:
        pools = {p.name: p for p in snapshot.pools}
        on = snapshot.pods_on
        out: list[Candidate] = []
        for claim in snapshot.nodeclaims:
            node_name = (claim.get("status") or {}).get("nodeName") or ""
            node = snapshot.nodes.get(node_name)
            pool = pools.get(((claim.get("metadata") or {}).get("labels") or {}).get(L.NODEPOOL_LABEL, ""))
            if node is None or pool is None or not is_true(claim, "Initialized"):
                continue
            if self.termination.is_terminating(name_of(claim)) or (claim.get("metadata") or {}).get(
                    "deletionTimestamp") or self._in_command(name_of(claim)):
                continue
            if self.provisioner.is_nominated(node_name, name_of(claim)):
                continue
            if do_not_disrupt(node) or L.NODEPOOL_LABEL not in ((node.get("metadata") or {}).get("labels") or {}):
                continue
            pods = [p for p in on.get(node_name, []) if is_reschedulable(p)]
            if any(do_not_disrupt(p) for p in on.get(node_name, [])):
                continue
            if any(not_safe_to_move(p, pool) for p in on.get(node_name, [])):
                continue
            if any(eviction_blocker(p, snapshot.pdbs, snapshot.pods) for p in pods):
                continue
            price = self._price(pool, node)
            if price is None:
                continue
            lifetime = self._lifetime_remaining(claim, pool)
            cost = sum(pod_disruption_cost(p) for p in pods) * lifetime
            out.append(Candidate(claim, node, pool, pods, price, cost, self._consolidatable(claim, node_name, pool),
                                 self.drift_reason(claim, pool)))
        out.sort(key=lambda c: (c.cost, -c.price, c.name))
        return out

    def drift_reason(self, claim: dict[str, Any], pool: NodePool) -> str:
        """Why a NodeClaim no longer matches its NodePool (Karpenter's reasons), or ""."""
        annotations = (claim.get("metadata") or {}).get("annotations") or {}
        recorded = annotations.get(L.NODEPOOL_HASH_ANNOTATION)
        pool_hash, pool_reqs = self._pool_facts(pool)
        if recorded is not None and recorded != pool_hash:
            return "NodePoolDrifted"
        labels = (claim.get("metadata") or {}).get("labels") or {}
        if not pool_reqs.satisfied_by({k: v for k, v in labels.items() if pool_reqs.get(k) is not None}):
            return "RequirementsDrifted"
        return self.provider.is_drifted(claim)

    def _pool_facts(self, pool: NodePool) -> tuple[str, Requirements]:
        """The pool's template hash and requirements, derived once per parsed pool (the cluster state keeps the
        same NodePool object until the pool changes)."""
        hit = self._pool_memo.get(id(pool))
        if hit is None or hit[0] is not pool:
            reqs = Requirements.from_api([r.model_dump(exclude_none=True)
                                          for r in pool.spec.template.spec.requirements])
            if len(self._pool_memo) > 64:
                self._pool_memo.clear()
            hit = self._pool_memo[id(pool)] = (pool, template_hash(pool), reqs)
        return hit[1], hit[2]

    def _in_command(self, name: str) -> bool:
        if any(name_of(c) == name for cmd in self.orchestrator.in_flight for c in cmd.claims):
            return True
        return self.pending is not None and any(c.name == name for c in self.pending.candidates)

    def _lifetime_remaining(self, claim: dict[str, Any], pool: NodePool) -> float:
        expire = parse_duration(pool.spec.template.spec.expireAfter)
        if not expire:
            return 1.0
        age = self.clock.now() - created_at(claim)
        return max(0.0, min(1.0, 1.0 - age / expire))

    def _price(self, pool: NodePool, node: dict[str, Any]) -> float | None:
        labels = (node.get("metadata") or {}).get("labels") or {}
        name, zone = labels.get(L.INSTANCE_TYPE_LABEL), labels.get(L.ZONE_LABEL)
        ctype = labels.get(L.CAPACITY_TYPE_LABEL)
        for it in self.provider.instance_types(pool):
            if it.name == name:
                for offering in it.offerings:
                    if offering.zone == zone and offering.capacity_type == ctype:
                        return offering.price
        return None

    def budgets(self, snapshot: Snapshot) -> dict[tuple[str, str], int]:
        """Per (NodePool, reason): nodes that may still be disrupted now (min over active budgets − disrupting)."""
        now = datetime.fromtimestamp(self.clock.now(), UTC)
        totals: dict[str, int] = {}
        disrupting: dict[str, int] = {}
        for claim in snapshot.nodeclaims:
            pool = ((claim.get("metadata") or {}).get("labels") or {}).get(L.NODEPOOL_LABEL, "")
            totals[pool] = totals.get(pool, 0) + 1
            if self.termination.is_terminating(name_of(claim)) or self._in_command(name_of(claim)) or \
                    (claim.get("metadata") or {}).get("deletionTimestamp"):
                disrupting[pool] = disrupting.get(pool, 0) + 1
        out: dict[tuple[str, str], int] = {}
        for pool in snapshot.pools:
            for reason in (EMPTY, UNDERUTILIZED, "Drifted"):
                try:
                    active = [b.allowed(totals.get(pool.name, 0)) for b in pool.spec.disruption.budgets
                              if b.applies_to(reason) and b.active(now)]
                except ValueError:  # a budget that cannot be evaluated fails closed
                    active = [0]
                allowed = min(active) if active else totals.get(pool.name, 0)
                out[(pool.name, reason)] = max(0, allowed - disrupting.get(pool.name, 0))
                if self.metrics is not None:
                    self.metrics.allowed_disruptions.labels(pool.name, reason).set(out[(pool.name, reason)])
        return out

    # -- methods ------------------------------------------------------------------------------------------------
    def _within_budget(self, candidates: Sequence[Candidate], budgets: dict[tuple[str, str], int],
                       reason: str) -> list[Candidate]:
        left = dict(budgets)
        out = []
        for cand in candidates:
            key = (cand.pool.name, reason)
            if left.get(key, 0) > 0:
                left[key] -= 1
                out.append(cand)
        return out

    def _emptiness(self, candidates: list[Candidate], budgets: dict[tuple[str, str], int],
                   snapshot: Snapshot) -> Command | None:
        empty = [c for c in candidates if not c.pods]
        chosen = self._within_budget(empty, budgets, EMPTY)
        return Command(EMPTY, chosen) if chosen else None

    def _underutilized(self, candidates: list[Candidate], budgets: dict[tuple[str, str], int]) -> list[Candidate]:
        eligible = [c for c in candidates if c.pool.spec.disruption.consolidationPolicy == "WhenEmptyOrUnderutilized"]
        return self._within_budget(eligible, budgets, UNDERUTILIZED)

    def _reschedule(self, candidates: Sequence[Candidate], snapshot: Snapshot) -> SchedulingResult:
        """Where the candidates' pods would go with the candidates gone (pending pods keep their nominations)."""
        pods = []
        for cand in candidates:
            for pod in cand.pods:
                moved = {**pod, "spec": {k: v for k, v in (pod.get("spec") or {}).items() if k != "nodeName"},
                         "status": {"phase": "Pending"}}
                pods.append(moved)
        exclude = {name_of(c.node) for c in candidates}
        return self.provisioner.schedule(snapshot, pods, exclude_nodes=exclude, count_nominated=True)

    def simulate(self, candidates: Sequence[Candidate], snapshot: Snapshot) -> tuple[bool, ClaimPlan | None]:
        """Can the candidates' pods go elsewhere with at most one new node? (ok, the replacement if any)."""
        result = self._reschedule(candidates, snapshot)
        if result.unschedulable or len(result.claims) > 1:
            return False, None
        if not result.claims:
            return True, None
        plan = result.claims[0]
        total = sum(c.price for c in candidates)
        if plan.price >= total - 1e-9:
            return False, None
        if len(candidates) == 1 and plan.instance_type == ((candidates[0].node.get("metadata") or {}).get(
                "labels") or {}).get(L.INSTANCE_TYPE_LABEL):
            return False, None
        return True, plan

    def _multi_node(self, candidates: list[Candidate], budgets: dict[tuple[str, str], int],
                    snapshot: Snapshot) -> Command | None:
        eligible = self._underutilized(candidates, budgets)[:MAX_MULTI_CANDIDATES]
        if len(eligible) < 2:
            return None
        best: Command | None = None
        low, high = 2, len(eligible)
        while low <= high:
            mid = (low + high) // 2
            ok, plan = self.simulate(eligible[:mid], snapshot)
            if ok:
                best = Command(UNDERUTILIZED, eligible[:mid], [plan] if plan else [])
                low = mid + 1
            else:
                high = mid - 1
        return best

    def _single_node(self, candidates: list[Candidate], budgets: dict[tuple[str, str], int],
                     snapshot: Snapshot) -> Command | None:
        for cand in self._round_robin(self._underutilized(candidates, budgets)):
            ok, plan = self.simulate([cand], snapshot)
            if ok:
                return Command(UNDERUTILIZED, [cand], [plan] if plan else [])
        return None

    def _drift(self, candidates: list[Candidate], budgets: dict[tuple[str, str], int],
               snapshot: Snapshot) -> Command | None:
        """Drifted nodes, empty ones first then oldest: replaced by whatever their pods need, cheaper or not."""
        drifted = sorted((c for c in candidates if c.drifted),
                         key=lambda c: (bool(c.pods), created_at(c.claim), c.name))
        for cand in self._within_budget(drifted, budgets, DRIFTED):
            result = self._reschedule([cand], snapshot)
            if not result.unschedulable:
                return Command(DRIFTED, [cand], list(result.claims))
        return None

    @staticmethod
    def _round_robin(candidates: list[Candidate]) -> list[Candidate]:
        by_pool: dict[str, list[Candidate]] = {}
        for cand in candidates:
            by_pool.setdefault(cand.pool.name, []).append(cand)
        out: list[Candidate] = []
        queues = [list(v) for _, v in sorted(by_pool.items())]
        while any(queues):
            for queue in queues:
                if queue:
                    out.append(queue.pop(0))
        return out

    # -- execution ----------------------------------------------------------------------------------------------
    def _still_valid(self, command: Command, snapshot: Snapshot) -> bool:
        current = {c.name: c for c in self.candidates(snapshot)}
        for cand in command.candidates:
            now = current.get(cand.name)
            if now is None or sorted(map(name_of, now.pods)) != sorted(map(name_of, cand.pods)):
                return False
        return True
