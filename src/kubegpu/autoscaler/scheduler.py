"""The provisioning simulation: which pending pods go where, and which new nodes to buy for the rest.

Karpenter's order: pods sorted biggest first (GPU pods first, then CPU, memory, creation time, UID); each pod
tries (a) existing and in-flight nodes, with `kubegpu.scheduling.fits`; (b) NodeClaims opened earlier in this
pass, fewest pods first; (c) a new NodeClaim from the highest-weight NodePool whose requirements, taints and
remaining limits allow it. A NodeClaim keeps the instance types that still fit its pods plus daemonset overhead
with an available offering, and launches the cheapest of them.

Two things make it fast and cheap: consecutive identical pods are placed as one group (the count that fits is
arithmetic, not a loop of fit checks), and instance-type narrowing is numpy over a types × resources matrix.
Where Karpenter opens a NodeClaim with every type and ends up on the largest, we cap a new NodeClaim's price at
the type with the lowest price per pod for the pods waiting in its group, which is what keeps the bill near the
LP lower bound (see benchmarks/provisioning.py). A `node_cost` adds what each node costs beyond its price (its
DaemonSet pods, the control plane's and the scheduler's work per node) to that price per pod, so a bigger type wins
where its price per pod is only a little higher: fewer nodes for a small premium. Pods with topology spread or
required pod affinity (topology.py) are placed one at a time, since each placement moves the counts the next one is
judged by. Pure: no clock, no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from kubegpu.autoscaler import labels as L
from kubegpu.autoscaler.api import NodePool
from kubegpu.autoscaler.claim_placement import ClaimPlacement
from kubegpu.autoscaler.claims import DraPlanner, DraWorld
from kubegpu.autoscaler.instancetypes import InstanceType
from kubegpu.autoscaler.pending import (
    GPU_PREFIX,
    PendingPod,
    node_zone,
    pod_key,
    pod_problem,
    pod_zones,
    prepare_pod,
    queue_order,
    repels,
)
from kubegpu.autoscaler.requirements import Requirement, Requirements
from kubegpu.autoscaler.templates import (
    EPS,
    CapacityFn,
    ClaimPlan,
    NodeTemplate,
    OpenClaim,
    SchedulingResult,
    default_capacity,
    finalize_claim,
    fit_counts,
    min_values_ok,
    no_type_reason,
    why_not,
)
from kubegpu.autoscaler.topology import TopologyCounts, Verdict
from kubegpu.scheduling import NodeInfo, fits, tolerates

__all__ = ["GPU_PREFIX", "CapacityFn", "ClaimPlan", "Scheduler", "SchedulingResult", "default_capacity", "pod_key",
           "pod_problem"]

# How a new NodeClaim's price is capped when it opens: at the type with the lowest price per pod for the identical
# pods waiting ("group") or for every pod still queued ("queue"), or not at all ("largest", Karpenter's behaviour).
SIZINGS = ("group", "queue", "largest")
# The `kubegpu autoscaler` / `kubegpu provision` default node cost, $/h per new node. At 6 a burst of mixed GPU pods
# goes onto 8-GPU nodes rather than hundreds of 1-GPU ones: fewer launches than Karpenter's for the same pods, under
# its price, bound sooner (docs/autoscaler.md, "Node cost"). 0 asks for the cheapest plan by price alone.
NODE_COST = 6.0


class Scheduler(ClaimPlacement):
    """One provisioning pass over a snapshot of the cluster (see the module docstring)."""

    def __init__(
        self,
        nodepools: Sequence[NodePool],
        instance_types: Mapping[str, Sequence[InstanceType]],
        existing: Sequence[NodeInfo] = (),
        daemonsets: Sequence[dict[str, Any]] = (),
        usage: Mapping[str, Mapping[str, float]] | None = None,
        capacity_fn: CapacityFn = default_capacity,
        sizing: str = "group",
        node_cost: float = 0.0,
        dra: DraWorld | Callable[[], DraWorld] | None = None,
    ) -> None:
        if sizing not in SIZINGS:
            raise ValueError(f"sizing must be one of {SIZINGS}")
        if not node_cost >= 0.0:
            raise ValueError("node_cost must be a non-negative number")
        self.sizing = sizing
        self.node_cost = node_cost   # $/h a node costs beyond its price, when choosing a new claim's size
        self.existing = list(existing)
        pools = sorted(nodepools, key=lambda p: (-p.weight, p.name))
        names: set[str] = {"cpu", "memory", "pods"}
        self._allocs: dict[str, list[Mapping[str, float]]] = {}
        for pool in pools:
            for it in instance_types.get(pool.name, ()):
                names.update(it.capacity)
                names.update(capacity_fn(pool, it))
        self.index = {name: i for i, name in enumerate(sorted(names))}
        self.templates = [
            NodeTemplate(p, instance_types.get(p.name, ()), capacity_fn, self.index, (usage or {}).get(p.name, {}),
                      daemonsets)
            for p in pools
        ]
        self.claims: list[OpenClaim] = []
        self._headroom = np.full((0, len(self.index)), -np.inf)
        self._pod_counts = np.zeros(0, dtype=np.int64)   # pods per claim, for the fewest-pods-first order
        self._queued = 0
        self._committed: dict[str, np.ndarray] = {}
        self._committed_nodes: dict[str, int] = {}
        self._topology = TopologyCounts(frozenset())
        self._pool_zones: dict[str, set[str]] = {}
        by_name = {it.name: it for t in self.templates for it in t.types}
        # DRA objects (or how to read them, once a pod needs them): pods with ResourceClaims, and extended
        # resources no instance type offers but a DeviceClass serves, are planned with the allocator (claims.py)
        self._dra: DraWorld | Callable[[], DraWorld] | None = dra
        self._type_of: Callable[[str], InstanceType | None] = by_name.get
        self.planner: DraPlanner | None = None

    # -- public ---------------------------------------------------------------------------------------------
    def solve(self, pods: Iterable[dict[str, Any]]) -> SchedulingResult:
        result = SchedulingResult()
        queue = sorted((prepare_pod(p) for p in pods), key=queue_order)
        for item in queue:
            self._claims_for(item)
        self._start_topology(queue)
        start = 0
        while start < len(queue):
            end = start + 1
            while end < len(queue) and queue[end].shape == queue[start].shape:
                end += 1
            self._queued = len(queue) - start
            self._place_group(queue[start:end], result)
            start = end
        result.claims = [plan for plan in (finalize_claim(c, self.index) for c in self.claims) if plan is not None]
        return result

    # -- placement --------------------------------------------------------------------------------------------
    def _place_group(self, group: list[PendingPod], result: SchedulingResult) -> None:
        rep = group[0]
        missing = [name for name in rep.requests if name not in self.index and rep.requests[name] > 0]
        if rep.claims is not None:
            self._place_claims(group, result, None if missing else self._vector(rep.requests))
            return
        if rep.topo is not None:
            self._place_each(group, result, None if missing else self._vector(rep.requests))
            return
        remaining = list(group)
        remaining = self._onto_existing(remaining, result)
        if not remaining:
            return
        if missing and not self.existing:
            self._unschedulable(remaining, result, f"no instance type offers {', '.join(sorted(missing))}")
            return
        vec = self._vector(rep.requests) if not missing else None
        if vec is not None:
            remaining = self._onto_open_claims(remaining, vec)
            while remaining:
                claim, why = self._open_claim(rep, vec, len(remaining))
                if claim is None:
                    self._unschedulable(remaining, result, why)
                    return
                before = len(remaining)
                remaining = self._add_to_claim(claim, remaining, vec)
                if len(remaining) == before:   # cannot happen for a fresh claim unless a rule rejects every option
                    self._unschedulable(remaining, result, f"nodepool {claim.template.pool.name}: no instance type "
                                        "satisfies every requirement for this pod")
                    return
        else:
            self._unschedulable(remaining, result, f"no instance type offers {', '.join(sorted(missing))}")

    # -- topology (spread constraints, pod affinity; see topology.py) ------------------------------------------
    def _start_topology(self, queue: Sequence[PendingPod]) -> None:
        """Zone domains: those the NodePools can launch in plus those of existing nodes; count existing pods."""
        self._pool_zones = {tmpl.pool.name: self._template_zones(tmpl) for tmpl in self.templates}
        zones = {z for found in self._pool_zones.values() for z in found}
        zones.update(z for z in (node_zone(info) for info in self.existing) if z)
        self._topology = TopologyCounts.for_pods(zones, (item.topo for item in queue))
        for info in self.existing:
            for pod in info.pods:
                self._topology.record(pod, node_zone(info), info.name)

    def _template_zones(self, tmpl: NodeTemplate) -> set[str]:
        allowed = tmpl.requirements.get(L.ZONE_LABEL)
        return {o.zone for it in tmpl.types for o in it.offerings
                if o.available and (allowed is None or allowed.has(o.zone))}

    def _zone_pin(self, item: PendingPod, reqs: Requirements,
                  tmpl: NodeTemplate) -> tuple[Requirements | None, Verdict]:
        """The zone requirement the pod's topology adds under `reqs` (empty when none), or None and why not."""
        if item.topo is None or not item.topo.zonal:
            return Requirements(), Verdict.OK
        zone, verdict = self._topology.zone_choice(item.topo, self._zones_under(reqs, tmpl), pod_zones(item))
        if zone is None:
            return None, verdict
        return Requirements([Requirement.of(L.ZONE_LABEL, "In", [zone])]), Verdict.OK

    def _zones_under(self, reqs: Requirements, tmpl: NodeTemplate) -> set[str]:
        allowed = reqs.get(L.ZONE_LABEL)
        return {z for z in self._pool_zones[tmpl.pool.name] if allowed is None or allowed.has(z)}

    @staticmethod
    def _claim_host(claim: OpenClaim) -> str:
        """The hostname domain of a NodeClaim opened in this pass (existing nodes use their node names)."""
        return f"new-nodeclaim/{claim.index}"

    def _record_on_claim(self, claim: OpenClaim, pods: Sequence[PendingPod]) -> None:
        zone = claim.requirements.get(L.ZONE_LABEL)
        single = next(iter(zone.values)) if zone is not None and not zone.complement and len(zone.values) == 1 \
            else None
        for item in pods:
            self._topology.record(item.pod, single, self._claim_host(claim))

    def _place_each(self, group: list[PendingPod], result: SchedulingResult, vec: np.ndarray | None) -> None:
        """Pods with topology terms go one at a time, as in Karpenter: each placement changes the counts."""
        pool = self._claim_pool(vec) if vec is not None else []
        for item in group:
            if self._onto_existing_one(item, result):
                continue
            if vec is None:
                missing = sorted(n for n, v in item.requests.items() if n not in self.index and v > 0)
                self._unschedulable([item], result, f"no instance type offers {', '.join(missing)}")
                continue
            if self._onto_pool(item, vec, pool):
                continue
            claim, why = self._open_claim(item, vec, self._share(item, len(group)))
            if claim is None:
                self._unschedulable([item], result, why)
                continue
            if self._try_claim(claim, item, vec) is not Verdict.OK:
                self._unschedulable([item], result, f"nodepool {claim.template.pool.name}: no instance type "
                                    "satisfies every requirement and topology term for this pod")
                continue
            pool.insert(0, claim)

    def _share(self, item: PendingPod, waiting: int) -> int:
        """How many of the waiting identical pods one new NodeClaim can expect (sizes its price cap)."""
        assert item.topo is not None
        limit = item.topo.per_host_limit
        if item.anti_key:
            return 1
        if limit is not None:
            return min(limit, waiting)
        spread = any(t.max_skew is not None and t.key == L.ZONE_LABEL for t in item.topo.terms)
        return max(1, math.ceil(waiting / max(len(self._topology.zones), 1))) if spread else waiting

    def _claim_pool(self, vec: np.ndarray) -> list[OpenClaim]:
        return [self.claims[i] for i in self._fewest_pods_first(vec)]

    def _fewest_pods_first(self, vec: np.ndarray) -> list[int]:
        """Indices of the claims whose best headroom fits `vec`, fewest pods first, then in opening order."""
        count = len(self.claims)
        possible = np.nonzero((self._headroom[:count] >= vec - EPS).all(axis=1))[0]
        ordered: list[int] = possible[np.argsort(self._pod_counts[possible], kind="stable")].tolist()
        return ordered

    def _onto_pool(self, item: PendingPod, vec: np.ndarray, pool: list[OpenClaim]) -> bool:
        """First claim of `pool` that takes the pod; claims that never will in this group leave the pool."""
        dropped: set[int] = set()
        placed = False
        for claim in pool:
            verdict = self._try_claim(claim, item, vec)
            if verdict is Verdict.OK:
                placed = True
                break
            if verdict is Verdict.NEVER:
                dropped.add(claim.index)
        if dropped:
            pool[:] = [c for c in pool if c.index not in dropped]
        return placed

    def _try_claim(self, claim: OpenClaim, item: PendingPod, vec: np.ndarray) -> Verdict:
        """Add the pod to the claim if its rules allow; NEVER verdicts that no later placement can undo (taints,
        requirements, anti-affinity, a node's hostname count) are remembered per claim, so rescans are cheap."""
        assert item.topo is not None
        if item.rule_key in claim.never:
            return Verdict.NEVER
        if not (self._headroom[claim.index] >= vec - EPS).all():
            return Verdict.NEVER
        reqs = self._merged(claim.requirements, item)
        if ((item.anti_key and item.anti_key in claim.anti_keys) or not self._admits(claim.template, item)
                or reqs is None
                or self._topology.host_verdict(item.topo, self._claim_host(claim)) is Verdict.NEVER):
            claim.never.add(item.rule_key)
            return Verdict.NEVER
        pin, verdict = self._zone_pin(item, reqs, claim.template)
        if pin is None:
            return verdict
        if self._add_to_claim(claim, [item], vec, pin):
            return Verdict.RETRY if len(pin) else Verdict.NEVER
        return Verdict.OK

    def _onto_existing_one(self, item: PendingPod, result: SchedulingResult) -> bool:
        """The first existing/in-flight node whose hostname and zone counts admit the pod and that fits it."""
        assert item.topo is not None
        for info in self.existing:
            labels = (info.node.get("metadata") or {}).get("labels") or {}
            if item.anti_key and any(repels(item, p) for p in info.pods):
                continue
            if self._topology.host_verdict(item.topo, info.name) is not Verdict.OK:
                continue
            zone = labels.get(L.ZONE_LABEL)
            if item.topo.zonal:
                chosen, _ = self._topology.zone_choice(item.topo, [zone] if zone else [], pod_zones(item))
                if chosen is None:
                    continue
            if fits(item.pod, info, item.requests).ok:
                info.add_pod(item.pod, item.requests)
                result.existing.setdefault(info.name, []).append(item.pod)
                self._topology.record(item.pod, zone, info.name)
                return True
        return False

    def _vector(self, requests: Mapping[str, float]) -> np.ndarray:
        out = np.zeros(len(self.index))
        for name, value in requests.items():
            out[self.index[name]] = value
        return out

    def _unschedulable(self, pods: Sequence[PendingPod], result: SchedulingResult, why: str) -> None:
        for item in pods:
            result.unschedulable[pod_key(item.pod)] = why
            result.unschedulable_pods.append(item.pod)

    def _onto_existing(self, pods: list[PendingPod], result: SchedulingResult) -> list[PendingPod]:
        if not self.existing:
            return pods
        rep = pods[0]
        for info in self.existing:
            if not pods:
                break
            if rep.anti_key and any(repels(rep, p) for p in info.pods):
                continue
            placed = 0
            while placed < len(pods) and fits(pods[placed].pod, info, pods[placed].requests).ok:
                info.add_pod(pods[placed].pod, pods[placed].requests)
                result.existing.setdefault(info.name, []).append(pods[placed].pod)
                self._topology.record(pods[placed].pod, node_zone(info), info.name)
                placed += 1
                if rep.anti_key:
                    break
            pods = pods[placed:]
        return pods

    def _onto_open_claims(self, pods: list[PendingPod], vec: np.ndarray) -> list[PendingPod]:
        """Fewest pods first, as Karpenter; a numpy pre-filter on each claim's best headroom skips full claims."""
        if not self.claims:
            return pods
        rep = pods[0]
        for index in self._fewest_pods_first(vec):
            claim = self.claims[index]
            if not pods:
                break
            if rep.anti_key and rep.anti_key in claim.anti_keys:
                continue
            if not self._admits(claim.template, rep) or self._merged(claim.requirements, rep) is None:
                continue
            pods = self._add_to_claim(claim, pods, vec)
        return pods

    def _track(self, claim: OpenClaim) -> None:
        """Refresh the claim's row of best-case headroom (max over its candidate types of allocatable − used)."""
        if claim.index >= self._headroom.shape[0]:
            grown = np.full((max(16, 2 * self._headroom.shape[0]), len(self.index)), -np.inf)
            grown[: self._headroom.shape[0]] = self._headroom
            self._headroom = grown
            self._pod_counts = np.concatenate([self._pod_counts, np.zeros(grown.shape[0] - self._pod_counts.size,
                                                                          dtype=np.int64)])
        self._pod_counts[claim.index] = len(claim.pods)
        if claim.cand.size:
            self._headroom[claim.index] = claim.template.alloc[claim.cand].max(axis=0) - claim.used
        else:
            self._headroom[claim.index] = -np.inf

    def _admits(self, tmpl: NodeTemplate, item: PendingPod) -> bool:
        return all(tolerates(item.tolerations, t) for t in tmpl.taints)

    def _merged(self, reqs: Requirements, item: PendingPod) -> Requirements | None:
        for option in item.options:
            if reqs.conflict(option) is None:
                return reqs.merge(option)
        return None

    def _allowed(self, claim: OpenClaim, reqs: Requirements) -> np.ndarray:
        """Candidate type indices for `claim` under `reqs`: suitable, within the price cap and the limits."""
        tmpl = claim.template
        ok, prices = tmpl.type_mask(reqs)
        cand = claim.cand[ok[claim.cand] & (prices[claim.cand] <= claim.price_cap + EPS)]
        if tmpl.limits is not None and cand.size:
            remaining = tmpl.limits[0] - self._committed.get(tmpl.pool.name, 0.0)
            if claim.committed is not None:
                remaining = remaining + claim.committed
            cand = cand[(tmpl.capacity[cand] <= remaining + EPS).all(axis=1)]
        return cand

    def _add_to_claim(self, claim: OpenClaim, pods: list[PendingPod], vec: np.ndarray,
                      pin: Requirements | None = None, only: np.ndarray | None = None) -> list[PendingPod]:
        """Add as many of the identical `pods` as fit; `only` (a mask over the pool's types) keeps the types the
        pods' DRA claims fit on, and then adds one pod."""
        rep = pods[0]
        reqs = self._merged(claim.requirements, rep)
        if reqs is None:
            return pods
        if pin is not None:
            reqs = reqs.merge(pin)
        cand = self._allowed(claim, reqs)
        if only is not None:
            cand = cand[only[cand]]
        if cand.size == 0:
            return pods
        counts = fit_counts(claim.template.alloc[cand], claim.used, vec)
        take = int(min(counts.max(initial=0), len(pods)))
        if rep.anti_key or rep.topo is not None or only is not None:
            take = min(take, 1)
        while take > 0 and not min_values_ok(claim.template, reqs, cand[counts >= take]):
            take -= 1
        if take <= 0:
            return pods
        claim.used = claim.used + vec * take
        claim.cand = cand[counts >= take]
        claim.requirements = reqs
        claim.pods.extend(p.pod for p in pods[:take])
        self._record_on_claim(claim, pods[:take])
        if rep.anti_key:
            claim.anti_keys.add(rep.anti_key)
        self._commit(claim)
        self._track(claim)
        return pods[take:]

    def _commit(self, claim: OpenClaim) -> None:
        """Count the claim's cheapest candidate against its pool's limits."""
        tmpl = claim.template
        if tmpl.limits is None:
            return
        _, prices = tmpl.type_mask(claim.requirements)
        best = claim.cand[np.argmin(prices[claim.cand])]
        name = tmpl.pool.name
        total = self._committed.get(name, np.zeros(len(self.index)))
        if claim.committed is not None:
            total = total - claim.committed
        claim.committed = tmpl.capacity[best]
        self._committed[name] = total + claim.committed

    def _open_claim(self, item: PendingPod, vec: np.ndarray, waiting: int) -> tuple[OpenClaim | None, str]:
        """A new NodeClaim for `item`, its price capped for `waiting` pods like it (DRA claims: `DraPlanner.counts`)."""
        reasons: list[str] = []
        for tmpl in self.templates:
            why = why_not(tmpl, item)
            if why:
                reasons.append(f"nodepool {tmpl.pool.name}: {why}")
                continue
            reqs = self._merged(tmpl.requirements, item)
            assert reqs is not None
            pin, _ = self._zone_pin(item, reqs, tmpl)
            if pin is None:
                reasons.append(f"nodepool {tmpl.pool.name}: topology spread / pod affinity allows no zone")
                continue
            reqs = reqs.merge(pin)
            ok, prices = tmpl.type_mask(reqs)
            base = tmpl.daemon
            counts = fit_counts(tmpl.alloc, base, vec)
            roomy = (ok & (counts >= 1)).any()
            if item.claims is not None and self.planner is not None:
                counts = np.minimum(counts, self.planner.counts(tmpl.types, item.claims, waiting))
                if self.planner.shares(item.claims) and (ok & (counts >= waiting)).any():
                    counts = np.where(counts >= waiting, counts, 0)   # a shared claim's pods all go beside it
            usable = ok & (counts >= 1)
            if tmpl.limits is not None:
                remaining = tmpl.limits[0] - self._committed.get(tmpl.pool.name, 0.0)
                within = (tmpl.capacity <= remaining + EPS).all(axis=1)
                nodes_left = tmpl.limits[1] - sum(1 for c in self.claims if c.template is tmpl)
                if usable.any() and (nodes_left < 1 or not (usable & within).any()):
                    reasons.append(f"nodepool {tmpl.pool.name}: limits exceeded")
                    continue
                usable &= within
            if not usable.any():
                why = "no instance type's GPUs can allocate the pod's resource claims" \
                    if roomy and item.claims is not None else no_type_reason(tmpl, ok)
                reasons.append(f"nodepool {tmpl.pool.name}: {why}")
                continue
            if self.sizing == "largest" or any(r.min_values for r in reqs):
                cap = math.inf
            else:
                limit = waiting if self.sizing == "group" else max(waiting, self._queued)
                per_pod = np.where(usable, (prices + self.node_cost) / np.maximum(np.minimum(counts, limit), 1),
                                   np.inf)
                cap = float(prices[int(np.argmin(per_pod))])
            cand = np.nonzero(usable)[0]
            if not min_values_ok(tmpl, reqs, cand):
                reasons.append(f"nodepool {tmpl.pool.name}: fewer instance-type options than minValues requires")
                continue
            claim = OpenClaim(tmpl, tmpl.requirements.merge(pin), cand, base.copy(), cap, index=len(self.claims))
            self.claims.append(claim)
            self._track(claim)
            return claim, ""
        return None, "; ".join(reasons) or "no NodePool"
