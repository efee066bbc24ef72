"""Building the exact planner's model (see `exact` for what it is and why it is aggregated): GPU classes and their
layout-option columns, MPS knapsack columns, supply groups and pod-group columns, all as arrays handed to the
`solver.Solver` builder in bulk. Kept apart from `exact`, which drives the solve, so each stays readable.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from kubegpu.gpu.geometry import PlacedInstance
from kubegpu.partitioner.planner.gpus import USED, MigGpu, MpsGpu
from kubegpu.partitioner.planner.greedy import Problem
from kubegpu.partitioner.planner.layouts import LayoutCache, Options
from kubegpu.partitioner.planner.model import is_partition_resource, mig_resource, mps_resource, mps_size, pod_priority
from kubegpu.partitioner.planner.pods import eligible_nodes
from kubegpu.partitioner.planner.solver import Solver


@dataclass
class MigClass:
    group: str
    node_gpus: list[tuple[str, int]]  # (node, GPU index), stable order
    options: Options
    columns: range = range(0)  # one per option, in order
    used: tuple[PlacedInstance, ...] = ()
    resources: tuple[str, ...] = ()  # resource name per free-count position
    profile_ids: tuple[int, ...] = ()  # profile id per free-count position
    wanted: tuple[bool, ...] = ()  # per free-count position: does a pending pod want that profile


@dataclass
class MpsColumns:
    group: str
    node: str
    index: int
    used: tuple[int, ...]
    current: Counter[int]  # free slices by size
    keep: dict[int, int] = field(default_factory=dict)  # size → column
    new: dict[int, int] = field(default_factory=dict)


Supply = dict[tuple[str, str], list[tuple[npt.NDArray[np.int64], npt.NDArray[np.float64]]]]
"""(supply group, resource) → chunks of (columns, instances of the resource each column offers there)."""


@dataclass
class PodGroup:
    units: Counter[str]
    priority: int
    pods: list[dict[str, Any]]
    columns: dict[str, int] = field(default_factory=dict)  # supply group → column


@dataclass
class Model:
    solver: Solver
    groups: dict[str, list[str]]  # supply group → node names
    node_group: dict[str, str]
    mig: list[MigClass]
    mps: list[MpsColumns]
    pods: list[PodGroup]
    weights: dict[int, int]  # priority → weight of one pod
    levels: dict[int, int] = field(default_factory=dict)  # pod column → priority
    node_level: bool = False  # every node is its own supply group, with its cpu, memory and pod slots as rows


# --- building the model -----------------------------------------------------------------------------------------


def build(problem: Problem, layouts: LayoutCache) -> Model:
    solver = Solver()
    plannable = problem.plannable
    eligible_cache: dict[str, list[str]] = {}
    eligible = {problem.key(p): eligible_nodes(p, units, plannable, eligible_cache) for p, units in problem.candidates}
    node_level = _node_level(problem, eligible)
    groups, node_group = _supply_groups(plannable, list(eligible_cache.values()), node_level)
    if node_level:
        for name in _surplus(problem, eligible):
            groups.pop(node_group[name])
            node_group[name] = SURPLUS
    wanted_mig: set[str] = set()
    wanted_mps: set[int] = set()
    for _, units in problem.candidates:
        for unit in units:
            size = mps_size(unit)
            if size is None:
                wanted_mig.add(unit)
            else:
                wanted_mps.add(size)
    model = Model(solver, groups, node_group, [], [], [], weights=_weights(problem), node_level=node_level)
    supply: Supply = defaultdict(list)
    _mig_columns(problem, model, wanted_mig, supply, layouts)
    _mps_columns(problem, model, wanted_mps, supply)
    _pod_columns(problem, model, eligible, node_level, supply)
    return model


def _node_level(problem: Problem, eligible: dict[str, list[str]]) -> bool:
    """Whether pods must be modelled node by node: multi-instance pods, or cpu/memory/pod slots that could bind."""
    if any(len(units) > 1 for _, units in problem.candidates):
        return True
    by_list: dict[int, tuple[list[str], dict[str, float]]] = {}
    shapes: dict[tuple[Any, ...], dict[str, float]] = {}  # pods share requests: filtered once per distinct set
    for pod, _ in problem.candidates:
        names = eligible[problem.key(pod)]
        totals = by_list.setdefault(id(names), (names, {}))[1]
        requests = problem.requirements(pod).requests
        shape = tuple(requests.items())
        other = shapes.get(shape)
        if other is None:
            other = shapes[shape] = _other_requests(requests)
        for resource, amount in other.items():
            totals[resource] = totals.get(resource, 0.0) + amount
    wanted: dict[str, dict[str, float]] = defaultdict(dict)
    for names, totals in by_list.values():
        if not totals:
            continue
        for name in names:
            here = wanted[name]
            for resource, amount in totals.items():
                here[resource] = here.get(resource, 0.0) + amount
    for name, totals in wanted.items():
        base = problem.states[name].base
        if any(amount > base.free(resource) + 1e-9 for resource, amount in totals.items()):
            return True
    return False


SURPLUS = ""
"""The supply group of a node left out of a node-level model's supply (`_surplus`): its GPUs stay in the model (they
keep their layouts, a change would only cost churn), no pod is placed there."""


def _surplus(problem: Problem, eligible: dict[str, list[str]]) -> list[str]:
    """In a node-level model, the nodes no plan needs: of nodes alike in every respect the model sees (GPU layouts,
    the pods that may go there, non-GPU allocatable and requests), at most as many as the pods that may go there can
    host a pod, and any plan's placement maps onto the first that many (by name). Without this, 100 empty nodes alike
    were 100 supply groups and a search HiGHS could not close in its node limit (fragmentation tie-breaker)."""
    lists = {id(names): names for names in eligible.values()}
    demand = Counter(id(eligible[problem.key(pod)]) for pod, _ in problem.candidates)
    members = {key: set(names) for key, names in lists.items()}
    alike: dict[tuple[Any, ...], list[str]] = {}
    for name in sorted(problem.plannable):
        state = problem.states[name]
        where = tuple(key for key in lists if name in members[key])
        gpus = tuple(sorted(_gpu_shape(gpu) for gpu in state.gpus))
        key = (state.node.mode, where, gpus, tuple(sorted(state.base.allocatable.items())),
               tuple(sorted(state.base.requested.items())))
        alike.setdefault(key, []).append(name)
    surplus: list[str] = []
    for (_, where, *_rest), names in alike.items():
        surplus += names[sum(demand[key] for key in where):]
    return surplus


def _gpu_shape(gpu: MigGpu | MpsGpu) -> tuple[Any, ...]:
    if isinstance(gpu, MigGpu):
        return ("mig", gpu.model.key, tuple(sorted(gpu.layout)), gpu.frozen)
    return ("mps", gpu.model_key, gpu.capacity_gb, tuple(sorted(gpu.slices)), gpu.frozen)


def _other_requests(requests: dict[str, float]) -> dict[str, float]:
    return {r: a for r, a in requests.items() if not is_partition_resource(r) and a > 0}


def _supply_groups(plannable: dict[str, Any], eligible_lists: Sequence[list[str]], node_level: bool
                   ) -> tuple[dict[str, list[str]], dict[str, str]]:
    groups: dict[str, list[str]] = {}
    node_group: dict[str, str] = {}
    lists = [set(names) for names in eligible_lists]
    for name in sorted(plannable):
        if node_level:
            key = name
        else:
            signature = "".join("1" if name in names else "0" for names in lists)
            key = f"{plannable[name].mode}:{signature}"
        groups.setdefault(key, []).append(name)
        node_group[name] = key
    return groups, node_group


def _weights(problem: Problem) -> dict[int, int]:
    """One pod of a priority level outweighs every pod of all lower levels together."""
    counts = Counter(pod_priority(p) for p, _ in problem.candidates)
    weights: dict[int, int] = {}
    below = 0
    for level in sorted(counts):
        weights[level] = below + 1
        below += weights[level] * counts[level]
    return weights


def _mig_columns(problem: Problem, model: Model, wanted: set[str], supply: Supply, layouts: LayoutCache) -> None:
    members: dict[tuple[Any, ...], list[tuple[str, int]]] = {}
    gpus: dict[tuple[Any, ...], MigGpu] = {}
    # in-use and free instances, once per tagged layout (GPUs of one shape share theirs: `GpuCache.mig_layout`)
    split: dict[int, tuple[tuple[PlacedInstance, ...], tuple[PlacedInstance, ...], tuple[Any, ...]]] = {}
    for name, state in sorted(problem.states.items()):
        group = model.node_group.get(name, "")  # a node with no plannable GPU is in no group (and skipped)
        for gpu in state.gpus:
            if isinstance(gpu, MigGpu):
                parts = split.get(id(gpu.layout))
                if parts is None:
                    used = tuple(sorted(i for i, t in gpu.layout if t == USED))
                    free = tuple(sorted(i for i, t in gpu.layout if t != USED))
                    parts = split[id(gpu.layout)] = (used, free, gpu.layout)  # the layout kept alive with its id
                used, free, _ = parts
                key = (group, gpu.model.key, used, free, gpu.frozen)
                members.setdefault(key, []).append((name, gpu.index))
                gpus.setdefault(key, gpu)
    # the layout options of every distinct (model, in-use, free) shape, one model at a time, computed together
    shapes: dict[str, dict[tuple[Any, ...], None]] = defaultdict(dict)
    for key in members:
        shapes[key[1]][key[2:]] = None
    options: dict[tuple[Any, ...], tuple[Any, Options, frozenset[int]]] = {}
    for model_key, wanted_shapes in shapes.items():
        gpu = next(g for k, g in gpus.items() if k[1] == model_key)
        ids = frozenset(pid for pid in (gpu.resources().get(r) for r in wanted) if pid is not None)
        requests = list(wanted_shapes)
        for shape, (world, found) in zip(requests, layouts.mig_options_many(gpu.model, ids, requests), strict=True):
            options[(model_key, *shape)] = (world, found, ids)
    # the classes' columns, rows and supply in bulk: one column per (class, option), bounded by the class's GPUs
    kinds: dict[tuple[int, frozenset[int]], list[MigClass]] = {}  # classes by universe and wanted profiles
    named: dict[tuple[int, frozenset[int]], tuple[tuple[str, ...], tuple[bool, ...]]] = {}
    first = model.solver.columns
    for key, node_gpus in members.items():
        world, found, ids = options[key[1:]]
        kind = (id(world), ids)
        names = named.get(kind)
        if names is None:
            model_obj = gpus[key].model
            names = named[kind] = (tuple(mig_resource(model_obj, p) for p in world.profile_ids),
                                   tuple(p in ids for p in world.profile_ids))
        mig = MigClass(key[0], node_gpus, found, range(first, first + len(found)), used=key[2],
                       resources=names[0], profile_ids=world.profile_ids, wanted=names[1])
        first += len(found)
        kinds.setdefault(kind, []).append(mig)
        model.mig.append(mig)
    if not model.mig:
        return
    sizes = np.array([len(m.options) for m in model.mig], dtype=np.int64)
    counts = np.array([len(m.node_gpus) for m in model.mig], dtype=np.float64)
    upper = np.repeat(counts, sizes)
    columns = model.solver.column_array(np.zeros(len(upper)), upper,
                                        churn=np.concatenate([m.options.churn for m in model.mig]),
                                        frag=np.concatenate([m.options.frag for m in model.mig]))
    starts = np.concatenate([[0], np.cumsum(sizes)])
    model.solver.rows_csr(counts, counts, starts, np.arange(columns.start, columns.stop), np.ones(len(upper)))
    for classes in kinds.values():
        offers = np.concatenate([m.options.free for m in classes])
        where = np.concatenate([np.arange(m.columns.start, m.columns.stop) for m in classes])
        group_names = sorted({m.group for m in classes})
        group_of = {g: k for k, g in enumerate(group_names)}
        group_at = np.repeat(np.array([group_of[m.group] for m in classes]), [len(m.options) for m in classes])
        for k, resource in enumerate(classes[0].resources):
            if resource not in wanted:
                continue
            offering = np.flatnonzero(offers[:, k])
            if not len(offering):
                continue
            order = offering[np.argsort(group_at[offering], kind="stable")]
            bounds = np.flatnonzero(np.diff(group_at[order])) + 1
            for chunk in np.split(order, bounds):
                supply[(group_names[int(group_at[chunk[0]])], resource)].append(
                    (where[chunk], offers[chunk, k].astype(np.float64)))


def _mps_columns(problem: Problem, model: Model, wanted: set[int], supply: Supply) -> None:
    # the supply's columns gathered per (group, resource) and made one array each at the end: a pair of tiny arrays
    # per slice column was most of this function's time on 800 GPUs (same columns, same order in every row)
    offering: dict[tuple[str, str], list[int]] = defaultdict(list)
    for name, state in sorted(problem.states.items()):
        for gpu in state.gpus:
            if not isinstance(gpu, MpsGpu):
                continue
            used = tuple(gb for gb, t in gpu.slices if t == USED)
            current = Counter(gb for gb, t in gpu.slices if t != USED)
            room = gpu.capacity_gb - sum(used)
            entry = MpsColumns(model.node_group[name], name, gpu.index, used, current)
            group = entry.group
            for size in sorted(set(current) | wanted):
                if size in current:
                    low = current[size] if gpu.frozen else 0
                    entry.keep[size] = model.solver.column(low, current[size], churn=-1)
                if size in wanted and not gpu.frozen and size <= room:
                    entry.new[size] = model.solver.column(0, room // size, churn=1)
                if size in wanted:
                    columns = offering[(group, mps_resource(size))]
                    for column in (entry.keep.get(size), entry.new.get(size)):
                        if column is not None:
                            columns.append(column)
            sizes = [(c, float(s)) for s, c in entry.keep.items()] + [(c, float(s)) for s, c in entry.new.items()]
            if sizes:
                model.solver.row(None, float(room), sizes)
            model.mps.append(entry)
    for key, found in offering.items():
        if found:
            supply[key].append((np.array(found, dtype=np.int64), np.ones(len(found))))


def _pod_columns(problem: Problem, model: Model, eligible: dict[str, list[str]], node_level: bool,
                 supply: Supply) -> None:
    groups: dict[tuple[Any, ...], PodGroup] = {}
    by_list: dict[int, tuple[str, ...]] = {}  # pods share their eligible lists: their groups computed once per list
    for pod, units in problem.candidates:
        names = eligible[problem.key(pod)]
        places = by_list.get(id(names))
        if places is None:
            places = by_list[id(names)] = tuple(sorted({model.node_group[n] for n in names} - {SURPLUS}))
        other = tuple(sorted(_other_requests(problem.requirements(pod).requests).items())) if node_level else ()
        key = (units, pod_priority(pod), places, other)
        if key not in groups:
            groups[key] = PodGroup(Counter(units), pod_priority(pod), [])
        groups[key].pods.append(pod)
    demand: dict[tuple[str, str], list[tuple[int, float]]] = defaultdict(list)
    limits: dict[tuple[str, str], list[tuple[int, float]]] = defaultdict(list)
    for key, group in sorted(groups.items(), key=lambda kv: (-kv[1].priority, repr(kv[0]))):
        count = len(group.pods)
        for where in key[2]:
            if any((where, unit) not in supply for unit in group.units):
                continue  # nothing there can ever offer one of its units
            column = model.solver.column(0, count, pods=model.weights[group.priority])
            model.levels[column] = group.priority
            group.columns[where] = column
            for unit, n in group.units.items():
                demand[(where, unit)].append((column, float(n)))
            for resource, amount in key[3]:
                limits[(where, resource)].append((column, float(amount)))
        if group.columns:
            model.solver.row(None, float(count), [(c, 1.0) for c in group.columns.values()])
        model.pods.append(group)
    for (at, unit), entries in demand.items():
        offered = supply[(at, unit)]
        model.solver.row_arrays(None, 0.0, np.concatenate([[c for c, _ in entries], *(c for c, _ in offered)]),
                                np.concatenate([[n for _, n in entries], *(-n for _, n in offered)]))
    for (at, resource), entries in limits.items():
        base = problem.states[at].base
        model.solver.row(None, max(0.0, base.free(resource)), entries)


# --- stages, start and bound ----------------------------------------------------------------------------------
