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
LP lower bound (see benchmarks/provisioning.py). Pods with topology spread or required pod affinity (topology.py)
are placed one at a time, since each placement moves the counts the next one is judged by. Pure: no clock, no I/O.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from kubegpu.autoscaler import labels as L
from kubegpu.autoscaler.api import NodePool
from kubegpu.autoscaler.instancetypes import InstanceType, Offering
from kubegpu.autoscaler.requirements import Requirement, Requirements, pod_requirement_options
from kubegpu.autoscaler.topology import PodTopology, TopologyCounts, Verdict, pod_topology
from kubegpu.errors import ConfigError, KubegpuError
from kubegpu.scheduling import NodeInfo, container_requests, fits, parse_quantity, pod_requests, tolerates

EPS = 1e-9
MAX_INSTANCE_TYPES = 600
GPU_PREFIX = "nvidia.com/"
CapacityFn = Callable[[NodePool, InstanceType], Mapping[str, float]]
# How a new NodeClaim's price is capped when it opens: at the type with the lowest price per pod for the identical
# pods waiting ("group") or for every pod still queued ("queue"), or not at all ("largest", Karpenter's behaviour).
SIZINGS = ("group", "queue", "largest")


def default_capacity(_pool: NodePool, it: InstanceType) -> Mapping[str, float]:
    return it.allocatable


@dataclass
class ClaimPlan:
    """A NodeClaim the pass decided to create: where it comes from, what it launches, and for whom."""

    nodepool: str
    instance_type: str
    offering: Offering
    pods: list[dict[str, Any]]
    requests: dict[str, float]
    requirements: Requirements
    instance_type_options: list[str]
    allocatable: dict[str, float]
    capacity: dict[str, float]

    @property
    def price(self) -> float:
        return self.offering.price


@dataclass
class SchedulingResult:
    claims: list[ClaimPlan] = field(default_factory=list)
    existing: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # node name → pods placed there
    unschedulable: dict[str, str] = field(default_factory=dict)              # "ns/name" → reason
    unschedulable_pods: list[dict[str, Any]] = field(default_factory=list)

    @property
    def cost(self) -> float:
        return sum(c.price for c in self.claims)


def pod_key(pod: Mapping[str, Any]) -> str:
    meta = pod.get("metadata") or {}
    return f"{meta.get('namespace', 'default')}/{meta.get('name', '?')}"


@dataclass
class _Pod:
    pod: dict[str, Any]
    requests: dict[str, float]
    options: list[Requirements]
    tolerations: list[dict[str, Any]]
    anti_key: str | None
    shape: str
    topo: PodTopology | None = None
    rule_key: str = ""   # what decides placement besides the requests (pods with topology terms only)


