"""How close the partitioner's plans come to the best possible, and how fast they are.

Three suites (`--suite classic|hard|timing|all`):
  * classic: generated cluster states (1 to 500 GPUs, mixed A100/H100/A30 models, 30-90 % of instances in use,
    about two pending pods per GPU); our planner (the exact one, default) and the greedy against
      - the exact optimum of a reference MILP solved by HiGHS (`highspy`), built independently of the planner's own
        model: per node and group of GPUs with the same in-use instances, one choice among the free-instance
        multisets `geometry.feasible_multisets` allows around them; per node and resource, pods <= supply. HiGHS,
        not OR-Tools' CP-SAT: OR-Tools pins a protobuf the gRPC stack here cannot share (reference/deps.md);
      - a nos-style greedy: order-based geometry choice by profile counts, blind to placement, so a GPU whose chosen
        geometry cannot be placed around the instances in use fails (counted, and left as it was);
      - the best static layout (`kubegpu.partitioner.baselines.best_static_layout`): mig-parted's default layouts
        (`all-<profile>` at max count, `all-balanced`), one per GPU model, the best combination; instances in use
        stay, the static layout's colliding instances are re-placed where they fit or dropped; pods matched
        greedily, never re-cutting;
      - no re-cut: the current layout's free instances, as they are.
  * hard: random earlier layouts on ~80 % of GPUs, 10-80 % in use, demand above free capacity, mostly
    small profiles, some pods with priorities and node selectors, 1 to 512 GPUs; exact and greedy against the
    reference optimum, whether the exact plan is proven optimal, and instances created plus destroyed for both.
  * timing: the exact planner on 1,000 pending pods and 512 GPUs, median of 3 (wall and CPU seconds).
  * fleet: 5,000 pending pods over 4,096 GPUs (mixed A100/H100, earlier layouts, 10-80 % in use), and
    the same fleet with 14,000 (demand above what a re-cut serves); the exact planner (cold and warm), the greedy and
    `kubegpu plan --state FILE -o json` end to end (a fresh process) against the LP bound of the reference model,
    and each against the greedy, with wall and CPU time.
Pods count priority-weighted (one priority-1 pod outweighs every priority-0 pod). Run:
    python benchmarks/partitioner_quality.py [--quick] [--seed N] [--suite S] [--time-limit SECONDS]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource as rusage
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import highspy

from kubegpu.gpu.catalog import GpuModel, get_model
from kubegpu.gpu.geometry import PlacedInstance, feasible_multisets, layout_errors, place
from kubegpu.partitioner.baselines import best_static_layout
from kubegpu.partitioner.planner import (
    CurrentInstance,
    GpuInput,
    NodeInput,
    Plan,
    Planner,
    plan,
    plan_violations,
    pod_key,
)

MODELS = ["A100-SXM4-80GB", "H100-SXM5-80GB", "A30-24GB"]
PROFILE_MIX = {"1g": 40, "1g.double": 10, "2g": 25, "3g": 15, "4g": 5, "7g": 5}


@dataclass
class Case:
    name: str
    nodes: list[NodeInput]
    pods: list[dict[str, Any]]

    @property
    def gpus(self) -> int:
        return sum(len(n.gpus) for n in self.nodes)


# --- generation -------------------------------------------------------------------------------------------------


def _random_layout(model: GpuModel, rng: random.Random) -> list[PlacedInstance]:
    shapes = [m for m in feasible_multisets(model) if len(m) > 0]
    shapes.sort()
    wanted = list(rng.choice([s for s in shapes if sum(model.profile(p).memory_slots for p in s)
                              >= model.mig_memory_slots - 1] or shapes))
    return place(model, wanted) or []


def _profile_for(model: GpuModel, kind: str) -> str | None:
    slots = model.mig_memory_slots
    by_kind = {
        "1g": [p for p in model.mig_profiles if p.compute_slices == 1 and p.memory_slots == 1],
        "1g.double": [p for p in model.mig_profiles if p.compute_slices == 1 and p.memory_slots == 2],
        "2g": [p for p in model.mig_profiles if p.compute_slices == 2],
        "3g": [p for p in model.mig_profiles if p.compute_slices == 3],
        "4g": [p for p in model.mig_profiles if p.compute_slices == 4 and p.memory_slots < slots],
        "7g": [p for p in model.mig_profiles if p.memory_slots == slots],
    }
    options = [p for p in by_kind[kind] if not p.media_extensions]
    return f"nvidia.com/{options[0].resource_name}" if options else None


def generate(name: str, gpus: int, rng: random.Random) -> Case:
    nodes: list[NodeInput] = []
    made = 0
    while made < gpus:
        model = get_model(rng.choice(MODELS))
        per_node = min(gpus - made, 4 if model.mig_memory_slots == 4 else 8)
        busy = rng.uniform(0.3, 0.9)
        gpu_inputs = []
        for index in range(per_node):
            layout = _random_layout(model, rng)
            gpu_inputs.append(GpuInput(index, model.key, model, tuple(
                CurrentInstance(i.profile_id, i.start, rng.random() < busy) for i in layout)))
        node_name = f"node-{len(nodes):03d}"
        labels = {"pool": rng.choice(["a", "b"])}
        nodes.append(NodeInput(node_name, "mig", {"metadata": {"name": node_name, "labels": labels}},
                               tuple(gpu_inputs)))
        made += per_node
    pods = []
    kinds, weights = zip(*PROFILE_MIX.items(), strict=True)
    for k in range(2 * gpus):
        model = get_model(rng.choice(MODELS))
        resource = None
        while resource is None:
            resource = _profile_for(model, rng.choices(kinds, weights)[0])
        selector = {"pool": rng.choice(["a", "b"])} if rng.random() < 0.2 else {}
        pods.append({"metadata": {"name": f"pod-{k:04d}", "namespace": "default"},
                     "spec": {"priority": 1 if rng.random() < 0.2 else 0, "nodeSelector": selector,
                              "containers": [{"name": "c", "resources": {"limits": {resource: "1"}}}]}})
    return Case(name, nodes, pods)


# --- scoring ----------------------------------------------------------------------------------------------------


def _resource(pod: dict[str, Any]) -> str:
    return next(iter(pod["spec"]["containers"][0]["resources"]["limits"]))


def _weight(pod: dict[str, Any], n_pods: int) -> float:
    return float(n_pods + 1) ** int(pod["spec"]["priority"])


def _eligible(pod: dict[str, Any], node: NodeInput) -> bool:
    selector = pod["spec"].get("nodeSelector") or {}
    labels = node.node["metadata"]["labels"]
    return all(labels.get(k) == v for k, v in selector.items())


def _free_options(gpu: GpuInput) -> list[Counter[str]]:
    """Every multiset of free instances a legal layout keeping the in-use instances in place can offer."""
    model = gpu.model
    assert model is not None
    used = [PlacedInstance(i.profile_id, i.start) for i in gpu.instances if i.used]
    used_counts = Counter(i.profile_id for i in used)
    options = [Counter[str]()]
    for multiset in feasible_multisets(model):
        extra = Counter(multiset) - used_counts
        if Counter(multiset) & used_counts != used_counts:
            continue
        if place(model, sorted(extra.elements()), used) is not None:
            options.append(Counter({f"nvidia.com/{model.profile(p).resource_name}": n for p, n in extra.items()}))
    return options


def optimum(case: Case, relax: bool = False) -> float:
    """Exact best priority-weighted count: choose one free-instance multiset per GPU, assign pod classes to nodes.
    `relax`: the model's linear relaxation instead, an upper bound (the fleet suite's reference)."""
    lp = highspy.Highs()
    lp.setOptionValue("output_flag", False)
    lp.setOptionValue("mip_rel_gap", 0.0)
    n_pods = len(case.pods)
    classes: Counter[tuple[str, int, tuple[tuple[str, str], ...]]] = Counter()
    for pod in case.pods:
        classes[(_resource(pod), int(pod["spec"]["priority"]),
                 tuple(sorted((pod["spec"].get("nodeSelector") or {}).items())))] += 1
    col = 0
    supply: dict[tuple[str, str], list[tuple[int, float]]] = defaultdict(list)
    demand: dict[tuple[str, str], list[tuple[int, float]]] = defaultdict(list)
    per_class: dict[tuple[str, int, tuple[tuple[str, str], ...]], list[int]] = defaultdict(list)
    cache: dict[tuple[Any, ...], list[Counter[str]]] = {}

    def add_col(cost: float, lower: float, upper: float) -> int:
        nonlocal col
        lp.addVar(lower, upper)
        lp.changeColCost(col, cost)
        if not relax:
            lp.changeColIntegrality(col, highspy.HighsVarType.kInteger)
        col += 1
        return col - 1

    for node in case.nodes:
        groups: Counter[tuple[Any, ...]] = Counter()
        by_key: dict[tuple[Any, ...], GpuInput] = {}
        for gpu in node.gpus:
            key = (gpu.model_key, tuple(sorted((i.profile_id, i.start) for i in gpu.instances if i.used)))
            groups[key] += 1
            by_key[key] = gpu
        for key, count in groups.items():
            if key not in cache:
                cache[key] = _free_options(by_key[key])
            choice_cols = []
            for option in cache[key]:
                c = add_col(0.0, 0, count)
                choice_cols.append(c)
                for resource, n in option.items():
                    supply[(node.name, resource)].append((c, float(n)))
            lp.addRow(count, count, len(choice_cols), choice_cols, [1.0] * len(choice_cols))
        for cls, count in classes.items():
            resource, priority, selector = cls
            probe = {"spec": {"nodeSelector": dict(selector)}}
            if not _eligible(probe, node):
                continue
            c = add_col(-float(n_pods + 1) ** priority, 0, count)
            demand[(node.name, resource)].append((c, 1.0))
            per_class[cls].append(c)
    for where, wanting in demand.items():
        entries = wanting + [(c, -v) for c, v in supply.get(where, [])]
        lp.addRow(-highspy.kHighsInf, 0.0, len(entries), [c for c, _ in entries], [v for _, v in entries])
    for cls, class_cols in per_class.items():
        lp.addRow(0.0, classes[cls], len(class_cols), class_cols, [1.0] * len(class_cols))
    lp.changeObjectiveSense(highspy.ObjSense.kMinimize)
    lp.run()
    return -float(lp.getInfo().objective_function_value)


def nos_greedy(case: Case) -> tuple[float, int]:
    """nos's planner (reference §3.4): per node and GPU, the geometry (by counts) that serves most lacking pods,
    first in list order on ties, no placement check; then count the pods that fit. Returns (score, failed GPUs)."""
    lacking: Counter[str] = Counter(_resource(p) for p in case.pods)
    failed = 0
    free_by_node: dict[str, Counter[str]] = {}
    for node in sorted(case.nodes, key=lambda n: n.name):
        free: Counter[str] = Counter()
        for gpu in node.gpus:
            model = gpu.model
            assert model is not None
            used = Counter(i.profile_id for i in gpu.instances if i.used)
            current_free = Counter(i.profile_id for i in gpu.instances if not i.used)
            name = {p.profile_id: f"nvidia.com/{p.resource_name}" for p in model.mig_profiles}
            best, best_score = None, 0
            for geometry in feasible_multisets(model):
                counts = Counter(geometry)
                if any(counts[p] < n for p, n in used.items()):
                    continue
                score = sum(min(max(0, counts[p] - used[p] - current_free[p]), lacking[name[p]]) for p in counts)
                if score > best_score:
                    best, best_score = counts, score
            chosen = current_free
            if best is not None:
                fixed = [PlacedInstance(i.profile_id, i.start) for i in gpu.instances if i.used]
                if place(model, sorted((best - used).elements()), fixed) is None:
                    failed += 1  # the agent cannot realise it; the GPU keeps its old layout
                else:
                    chosen = best - used
            for p, n in chosen.items():
                free[name[p]] += n
                lacking[name[p]] = max(0, lacking[name[p]] - n)
        free_by_node[node.name] = free
    return _count_fitting(case, free_by_node), failed


def best_static(case: Case) -> tuple[float, dict[str, str]]:
    """The best static layout's score and the default layout it chose per GPU model."""
    baseline = best_static_layout(case.nodes, case.pods)
    by_key = {pod_key(p): p for p in case.pods}
    return sum(_weight(by_key[k], len(case.pods)) for k in baseline.assignments), baseline.layouts


