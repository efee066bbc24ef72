"""The `kubegpu plan --state FILE` format: a cluster snapshot the planner can run on offline.

```yaml
nodes:
- name: node-a
  labels: {kubegpu.io/gpu-partitioning: mig}      # "mps" makes it an MPS node; default mig
  gpus:
  - model: A100-SXM4-80GB                          # catalog key, NVML product name or PCI id
    instances: [{profile: 1g.10gb, start: 0, used: true}]   # MPS nodes: {profile: 10gb, used: true}
pods:
- {name: p1, namespace: default, priority: 0, requests: {nvidia.com/mig-2g.20gb: 1}, nodeSelector: {}}
```
Nodes may also give `allocatable` (cpu, memory, pods) and `taints`; without `allocatable` only GPU resources limit.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from kubegpu.errors import ConfigError, NotFoundError
from kubegpu.files import load_data_file
from kubegpu.gpu.catalog import GpuModel, MigProfile, get_model
from kubegpu.gpu.geometry import PlacedInstance, format_layout, layout_errors
from kubegpu.partitioner.planner import CurrentInstance, GpuInput, MpsSlice, NodeInput, Plan, pod_key, pod_priority
from kubegpu.scheduling import parse_quantities

PARTITIONING_LABEL = "kubegpu.io/gpu-partitioning"
_MPS_PROFILE = re.compile(r"^(\d+)gb$")


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class InstanceState(_Model):
    profile: str
    start: int | None = Field(default=None, ge=0)
    used: bool = False


class GpuState(_Model):
    model: str
    instances: list[InstanceState] = Field(default_factory=list)


class NodeState(_Model):
    name: str = Field(min_length=1)
    labels: dict[str, str] = Field(default_factory=dict)
    gpus: list[GpuState] = Field(default_factory=list)
    allocatable: dict[str, str | int | float] | None = None
    taints: list[dict[str, Any]] = Field(default_factory=list)


class PodState(_Model):
    name: str = Field(min_length=1)
    namespace: str = "default"
    priority: int = 0
    requests: dict[str, str | int | float] = Field(default_factory=dict)
    node_selector: dict[str, str] = Field(default_factory=dict, alias="nodeSelector")
    tolerations: list[dict[str, Any]] = Field(default_factory=list)


class ClusterState(_Model):
    nodes: list[NodeState] = Field(default_factory=list)
    pods: list[PodState] = Field(default_factory=list)


def load_state(path: Path | str) -> ClusterState:
    """Read and validate a state file (YAML or JSON); ConfigError `FILE: field.path: what` on any problem."""
    source = str(path)
    return parse_state(load_data_file(path), source)  # bounded, UTF-8, safe YAML/strict JSON


def parse_state(data: object, source: str) -> ClusterState:
    try:
        return ClusterState.model_validate(data if data is not None else {})
    except ValidationError as exc:
        err = exc.errors()[0]
        path = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in err["loc"]).lstrip(".")
        raise ConfigError(f"{source}: {path or '<root>'}: {err['msg']}") from None


def planner_inputs(state: ClusterState, source: str = "state") -> tuple[list[NodeInput], list[dict[str, Any]]]:
    """Planner inputs from a state file: unknown models become GPUs the planner reports, bad profiles errors."""
    _check_unique([n.name for n in state.nodes], f"{source}: nodes", "node name")
    _check_unique([f"{p.namespace}/{p.name}" for p in state.pods], f"{source}: pods", "pod")
    for i, pod in enumerate(state.pods):
        _check_requests(pod, f"{source}: pods[{i}].requests")
    seen: dict[tuple[Any, ...], Any] = {}  # profiles and layout checks, once per distinct one in the file
    nodes = [_node_input(n, f"{source}: nodes[{i}]", seen) for i, n in enumerate(state.nodes)]
    return nodes, [pod_dict(p) for p in state.pods]


def _check_unique(keys: list[str], where: str, what: str) -> None:
    """Names are how plans and pods refer to nodes; a second entry with one would silently shadow the first."""
    seen: set[str] = set()
    for i, key in enumerate(keys):
        if key in seen:
            raise ConfigError(f"{where}[{i}]: duplicate {what} {key!r}")
        seen.add(key)


def _check_requests(pod: PodState, where: str) -> None:
    """Quantities are checked here so a bad one names its field, not just the pod, and stops the run."""
    parse_quantities(pod.requests, where)


def _node_input(node: NodeState, where: str, seen: dict[tuple[Any, ...], Any]) -> NodeInput:
    mode_label = node.labels.get(PARTITIONING_LABEL, "mig")
    if mode_label not in ("mig", "mps"):
        raise ConfigError(f"{where}.labels.{PARTITIONING_LABEL}: must be mig or mps, not {mode_label!r}")
    mode: Literal["mig", "mps"] = "mps" if mode_label == "mps" else "mig"
    gpus = tuple(_gpu_input(mode, i, g, f"{where}.gpus[{i}]", seen) for i, g in enumerate(node.gpus))
    status: dict[str, Any] = {}
    if node.allocatable is not None:
        status["allocatable"] = {k: str(v) for k, v in node.allocatable.items()}
    obj = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": node.name, "labels": dict(node.labels)},
           "spec": {"taints": list(node.taints)}, "status": status}
    return NodeInput(name=node.name, mode=mode, node=obj, gpus=gpus)


def _gpu_input(mode: str, index: int, gpu: GpuState, where: str, seen: dict[tuple[Any, ...], Any]) -> GpuInput:
    key = ("model", gpu.model)
    if key not in seen:
        try:
            seen[key] = get_model(gpu.model)
        except NotFoundError:
            seen[key] = None
    model: GpuModel | None = seen[key]
    if model is None:
        return GpuInput(index=index, model_key=gpu.model, model=None)
    if mode == "mps":
        slices = []
        for k, inst in enumerate(gpu.instances):
            m = _MPS_PROFILE.match(inst.profile)
            if not m:
                raise ConfigError(f"{where}.instances[{k}].profile: MPS slices are <N>gb, not {inst.profile!r}")
            slices.append(MpsSlice(int(m.group(1)), inst.used))
        capacity_gb = model.memory_mib // 1024
        if sum(sl.size_gb for sl in slices) > capacity_gb:
            raise ConfigError(f"{where}.instances: MPS slices add up to more than the {model.key}'s "
                              f"{capacity_gb} GB")
        return GpuInput(index=index, model_key=model.key, model=model, slices=tuple(slices))
    instances = []
    for k, inst in enumerate(gpu.instances):
        profile = _profile(model, inst.profile, seen)
        if profile is None:
            raise ConfigError(f"{where}.instances[{k}].profile: {model.key} has no MIG profile "
                              f"{inst.profile!r}") from None
        if inst.start is None:
            raise ConfigError(f"{where}.instances[{k}].start: required for a MIG instance")
        instances.append(CurrentInstance(profile.profile_id, inst.start, inst.used))
    _check_layout(model, instances, where, seen)
    return GpuInput(index=index, model_key=model.key, model=model, instances=tuple(instances))


def _profile(model: GpuModel, name: str, seen: dict[tuple[Any, ...], Any]) -> MigProfile | None:
    """`model.profile(name)`, None when it has none; remembered in `seen` for the file being read (a fleet's file
    names the same few profiles tens of thousands of times, and the catalog normalises every name it is asked)."""
    key = ("profile", model.key, id(model), name)
    if key not in seen:
        try:
            seen[key] = model.profile(name)
        except NotFoundError:
            seen[key] = None
    found: MigProfile | None = seen[key]
    return found


def _layout_error(model: GpuModel, layout: tuple[tuple[int, int], ...], seen: dict[tuple[Any, ...], Any]
                  ) -> tuple[int, str] | None:
    """The first instance that makes `layout` illegal and why, None when it is legal; remembered in `seen` per
    distinct layout (a fleet repeats them). Only an illegal layout is checked prefix by prefix, for the instance
    to name."""
    key = ("layout", model.key, id(model), layout)
    if key not in seen:
        seen[key] = None
        if layout_errors(model, [PlacedInstance(p, s) for p, s in layout]):
            for k in range(len(layout)):
                problems = layout_errors(model, [PlacedInstance(p, s) for p, s in layout[:k + 1]])
                if problems:
                    seen[key] = (k, problems[0])
                    break
    found: tuple[int, str] | None = seen[key]
    return found


def _check_layout(model: GpuModel, instances: list[CurrentInstance], where: str,
                  seen: dict[tuple[Any, ...], Any]) -> None:
    """A placement the GPU cannot have (bad start, overlap, MIG on a non-MIG model) makes the file invalid."""
    if instances and not model.mig_capable:
        raise ConfigError(f"{where}.instances: {model.key} does not support MIG")
    problem = _layout_error(model, tuple((i.profile_id, i.start) for i in instances), seen)
    if problem is not None:
        raise ConfigError(f"{where}.instances[{problem[0]}].start: {problem[1]}")


def pod_dict(pod: PodState) -> dict[str, Any]:
    """A Pod object from a state-file entry; extended resources go to limits as Kubernetes requires."""
    resources = {k: str(v) for k, v in pod.requests.items()}
    extended = {k: v for k, v in resources.items() if "/" in k}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": pod.name, "namespace": pod.namespace},
        "spec": {
            "priority": pod.priority,
            "nodeSelector": dict(pod.node_selector),
            "tolerations": list(pod.tolerations),
            "containers": [{"name": "main", "resources": {"requests": resources, "limits": extended}}],
        },
        "status": {"phase": "Pending"},
    }


def plan_to_json(result: Plan, nodes: list[NodeInput], pods: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """The `kubegpu plan -o json` document: layouts per node and GPU index, then who fits and who does not, and
    the objective against the planner's proven bound (`objective`)."""
    models = {g.model_key: g.model for n in nodes for g in n.gpus}
    layouts: dict[tuple[str, tuple[PlacedInstance, ...]], tuple[list[dict[str, Any]], str]] = {}  # fleets repeat
    out_nodes = []
    for node in nodes:
        node_plan = result.nodes[node.name]
        gpus = []
        for gpu in node_plan.gpus:
            model = models.get(gpu.model_key)
            entry: dict[str, Any] = {"index": gpu.index, "model": gpu.model_key}
            if node.mode == "mig" and model is not None:
                shown = layouts.get((gpu.model_key, gpu.instances))
                if shown is None:
                    shown = layouts[(gpu.model_key, gpu.instances)] = (
                        [{"profile": model.profile(i.profile_id).name, "start": i.start} for i in gpu.instances],
                        format_layout(model, list(gpu.instances)))
                entry["instances"] = [dict(i) for i in shown[0]]
                entry["layout"] = shown[1]
            else:
                entry["instances"] = [{"profile": f"{gb}gb"} for gb in gpu.slices]
            entry.update(created=gpu.created, destroyed=gpu.destroyed)
            if gpu.error:
                entry["error"] = gpu.error
            gpus.append(entry)
        out_nodes.append({"name": node.name, "mode": node.mode, "changed": node_plan.changed, "gpus": gpus})
    return {
        "nodes": out_nodes,
        "schedulable": result.schedulable_names(),
        "unschedulable": result.unschedulable_names(),
        "assignments": dict(result.assignments),
        "reasons": dict(result.unschedulable),
        "created": result.created,
        "destroyed": result.destroyed,
        "planner": result.planner,
        "optimal": result.optimal,
        "bound": result.bound,
        "score": result.score,
        "note": result.note,
        "objective": objective_json(result, pods),
    }


