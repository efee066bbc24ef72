"""Pods that take GPUs through DRA ResourceClaims, as the provisioning pass plans them.

A pod's `spec.resourceClaims` name claims (`resourceClaimName`, possibly shared by several pods) or templates
(`resourceClaimTemplateName`, one claim per pod, made by kube-controller-manager). `DraWorld` reads the cluster's
DeviceClasses, ResourceClaims, templates and published ResourceSlices once per pass and turns a pod into the claims
still to allocate (`PodClaims`); a claim already allocated pins the pod to its node.

`DraPlanner` answers, for the scheduler, whether a pod's claims fit on a node — with kube-scheduler's own
structured-parameters allocator (`kubegpu.scheduling.dra`) over the slices the node publishes (an existing node's as
published, or, for a node not up yet and for every instance type a new NodeClaim may launch, the slices kubegpu's
driver would publish for its GPUs, `dra_nodes.predicted_slices`). Device classes, CEL selectors, counts,
`allocationMode: All`, `matchAttribute` and shared counters (dynamic MIG) are all the allocator's. Allocations are
incremental as in kube-scheduler: each pod's claims against what the pods before it took on that node, per candidate
instance type of a new NodeClaim. A shared claim is allocated once, where its first pod goes; its other pods must go
there too. Pure but for `DraWorld.read`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from kubegpu.autoscaler import labels as L
from kubegpu.autoscaler.dra_nodes import predicted_slices
from kubegpu.errors import ConfigError
from kubegpu.kube.errors import NotFound
from kubegpu.kube.resources import ResourceKind, register_kind
from kubegpu.scheduling import pod_requests
from kubegpu.scheduling.dra import (
    Allocator,
    Claim,
    ClaimError,
    DeviceClass,
    DeviceId,
    ResourceSlice,
    Result,
    parse_claim,
    parse_class,
    parse_slice,
)

if TYPE_CHECKING:
    from kubegpu.autoscaler.instancetypes import InstanceType
    from kubegpu.kube import Cluster
    from kubegpu.scheduling import NodeInfo

for _kind, _plural, _namespaced in (("ResourceClaim", "resourceclaims", True),
                                    ("ResourceClaimTemplate", "resourceclaimtemplates", True),
                                    ("DeviceClass", "deviceclasses", False)):
    register_kind(ResourceKind(_kind, "resource.k8s.io", "v1", _plural, namespaced=_namespaced,
                               status_subresource=_kind == "ResourceClaim", strategic_merge=False))

PREDICTED_NODE = "predicted-node"   # the node name predicted slices of a new NodeClaim's types are built under
MAX_COUNT = 256                     # enough identical pods per node for sizing a new NodeClaim


def uses_claims(pod: Mapping[str, Any]) -> bool:
    return bool((pod.get("spec") or {}).get("resourceClaims"))


@dataclass(frozen=True)
class PodClaims:
    """What the pass must allocate for one pod: its claims not allocated yet (a shared one once), the node an
    allocated claim already binds it to, or why it cannot be planned."""

    claims: tuple[Claim, ...] = ()
    pinned: str | None = None
    problem: str = ""
    shared: frozenset[str] = frozenset()   # keys of the claims named by `resourceClaimName` (others' too, maybe)


def _key(obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata") or {}
    return f"{meta.get('namespace', 'default')}/{meta.get('name')}"


def _allocated_node(obj: Mapping[str, Any], claim: Claim) -> str | None:
    """The node an allocated claim is bound to: its allocation's node selector, else its devices' pool (our driver
    names each pool after its node)."""
    selector = (((obj.get("status") or {}).get("allocation") or {}).get("nodeSelector") or {})
    for term in selector.get("nodeSelectorTerms") or ():
        for expr in term.get("matchFields") or ():
            if expr.get("key") == "metadata.name" and len(expr.get("values") or ()) == 1:
                return str(expr["values"][0])
    pools = {r.pool for r in claim.allocation or ()}
    return next(iter(pools)) if len(pools) == 1 else None


class DraWorld:
    """The cluster's DRA objects for one pass: classes, claims, templates, published slices, devices in use."""

    def __init__(self, classes: Iterable[Mapping[str, Any]] = (), claims: Iterable[Mapping[str, Any]] = (),
                 templates: Iterable[Mapping[str, Any]] = (), slices: Iterable[Mapping[str, Any]] = ()) -> None:
        self.classes: dict[str, DeviceClass] = {}
        for index, obj in enumerate(classes):
            try:
                parsed = parse_class(obj, index)
            except ConfigError:
                continue   # a claim naming it is then refused with the allocator's "class not found"
            self.classes[parsed.name] = parsed
        # extended resources a class serves (DRAExtendedResource): `nvidia.com/gpu: 1` through `gpu.nvidia.com`
        self.extended = {c.extended_resource_name: c.name for c in self.classes.values() if c.extended_resource_name}
        self.claims = {_key(c): c for c in claims}
        self.templates = {_key(t): t for t in templates}
        self.in_use: set[DeviceId] = set()
        for obj in self.claims.values():
            for result in ((((obj.get("status") or {}).get("allocation") or {}).get("devices") or {})
                           .get("results") or ()):
                self.in_use.add(DeviceId(str(result.get("driver")), str(result.get("pool")),
                                         str(result.get("device"))))
        self.published: dict[str, list[ResourceSlice]] = {}
        for index, obj in enumerate(slices):
            node = (obj.get("spec") or {}).get("nodeName")
            if not node:
                continue
            try:
                self.published.setdefault(str(node), []).append(parse_slice(obj, index))
            except ConfigError:
                continue

    @classmethod
    def read(cls, cluster: Cluster) -> DraWorld:
        """The DRA objects of `cluster` (a kind the server does not serve reads as none)."""
        def listed(kind: str) -> list[dict[str, Any]]:
            try:
                return cluster.list(kind)
            except NotFound:
                return []
        return cls(listed("DeviceClass"), listed("ResourceClaim"), listed("ResourceClaimTemplate"),
                   listed("ResourceSlice"))

    def pod_claims(self, pod: Mapping[str, Any]) -> PodClaims:
        meta, spec = pod.get("metadata") or {}, pod.get("spec") or {}
        namespace, name = str(meta.get("namespace", "default")), str(meta.get("name"))
        generated = {str(s.get("name")): s.get("resourceClaimName")
                     for s in (pod.get("status") or {}).get("resourceClaimStatuses") or ()}
        claims: list[Claim] = []
        pinned: set[str] = set()
        shared: set[str] = set()
        for index, ref in enumerate(spec.get("resourceClaims") or ()):
            where = f"pod {namespace}/{name}: spec.resourceClaims[{index}]"
            ref_name = str(ref.get("name"))
            if ref.get("resourceClaimName"):
                obj = self.claims.get(f"{namespace}/{ref['resourceClaimName']}")
                if obj is None:
                    return PodClaims(problem=f"{where}: resourceClaim {ref['resourceClaimName']} not found")
                shared.add(f"{namespace}/{ref['resourceClaimName']}")
            elif ref.get("resourceClaimTemplateName"):
                made = generated.get(ref_name)
                obj = self.claims.get(f"{namespace}/{made}") if made else None
                if obj is None:
                    template = self.templates.get(f"{namespace}/{ref['resourceClaimTemplateName']}")
                    if template is None:
                        return PodClaims(problem=f"{where}: resourceClaimTemplate "
                                                 f"{ref['resourceClaimTemplateName']} not found")
                    obj = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                           "metadata": {"namespace": namespace, "name": f"{name}-{ref_name}"},
                           "spec": (template.get("spec") or {}).get("spec") or {}}
            else:
                continue   # neither: the API server refuses such a pod
            try:
                claim = parse_claim(obj, index)
            except ConfigError as exc:
                return PodClaims(problem=f"{where}: {exc}")
            if claim.allocation is not None:
                node = _allocated_node(obj, claim)
                if node:
                    pinned.add(node)
            else:
                claims.append(claim)
        if len(pinned) > 1:
            return PodClaims(problem=f"pod {namespace}/{name}: its claims are allocated on different nodes "
                                     f"({', '.join(sorted(pinned))})")
        return PodClaims(tuple(claims), next(iter(pinned), None), shared=frozenset(shared))