def no_recut(case: Case) -> float:
    free_by_node: dict[str, Counter[str]] = {}
    for node in case.nodes:
        free_by_node[node.name] = Counter()
        for gpu in node.gpus:
            assert gpu.model is not None
            free_by_node[node.name].update(f"nvidia.com/{gpu.model.profile(i.profile_id).resource_name}"
                                           for i in gpu.instances if not i.used)
    return _count_fitting(case, free_by_node)


def _count_fitting(case: Case, free_by_node: dict[str, Counter[str]]) -> float:
    score = 0.0
    for pod in sorted(case.pods, key=lambda p: -int(p["spec"]["priority"])):
        for node in case.nodes:
            if _eligible(pod, node) and free_by_node[node.name][_resource(pod)] > 0:
                free_by_node[node.name][_resource(pod)] -= 1
                score += _weight(pod, len(case.pods))
                break
    return score


def ours(case: Case, planner: str = "exact", time_limit: float = 1.0) -> tuple[float, float, int, Plan]:
    """Our planner's priority-weighted score, wall time, instances created plus destroyed, and the plan."""
    started = time.perf_counter()
    result = plan(case.nodes, case.pods, planner=planner, time_limit=time_limit)
    elapsed = time.perf_counter() - started
    problems = plan_violations(case.nodes, case.pods, result)
    if problems:
        raise SystemExit(f"{case.name}: invalid {planner} plan: {problems[0]}")
    by_key = {pod_key(p): p for p in case.pods}
    score = sum(_weight(by_key[k], len(case.pods)) for k in result.assignments)
    return score, elapsed, result.created + result.destroyed, result


