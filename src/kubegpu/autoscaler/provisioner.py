"""The provisioning controller: pending pods → a batch → a scheduling pass → NodeClaims.

Everything it decides comes from `scheduler.Scheduler`; this module only reads the cluster into a snapshot,
turns the pass's plans into NodeClaim objects and reports (one Event per pod and reason, not per pass).
A NodePool that fails validation is reported once and skipped; the others keep serving.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from functools import cache, partial
from typing import TYPE_CHECKING, Any

from kubegpu.autoscaler import labels as L
from kubegpu.autoscaler.api import NodePool, template_hash
from kubegpu.autoscaler.claims import DraWorld, uses_claims
from kubegpu.autoscaler.cluster_state import ClusterState, Snapshot, informed, take_snapshot
from kubegpu.autoscaler.fanout import each_at_once, each_write
from kubegpu.autoscaler.gpu_capacity import CapacityModel
from kubegpu.autoscaler.instancetypes import InstanceType
from kubegpu.autoscaler.nomination import reservation_taint, without_reservation
from kubegpu.autoscaler.objects import (
    CREATED_AT_ANNOTATION,
    has_taint,
    is_provisionable,
    is_true,
    name_of,
)
from kubegpu.autoscaler.pool_status import PoolStatus, pool_usage
from kubegpu.autoscaler.recovery import UNUSED, set_disrupted, unused_cordons
from kubegpu.autoscaler.replan import SurplusTracker, could_take, keep_nominated, pod_shapes, target_aliases
from kubegpu.autoscaler.requirements import Requirement, Requirements
from kubegpu.autoscaler.reservations import Reservations
from kubegpu.autoscaler.scheduler import ClaimPlan, Scheduler, SchedulingResult, pod_key, pod_problem
from kubegpu.errors import KubegpuError
from kubegpu.kube.batching import Batcher
from kubegpu.scheduling import NodeInfo, node_info
from kubegpu.scheduling.quantity import format_quantity

if TYPE_CHECKING:
    from kubegpu.autoscaler.provider import CloudProvider
    from kubegpu.clock import Clock
    from kubegpu.kube import Cluster
    from kubegpu.metrics import AutoscalerMetrics

Log = Callable[[str], None]
__all__ = ["Provisioner", "Snapshot", "existing_infos", "nodeclaim_object", "plan_summary", "run_pass",
           "take_snapshot"]


def inflight_node(claim: Mapping[str, Any]) -> dict[str, Any]:
    """A stand-in Node for a NodeClaim whose node is not initialized yet: its labels, taints and allocatable."""
    meta, spec, status = claim.get("metadata") or {}, claim.get("spec") or {}, claim.get("status") or {}
    labels = dict(meta.get("labels") or {})
    for req in Requirements.from_api(spec.get("requirements") or []):
        if not req.complement and len(req.values) == 1:
            labels.setdefault(req.key, next(iter(req.values)))
    allocatable = status.get("allocatable") or (spec.get("resources") or {}).get("requests") or {}
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": status.get("nodeName") or f"nodeclaim/{meta.get('name')}", "labels": labels},
            "spec": {"taints": list(spec.get("taints") or [])},
            "status": {"allocatable": dict(allocatable)}}


class InfoMemo:
    """NodeInfos kept from one pass to the next: a node whose object and pods are the very objects of the last pass
    (a snapshot's objects are the informers' own, replaced whenever they change) is not parsed and summed again.
    Callers get copies, since a pass counts more pods onto them."""

    def __init__(self) -> None:
        self._memo: dict[str, tuple[Mapping[str, Any], tuple[dict[str, Any], ...], NodeInfo]] = {}

    def info(self, key: str, source: dict[str, Any], pods: list[dict[str, Any]],
             as_node: Callable[[dict[str, Any]], dict[str, Any]] | None = None) -> NodeInfo:
        """The NodeInfo of `source` (a Node, or what `as_node` makes of it) with `pods` counted on it."""
        hit = self._memo.get(key)
        if hit is None or hit[0] is not source or len(hit[1]) != len(pods) or \
                any(a is not b for a, b in zip(hit[1], pods, strict=True)):
            node = as_node(source) if as_node is not None else source
            hit = self._memo[key] = (source, tuple(pods), node_info(node, pods))
        return _copy_info(hit[2])

    def retain(self, snapshot: Snapshot) -> None:
        """Forget the nodes and NodeClaims the snapshot no longer has."""
        live = {f"node/{name}" for name in snapshot.nodes} | {f"claim/{name_of(c)}" for c in snapshot.nodeclaims}
        self._memo = {k: v for k, v in self._memo.items() if k in live}


def existing_infos(snapshot: Snapshot, exclude_nodes: set[str] = frozenset(),  # type: ignore[assignment]
                   nominated: Mapping[str, set[str]] | None = None, memo: InfoMemo | None = None) -> list[NodeInfo]:
    """Initialized nodes as they are, in-flight NodeClaims as stand-ins, unmanaged nodes as they are.

    With `nominated` (target name → pod keys), pending pods nominated to a node or NodeClaim count on it, so a
    consolidation simulation does not hand their capacity to someone else. With `memo`, unchanged nodes' infos are
    reused (`InfoMemo`).
    """
    memo = memo or InfoMemo()
    on = snapshot.pods_on
    pending = {pod_key(p): p for p in snapshot.pods if is_provisionable(p)} if nominated else {}

    def pods_for(node_name: str, *targets: str) -> list[dict[str, Any]]:
        extra = [pending[k] for t in targets for k in sorted((nominated or {}).get(t, ())) if k in pending]
        return [*on.get(node_name, []), *extra]

    infos: list[NodeInfo] = []
    claimed: set[str] = set()
    for claim in snapshot.nodeclaims:
        node_name = (claim.get("status") or {}).get("nodeName") or ""
        if node_name:
            claimed.add(node_name)
        if (claim.get("metadata") or {}).get("deletionTimestamp") or node_name in exclude_nodes:
            continue
        node = snapshot.nodes.get(node_name)
        pods = pods_for(node_name, node_name, name_of(claim))
        if node is not None and is_true(claim, "Initialized"):
            infos.append(memo.info(f"node/{node_name}", node, pods, without_reservation))
        else:
            infos.append(memo.info(f"claim/{name_of(claim)}", claim, pods, _planned_node))
    for name, node in sorted(snapshot.nodes.items()):
        if name not in claimed and name not in exclude_nodes:
            infos.append(memo.info(f"node/{name}", node, pods_for(name, name), without_reservation))
    return infos


def _planned_node(claim: dict[str, Any]) -> dict[str, Any]:
    return without_reservation(inflight_node(claim))


def nodeclaim_object(plan: ClaimPlan, pool: NodePool, name: str, now: float,
                     reservation: str | None = None) -> dict[str, Any]:
    """The NodeClaim for a plan: the pool's template plus the narrowed requirements and the summed requests.

    A `name` ending in "-" is a `generateName`: the API server appends a suffix that cannot clash (Karpenter's
    way; a name made here from a hash collides sooner or later on large bursts). The
    `kubegpu.io/termination` finalizer is there from the start, so whoever deletes the claim, termination runs.
    With a `reservation` token, the claim's taints hold its node for the plan's pods (`nomination.py`)."""
    tmpl = pool.spec.template
    reqs = Requirements([r for r in plan.requirements if r.key != L.NODEPOOL_LABEL])
    reqs = reqs.merge(Requirements([Requirement(L.INSTANCE_TYPE_LABEL, False, frozenset(plan.instance_type_options))]))
    return {
        "apiVersion": L.API_VERSION,
        "kind": "NodeClaim",
        "metadata": {
            **({"generateName": name} if name.endswith("-") else {"name": name}),
            "finalizers": [L.TERMINATION_FINALIZER],
            "labels": {**tmpl.metadata.labels, L.NODEPOOL_LABEL: pool.name},
            "annotations": {**tmpl.metadata.annotations, CREATED_AT_ANNOTATION: repr(now),
                            L.NODEPOOL_HASH_ANNOTATION: template_hash(pool)},
        },
        "spec": {
            "nodeClassRef": tmpl.spec.nodeClassRef.model_dump(),
            "requirements": reqs.to_api(),
            "taints": [*(t.model_dump(exclude_none=True) for t in tmpl.spec.taints),
                       *([reservation_taint(reservation)] if reservation else [])],
            "startupTaints": [t.model_dump(exclude_none=True) for t in tmpl.spec.startupTaints],
            "resources": {"requests": {k: format_quantity(v) for k, v in plan.requests.items()}},
            "expireAfter": tmpl.spec.expireAfter,
            **({"terminationGracePeriod": tmpl.spec.terminationGracePeriod}
               if tmpl.spec.terminationGracePeriod else {}),
        },
    }


def plan_summary(result: SchedulingResult) -> dict[str, Any]:
    """The `kubegpu provision -o json` shape."""
    return {
        "nodeclaims": [
            {"nodepool": c.nodepool, "instanceType": c.instance_type, "price": round(c.price, 6),
             "capacityType": c.offering.capacity_type, "zone": c.offering.zone,
             "pods": [p["metadata"]["name"] for p in c.pods]}
            for c in result.claims
        ],
        "existing": {node: [p["metadata"]["name"] for p in pods] for node, pods in result.existing.items()},
        "unschedulable": [{"pod": key.split("/", 1)[1], "namespace": key.split("/", 1)[0], "reason": why}
                          for key, why in result.unschedulable.items()],
        "cost": round(result.cost, 6),
    }


def _copy_info(info: NodeInfo) -> NodeInfo:
    return NodeInfo(info.node, dict(info.allocatable), dict(info.requested), list(info.pods))


def run_pass(pools: Sequence[NodePool], types_for: Callable[[NodePool], Sequence[InstanceType]],
             pending: Sequence[dict[str, Any]], existing: Sequence[NodeInfo] = (),
             daemonsets: Sequence[dict[str, Any]] = (), usage: Mapping[str, Mapping[str, float]] | None = None,
             capacity: CapacityModel | None = None, sizings: Sequence[str] = ("group", "queue"),
             not_ready: Callable[[NodePool], str | None] | None = None, node_cost: float = 0.0,
             dra: DraWorld | Callable[[], DraWorld] | None = None) -> SchedulingResult:
    """One scheduling pass (pure): used by the controller, `kubegpu provision`, consolidation and the benchmark.

    The pass runs once per NodeClaim sizing rule and keeps the result that leaves the fewest pods unschedulable,
    then costs least: sizing for the identical pods at hand wins on large uniform batches, sizing for the whole
    queue on small mixed ones, and a pass is cheap enough to try both. `node_cost` ($/h per new node beyond its
    price) counts in both the sizing of new claims and that comparison; the plan's `cost` stays the price. A pool
    that `not_ready` gives a reason for (its provider's NodeClass is not ready) launches nothing, and pods left
    unschedulable are told that reason. With `dra` (or how to read it, called once if a pod needs it), pods with
    ResourceClaims are planned by allocating them (`claims.py`); without, their claims are not looked at.
    """
    model = capacity or CapacityModel()
    types: dict[str, Sequence[InstanceType]] = {}
    unready: dict[str, str] = {}
    for pool in pools:
        why = not_ready(pool) if not_ready is not None else None
        if why is not None:
            unready[pool.name] = why
        types[pool.name] = [] if why is not None else types_for(pool)
        model.sharing(pool)
    if dra is not None and not isinstance(dra, DraWorld):
        dra = cache(dra)   # both sizings' passes share one read
    best: SchedulingResult | None = None
    for sizing in sizings:
        scheduler = Scheduler(pools, types, [_copy_info(i) for i in existing], daemonsets, usage,
                              capacity_fn=model, sizing=sizing, node_cost=node_cost, dra=dra)
        result = scheduler.solve(pending)
        if best is None or (len(result.unschedulable), result.cost + node_cost * len(result.claims)) < \
                (len(best.unschedulable), best.cost + node_cost * len(best.claims)):
            best = result
    assert best is not None
    if unready:
        explain_unready(best, len(unready) == len(pools), list(unready.values()))
    return best


def explain_unready(result: SchedulingResult, none_ready: bool, reasons: Sequence[str]) -> None:
    """Pods left unschedulable hear about the pools that launch nothing: only that when no pool is ready (any
    instance-type reason would mislead), after their own reason otherwise."""
    told = "; ".join(reasons)
    for key, why in result.unschedulable.items():
        result.unschedulable[key] = told if none_ready else f"{why}; {told}"


class Provisioner:
    """Watches for pending pods, batches them, and creates NodeClaims for what existing capacity cannot take."""

    def __init__(self, cluster: Cluster, provider: CloudProvider, clock: Clock, batch_idle: float = 1.0,
                 batch_max: float = 10.0, log: Log | None = None, state: ClusterState | None = None,
                 parallelism: int = 1, surplus_grace: float = 3.0, node_cost: float = 0.0) -> None:
        self.state = state or ClusterState(informed(cluster), clock, 2 * batch_max)
        self.cluster = self.state.cluster
        self.provider = provider
        self.parallelism = max(1, parallelism)
        self.node_cost = node_cost           # $/h a node costs beyond its price, in the plan's objective (run_pass)
        self.clock = clock
        self.batcher = Batcher(window=batch_max, idle=batch_idle)
        self.log = log or (lambda _line: None)
        self.capacity = CapacityModel()
        self._reported: dict[str, str] = {}
        self._pool_errors: dict[str, str] = {}
        self.last_result: SchedulingResult | None = None
        self.metrics: AutoscalerMetrics | None = None
        self.surplus = SurplusTracker(grace=surplus_grace)
        self._cordoned: dict[str, tuple[str, float]] = {}   # unused claim → (its node, when its cordon was seen)
        self._infos = InfoMemo()   # NodeInfos of unchanged nodes, from one pass to the next
        self.reservations = Reservations(self.cluster, self.state, self.log, self.parallelism, clock)
        self.pool_status = PoolStatus(self.cluster, clock, self.log)
        # how an unused NodeClaim is let go (the autoscaler hands in termination's start; None: never)
        self.terminate: Callable[[dict[str, Any], str], None] | None = None

    @property
    def nominations(self) -> Mapping[str, set[str]]:
        """Node or NodeClaim name → keys of the pods the last pass nominated to it (kept in the cluster state)."""
        return self.state.nominations_view()

    def is_nominated(self, *names: str) -> bool:
        """Whether pending pods were recently nominated to this node/NodeClaim (then it must not be disrupted)."""
        return self.state.is_nominated(*names)

    def pending_pods(self, snapshot: Snapshot) -> list[dict[str, Any]]:
        """The pods this pass provisions for: pending, unbound, not a daemonset pod, not deleting, and readable.
        The one place that decides which pending pods the autoscaler serves."""
        return [p for p in snapshot.pods if is_provisionable(p) and self._readable(p)]

    def reconcile(self, snapshot: Snapshot | None = None) -> SchedulingResult | None:
        now = self.clock.now()
        snapshot = snapshot or self.state.snapshot()
        self._report_pool_errors(snapshot)
        self._write_pool_status(snapshot)
        self._infos.retain(snapshot)
        pending = self.pending_pods(snapshot)
        if not pending:   # nothing waits: every NodeClaim bought for pods that landed elsewhere is surplus
            self.batcher.reset()
            self._remove_surplus(snapshot, set(), now)
            self.reservations.reconcile(snapshot, pending)
            return None
        self.batcher.add((str((p.get("metadata") or {}).get("uid") or name_of(p)) for p in pending), now)
        result = self._provision(snapshot, pending, now) if self.batcher.ready(now) else None
        self.reservations.reconcile(snapshot, pending)
        return result

    def _provision(self, snapshot: Snapshot, pending: list[dict[str, Any]], now: float) -> SchedulingResult:
        """One scheduling pass over the batch: nominations, new NodeClaims, surplus let go, pods told why not."""
        self.batcher.reset()
        started = time.perf_counter()
        result = self.schedule(snapshot, pending, keep_nominations=True)
        if self.metrics is not None:
            self.metrics.scheduling_duration.labels("provisioner").observe(time.perf_counter() - started)
            self.metrics.unschedulable_pods.labels("provisioner").set(len(result.unschedulable))
        self.state.reset_nominations()
        for node_name, pods in result.existing.items():
            self.state.nominate(node_name.removeprefix("nodeclaim/"), (pod_key(p) for p in pods), now)
        if result.claims:   # as Karpenter's "computed new nodeclaim(s) to fit pod(s)"
            self.log(f"computed {len(result.claims)} new nodeclaims (${result.cost:,.2f}/h) for "
                     f"{sum(len(c.pods) for c in result.claims)} of {len(pending)} pending pods")
        self._create_claims(result, snapshot, now)
        self._remove_surplus(snapshot, set(result.existing), now, pending)
        self._report_unschedulable(result)
        self.last_result = result
        return result

    def _write_pool_status(self, snapshot: Snapshot) -> None:
        """NodePool conditions (`pool_status`): invalid pools, pools whose NodeClass is not ready, and the rest."""
        invalid = dict(snapshot.pool_errors)
        parsed: dict[str, NodePool] = {}
        for pool in snapshot.pools:
            try:
                self.capacity.sharing(pool)
                parsed[pool.name] = pool
            except KubegpuError as exc:
                invalid[pool.name] = str(exc)
        try:
            raw = self.cluster.list("NodePool")
        except KubegpuError as exc:
            self.log(f"cannot read NodePools for their status: {exc}")
            return
        self.pool_status.reconcile(raw, parsed, invalid, getattr(self.provider, "pool_not_ready", None),
                                   pool_usage(snapshot.nodeclaims))

    def _remove_surplus(self, snapshot: Snapshot, needed: set[str], now: float,
                        pending: Sequence[dict[str, Any]] = ()) -> None:
        """Let go of the NodeClaims nothing uses or will use (`replan.SurplusTracker`), cordon first: a claim with
        a node is deleted only `grace` seconds after this pass's view shows its node cordoned and still without a
        pod, since kube-scheduler may bind one a moment before the cordon lands, and the watch of pods may show it
        only after the watch of nodes shows the cordon (deleting then would evict it: a pod lost). A node a pending
        pod could be bound to now (`replan.could_take`) is not cordoned; one that took a pod meanwhile is uncordoned
        and kept. A step that fails is retried next pass."""
        live = [c for c in snapshot.nodeclaims if not self.state.is_deleting(c)]
        shapes = pod_shapes(pending)
        on = snapshot.pods_on
        for name, node_name in unused_cordons(live, snapshot.nodes).items():   # a previous leader's cordons: taken
            if name not in self._cordoned:   # over as laid now, unused since a grace ago (terminated or uncordoned)
                self._cordoned[name] = (node_name, now)
                self.surplus.since.setdefault(name, now - self.surplus.grace)
        surplus = self.surplus.update(live, on, needed, now)
        live_names = {name_of(c) for c in live}
        uncordon: list[tuple[str, str]] = []
        for name in set(self._cordoned) - {name_of(c) for c in surplus}:
            node_name = self._cordoned.pop(name)[0]
            if name in live_names:   # it took a pod (or a plan wants it) while cordoned: keep it after all
                self.log(f"nodeclaim {name}: in use after all; uncordoned")
                uncordon.append((name, node_name))
        cordon: list[tuple[str, str]] = []
        terminate: list[Mapping[str, Any]] = []
        for claim in surplus if self.terminate is not None else ():
            name = name_of(claim)
            node = snapshot.nodes.get((claim.get("status") or {}).get("nodeName") or "")
            if node is not None:
                cordoned = self._cordoned.get(name)
                if cordoned is None:
                    if not (shapes and could_take(node, on.get(name_of(node), []), shapes)):
                        cordon.append((name, name_of(node)))
                    continue
                if not has_taint(node, L.DISRUPTED_TAINT):
                    self._cordoned[name] = (cordoned[0], now)   # the cordon is not in this view yet: wait on
                    continue
                if now - cordoned[1] < self.surplus.grace:
                    continue
            terminate.append(claim)
        # the decisions above are this pass's; the writes go out together (a burst ends with hundreds unused)
        lifted = self._each_write([(name, partial(set_disrupted, self.cluster, node, False, UNUSED))
                                   for name, node in uncordon])
        for (name, node_name), done in zip(uncordon, lifted, strict=True):
            if not done:
                self._cordoned[name] = (node_name, now)   # still cordoned: try again next pass
        laid = self._each_write([(name, partial(set_disrupted, self.cluster, node, True, UNUSED))
                                 for name, node in cordon])
        for (name, node_name), done in zip(cordon, laid, strict=True):
            if done:
                self._cordoned[name] = (node_name, now)
        if self.terminate is not None:
            ended = self._each_write([(name_of(c), partial(self.terminate, dict(c), "unused")) for c in terminate])
            for claim, done in zip(terminate, ended, strict=True):
                if done:
                    self._cordoned.pop(name_of(claim), None)

    def _each_write(self, writes: Sequence[tuple[str, Callable[[], object]]]) -> list[bool]:
        return each_write(writes, self.parallelism,
                          lambda claim, exc: self.log(f"nodeclaim {claim}: cannot let the unused claim go: {exc}"))

    def schedule(self, snapshot: Snapshot, pending: Sequence[dict[str, Any]],
                 exclude_nodes: set[str] = frozenset(),  # type: ignore[assignment]
                 count_nominated: bool = False, keep_nominations: bool = False) -> SchedulingResult:
        """A pass for `pending`; `count_nominated` (consolidation) keeps capacity nominated to pending pods taken;
        `keep_nominations` (provisioning) leaves pending pods where the last pass nominated them while they still
        fit there next to what really landed, and plans only the others (`replan.keep_nominated`)."""
        pools = []
        for pool in snapshot.pools:
            try:
                self.capacity.sharing(pool)
                pools.append(pool)
            except KubegpuError as exc:
                self._pool_error(pool.name, str(exc))
        nominated = self.state.nominations_view() if count_nominated else None
        infos = existing_infos(snapshot, exclude_nodes, nominated, self._infos)
        kept: dict[str, list[dict[str, Any]]] = {}
        if keep_nominations:
            aliases = target_aliases(snapshot.nodeclaims, snapshot.nodes)
            # pods with claims are planned afresh each pass: whether a nomination still holds is an allocation
            # (the pass allocates them onto existing and in-flight nodes first), not the CPU and memory left there
            claim_pods = [p for p in pending if uses_claims(p)]
            kept, pending = keep_nominated(infos, [p for p in pending if not uses_claims(p)],
                                           self.state.nominations_view(), aliases)
            pending = [*pending, *claim_pods]
        result = run_pass(pools, self.provider.instance_types, pending, infos,
                          snapshot.daemonsets, pool_usage(snapshot.nodeclaims), self.capacity,
                          not_ready=getattr(self.provider, "pool_not_ready", None), node_cost=self.node_cost,
                          dra=partial(DraWorld.read, self.cluster))   # read only if a pod needs it
        for name, pods in kept.items():
            result.existing.setdefault(name, []).extend(pods)
        return result

    def create_claim(self, plan: ClaimPlan, pool: NodePool, name: str | None = None,
                     reserve: bool = False) -> dict[str, Any]:
        """Create the NodeClaim and nominate the plan's pods to it; with `reserve` (new capacity for pending pods),
        its node is held for them (`nomination.py`; their tolerations are written when the node registers). The API
        server names it from `generateName` unless the caller recorded a `name` for it first (disruption's
        replacements)."""
        token = uuid.uuid4().hex[:16] if reserve else None
        claim = nodeclaim_object(plan, pool, name or f"{pool.name}-", self.clock.now(), token)
        created = self.cluster.create(claim)
        self.state.nominate(name_of(created), (pod_key(p) for p in plan.pods), self.clock.now())
        if self.metrics is not None:
            self.metrics.nodeclaims_created.labels("provisioned", pool.name, "false").inc()
            self.metrics.decisions.labels("launch").inc()
        for pod in plan.pods:
            self._event(pod, "Nominated", f"Pod should schedule on: nodeclaim/{name_of(created)}", "Normal")
        return created

    def _create_claims(self, result: SchedulingResult, snapshot: Snapshot, now: float) -> None:
        """Create every planned NodeClaim, up to `parallelism` at a time. Each creation stands alone: one that fails
        is logged and its pods stay pending, so the next batch plans them again; the others go ahead."""
        pools = {p.name: p for p in snapshot.pools}

        def create(plan: ClaimPlan) -> None:
            try:
                self.create_claim(plan, pools[plan.nodepool], reserve=True)
            except KubegpuError as exc:
                self.log(f"nodepool {plan.nodepool}: cannot create a NodeClaim ({plan.instance_type}) for "
                         f"{len(plan.pods)} pods: {exc}; retried with the next batch")

        each_at_once(create, result.claims, self.parallelism)

    def _readable(self, pod: dict[str, Any]) -> bool:
        """A pod whose spec the provisioner cannot read is reported once and left out; the rest are served."""
        why = pod_problem(pod)
        if why is None:
            return True
        key = pod_key(pod)
        if self._reported.get(key) != why:
            self._reported[key] = why
            self.log(why)
            self._event(pod, "FailedScheduling", f"Failed to schedule pod, {why}", "Warning")
        return False

    def _report_unschedulable(self, result: SchedulingResult) -> None:
        for pod in result.unschedulable_pods:
            key = f"{(pod.get('metadata') or {}).get('namespace', 'default')}/{name_of(pod)}"
            why = result.unschedulable[key]
            if self._reported.get(key) == why:
                continue
            self._reported[key] = why
            self.log(f"pod {key}: cannot provision: {why}")
            self._event(pod, "FailedScheduling", f"Failed to schedule pod, {why}", "Warning")

    def _report_pool_errors(self, snapshot: Snapshot) -> None:
        for name, why in snapshot.pool_errors.items():
            self._pool_error(name, why)

    def _pool_error(self, name: str, why: str) -> None:
        if self._pool_errors.get(name) == why:
            return
        self._pool_errors[name] = why
        self.log(why)
        try:
            pool = self.cluster.get("NodePool", name)
        except KubegpuError:
            return
        self._event(pool, "InvalidNodePool", why, "Warning")

    def _event(self, obj: dict[str, Any], reason: str, message: str, type_: str) -> None:
        from kubegpu.kube import record_event

        try:
            record_event(self.cluster, obj, reason, message, type_=type_, component="kubegpu-autoscaler")
        except KubegpuError as exc:
            self.log(f"cannot record event {reason} on {name_of(obj)}: {exc}")