def _allocate(allocator: Allocator, node: str, claims: Sequence[Claim],
              used: Iterable[DeviceId]) -> dict[str, tuple[Result, ...]] | None:
    """The allocator's answer; a claim it refuses as written (`ClaimError`) fits nowhere (`check_claims` says why)."""
    try:
        return allocator.allocate(node, claims, used)
    except ClaimError:
        return None


def implicit_claims(world: DraWorld, pod: Mapping[str, Any], amounts: Mapping[str, float]) -> PodClaims:
    """The claim kube-scheduler makes for extended resources that no node offers but a DeviceClass serves
    (`extendedResourceName`): one request of that class per resource, for the amount asked."""
    meta = pod.get("metadata") or {}
    requests = [{"name": f"r{index}", "exactly": {"deviceClassName": world.extended[name],
                                                 "count": max(1, int(amount))}}
                for index, (name, amount) in enumerate(sorted(amounts.items()))]
    obj = {"metadata": {"namespace": meta.get("namespace", "default"), "name": f"{meta.get('name')}-extended"},
           "spec": {"devices": {"requests": requests}}}
    return PodClaims((parse_claim(obj),))


def _shape(claims: Sequence[Claim]) -> object:
    return tuple((c.requests, c.constraints) for c in claims)


@dataclass
class _Node:
    """An existing (or in-flight) node's devices as this pass allocates them."""

    allocator: Allocator
    name: str
    in_use: set[DeviceId]