def objective_json(result: Plan, pods: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """What the plan achieves against what any plan could: pods made schedulable (in all and per priority level),
    the priority-weighted score and the planner's proven upper bound on it (one pod of a level outweighs every pod
    below it; with one level, pods), their ratio, and the instances the plan creates and destroys."""
    ratio = None
    if result.score is not None and result.bound is not None:
        ratio = 1.0 if result.bound == 0 else result.score / result.bound
    out: dict[str, Any] = {
        "schedulable": len(result.assignments),
        "pending": len(result.assignments) + len(result.unschedulable),
        "score": result.score,
        "bound": result.bound,
        "ratioToBound": ratio,
        "provenOptimal": result.optimal,
        "instancesChanged": result.created + result.destroyed,
    }
    if pods is not None:
        levels: dict[int, list[int]] = {}
        for pod in pods:
            level = levels.setdefault(pod_priority(pod), [0, 0])
            level[0] += 1
            level[1] += pod_key(pod) in result.assignments
        out["byPriority"] = [{"priority": p, "pending": n, "schedulable": m}
                             for p, (n, m) in sorted(levels.items(), reverse=True)]
    return out


def optimality_line(result: Plan) -> str:
    """One line saying which planner ran and whether its plan is proven optimal (the table output's last line)."""
    if result.optimal:
        verdict = "proven optimal"
    elif result.planner == "greedy":
        verdict = "not proven optimal (greedy heuristic)"
    else:
        verdict = "not proven optimal"
    numbers = f"score {result.score}, bound {result.bound}" if result.bound is not None else ""
    detail = "; ".join(x for x in (numbers, result.note) if x)
    return f"planner {result.planner}: {verdict}" + (f" ({detail})" if detail else "")
