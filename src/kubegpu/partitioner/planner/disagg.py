"""From the exact planner's aggregated solution to a plan per physical GPU and a node per pod. Deterministic.

A class's GPUs (sorted by node name, then GPU index) take the class's chosen layouts in a stable order: unchanged
and cheapest layouts first, so the first GPUs keep their layout and the changes land on the later ones. Pods are
then placed group by group (highest priority first, then in input order) on the first node of their supply group,
by name, where `kubegpu.scheduling.fits` accepts them on the new allocatable: the same check `plan_violations`
repeats, so every pod a plan calls schedulable fits the layout it produced.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from kubegpu.gpu.geometry import free_space_score
from kubegpu.partitioner.planner.model import GpuPlan, NodeInput, Plan, mig_resource, pod_priority
from kubegpu.scheduling import NodeInfo, fits, pod_key

if TYPE_CHECKING:
    from kubegpu.partitioner.planner.exact import Model
    from kubegpu.partitioner.planner.greedy import Problem


def disaggregate(problem: Problem, model: Model, values: Sequence[float]
                 ) -> tuple[dict[str, list[GpuPlan]], dict[str, str]]:
    plans: dict[str, list[GpuPlan]] = {name: [] for name in problem.states}
    for mig in model.mig:
        chosen = sorted(((option, round(values[col])) for option, col in zip(mig.options, mig.columns, strict=True)),
                        key=lambda oc: (oc[0].churn, oc[0].frag, oc[0].free))
        gpus = iter(sorted(mig.node_gpus))
        for option, count in chosen:
            for _ in range(count):
                node, index = next(gpus)
                plans[node].append(GpuPlan(index=index, model_key=_model_key(problem, node, index),
                                           instances=option.instances, created=option.created,
                                           destroyed=option.destroyed))
    for mps in model.mps:
        keep = Counter({size: round(values[col]) for size, col in mps.keep.items()})
        new = Counter({size: round(values[col]) for size, col in mps.new.items()})
        slices = Counter(mps.used) + keep + new
        plans[mps.node].append(GpuPlan(index=mps.index, model_key=_model_key(problem, mps.node, mps.index),
                                       slices=tuple(sorted(slices.elements())), created=sum(new.values()),
                                       destroyed=sum((mps.current - keep).values())))
    views: dict[str, NodeInfo] = {}  # built when a pod first looks at the node
    assignments: dict[str, str] = {}
    # A node that cannot take a pod cannot take a later one asking the same (free capacity only shrinks, labels
    # and taints do not change): each kind of pod resumes its supply group's scan where the last one stopped.
    resume: dict[tuple[Any, ...], int] = {}
    for group in sorted(model.pods, key=lambda g: -g.priority):
        pods = iter(group.pods)
        units = list(group.units.items())
        for where, column in sorted(group.columns.items()):
            names = model.groups[where]
            for _ in range(round(values[column])):
                pod = next(pods, None)
                if pod is None:
                    break
                need = problem.requirements(pod)
                kind = (where, id(group), tuple(need.requests.items()), need.node_selector,
                        repr(need.affinity_terms), repr(need.tolerations), need.tolerates_unschedulable, need.node_name)
                k = resume.get(kind, 0)
                while k < len(names):
                    view = views.get(names[k])
                    if view is None:
                        view = views[names[k]] = _view(problem, names[k], plans[names[k]])
                    if all(view.free(unit) >= n for unit, n in units) and fits(need, view).ok:
                        view.add_pod(pod, need.requests)
                        assignments[pod_key(pod)] = names[k]
                        break
                    k += 1
                resume[kind] = k
    return plans, assignments


def _model_key(problem: Problem, node: str, index: int) -> str:
    state = problem.states[node]
    return next(g.model_key for g in state.node.gpus if g.index == index)


def _view(problem: Problem, name: str, plans: Sequence[GpuPlan]) -> NodeInfo:
    """The node's scheduling view after the plan: base resources plus the planned GPUs' free instances."""
    state = problem.states[name]
    base = state.base
    allocatable = dict(base.allocatable)
    for resource, n in free_instances(state.node, plans).items():
        allocatable[resource] = allocatable.get(resource, 0.0) + n
    return NodeInfo(node=state.node.node, allocatable=allocatable, requested=dict(base.requested), pods=[])


def free_instances(node: NodeInput, plans: Sequence[GpuPlan]) -> Counter[str]:
    """Partition resources the plans offer on `node`, instances and slices in use left out."""
    from kubegpu.gpu.geometry import PlacedInstance
    from kubegpu.partitioner.planner.model import mps_resource

    gpus = {g.index: g for g in node.gpus}
    found: Counter[str] = Counter()
    for plan in plans:
        gpu = gpus[plan.index]
        if node.mode == "mps":
            found.update(Counter(mps_resource(gb) for gb in plan.slices)
                         - Counter(mps_resource(s.size_gb) for s in gpu.slices if s.used))
        elif gpu.model is not None:
            used = {PlacedInstance(i.profile_id, i.start) for i in gpu.instances if i.used}
            found.update(mig_resource(gpu.model, i.profile_id) for i in plan.instances if i not in used)
    return found


def plan_objective(problem: Problem, plan: Plan) -> tuple[Any, ...]:
    """The planners' shared objective, smaller is better: minus the pods placed per priority level (highest
    first), instances created plus destroyed, minus the free-space score of the new MIG layouts."""
    per_level: Counter[int] = Counter()
    for pod, _ in problem.candidates:
        if pod_key(pod) in plan.assignments:
            per_level[pod_priority(pod)] += 1
    levels = sorted({pod_priority(p) for p, _ in problem.candidates}, reverse=True)
    models: Mapping[tuple[str, int], Any] = {(n.name, g.index): g.model for n in problem.nodes for g in n.gpus}
    frag = 0
    for name, node_plan in plan.nodes.items():
        for gpu in node_plan.gpus:
            model = models.get((name, gpu.index))
            if model is not None and model.mig_capable and node_plan.mode == "mig" and not gpu.error:
                frag -= free_space_score(model, list(gpu.instances))
    return tuple(-per_level[p] for p in levels), plan.created + plan.destroyed, frag