BASELINES = ("ours", "greedy", "nos-style", "best static", "no re-cut")


def classic(args: argparse.Namespace) -> bool:
    """The original suite: our (exact) planner against the reference optimum and the baselines."""
    rng = random.Random(args.seed)
    sizes = [1, 4, 8, 16, 32] if args.quick else [1, 2, 4, 8, 16, 32, 64, 128, 256, 500]
    repeats = 3 if args.quick else 4
    print(f"{'case':<14}{'gpus':>5}{'pods':>6}{'ours/opt':>10}{'greedy':>8}{'nos/opt':>9}{'nos fail':>9}"
          f"{'static/opt':>11}{'as-is/opt':>10}{'changes':>8}{'ours s':>8}{'static s':>9}{'milp s':>8}")
    ratios: dict[str, list[float]] = {name: [] for name in BASELINES}
    chosen: Counter[tuple[str, str]] = Counter()
    big_time: float | None = None
    for size in sizes:
        for r in range(repeats if size < 256 else 1):
            case = generate(f"{size}gpu-{r}", size, rng)
            score, elapsed, changes, _ = ours(case, time_limit=args.time_limit)
            greedy_score = ours(case, "greedy")[0]
            started = time.perf_counter()
            best = optimum(case)
            milp_time = time.perf_counter() - started
            nos_score, nos_failed = nos_greedy(case)
            started = time.perf_counter()
            static, layouts = best_static(case)
            static_time = time.perf_counter() - started
            chosen.update(layouts.items())
            row = [x / best if best > 0 else 1.0 for x in (score, greedy_score, nos_score, static, no_recut(case))]
            for name, value in zip(BASELINES, row, strict=True):
                ratios[name].append(value)
            if size == 500:
                big_time = elapsed
            print(f"{case.name:<14}{case.gpus:>5}{len(case.pods):>6}{row[0]:>10.4f}{row[1]:>8.4f}{row[2]:>9.4f}"
                  f"{nos_failed:>9}{row[3]:>11.4f}{row[4]:>10.4f}{changes:>8}{elapsed:>8.3f}{static_time:>9.3f}"
                  f"{milp_time:>8.2f}")
    _summary(ratios, chosen)
    worst = min(ratios["ours"])
    if big_time is not None:
        print(f"plan time, 1000 pods on 500 GPUs: {big_time:.3f} s = {big_time / 1.0:.2f} x the 1 s target")
    return worst >= 0.99


