"""NodePools as the provisioning simulation sees them (requirements, taints, instance types as matrices, limits),
the NodeClaims a pass opens, and what a pass returns.

Split from scheduler.py: these are the data the solver works on; scheduler.py is the order in which it places pods.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from kubegpu.autoscaler import labels as L
from kubegpu.autoscaler.api import NodePool
from kubegpu.autoscaler.instancetypes import InstanceType, Offering
from kubegpu.autoscaler.pending import PendingPod
from kubegpu.autoscaler.requirements import Requirements, pod_requirement_options
from kubegpu.errors import KubegpuError
from kubegpu.scheduling import parse_quantity, pod_requests, tolerates

EPS = 1e-9
MAX_INSTANCE_TYPES = 600
CapacityFn = Callable[[NodePool, InstanceType], Mapping[str, float]]


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


class NodeTemplate:
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
            if not labels_ok(reqs, it.labels):
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
}) | L.AWS_INSTANCE_TYPE_LABELS


def labels_ok(reqs: Requirements, labels: Mapping[str, str]) -> bool:
    """Whether an instance type's labels meet `reqs`; a label the type lacks fails a positive requirement on it."""
    return all(req.admits(labels.get(req.key), absent_fails=req.key in INSTANCE_LABELS) for req in reqs)


def min_values_ok(tmpl: NodeTemplate, reqs: Requirements, cand: np.ndarray) -> bool:
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
class OpenClaim:
    template: NodeTemplate
    requirements: Requirements
    cand: np.ndarray       # indices into template.types still possible
    used: np.ndarray
    price_cap: float
    pods: list[dict[str, Any]] = field(default_factory=list)
    anti_keys: set[str] = field(default_factory=set)
    never: set[str] = field(default_factory=set)   # rule keys of pods this claim can never take (see _try_claim)
    committed: np.ndarray | None = None   # capacity counted against the pool's limits
    index: int = 0


def fit_counts(alloc: np.ndarray, used: np.ndarray, vec: np.ndarray) -> np.ndarray:
    """How many more pods of request `vec` each row could take on top of `used`."""
    need = vec > 0
    headroom = alloc[:, need] - used[need]
    if headroom.shape[1] == 0:
        return np.full(alloc.shape[0], 10**9)
    counts = np.floor((headroom + EPS) / vec[need]).min(axis=1)
    return np.maximum(counts, 0).astype(np.int64)


def why_not(tmpl: NodeTemplate, item: PendingPod) -> str | None:
    """Why a NodePool can never take this pod (a taint it does not tolerate, requirements that conflict), or None."""
    for taint in tmpl.taints:
        if not tolerates(item.tolerations, taint):
            return f"taint {taint['key']}={taint.get('value', '')}:{taint['effect']} not tolerated"
    conflicts = [tmpl.requirements.conflict(opt) for opt in item.options]
    if all(c is not None for c in conflicts):
        return f"incompatible requirements ({conflicts[0]})"
    return None

def no_type_reason(tmpl: NodeTemplate, ok: np.ndarray) -> str:
    if not tmpl.types:
        return "no instance types"
    if not ok.any():
        return "no instance type with an available offering matches the requirements"
    return "no instance type fits the requests plus daemonset overhead"

def finalize_claim(claim: OpenClaim, index: Mapping[str, int]) -> ClaimPlan | None:
    """The NodeClaim an open claim becomes: the cheapest instance type still possible, and the others as options."""
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
    names = {v: k for k, v in index.items()}
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
