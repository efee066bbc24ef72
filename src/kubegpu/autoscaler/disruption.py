"""Disruption: emptiness, drift, multi-node and single-node consolidation, under budgets, PDBs, do-not-disrupt.

Methods run in Karpenter's order — emptiness, drift, multi-node, then single-node consolidation — and only the
first that finds something acts in a pass. A decision waits `validation_delay` (15 s) and is dropped if the
candidates' pods changed meanwhile. A replacement (a strictly cheaper node for one or more candidates) is launched
first; the candidates are deleted only once it is Initialized, and it is rolled back (deleted, candidates
untainted) if that takes longer than `replacement_timeout`.

Record before act (`recovery.py`): a command is written onto its candidates' NodeClaims — the `kubegpu.io/disruption`
annotation names the reason, every candidate and the replacements, whose names are chosen before they are created —
before any candidate is tainted, and the replacements are created only once every candidate is tainted. Each pass
reads the commands back from the API and walks them on (`_progress`), so whatever point a leader died at, the next
one finishes or undoes the command: a deletion whose candidate was tainted goes on to termination, one whose taint
never landed is dropped; a replacement that was never created, or that does not initialize in time, is rolled back.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from kubegpu.autoscaler import labels as L
from kubegpu.autoscaler.api import NodePool, parse_duration, template_hash
from kubegpu.autoscaler.cluster_state import Snapshot
from kubegpu.autoscaler.objects import (
    condition,
    created_at,
    do_not_disrupt,
    has_taint,
    is_reschedulable,
    is_true,
    name_of,
    parse_timestamp,
)
from kubegpu.autoscaler.recovery import DISRUPTION, fresh, set_disrupted
from kubegpu.autoscaler.requirements import Requirements
from kubegpu.autoscaler.scheduler import ClaimPlan, SchedulingResult
from kubegpu.autoscaler.termination import eviction_blocker
from kubegpu.kube import NotFound

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


@dataclass
class Command:
    reason: str                       # Empty | Underutilized | Drifted
    candidates: list[Candidate]
    replacements: list[ClaimPlan] = field(default_factory=list)
    decided_at: float = 0.0
    replacement_names: list[str] = field(default_factory=list)
    launched_at: float = 0.0

    def describe(self) -> str:
        names = ", ".join(c.name for c in self.candidates)
        if not self.replacements:
            return f"delete {names} ({self.reason})"
        types = ", ".join(p.instance_type for p in self.replacements)
        price = sum(p.price for p in self.replacements)
        return f"replace {names} with {types} at {price:.4f}/h ({self.reason})"


@dataclass
class InFlight:
    """A command under way, as read back from the API: the candidates' `kubegpu.io/disruption` annotation names the
    reason, the candidates and the replacement NodeClaims, so a replica that becomes leader finishes (or rolls back)
    what another began. `claims`: the live candidates that carry the record."""

    reason: str
    claims: list[dict[str, Any]]
    replacement_names: list[str]
    launched_at: float

    def describe(self) -> str:
        names = ", ".join(name_of(c) for c in self.claims)
        if not self.replacement_names:
            return f"delete {names} ({self.reason})"
        return f"replace {names} with {', '.join(self.replacement_names)} ({self.reason})"


def replacement_name(pool: str, candidates: Sequence[str], at: float, index: int) -> str:
    """The name a replacement gets, fixed before it is created so that the record can name it first."""
    digest = hashlib.sha1(json.dumps([sorted(candidates), repr(at), index]).encode()).hexdigest()[:10]
    return f"{pool}-{digest}"


def in_flight_commands(nodeclaims: Sequence[dict[str, Any]]) -> list[InFlight]:
    """The commands under way, grouped by the annotation the candidates share."""
    groups: dict[str, InFlight] = {}
    for claim in nodeclaims:
        meta = claim.get("metadata") or {}
        raw = (meta.get("annotations") or {}).get(DISRUPTION_ANNOTATION)
        if not raw or meta.get("deletionTimestamp"):
            continue
        try:
            data = json.loads(raw)
            entry = groups.get(raw) or InFlight(str(data["reason"]), [], [str(n) for n in data["replacements"]],
                                                float(data["launchedAt"]))
        except (ValueError, KeyError, TypeError):
            continue  # not ours to read: left alone
        groups[raw] = entry
        entry.claims.append(claim)
    return list(groups.values())



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
        self.in_flight: list[InFlight] = []   # read back from the API every pass (see `InFlight`)
        self._pod_signature: dict[str, tuple[str, float]] = {}
        self._pool_memo: dict[int, tuple[NodePool, str, Requirements]] = {}
        self._pods_seen: dict[str, list[dict[str, Any]]] = {}   # node → its pods as the last pass read them
        self.executed: list[Command] = []
        self.metrics: AutoscalerMetrics | None = None

    # -- the pass ---------------------------------------------------------------------------------------------
    def reconcile(self, snapshot: Snapshot) -> Command | None:
        now = self.clock.now()
        self._track_pod_events(snapshot, now)
        self._progress_replacements(snapshot, now)
        if self.in_flight:
            return None
        if self.pending is not None:
            if now < self.pending.decided_at + self.validation_delay:
                return None
            waiting, self.pending = self.pending, None
            if self._still_valid(waiting, snapshot):
                self._execute(waiting, snapshot)
                return waiting
            self.log(f"disruption: abandoned {waiting.describe()}: pods changed during validation")
            return None
        command = self.decide(snapshot)
        if command is None:
            return None
        command.decided_at = now
        if self.validation_delay <= 0:
            self._execute(command, snapshot)
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
        if any(name_of(c) == name for cmd in self.in_flight for c in cmd.claims):
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

    def _execute(self, command: Command, snapshot: Snapshot) -> None:
        """Record, taint, then act (module doc): each step is written before the next one starts."""
        self.log(f"disruption: {command.describe()}")
        self.executed.append(command)
        command.launched_at = self.clock.now()
        names = [c.name for c in command.candidates]
        command.replacement_names = [replacement_name(plan.nodepool, names, command.launched_at, i)
                                     for i, plan in enumerate(command.replacements)]
        note = json.dumps({"reason": command.reason, "candidates": names,
                           "replacements": command.replacement_names, "launchedAt": command.launched_at},
                          sort_keys=True)
        for cand in command.candidates:   # the command lives in the API from here on
            self.cluster.patch("NodeClaim", cand.name, {"metadata": {"annotations": {DISRUPTION_ANNOTATION: note}}})
        for cand in command.candidates:
            set_disrupted(self.cluster, name_of(cand.node), True, DISRUPTION)
        if not command.replacements:
            for cand in command.candidates:
                self.termination.start(cand.claim, command.reason.lower())
            return
        pools = {p.name: p for p in snapshot.pools}
        for plan, name in zip(command.replacements, command.replacement_names, strict=True):
            self.provisioner.create_claim(plan, pools[plan.nodepool], name=name)
        self.in_flight.append(InFlight(command.reason, [c.claim for c in command.candidates],
                                       command.replacement_names, command.launched_at))

    def _progress_replacements(self, snapshot: Snapshot, now: float) -> None:
        """Walk every command recorded in the API one step on (whoever recorded it)."""
        claims = {name_of(c): c for c in snapshot.nodeclaims}
        self.in_flight = in_flight_commands(snapshot.nodeclaims)
        for command in list(self.in_flight):
            if not command.replacement_names:
                self._finish_deletion(command, snapshot)
                self.in_flight.remove(command)
                continue
            replacements = [claims.get(n) for n in command.replacement_names]
            if all(r is not None and is_true(r, "Initialized") for r in replacements):
                for claim in command.claims:
                    self.termination.start(claim, command.reason.lower())
                self.in_flight.remove(command)
            elif now >= command.launched_at + self.replacement_timeout or any(
                    r is None or self.termination.is_terminating(r) for r in replacements):
                self.log(f"disruption: rolling back {command.describe()}: replacement not initialized")
                self._undo(command.claims)
                for r in replacements:
                    if r is not None:
                        self.termination.start(r, "rollback")
                self.in_flight.remove(command)

    def _finish_deletion(self, command: InFlight, snapshot: Snapshot) -> None:
        """A recorded deletion a leader did not finish: candidates whose taint landed go to termination; for the
        others the act never began, so their record is dropped (the decision is taken again, validated anew)."""
        untainted = []
        for claim in command.claims:
            node_name = (claim.get("status") or {}).get("nodeName") or ""
            if node_name and not self._tainted(node_name, snapshot):
                untainted.append(claim)
            else:
                self.log(f"disruption: finishing {command.describe()}")
                self.termination.start(claim, command.reason.lower())
        if untainted:
            self.log(f"disruption: dropping {command.describe()}: its taint never landed")
            self._undo(untainted)

    def _tainted(self, node_name: str, snapshot: Snapshot) -> bool:
        node = snapshot.nodes.get(node_name)
        if node is not None and has_taint(node, L.DISRUPTED_TAINT):
            return True
        try:   # the cache may not show the taint yet (Nodes and NodeClaims are watched apart): ask the server
            return has_taint(fresh(self.cluster).get("Node", node_name), L.DISRUPTED_TAINT)
        except NotFound:
            return True   # no node left to keep: termination takes the claim from here

    def _undo(self, claims: Sequence[dict[str, Any]]) -> None:
        """Untaint the candidates, then drop their record (the record goes last: until then it explains the taint)."""
        for claim in claims:
            node_name = (claim.get("status") or {}).get("nodeName")
            if node_name:
                set_disrupted(self.cluster, node_name, False)
            with contextlib.suppress(NotFound):
                self.cluster.patch("NodeClaim", name_of(claim),
                                   {"metadata": {"annotations": {DISRUPTION_ANNOTATION: None}}})