# --- hard states -------------------------------------------------------------------------------------

HARD_MIX = {"1g": 45, "1g.double": 10, "2g": 25, "3g": 8, "4g": 6, "7g": 6}
MIXES = [["A100-SXM4-80GB"], ["H100-SXM5-80GB"], ["A100-SXM4-80GB", "A30-24GB"],
         ["A100-SXM4-80GB", "H100-SXM5-80GB", "A30-24GB"], ["H100-SXM5-80GB", "A30-24GB"]]


def _earlier_layout(model: GpuModel, rng: random.Random) -> list[PlacedInstance]:
    """A random placed layout, as days of re-cuts leave it: random profiles at random legal starts."""
    options = [(p.profile_id, s) for p in model.mig_profiles if not p.media_extensions for s in p.starts]
    rng.shuffle(options)
    fill = rng.uniform(0.5, 1.0) * model.mig_memory_slots
    layout: list[PlacedInstance] = []
    for profile_id, start in options:
        trial = [*layout, PlacedInstance(profile_id, start)]
        if not layout_errors(model, trial):
            layout = trial
        if sum(model.profile(i.profile_id).memory_slots for i in layout) >= fill:
            break
    return layout


def generate_hard(name: str, gpus: int, rng: random.Random) -> Case:
    """~80 % of GPUs carry a random earlier layout, 10-80 % of instances in use, demand above free capacity,
    mostly small profiles, some pods at priority 1 or 2 and some with a node selector."""
    models = rng.choice(MIXES)
    nodes: list[NodeInput] = []
    made = free_slots = 0
    while made < gpus:
        model = get_model(rng.choice(models))
        per_node = min(gpus - made, 4 if model.mig_memory_slots == 4 else 8)
        busy = rng.uniform(0.1, 0.8)
        inputs = []
        for index in range(per_node):
            layout = _earlier_layout(model, rng) if rng.random() < 0.8 else []
            instances = tuple(CurrentInstance(i.profile_id, i.start, rng.random() < busy) for i in layout)
            free_slots += model.mig_memory_slots - sum(model.profile(i.profile_id).memory_slots
                                                       for i in instances if i.used)
            inputs.append(GpuInput(index, model.key, model, instances))
        node_name = f"node-{len(nodes):03d}"
        labels = {"pool": rng.choice(["a", "b", "c"])}
        nodes.append(NodeInput(node_name, "mig", {"metadata": {"name": node_name, "labels": labels}},
                               tuple(inputs)))
        made += per_node
    pods: list[dict[str, Any]] = []
    kinds, weights = zip(*HARD_MIX.items(), strict=True)
    demand = 0
    while demand <= free_slots * rng.uniform(1.1, 1.6):
        model = get_model(rng.choice(models))
        resource = None
        while resource is None:
            resource = _profile_for(model, rng.choices(kinds, weights)[0])
        demand += model.profile(resource.split("mig-", 1)[1]).memory_slots
        selector = {"pool": rng.choice(["a", "b", "c"])} if rng.random() < 0.15 else {}
        priority = rng.choices([0, 1, 2], [80, 15, 5])[0]
        pods.append({"metadata": {"name": f"pod-{len(pods):04d}", "namespace": "default"},
                     "spec": {"priority": priority, "nodeSelector": selector,
                              "containers": [{"name": "c", "resources": {"limits": {resource: "1"}}}]}})
    return Case(name, nodes, pods)


