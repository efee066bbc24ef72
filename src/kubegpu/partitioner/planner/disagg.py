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

import numpy as np

from kubegpu.gpu.geometry import free_space_score
from kubegpu.partitioner.planner.model import GpuPlan, Plan, mps_resource, pod_priority
from kubegpu.scheduling import NodeInfo, fits

if TYPE_CHECKING:
    from kubegpu.partitioner.planner.columns import Model
    from kubegpu.partitioner.planner.greedy import Problem


def disaggregate(problem: Problem, model: Model, values: Sequence[float]
                 ) -> tuple[dict[str, list[GpuPlan]], dict[str, str]]:
    plans: dict[str, list[GpuPlan]] = {name: [] for name in problem.states}
    free: dict[str, Counter[str]] = {name: Counter() for name in problem.states}  # instances the plans offer pods
    taken = np.rint(np.asarray(values, dtype=np.float64)).astype(np.int64)
    keys = {(name, g.index): g.model_key for name, state in problem.states.items() for g in state.node.gpus}
    # the options taken, class by class (a class's columns are one range, the classes' ranges in order)
    firsts = np.array([mig.columns.start for mig in model.mig], dtype=np.int64)
    picked = np.flatnonzero(taken[:model.mig[-1].columns.stop] if model.mig else taken[:0])
    owner = np.searchsorted(firsts, picked, side="right") - 1
    bounds = np.searchsorted(owner, np.arange(len(model.mig) + 1)).tolist()
    picked_at = (picked - firsts[owner]).tolist() if len(picked) else []
    for c, mig in enumerate(model.mig):
        options = mig.options
        counts = taken[mig.columns.start:mig.columns.stop]
        chosen = picked_at[bounds[c]:bounds[c + 1]]
        if len(chosen) > 1:
            chosen.sort(key=lambda k: (int(options.churn[k]), int(options.frag[k]), options.free[k].tolist()))
        gpus = iter(sorted(mig.node_gpus))
        for k in chosen:
            instances = options.world.instances(options.world.layouts[int(options.layout[k])])
            created, destroyed = int(options.created[k]), int(options.destroyed[k])
            offered = [(r, n) for r, n in zip(mig.resources, options.free[k].tolist(), strict=True) if n]
            for _ in range(int(counts[k])):
                node, index = next(gpus)
                plans[node].append(GpuPlan(index=index, model_key=keys[(node, index)], instances=instances,
                                           created=created, destroyed=destroyed))
                free[node].update(dict(offered))
    for mps in model.mps:
        # plain dicts, not Counter arithmetic: this runs for every MPS GPU of every plan
        offered_now: dict[int, int] = {}
        destroyed = 0
        for size, col in mps.keep.items():
            n = int(taken[col])
            destroyed += max(mps.current[size] - n, 0)
            if n > 0:
                offered_now[size] = n
        created = 0
        for size, col in mps.new.items():
            n = int(taken[col])
            if n > 0:
                created += n
                offered_now[size] = offered_now.get(size, 0) + n
        slices = list(mps.used)
        for size, n in offered_now.items():
            slices += [size] * n
        plans[mps.node].append(GpuPlan(index=mps.index, model_key=keys[(mps.node, mps.index)],
                                       slices=tuple(sorted(slices)), created=created, destroyed=destroyed))
        if offered_now:
            free[mps.node].update({mps_resource(size): n for size, n in offered_now.items()})
    views: dict[str, NodeInfo] = {}  # built when a pod first looks at the node
    assignments: dict[str, str] = {}
    # A node that cannot take a pod cannot take a later one asking the same (free capacity only shrinks, labels
    # and taints do not change): each kind of pod resumes its supply group's scan where the last one stopped.
    # Unless pods are modelled node by node, every node of a pod's supply group admits it and its cpu, memory and
    # pod slots cannot run out there (`exact._node_level`): only its partition resources need checking.
    full_check = model.node_level
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
                        view = views[names[k]] = _view(problem, names[k], free[names[k]])
                    if all(view.free(unit) >= n for unit, n in units) and (not full_check or fits(need, view).ok):
                        view.add_pod(pod, need.requests)
                        assignments[problem.key(pod)] = names[k]
                        break
                    k += 1
                resume[kind] = k
    return plans, assignments


def _view(problem: Problem, name: str, free: Counter[str]) -> NodeInfo:
    """The node's scheduling view after the plan: base resources plus the free instances its planned GPUs offer."""
    base = problem.states[name].base
    allocatable = dict(base.allocatable)
    for resource, n in free.items():
        allocatable[resource] = allocatable.get(resource, 0.0) + n
    return NodeInfo(node=problem.states[name].node.node, allocatable=allocatable, requested=dict(base.requested),
                    pods=[])


def plan_objective(problem: Problem, plan: Plan) -> tuple[Any, ...]:
    """The planners' shared objective, smaller is better: minus the pods placed per priority level (highest
    first), instances created plus destroyed, minus the free-space score of the new MIG layouts."""
    per_level: Counter[int] = Counter()
    for pod, _ in problem.candidates:
        if problem.key(pod) in plan.assignments:
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