@dataclass
class DraPlanner:
    """Where a pod's claims fit (module doc): existing nodes, an open NodeClaim's candidate types, a new node."""

    world: DraWorld
    type_of: Callable[[str], InstanceType | None]      # instance type by name (existing nodes' label)
    implicit: set[str] = field(default_factory=set)    # extended resources this pass serves through DRA classes
    placed: dict[str, str] = field(default_factory=dict)   # shared claim key → target it was allocated on
    _nodes: dict[str, _Node | None] = field(default_factory=dict)
    _types: dict[tuple[str, int], Allocator | None] = field(default_factory=dict)
    _claim_use: dict[tuple[int, int], frozenset[DeviceId]] = field(default_factory=dict)  # (claim, type) → in use
    _full: set[tuple[str, object]] = field(default_factory=set)   # (node, shape) that found no room: never will
    _counts: dict[tuple[int, object], np.ndarray] = field(default_factory=dict)
    _claim_full: set[tuple[int, int, object]] = field(default_factory=set)   # (claim, type, shape) with no room

    # -- a pod's claims, given what this pass allocated ---------------------------------------------------------
    def pending(self, pc: PodClaims) -> tuple[tuple[Claim, ...], str | None, str]:
        """The claims still to allocate, the target the pod must go to (a node name, or `new/<index>`), a problem."""
        targets = {f"node/{pc.pinned}"} if pc.pinned else set()
        todo = []
        for claim in pc.claims:
            target = self.placed.get(claim.key)
            if target is None:
                todo.append(claim)
            else:
                targets.add(target)
        if len(targets) > 1:
            return (), None, f"its claims are allocated on different nodes ({', '.join(sorted(targets))})"
        return tuple(todo), next(iter(targets), None), ""

    def _record(self, claims: Sequence[Claim], target: str) -> None:
        for claim in claims:
            self.placed[claim.key] = target

    # -- existing and in-flight nodes ----------------------------------------------------------------------------
    def node(self, info: NodeInfo) -> _Node | None:
        if info.name in self._nodes:
            return self._nodes[info.name]
        slices = self.world.published.get(info.name)
        if not slices:
            labels = (info.node.get("metadata") or {}).get("labels") or {}
            it = self.type_of(str(labels.get(L.INSTANCE_TYPE_LABEL, "")))
            raw = predicted_slices(info.name, it.gpu_model, it.gpu_count) if it is not None else []
            slices = [parse_slice(s, i) for i, s in enumerate(raw)]
        state = _Node(Allocator(slices, self.world.classes), info.name, set(self.world.in_use)) if slices else None
        self._nodes[info.name] = state
        if state is not None:   # pods counted on it whose claims are not allocated yet take theirs
            for pod in info.pods:
                claims, _, _ = self.pending(self.claims_of(pod))
                if claims:
                    self._allocate_on(state, claims)
        return state

    def claims_of(self, pod: Mapping[str, Any]) -> PodClaims:
        """What a pod counted on a node holds that the cluster's claims do not show: a pending (nominated) pod's
        claims, or any pod's extended resources served through a class this pass (`implicit`)."""
        if uses_claims(pod):
            return PodClaims() if (pod.get("spec") or {}).get("nodeName") else self.world.pod_claims(pod)
        if self.implicit:
            amounts = {k: v for k, v in pod_requests(pod).items() if k in self.implicit and v > 0}
            if amounts:
                return implicit_claims(self.world, pod, amounts)
        return PodClaims()

    def _allocate_on(self, state: _Node, claims: Sequence[Claim]) -> bool:
        shape = _shape(claims)
        if (state.name, shape) in self._full:
            return False
        answer = _allocate(state.allocator, state.name, claims, state.in_use)
        if answer is None:
            self._full.add((state.name, shape))
            return False
        state.in_use.update(r.id for results in answer.values() for r in results)
        self._record(claims, f"node/{state.name}")
        return True

    def onto_node(self, info: NodeInfo, pc: PodClaims) -> bool:
        """Allocate the pod's claims on this node if they fit (ClaimError: they never fit anywhere)."""
        claims, target, problem = self.pending(pc)
        if problem or (target is not None and target != f"node/{info.name}"):
            return False
        state = self.node(info)
        if state is None:
            return not claims and target is not None
        return not claims or self._allocate_on(state, claims)

    # -- a new NodeClaim's candidate instance types -----------------------------------------------------------------
    def type_allocator(self, it: InstanceType) -> Allocator | None:
        key = (it.gpu_model or "", it.gpu_count)
        if key not in self._types:
            raw = predicted_slices(PREDICTED_NODE, it.gpu_model, it.gpu_count)
            self._types[key] = Allocator([parse_slice(s, i) for i, s in enumerate(raw)], self.world.classes) \
                if raw else None
        return self._types[key]

    def onto_claim(self, index: int, types: Sequence[InstanceType], cand: np.ndarray,
                   pc: PodClaims) -> dict[int, frozenset[DeviceId]]:
        """For each candidate type of open NodeClaim `index`: the devices in use once the pod's claims are added,
        for the types where they fit (none fit: {})."""
        claims, target, problem = self.pending(pc)
        if problem or (target is not None and target != f"new/{index}"):
            return {}
        out: dict[int, frozenset[DeviceId]] = {}
        shape = _shape(claims)
        for t in cand.tolist():
            used = self._claim_use.get((index, t), frozenset())
            if not claims:
                out[t] = used
                continue
            if (index, t, shape) in self._claim_full:
                continue
            allocator = self.type_allocator(types[t])
            answer = _allocate(allocator, PREDICTED_NODE, claims, used) if allocator is not None else None
            if answer is None:
                self._claim_full.add((index, t, shape))
            else:
                out[t] = used | {r.id for results in answer.values() for r in results}
        return out

    def commit_claim(self, index: int, pc: PodClaims, allocations: Mapping[int, frozenset[DeviceId]],
                     kept: Iterable[int]) -> None:
        """The pod went onto open NodeClaim `index`, which keeps the types `kept`."""
        claims, _, _ = self.pending(pc)
        for t in kept:
            self._claim_use[(index, t)] = allocations[t]
        self._record(claims, f"new/{index}")

    def counts(self, types: Sequence[InstanceType], pc: PodClaims, limit: int) -> np.ndarray:
        """How many pods like this one (same claims, each its own copy of the unshared ones) fit on an empty node of
        each type, up to `limit`; 0 where none does. Claims shared with pods placed earlier count once. Counted to
        exhaustion once per claim shape (the devices bound it) and cut to `limit` per call."""
        claims, target, problem = self.pending(pc)
        if problem or target is not None:
            return np.zeros(len(types), dtype=np.int64)
        shared = {c.key for c in claims if c.key in pc.shared}
        memo = (id(types), (_shape(claims), tuple(sorted(shared))))
        out = self._counts.get(memo)
        if out is None:
            out = self._counts[memo] = self._exhaust(types, claims, shared)
        return np.minimum(out, max(1, limit))

    def shares(self, pc: PodClaims) -> bool:
        """Whether the pod has a claim still to allocate that other pods share (they must all fit beside it)."""
        claims, _, _ = self.pending(pc)
        return any(c.key in pc.shared for c in claims)

    def _exhaust(self, types: Sequence[InstanceType], claims: Sequence[Claim], shared: set[str]) -> np.ndarray:
        out = np.zeros(len(types), dtype=np.int64)
        for t, it in enumerate(types):
            allocator = self.type_allocator(it)
            if allocator is None:
                out[t] = MAX_COUNT if not claims else 0
                continue
            used: set[DeviceId] = set()
            for copy in range(MAX_COUNT):
                batch = [c if c.key in shared else dataclasses.replace(c, name=f"{c.name}#{copy}") for c in claims
                         if copy == 0 or c.key not in shared]
                if not batch:   # only shared claims, allocated with the first copy: the devices bound no more
                    out[t] = MAX_COUNT
                    break
                answer = _allocate(allocator, PREDICTED_NODE, batch, used)
                if answer is None:
                    break
                used.update(r.id for results in answer.values() for r in results)
                out[t] = copy + 1
        return out


def check_claims(planner: DraPlanner, pc: PodClaims) -> str:
    """Why the pod's claims can never be allocated as written (unknown class, failing CEL ...), or ""."""
    if pc.problem:
        return pc.problem
    claims, _, problem = planner.pending(pc)
    if problem:
        return problem
    try:
        Allocator([], planner.world.classes).allocate(None, claims)
    except ClaimError as exc:
        return str(exc)
    return ""