def hard(args: argparse.Namespace) -> bool:
    """Exact and greedy against the independent per-GPU reference model on the hard states."""
    rng = random.Random(args.seed + 1)
    sizes = [1, 2, 4, 8, 16, 32, 64] if args.quick else [1, 2, 4, 8, 16, 32, 64, 128, 256, 512]
    print(f"\nhard states (time limit {args.time_limit:g} s)")
    print(f"{'case':<12}{'gpus':>5}{'pods':>6}{'exact/opt':>10}{'optimal':>8}{'greedy/opt':>11}{'served':>8}"
          f"{'greedy':>7}{'exact c+d':>10}{'greedy c+d':>11}{'exact s':>8}{'greedy s':>9}{'ref s':>7}")
    worst, worst_optimal, failures = 1.0, 1.0, []
    churn = Counter[str]()
    for size in sizes:
        for r in range(2 if size <= 64 else 1):
            case = generate_hard(f"{size}gpu-{r}", size, rng)
            exact, exact_s, exact_churn, result = ours(case, "exact", args.time_limit)
            greedy, greedy_s, greedy_churn, greedy_plan = ours(case, "greedy")
            started = time.perf_counter()
            best = optimum(case)
            ref_s = time.perf_counter() - started
            ratio, greedy_ratio = (exact / best, greedy / best) if best > 0 else (1.0, 1.0)
            worst = min(worst, ratio)
            if result.optimal:
                worst_optimal = min(worst_optimal, ratio)
            if exact < greedy:
                failures.append(f"{case.name}: exact below greedy")
            if exact == greedy and exact_churn > greedy_churn:
                failures.append(f"{case.name}: same pods as greedy but more churn")
            churn.update(exact=exact_churn, greedy=greedy_churn)
            churn.update(exact_pods=len(result.assignments), greedy_pods=len(greedy_plan.assignments))
            print(f"{case.name:<12}{case.gpus:>5}{len(case.pods):>6}{ratio:>10.4f}{result.optimal!s:>8}"
                  f"{greedy_ratio:>11.4f}{len(result.assignments):>8}{len(greedy_plan.assignments):>7}"
                  f"{exact_churn:>10}{greedy_churn:>11}{exact_s:>8.3f}{greedy_s:>9.3f}{ref_s:>7.2f}")
    print(f"worst exact/optimum: {worst:.4f} overall (target >= 0.999), {worst_optimal:.4f} where proven optimal "
          f"(target 1.000)\nall cases: pods served exact {churn['exact_pods']}, greedy {churn['greedy_pods']}; "
          f"instances created+destroyed exact {churn['exact']}, greedy {churn['greedy']}; no case where exact "
          f"serves the same pods with more churn: {not any('churn' in f for f in failures)}")
    for failure in failures:
        print(f"FAIL {failure}")
    return worst >= 0.999 and worst_optimal >= 1.0 - 1e-9 and not failures


