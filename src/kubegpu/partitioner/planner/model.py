"""The planner's vocabulary: what a planner is given (nodes, GPUs, instances), what it returns (a Plan), and the
checks every plan must pass, whichever planner made it. Shared by the greedy and the exact planner so the
controller, the agent, the simulator and the benchmark never care which one ran.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from kubegpu.gpu.catalog import GpuModel
from kubegpu.gpu.geometry import PlacedInstance, layout_errors
from kubegpu.scheduling import NodeInfo, fits, parse_quantity, pod_key, pod_requests
from kubegpu.sharing.names import (
    GPU_MEMORY_RESOURCE,
    mig_profile_of,
    mig_resource_name,
    mps_slice_resource_name,
    mps_slice_size_of,
)

Mode = Literal["mig", "mps"]
UNLIMITED = 1e18  # allocatable for resources a planner input does not describe (a state file without allocatable)


def is_partition_resource(resource: str) -> bool:
    """True for the resources the partitioner can create: MIG profiles and MPS memory slices."""
    return mig_profile_of(resource) is not None or mps_slice_size_of(resource) is not None


def mps_resource(size_gb: int) -> str:
    return mps_slice_resource_name(size_gb)


def mig_resource(model: GpuModel, profile_id: int) -> str:
    return mig_resource_name(model.profile(profile_id).name)


# ---------------------------------------------------------------------------------------------------------------
# Inputs and outputs


@dataclass(frozen=True)
class CurrentInstance:
    """A MIG instance as the node reports it: its placement and whether a container holds it."""

    profile_id: int
    start: int
    used: bool = False


@dataclass(frozen=True)
class MpsSlice:
    """An MPS memory slice (`nvidia.com/gpu-<N>gb`) as the node reports it."""

    size_gb: int
    used: bool = False


@dataclass(frozen=True)
class GpuInput:
    index: int
    model_key: str
    model: GpuModel | None  # None: not in the catalog, the GPU is left alone and reported
    instances: tuple[CurrentInstance, ...] = ()
    slices: tuple[MpsSlice, ...] = ()
    frozen: bool = False  # its free instances may serve pods, but its layout must not change


@dataclass(frozen=True)
class NodeInput:
    """A partitionable node: `node` is a Node dict (labels, taints, non-GPU allocatable) for the scheduling fit,
    `pods` the pods already bound to it (their non-GPU requests still count)."""

    name: str
    mode: Mode
    node: dict[str, Any]
    gpus: tuple[GpuInput, ...]
    pods: tuple[dict[str, Any], ...] = ()


@dataclass(frozen=True)
class GpuPlan:
    index: int
    model_key: str
    instances: tuple[PlacedInstance, ...] = ()  # MIG: the whole new layout, sorted by start
    slices: tuple[int, ...] = ()  # MPS: the whole new list of slice sizes (GB)
    created: int = 0
    destroyed: int = 0
    error: str | None = None  # why this GPU was left as it is

    @property
    def changed(self) -> bool:
        return self.created + self.destroyed > 0


@dataclass(frozen=True)
class NodePlan:
    name: str
    mode: Mode
    gpus: tuple[GpuPlan, ...]

    @property
    def changed(self) -> bool:
        return any(g.changed for g in self.gpus)


@dataclass
class Plan:
    nodes: dict[str, NodePlan]
    assignments: dict[str, str]  # pod key ("namespace/name") → node it now fits on
    unschedulable: dict[str, str]  # pod key → reason
    pod_names: dict[str, str] = field(default_factory=dict)  # pod key → name
    impossible: frozenset[str] = frozenset()  # unschedulable whatever the layout: no GPU offers what they ask
    planner: str = "greedy"  # which planner produced the plan: "exact" or "greedy"
    optimal: bool = False  # proven optimal (the exact planner finished within its time limit)
    bound: int | None = None  # exact planner: upper bound on `score` over every possible plan
    score: int | None = None  # priority-weighted pods made schedulable (a pod outweighs all lower-priority ones)
    note: str = ""  # how the plan was found, one line (solver status, fallback)

    @property
    def created(self) -> int:
        return sum(g.created for n in self.nodes.values() for g in n.gpus)

    @property
    def destroyed(self) -> int:
        return sum(g.destroyed for n in self.nodes.values() for g in n.gpus)

    def schedulable_names(self) -> list[str]:
        return [self.pod_names.get(k, k) for k in self.assignments]

    def unschedulable_names(self) -> list[str]:
        return [self.pod_names.get(k, k) for k in self.unschedulable]


def pod_priority(pod: Mapping[str, Any]) -> int:
    return int((pod.get("spec") or {}).get("priority") or 0)


def mps_size(resource: str) -> int | None:
    """The slice size in GB of `nvidia.com/gpu-<N>gb`, None for any other resource."""
    return mps_slice_size_of(resource)


_BOUND_MEMO: dict[int, tuple[Mapping[str, Any], Any, dict[str, float]]] = {}
_BOUND_MEMO_SIZE = 200_000  # entries kept before the memo starts over (a fleet's bound pods, with room)


def bound_requests(pod: Mapping[str, Any]) -> Mapping[str, float]:
    """`pod_requests` of a pod bound to a node, memoised by the pod object's identity and resourceVersion: the
    controller hands the planner the same bound-pod objects plan after plan, and parsing them all again was most of
    a small plan's time on a large cluster. The memo holds the pod itself, so its id is not reused while cached;
    an updated pod (new resourceVersion or a new object) is parsed again. Callers must not change the result."""
    version = (pod.get("metadata") or {}).get("resourceVersion")
    found = _BOUND_MEMO.get(id(pod))
    if found is not None and found[0] is pod and found[1] == version:
        return found[2]
    requests = pod_requests(pod)
    if len(_BOUND_MEMO) >= _BOUND_MEMO_SIZE:
        _BOUND_MEMO.clear()
    _BOUND_MEMO[id(pod)] = (pod, version, requests)
    return requests


_BASE_MEMO: dict[tuple[Any, ...], tuple[NodeInput, NodeInfo]] = {}
_BASE_MEMO_SIZE = 20_000  # entries kept before the memo starts over (a fleet's nodes, with room for changes)


def base_view(node: NodeInput) -> NodeInfo:
    """`scheduling_view(node, [], [])`, memoised by the Node object, its allocatable and its bound pods (identity and
    resourceVersion): the controller hands the planner the same objects plan after plan, and every plan rebuilt
    every node's view. The memo holds the NodeInput it was made from, so the ids in its key are not reused while it
    is cached. Shared: callers must copy before changing it (the planners only read it)."""
    status_alloc = (node.node.get("status") or {}).get("allocatable")
    key = (id(node.node), None if status_alloc is None else tuple(status_alloc.items()),
           tuple((id(p), (p.get("metadata") or {}).get("resourceVersion")) for p in node.pods))
    found = _BASE_MEMO.get(key)
    if found is not None:
        return found[1]
    view = scheduling_view(node, [], [])
    if len(_BASE_MEMO) >= _BASE_MEMO_SIZE:
        _BASE_MEMO.clear()
    _BASE_MEMO[key] = (node, view)
    return view


def scheduling_view(node: NodeInput, gpus: Sequence[GpuPlan], used: Sequence[Mapping[str, int]]) -> NodeInfo:
    """A NodeInfo whose partition resources are the instances of `gpus` not in use.

    Non-GPU resources come from the Node's allocatable minus the pods already bound there; a node that states no
    allocatable (a state file) is unconstrained on them.
    """
    models = {g.model_key: g for g in node.gpus}
    allocatable: dict[str, float] = {}
    status_alloc = (node.node.get("status") or {}).get("allocatable")
    if status_alloc is None:
        allocatable.update({"cpu": UNLIMITED, "memory": UNLIMITED, "ephemeral-storage": UNLIMITED,
                            "pods": UNLIMITED})
    for gpu_plan, used_counts in zip(gpus, used, strict=True):
        model = models[gpu_plan.model_key].model if gpu_plan.model_key in models else None
        counts: Counter[str] = Counter()
        if node.mode == "mig" and model is not None:
            counts.update(mig_resource(model, i.profile_id) for i in gpu_plan.instances)
        counts.update(mps_resource(gb) for gb in gpu_plan.slices)
        counts.subtract(used_counts)
        for resource, n in counts.items():
            allocatable[resource] = allocatable.get(resource, 0.0) + max(0, n)
    info = NodeInfo(node=node.node, allocatable=allocatable, requested={}, pods=[])
    if status_alloc is not None:
        for key, value in status_alloc.items():
            if not is_partition_resource(key):
                info.allocatable[key] = parse_quantity(value)
    # the quota charge fits wherever the GPU resources do (docs/quotas.md); the node's figure is for its current cut
    info.allocatable[GPU_MEMORY_RESOURCE] = UNLIMITED
    for pod in node.pods:
        info.add_pod(pod, bound_requests(pod))
    for key in [k for k in info.requested if is_partition_resource(k) or k == GPU_MEMORY_RESOURCE]:
        del info.requested[key]  # bound pods hold the instances marked used, which allocatable already omits
    return info


# ---------------------------------------------------------------------------------------------------------------
# Checking a plan (used by the property tests and the benchmark, and cheap enough to run after every plan)


def plan_violations(nodes: Sequence[NodeInput], pods: Sequence[dict[str, Any]], result: Plan) -> list[str]:
    """What is wrong with `result`, recounted from scratch: illegal layouts, moved in-use instances, pods called
    schedulable that do not fit the new allocatable. Empty when the plan is sound."""
    problems: list[str] = []
    by_key = {pod_key(p): p for p in pods}
    for node in nodes:
        node_plan = result.nodes[node.name]
        used: list[Counter[str]] = []
        for gpu in node.gpus:
            gp = next(g for g in node_plan.gpus if g.index == gpu.index)
            used.append(_check_gpu(node, gpu, gp, problems))
        view = scheduling_view(node, [next(g for g in node_plan.gpus if g.index == gpu.index) for gpu in node.gpus],
                               used)
        for key, where in result.assignments.items():
            if where != node.name:
                continue
            fit = fits(by_key[key], view)
            if not fit.ok:
                problems.append(f"{key} called schedulable on {node.name} but: {'; '.join(fit.reasons)}")
            view.add_pod(by_key[key])
    return problems


def _check_gpu(node: NodeInput, gpu: GpuInput, gp: GpuPlan, problems: list[str]) -> Counter[str]:
    where = f"{node.name}/gpu{gpu.index}"
    if gpu.model is None:
        return Counter()
    if node.mode == "mps":
        if sum(gp.slices) > gpu.model.memory_mib // 1024:
            problems.append(f"{where}: slices exceed GPU memory")
        missing = Counter(s.size_gb for s in gpu.slices if s.used) - Counter(gp.slices)
        if missing:
            problems.append(f"{where}: used slices dropped: {dict(missing)}")
        return Counter(mps_resource(s.size_gb) for s in gpu.slices if s.used)
    errors = layout_errors(gpu.model, list(gp.instances))
    if errors:
        problems.append(f"{where}: illegal layout: {errors[0]}")
    for inst in gpu.instances:
        if inst.used and PlacedInstance(inst.profile_id, inst.start) not in gp.instances:
            problems.append(f"{where}: in-use instance {inst.profile_id}@{inst.start} moved or destroyed")
    return Counter(mig_resource(gpu.model, i.profile_id) for i in gpu.instances if i.used)