def _anti_affinity_key(pod: Mapping[str, Any]) -> str | None:
    """Required hostname anti-affinity: pods sharing this key never share a node."""
    terms = (((pod.get("spec") or {}).get("affinity") or {}).get("podAntiAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution") or []
    keys = [json.dumps(t.get("labelSelector") or {}, sort_keys=True) for t in terms
            if t.get("topologyKey") == L.HOSTNAME_LABEL]
    return "|".join(sorted(keys)) or None


def _selector_matches(selector_json: str, labels: Mapping[str, str]) -> bool:
    for part in selector_json.split("|"):
        match = json.loads(part).get("matchLabels") or {}
        if match and all(labels.get(k) == v for k, v in match.items()):
            return True
    return False


def _prepare(pod: dict[str, Any]) -> _Pod:
    """Parse a pod once; ConfigError naming the pod when its resources or node affinity cannot be read."""
    spec = pod.get("spec") or {}
    try:
        requests = pod_requests(pod)
        _reject_negative(pod)
    except (TypeError, AttributeError, ValueError) as exc:  # a spec of the wrong shape, not a bad quantity
        raise ConfigError(f"pod {pod_key(pod)}: spec / containers / resources: cannot be read "
                          f"({type(exc).__name__}: {exc})") from None
    try:
        tolerations = list(spec.get("tolerations") or [])
        if not all(isinstance(t, dict) for t in tolerations):
            raise TypeError("every toleration must be a mapping")
        anti = _anti_affinity_key(pod)
        options = pod_requirement_options(pod)
        shape = json.dumps([sorted(requests.items()), spec.get("nodeSelector"), spec.get("affinity"), tolerations,
                            anti], sort_keys=True, default=str)
        topo = pod_topology(pod)
        rule_key = ""
        if topo is not None:
            rule_key = json.dumps([spec.get("nodeSelector"), spec.get("affinity"), tolerations, anti],
                                  sort_keys=True, default=str) + topo.signature()
            shape += rule_key
    except (ValueError, KeyError, TypeError, AttributeError, StopIteration) as exc:
        raise ConfigError(f"pod {pod_key(pod)}: spec.affinity / nodeSelector / tolerations: cannot be read "
                          f"({type(exc).__name__}: {exc})") from None
    return _Pod(pod, requests, options, tolerations, anti, shape, topo, rule_key)


def _reject_negative(pod: dict[str, Any]) -> None:
    """The API server refuses negative quantities; a summed total could hide one, so look per container."""
    spec = pod.get("spec") or {}
    for kind in ("containers", "initContainers"):
        for index, container in enumerate(spec.get(kind) or ()):
            for name, amount in container_requests(container).items():
                if amount < 0:
                    raise ConfigError(f"pod {pod_key(pod)}: spec.{kind}[{index}].resources.{name}: "
                                      f"must not be negative")


def pod_problem(pod: dict[str, Any]) -> str | None:
    """Why the provisioner cannot read this pod (one line), or None."""
    try:
        _prepare(pod)
    except KubegpuError as exc:
        return str(exc)
    return None


def _queue_order(item: _Pod) -> tuple[Any, ...]:
    gpu = sum(v for k, v in item.requests.items() if k.startswith(GPU_PREFIX))
    meta = item.pod.get("metadata") or {}
    return (-(gpu > 0), -item.requests.get("cpu", 0.0), -item.requests.get("memory", 0.0),
            str(meta.get("creationTimestamp", "")), str(meta.get("uid", "")), pod_key(item.pod))


class _Template:
    """One NodePool as the solver sees it: requirements, taints, candidate types as matrices, limits."""

    def __init__(self, pool: NodePool, types: Sequence[InstanceType], capacity_fn: CapacityFn,
                 index: dict[str, int], usage: Mapping[str, float], daemonsets: Sequence[dict[str, Any]]) -> None:
        self.pool = pool
        tmpl = pool.spec.template
        self.requirements = Requirements.from_api(
            [r.model_dump(exclude_none=True) for r in tmpl.spec.requirements]
        ).merge(Requirements.from_labels({**tmpl.metadata.labels, L.NODEPOOL_LABEL: pool.name}))
        self.taints = [t.model_dump(exclude_none=True) for t in tmpl.spec.taints]
        self.index = index
        allocs = [dict(capacity_fn(pool, it)) for it in types]
        self.types = list(types)
        self.alloc = self._matrix(allocs)
        self.capacity = self._matrix([{**it.capacity, **a} for it, a in zip(types, allocs, strict=True)])
        self.daemon = self._vector(self._daemon_overhead(daemonsets))
        self.limits = self._limits(usage)
        self._masks: dict[Requirements, tuple[np.ndarray, np.ndarray]] = {}

    def _matrix(self, rows: Sequence[Mapping[str, float]]) -> np.ndarray:
        out = np.zeros((len(rows), len(self.index)))
        for i, row in enumerate(rows):
            for name, value in row.items():
                j = self.index.get(name)
                if j is not None:
                    out[i, j] = value
        return out

    def _vector(self, amounts: Mapping[str, float]) -> np.ndarray:
        out = np.zeros(len(self.index))
        for name, value in amounts.items():
            if name in self.index:
                out[self.index[name]] = value
        return out

    def _daemon_overhead(self, daemonsets: Sequence[dict[str, Any]]) -> dict[str, float]:
        """One pod per DaemonSet that would land on this pool's nodes (tolerates its taints, selectors agree)."""
        total: dict[str, float] = {}
        for ds in daemonsets:
            template = ((ds.get("spec") or {}).get("template")) or {}
            pod = {"metadata": template.get("metadata") or {}, "spec": template.get("spec") or {}}
            tolerations = pod["spec"].get("tolerations") or []
            if not all(tolerates(tolerations, t) for t in self.taints):
                continue
            if not any(self.requirements.conflict(opt) is None for opt in pod_requirement_options(pod)):
                continue
            for name, value in pod_requests(pod).items():
                total[name] = total.get(name, 0.0) + value
        return total

    def _limits(self, usage: Mapping[str, float]) -> tuple[np.ndarray, float] | None:
        """Remaining limit per resource (inf where unlimited) and remaining node count."""
        limits = self.pool.spec.limits
        if not limits:
            return None
        remaining = np.full(len(self.index), np.inf)
        nodes = math.inf
        for name, value in limits.items():
            left = parse_quantity(value) - usage.get(name, 0.0)
            if name == "nodes":
                nodes = left
            elif name in self.index:
                remaining[self.index[name]] = left
        return remaining, nodes

    def type_mask(self, reqs: Requirements) -> tuple[np.ndarray, np.ndarray]:
        """Which types suit `reqs` (labels and an available offering) and each one's cheapest suitable price."""
        cached = self._masks.get(reqs)
        if cached is not None:
            return cached
        zone = reqs.get(L.ZONE_LABEL)
        ctype = reqs.get(L.CAPACITY_TYPE_LABEL) or reqs.get("karpenter.sh/capacity-type")
        ok = np.zeros(len(self.types), dtype=bool)
        prices = np.full(len(self.types), np.inf)
        for i, it in enumerate(self.types):
            if not _labels_ok(reqs, it.labels):
                continue
            offer = it.cheapest_offering(lambda o, z=zone, c=ctype: (z is None or z.has(o.zone))
                                         and (c is None or c.has(o.capacity_type)))
            if offer is not None:
                ok[i] = True
                prices[i] = offer.price
        self._masks[reqs] = (ok, prices)
        return ok, prices


INSTANCE_LABELS = frozenset({
    L.INSTANCE_TYPE_LABEL, L.ARCH_LABEL, L.OS_LABEL, L.INSTANCE_FAMILY_LABEL, L.INSTANCE_SIZE_LABEL,
    L.INSTANCE_CPU_LABEL, L.INSTANCE_MEMORY_LABEL, L.INSTANCE_GPU_COUNT_LABEL, L.GPU_PRODUCT_LABEL, L.GPU_COUNT_LABEL,
})


def _labels_ok(reqs: Requirements, labels: Mapping[str, str]) -> bool:
    """Whether an instance type's labels meet `reqs`; a label the type lacks fails a positive requirement on it."""
    for req in reqs:
        value = labels.get(req.key)
        if value is None:
            if req.key in INSTANCE_LABELS and req.needs_label:
                return False
        elif not req.has(value):
            return False
    return True


def _min_values_ok(tmpl: _Template, reqs: Requirements, cand: np.ndarray) -> bool:
    """Karpenter's minValues: the NodeClaim must keep at least N distinct values of the key among its options."""
    for req in reqs:
        if not req.min_values:
            continue
        values: set[str] = set()
        for i in cand[:MAX_INSTANCE_TYPES].tolist():
            it = tmpl.types[i]
            if req.key in (L.ZONE_LABEL, L.CAPACITY_TYPE_LABEL):
                values.update(o.zone if req.key == L.ZONE_LABEL else o.capacity_type for o in it.offerings
                              if o.available and req.has(o.zone if req.key == L.ZONE_LABEL else o.capacity_type))
            elif req.key in it.labels:
                values.add(it.labels[req.key])
        if len(values) < req.min_values:
            return False
    return True


@dataclass
class _Claim:
    template: _Template
    requirements: Requirements
    cand: np.ndarray       # indices into template.types still possible
    used: np.ndarray
    price_cap: float
    pods: list[dict[str, Any]] = field(default_factory=list)
    anti_keys: set[str] = field(default_factory=set)
    never: set[str] = field(default_factory=set)   # rule keys of pods this claim can never take (see _try_claim)
    committed: np.ndarray | None = None   # capacity counted against the pool's limits
    index: int = 0


def _fit_counts(alloc: np.ndarray, used: np.ndarray, vec: np.ndarray) -> np.ndarray:
    """How many more pods of request `vec` each row could take on top of `used`."""
    need = vec > 0
    headroom = alloc[:, need] - used[need]
    if headroom.shape[1] == 0:
        return np.full(alloc.shape[0], 10**9)
    counts = np.floor((headroom + EPS) / vec[need]).min(axis=1)
    return np.maximum(counts, 0).astype(np.int64)


class Scheduler:
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
    ) -> None:
        if sizing not in SIZINGS:
            raise ValueError(f"sizing must be one of {SIZINGS}")
        self.sizing = sizing
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
            _Template(p, instance_types.get(p.name, ()), capacity_fn, self.index, (usage or {}).get(p.name, {}),
                      daemonsets)
            for p in pools
        ]
        self.claims: list[_Claim] = []
        self._headroom = np.full((0, len(self.index)), -np.inf)
        self._pod_counts = np.zeros(0, dtype=np.int64)   # pods per claim, for the fewest-pods-first order
        self._queued = 0
        self._committed: dict[str, np.ndarray] = {}
        self._committed_nodes: dict[str, int] = {}
        self._topology = TopologyCounts(frozenset())
        self._pool_zones: dict[str, set[str]] = {}

    # -- public ---------------------------------------------------------------------------------------------
    def solve(self, pods: Iterable[dict[str, Any]]) -> SchedulingResult:
        result = SchedulingResult()
        queue = sorted((_prepare(p) for p in pods), key=_queue_order)
        self._start_topology(queue)
        start = 0
        while start < len(queue):
            end = start + 1
            while end < len(queue) and queue[end].shape == queue[start].shape:
                end += 1
            self._queued = len(queue) - start
            self._place_group(queue[start:end], result)
            start = end
        result.claims = [plan for plan in (self._finalize(c) for c in self.claims) if plan is not None]
        return result

    # -- placement --------------------------------------------------------------------------------------------
    def _place_group(self, group: list[_Pod], result: SchedulingResult) -> None:
        rep = group[0]
        missing = [name for name in rep.requests if name not in self.index and rep.requests[name] > 0]
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
    def _start_topology(self, queue: Sequence[_Pod]) -> None:
        """Zone domains: those the NodePools can launch in plus those of existing nodes; count existing pods."""
        self._pool_zones = {tmpl.pool.name: self._template_zones(tmpl) for tmpl in self.templates}
        zones = {z for found in self._pool_zones.values() for z in found}
        zones.update(z for z in (_node_zone(info) for info in self.existing) if z)
        self._topology = TopologyCounts.for_pods(zones, (item.topo for item in queue))
        for info in self.existing:
            for pod in info.pods:
                self._topology.record(pod, _node_zone(info), info.name)

    def _template_zones(self, tmpl: _Template) -> set[str]:
        allowed = tmpl.requirements.get(L.ZONE_LABEL)
        return {o.zone for it in tmpl.types for o in it.offerings
                if o.available and (allowed is None or allowed.has(o.zone))}

    def _zone_pin(self, item: _Pod, reqs: Requirements, tmpl: _Template) -> tuple[Requirements | None, Verdict]:
        """The zone requirement the pod's topology adds under `reqs` (empty when none), or None and why not."""
        if item.topo is None or not item.topo.zonal:
            return Requirements(), Verdict.OK
        zone, verdict = self._topology.zone_choice(item.topo, self._zones_under(reqs, tmpl), _pod_zones(item))
        if zone is None:
            return None, verdict
        return Requirements([Requirement.of(L.ZONE_LABEL, "In", [zone])]), Verdict.OK

    def _zones_under(self, reqs: Requirements, tmpl: _Template) -> set[str]:
        allowed = reqs.get(L.ZONE_LABEL)
        return {z for z in self._pool_zones[tmpl.pool.name] if allowed is None or allowed.has(z)}

    @staticmethod
    def _claim_host(claim: _Claim) -> str:
        """The hostname domain of a NodeClaim opened in this pass (existing nodes use their node names)."""
        return f"new-nodeclaim/{claim.index}"

    def _record_on_claim(self, claim: _Claim, pods: Sequence[_Pod]) -> None:
        zone = claim.requirements.get(L.ZONE_LABEL)
        single = next(iter(zone.values)) if zone is not None and not zone.complement and len(zone.values) == 1 \
            else None
        for item in pods:
            self._topology.record(item.pod, single, self._claim_host(claim))

    def _place_each(self, group: list[_Pod], result: SchedulingResult, vec: np.ndarray | None) -> None:
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

    def _share(self, item: _Pod, waiting: int) -> int:
        """How many of the waiting identical pods one new NodeClaim can expect (sizes its price cap)."""
        assert item.topo is not None
        limit = item.topo.per_host_limit
        if item.anti_key:
            return 1
        if limit is not None:
            return min(limit, waiting)
        spread = any(t.max_skew is not None and t.key == L.ZONE_LABEL for t in item.topo.terms)
        return max(1, math.ceil(waiting / max(len(self._topology.zones), 1))) if spread else waiting

    def _claim_pool(self, vec: np.ndarray) -> list[_Claim]:
        return [self.claims[i] for i in self._fewest_pods_first(vec)]

    def _fewest_pods_first(self, vec: np.ndarray) -> list[int]:
        """Indices of the claims whose best headroom fits `vec`, fewest pods first, then in opening order."""
        count = len(self.claims)
        possible = np.nonzero((self._headroom[:count] >= vec - EPS).all(axis=1))[0]
        ordered: list[int] = possible[np.argsort(self._pod_counts[possible], kind="stable")].tolist()
        return ordered

    def _onto_pool(self, item: _Pod, vec: np.ndarray, pool: list[_Claim]) -> bool:
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

    def _try_claim(self, claim: _Claim, item: _Pod, vec: np.ndarray) -> Verdict:
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

    def _onto_existing_one(self, item: _Pod, result: SchedulingResult) -> bool:
        """The first existing/in-flight node whose hostname and zone counts admit the pod and that fits it."""
        assert item.topo is not None
        for info in self.existing:
            labels = (info.node.get("metadata") or {}).get("labels") or {}
            if item.anti_key and any(_selector_matches(item.anti_key, (p.get("metadata") or {}).get("labels") or {})
                                     for p in info.pods):
                continue
            if self._topology.host_verdict(item.topo, info.name) is not Verdict.OK:
                continue
            zone = labels.get(L.ZONE_LABEL)
            if item.topo.zonal:
                chosen, _ = self._topology.zone_choice(item.topo, [zone] if zone else [], _pod_zones(item))
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

    def _unschedulable(self, pods: Sequence[_Pod], result: SchedulingResult, why: str) -> None:
        for item in pods:
            result.unschedulable[pod_key(item.pod)] = why
            result.unschedulable_pods.append(item.pod)

    def _onto_existing(self, pods: list[_Pod], result: SchedulingResult) -> list[_Pod]:
        if not self.existing:
            return pods
        rep = pods[0]
        for info in self.existing:
            if not pods:
                break
            if rep.anti_key and any(_selector_matches(rep.anti_key, (p.get("metadata") or {}).get("labels") or {})
                                    for p in info.pods):
                continue
            placed = 0
            while placed < len(pods) and fits(pods[placed].pod, info, pods[placed].requests).ok:
                info.add_pod(pods[placed].pod, pods[placed].requests)
                result.existing.setdefault(info.name, []).append(pods[placed].pod)
                self._topology.record(pods[placed].pod, _node_zone(info), info.name)
                placed += 1
                if rep.anti_key:
                    break
            pods = pods[placed:]
        return pods

    def _onto_open_claims(self, pods: list[_Pod], vec: np.ndarray) -> list[_Pod]:
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

    def _track(self, claim: _Claim) -> None:
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

    def _admits(self, tmpl: _Template, item: _Pod) -> bool:
        return all(tolerates(item.tolerations, t) for t in tmpl.taints)

    def _merged(self, reqs: Requirements, item: _Pod) -> Requirements | None:
        for option in item.options:
            if reqs.conflict(option) is None:
                return reqs.merge(option)
        return None

    def _allowed(self, claim: _Claim, reqs: Requirements) -> np.ndarray:
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

    def _add_to_claim(self, claim: _Claim, pods: list[_Pod], vec: np.ndarray,
                      pin: Requirements | None = None) -> list[_Pod]:
        rep = pods[0]
        reqs = self._merged(claim.requirements, rep)
        if reqs is None:
            return pods
        if pin is not None:
            reqs = reqs.merge(pin)
        cand = self._allowed(claim, reqs)
        if cand.size == 0:
            return pods
        counts = _fit_counts(claim.template.alloc[cand], claim.used, vec)
        take = int(min(counts.max(initial=0), len(pods)))
        if rep.anti_key or rep.topo is not None:
            take = min(take, 1)
        while take > 0 and not _min_values_ok(claim.template, reqs, cand[counts >= take]):
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

    def _commit(self, claim: _Claim) -> None:
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

    def _open_claim(self, item: _Pod, vec: np.ndarray, waiting: int) -> tuple[_Claim | None, str]:
        reasons: list[str] = []
        for tmpl in self.templates:
            why = self._why_not(tmpl, item)
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
            counts = _fit_counts(tmpl.alloc, base, vec)
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
                reasons.append(f"nodepool {tmpl.pool.name}: {self._no_type_reason(tmpl, ok, counts)}")
                continue
            if self.sizing == "largest" or any(r.min_values for r in reqs):
                cap = math.inf
            else:
                limit = waiting if self.sizing == "group" else max(waiting, self._queued)
                per_pod = np.where(usable, prices / np.maximum(np.minimum(counts, limit), 1), np.inf)
                cap = float(prices[int(np.argmin(per_pod))])
            cand = np.nonzero(usable)[0]
            if not _min_values_ok(tmpl, reqs, cand):
                reasons.append(f"nodepool {tmpl.pool.name}: fewer instance-type options than minValues requires")
                continue
            claim = _Claim(tmpl, tmpl.requirements.merge(pin), cand, base.copy(), cap, index=len(self.claims))
            self.claims.append(claim)
            self._track(claim)
            return claim, ""
        return None, "; ".join(reasons) or "no NodePool"

    def _why_not(self, tmpl: _Template, item: _Pod) -> str | None:
        for taint in tmpl.taints:
            if not tolerates(item.tolerations, taint):
                return f"taint {taint['key']}={taint.get('value', '')}:{taint['effect']} not tolerated"
        conflicts = [tmpl.requirements.conflict(opt) for opt in item.options]
        if all(c is not None for c in conflicts):
            return f"incompatible requirements ({conflicts[0]})"
        return None

    def _no_type_reason(self, tmpl: _Template, ok: np.ndarray, counts: np.ndarray) -> str:
        if not tmpl.types:
            return "no instance types"
        if not ok.any():
            return "no instance type with an available offering matches the requirements"
        return "no instance type fits the requests plus daemonset overhead"

    # -- finalize ---------------------------------------------------------------------------------------------
    def _finalize(self, claim: _Claim) -> ClaimPlan | None:
        if not claim.pods:
            return None
        tmpl = claim.template
        ok, prices = tmpl.type_mask(claim.requirements)
        cand = claim.cand[ok[claim.cand]]
        if cand.size == 0:
            return None
        order = cand[np.argsort(prices[cand], kind="stable")][:MAX_INSTANCE_TYPES]
        best = tmpl.types[int(order[0])]
        zone = claim.requirements.get(L.ZONE_LABEL)
        ctype = claim.requirements.get(L.CAPACITY_TYPE_LABEL)
        offering = best.cheapest_offering(lambda o: (zone is None or zone.has(o.zone))
                                          and (ctype is None or ctype.has(o.capacity_type)))
        if offering is None:  # pragma: no cover - the mask guarantees one
            raise KubegpuError(f"instance type {best.name} lost its offering")
        names = {v: k for k, v in self.index.items()}
        requests = {names[i]: float(v) for i, v in enumerate(claim.used) if v > 0}
        row = tmpl.alloc[int(order[0])]
        cap_row = tmpl.capacity[int(order[0])]
        return ClaimPlan(
            nodepool=tmpl.pool.name,
            instance_type=best.name,
            offering=offering,
            pods=claim.pods,
            requests=requests,
            requirements=claim.requirements,
            instance_type_options=[tmpl.types[int(i)].name for i in order],
            allocatable={names[i]: float(v) for i, v in enumerate(row) if v > 0},
            capacity={names[i]: float(v) for i, v in enumerate(cap_row) if v > 0},
        )


def _node_zone(info: NodeInfo) -> str | None:
    zone = ((info.node.get("metadata") or {}).get("labels") or {}).get(L.ZONE_LABEL)
    return str(zone) if zone is not None else None


def _pod_zones(item: _Pod) -> set[str] | None:
    """The zones the pod's own node affinity allows (its first option), for the spread minimum; None: all."""
    zone = item.options[0].get(L.ZONE_LABEL) if item.options else None
    if zone is None or zone.complement:
        return None
    return set(zone.values)