def timing(args: argparse.Namespace) -> bool:
    """Plan time for 1,000 pending pods on 512 GPUs: median of 3, wall clock and CPU, with the time limit and with
    a generous one (the CPU time a proven optimum takes, a fair figure on a shared, loaded machine). The first run
    of the process is cold (the layout options of every GPU class computed); later runs reuse them, as a controller
    re-planning a cluster does; each run is printed."""
    case = generate_hard("timing", 512, random.Random(args.seed + 2))
    case.pods = case.pods[:1000]
    plan(case.nodes[:1], case.pods[:1])  # load HiGHS and the catalog first: a one-off, not a plan's cost
    results = {}
    for limit in (args.time_limit, 60.0):
        walls, cpus, optimal = [], [], []
        for _ in range(3):
            cpu = time.process_time()
            _, wall, _, result = ours(case, "exact", limit)
            walls.append(wall)
            cpus.append(time.process_time() - cpu)
            optimal.append(result.optimal)
        results[limit] = (sorted(walls)[1], sorted(cpus)[1])
        runs = ", ".join(f"{w:.3f}/{c:.3f}" for w, c in zip(walls, cpus, strict=True))
        print(f"\nplan time, {len(case.pods)} pods on {case.gpus} GPUs, exact planner, time limit {limit:g} s, "
              f"median of 3: {results[limit][0]:.3f} s wall, {results[limit][1]:.3f} s CPU; proven optimal: "
              f"{optimal}; each run (wall/CPU s): {runs}")
    print("target: < 1 s")
    return results[args.time_limit][0] < 1.0


def generate_fleet(gpus: int, pods: int, rng: random.Random) -> Case:
    """Issue 28's fleet: mixed A100/H100 nodes of 8, random earlier layouts on ~80 % of GPUs, 10-80 % of instances
    in use, node pools, priorities and node selectors as in the hard states, `pods` pending pods."""
    saved = MIXES[:]
    MIXES[:] = [["A100-SXM4-80GB", "H100-SXM5-80GB"]]
    try:
        case = generate_hard(f"fleet-{gpus}", gpus, rng)
    finally:
        MIXES[:] = saved
    while len(case.pods) < pods:  # demand below free capacity: top up with more of the same mix
        case.pods += generate_hard("more", 64, rng).pods
    case.pods = [{**p, "metadata": {**p["metadata"], "name": f"pod-{k:05d}"}} for k, p in enumerate(case.pods[:pods])]
    return case


def fleet(args: argparse.Namespace) -> bool:
    """Issue 28: 5,000 pending pods over 4,096 GPUs (and the same fleet with 14,000, demand above what any re-cut
    serves, so the pods stage is not settled by serving everyone), exact (default budget) and greedy, each against
    the LP bound of the independent reference model, and the exact against the greedy; wall and CPU seconds. The
    first plan of the process is cold (every GPU class's layout options computed); a second plan of the same
    cluster by the same planner is warm, as a controller re-planning its cluster."""
    gpus, sizes = (512, (600, 2400)) if args.quick else (4096, (5000, 14000))
    ok = True
    for pods in sizes:
        ok &= _fleet_case(args, generate_fleet(gpus, pods, random.Random(args.seed + 3)))
    print("target: exact >= 0.999 of the LP bound where not proven optimal, never below the greedy; within the "
          f"{args.time_limit:g} s budget (wall; CPU is what the plan itself took on this shared machine)")
    return ok


@dataclass
class FleetRow:
    label: str
    score: float  # priority-weighted pods served
    served: int
    optimal: bool
    changed: int  # instances created plus destroyed
    note: str
    wall: float
    cpu: float


def _fleet_case(args: argparse.Namespace, case: Case) -> bool:
    plan(case.nodes[:1], case.pods[:1])  # load HiGHS and the catalog first: a one-off, not a plan's cost
    started = time.perf_counter()
    bound = optimum(case, relax=True)
    bound_s = time.perf_counter() - started
    planner = Planner("exact", args.time_limit)
    by_key = {pod_key(p): p for p in case.pods}
    rows = []
    for label, run in (("exact cold", planner), ("exact warm", planner), ("greedy", Planner("greedy"))):
        cpu = time.process_time()
        started = time.perf_counter()
        result = run.plan(case.nodes, case.pods)
        wall, cpu = time.perf_counter() - started, time.process_time() - cpu
        problems = plan_violations(case.nodes, case.pods, result)
        if problems:
            raise SystemExit(f"fleet: invalid {label} plan: {problems[0]}")
        score = sum(_weight(by_key[k], len(case.pods)) for k in result.assignments)
        rows.append(FleetRow(label, score, len(result.assignments), result.optimal,
                             result.created + result.destroyed, result.note, wall, cpu))
    rows.append(_cli_row(case, args.time_limit, by_key))
    greedy_score = rows[2].score
    print(f"\nfleet: {case.gpus} GPUs ({len(case.nodes)} nodes, A100/H100), {len(case.pods)} pending pods, time limit "
          f"{args.time_limit:g} s; LP bound of the reference model {bound:.0f} (priority-weighted) in {bound_s:.1f} s; "
          f"load average {os.getloadavg()[0]:.1f}")
    print(f"{'planner':<13}{'served':>7}{'/LP bound':>11}{'/greedy':>10}{'optimal':>9}{'c+d':>6}{'wall s':>8}"
          f"{'CPU s':>7}{'wall/budget':>13}  note")
    ok = True
    for row in rows:
        ratio = row.score / bound if bound > 0 else 1.0
        print(f"{row.label:<13}{row.served:>7}{ratio:>11.6f}{row.score / greedy_score:>10.6f}{row.optimal!s:>9}"
              f"{row.changed:>6}{row.wall:>8.3f}{row.cpu:>7.3f}{row.wall / args.time_limit:>13.2f}  {row.note}")
        if row.label != "greedy":
            ok &= (row.optimal or ratio >= 0.999 - 1e-9) and row.score >= greedy_score
    print("(kubegpu plan: the whole command in a fresh process, as a user runs it: Python, imports, HiGHS's load, "
          "reading and checking the state file, the plan and its JSON; its score recounted from the JSON)")
    return ok


def state_file(case: Case) -> dict[str, Any]:
    """The case as a `kubegpu plan --state` document (partitioner.snapshot's format)."""
    nodes = [{"name": node.name, "labels": node.node["metadata"]["labels"],
              "gpus": [{"model": gpu.model_key,
                        "instances": [{"profile": gpu.model.profile(i.profile_id).name if gpu.model else "",
                                       "start": i.start, "used": i.used} for i in gpu.instances]}
                       for gpu in node.gpus]} for node in case.nodes]
    pods = [{"name": pod["metadata"]["name"], "namespace": pod["metadata"]["namespace"],
             "priority": pod["spec"]["priority"], "nodeSelector": pod["spec"]["nodeSelector"],
             "requests": pod["spec"]["containers"][0]["resources"]["limits"]} for pod in case.pods]
    return {"nodes": nodes, "pods": pods}


def _cli_row(case: Case, time_limit: float, by_key: dict[str, dict[str, Any]]) -> FleetRow:
    """`kubegpu plan --state FILE -o json` end to end in a fresh process: its score from the JSON's assignments,
    wall and CPU seconds of the whole command."""
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "state.json"
        path.write_text(json.dumps(state_file(case)))
        before = rusage.getrusage(rusage.RUSAGE_CHILDREN)
        started = time.perf_counter()
        done = subprocess.run([sys.executable, "-m", "kubegpu", "plan", "--state", str(path), "-o", "json",
                               "--time-limit", f"{time_limit:g}"], capture_output=True, text=True, check=True)
        wall = time.perf_counter() - started
        after = rusage.getrusage(rusage.RUSAGE_CHILDREN)
    doc = json.loads(done.stdout)
    score = sum(_weight(by_key[k], len(case.pods)) for k in doc["assignments"])
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return FleetRow("kubegpu plan", score, len(doc["assignments"]), doc["optimal"], doc["created"] + doc["destroyed"],
                    doc["note"], wall, cpu)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="small cases only (seconds)")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--suite", choices=("classic", "hard", "timing", "fleet", "all"), default="all")
    parser.add_argument("--time-limit", type=float, default=1.0, help="the exact planner's budget per plan (s)")
    args = parser.parse_args()
    ok = True
    if args.suite in ("classic", "all"):
        ok &= classic(args)
    if args.suite in ("hard", "all"):
        ok &= hard(args)
    if args.suite in ("timing", "all"):
        ok &= timing(args)
    if args.suite in ("fleet", "all"):
        ok &= fleet(args)
    sys.exit(0 if ok else 1)


def _summary(ratios: dict[str, list[float]], chosen: Counter[tuple[str, str]]) -> None:
    """Worst, mean and last case (the largest) ratio to the optimum per planner, and the static layouts that won."""
    cases = len(ratios["ours"])
    print(f"summary over {cases} cases, pods made schedulable / exact optimum (priority-weighted):")
    print(f"  {'':<13}{'worst':>8}{'mean':>8}{'last case':>11}")
    for name, values in ratios.items():
        print(f"  {name:<13}{min(values):>8.4f}{sum(values) / cases:>8.4f}{values[-1]:>11.4f}")
    by_model: dict[str, list[tuple[int, str]]] = defaultdict(list)
    for (model, layout), n in chosen.items():
        by_model[model].append((n, layout))
    wins = "; ".join(f"{model} {', '.join(f'{layout} x{n}' for n, layout in sorted(picks, reverse=True)[:3])}"
                     for model, picks in sorted(by_model.items()))
    print(f"  best static layouts chosen: {wins}")
    print(f"worst ours/optimum: {min(ratios['ours']):.4f} (target >= 0.99)")


if __name__ == "__main__":
    main()
