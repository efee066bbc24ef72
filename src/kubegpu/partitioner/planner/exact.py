"""The exact planner: a mixed-integer model of the whole re-cut, solved by HiGHS (`highspy`), lexicographic.

Model (aggregated so that 512 GPUs and 1,000 pods solve in well under a second):
  * GPU classes. MIG GPUs with the same model, supply group, in-use instances and free instances form one class;
    an integer column per (class, layout option) counts how many of the class's GPUs take that layout
    (`layouts.LayoutCache.mig_options`: every legal layout keeping the in-use instances, the best per free multiset).
    MPS GPUs are a knapsack each: columns for kept and new slices of every requested size within free memory.
  * Supply groups. Normally nodes whose labels and taints admit exactly the same pods form one group, and a pod
    may take instances anywhere in it; when a pod asks for several instances (all must be on one node) or the
    nodes' cpu, memory or pod slots could run out, every node is its own group with those limits as rows.
  * Pod groups: pods with the same units, priority and eligible supply groups; an integer column per (pod group,
    eligible supply group) counts the pods served there, bounded by the free instances the chosen layouts offer.
Objective, in order: priority-weighted pods made schedulable (one pod of a higher priority outweighs every pod below
it), then instances created plus destroyed, then fragmentation (`geometry.free_space_score`). Normally two stages,
each keeping the value the previous one reached: pods, then churn with fragmentation as its tie-breaker
(`solver.Lexicographic`: relaxation bound, neighbourhood incumbents, reduced-cost fixing, then branching).
Time budget, wall clock for the whole plan (parsing, model, solver, disaggregation; HiGHS's one-off library load
aside): the solver runs until `FINISH_SHARE` of it is left for disaggregation (or, while it has no plan at all, for
`grace_s` after the model is built, longer on a busy machine), and a plan whose pods stages it proves optimal is at
least as good as any greedy plan (a churn stage the deadline stopped keeps its best plan). If it has not proven its
pods by then, the greedy runs in all its pod orders (to the end, even past the budget: the plan is never worse than
the greedy's) and the better plan is kept.
"""

from __future__ import annotations

import math
import time
from collections import Counter
from collections.abc import Sequence
from typing import Any

import numpy as np

from kubegpu.highs import HighsLoader
from kubegpu.partitioner.planner.columns import Model, build
from kubegpu.partitioner.planner.disagg import disaggregate, plan_objective
from kubegpu.partitioner.planner.greedy import Problem, finish, greedy_solve
from kubegpu.partitioner.planner.layouts import LayoutCache
from kubegpu.partitioner.planner.model import Plan, pod_priority
from kubegpu.partitioner.planner.solver import Lexicographic, Outcome, Stage, StageResult
from kubegpu.scheduling import pod_key

MAX_COEFFICIENT = 1e9  # pod weights above this are solved level by level (the objective stays exact in doubles)
FINISH_SHARE = 0.1  # of the time limit, kept for turning the solver's counts into a plan per GPU and pod
GRACE = 4.0
"""Times the time limit (or times a second, if that is more) the solver may run on while it has no plan at all (a
large cluster, a loaded machine, a tiny budget): its first plan (on fleet-scale states the optimum, proven at the
root) comes in a fraction of the time the greedy fallback takes there (its four pod orders cost seconds of CPU on
4,096 GPUs)."""


SLOWDOWN = 4.0
"""The most the grace stretches on a busy machine: it is meant as work, so it grows with how much longer than its CPU
time building the model took in wall time (other processes on the cores), up to this factor. Giving up on it costs
more than going on: the greedy fallback's own CPU time then comes on top, stretched as much."""


HUGE = 100_000
"""Columns from which the greedy runs before the solver and its plan is the solver's start: a pods stage it serves
in full is then proven with no relaxation at all. 4,096 GPUs modelled node by node (pods asking for several
instances, or cpu and memory that could run out) make ~145,000 columns, whose one relaxation takes 7 s of CPU, past
any grace: the solver used to spend the grace on it and then fall back to the greedy anyway."""


def grace_s(time_limit: float, slowdown: float = 1.0) -> float:
    """How long after the model is built the solver may look for its first plan (see `GRACE`), on a machine where
    wall time runs `slowdown` times the plan's CPU time (see `SLOWDOWN`)."""
    return GRACE * max(time_limit, 1.0) * min(max(slowdown, 1.0), SLOWDOWN)


def exact_solve(problem: Problem, time_limit: float, started: float | None = None, layouts: LayoutCache | None = None,
                loader: HighsLoader | None = None) -> Plan:
    """Plan `problem` exactly within `time_limit` seconds of wall time counted from `started` (see module doc).

    The solver runs first, until `FINISH_SHARE` of the budget is left; a proven optimum is at least as good as any
    greedy plan. Otherwise the greedy runs in every pod order, the solver goes on from the better of the two plans
    while time is left, and the better of its plan and the greedy's is kept. `layouts` and `loader` are the
    planner's (fresh ones when None)."""
    loader = HighsLoader() if loader is None else loader
    loader.warm_up()
    started = time.perf_counter() if started is None else started
    solver_deadline = started + (1.0 - FINISH_SHARE) * time_limit
    if not problem.candidates:
        return _with(greedy_solve(problem, orders=slice(0, 1)), optimal=True, bound=0, score=0,
                     note="no pending pod a re-cut could serve; nothing changed")
    wall, cpu = time.perf_counter(), time.process_time()
    model = build(problem, LayoutCache() if layouts is None else layouts)
    stages = _stages(model)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    # a huge model: the greedy first, its plan the solver's start (a pods stage it serves in full is proven at once)
    greedy = greedy_solve(problem) if model.solver.columns > HUGE else None
    start = None if greedy is None else _start_from(model, problem, greedy)
    grace = time.perf_counter() + grace_s(time_limit, wall / cpu if cpu > 0.05 else 1.0)  # too short to tell: 1
    outcome = Lexicographic(model.solver, stages, loader).run(start, deadline=solver_deadline, grace=grace)
    if outcome.values is not None and (outcome.optimal or _pods_proven(stages, outcome)):
        # every pods stage proven: no plan, the greedy's included, makes more pods schedulable; a churn stage the
        # deadline stopped keeps the best plan it had (the pods stage's, already steered towards less churn)
        proven = _exact_plan(problem, model, outcome, _bound(model, outcome))
        if greedy is None or plan_objective(problem, proven) <= plan_objective(problem, greedy):
            return proven
    if greedy is None:
        greedy = greedy_solve(problem)
        start = _start_from(model, problem, greedy)
    bound = _bound(model, outcome)
    # e.g. the solver gave up early: go on from the greedy's plan when it is the better one (from its own plan the
    # solver would only repeat the effort it has just spent)
    if time.perf_counter() < solver_deadline and _rank(stages, start) < _rank(stages, outcome.values):
        again = Lexicographic(model.solver, stages, loader).run(start, deadline=solver_deadline)
        if again.values is not None and _rank(stages, again.values) <= _rank(stages, outcome.values):
            bound = min(bound, _bound(model, again))
            outcome = again
    exact = _exact_plan(problem, model, outcome, bound) if outcome.values is not None else None
    if exact is not None and (exact.optimal or plan_objective(problem, exact) <= plan_objective(problem, greedy)):
        return exact
    kept = _with(greedy, bound=bound, note=f"{outcome.status}; the greedy plan is kept")
    kept.score = score(model, kept)
    return kept


def _exact_plan(problem: Problem, model: Model, outcome: Outcome, bound: int) -> Plan:
    """The solver's plan, disaggregated, with its verdict."""
    assert outcome.values is not None
    gpu_plans, assignments = disaggregate(problem, model, outcome.values)
    exact = finish(problem, gpu_plans, assignments, planner="exact", optimal=outcome.optimal, bound=bound,
                   note=outcome.status)
    exact.score = score(model, exact)
    return exact


def _pods_proven(stages: Sequence[Stage], outcome: Outcome) -> bool:
    """Whether the solver proved every pods stage optimal (only the churn stage, if any, is left unproven)."""
    proven = {r.name for r in outcome.results if r.optimal}
    return all(stage.name in proven for stage in stages if stage.name.startswith("pods"))


def _rank(stages: Sequence[Stage], values: Sequence[float] | None) -> tuple[float, ...]:
    """A solution's stage objectives, in order (smaller is better); no solution ranks last."""
    if values is None:
        return (math.inf,)
    return tuple(sum(c * values[j] for j, c in stage.costs.items()) for stage in stages)


def _with(plan: Plan, **meta: Any) -> Plan:
    """A greedy plan handed out by the exact planner: it says so, with the solver's verdict and bound."""
    plan.planner = "exact"
    for key, value in meta.items():
        setattr(plan, key, value)
    return plan


def score(model: Model, plan: Plan) -> int:
    """The plan's priority-weighted pods made schedulable, in the model's weights (what `Plan.bound` bounds)."""
    by_key = {pod_key(p): p for g in model.pods for p in g.pods}
    return sum(model.weights[pod_priority(by_key[k])] for k in plan.assignments if k in by_key)


def _stages(model: Model) -> list[Stage]:
    """Pods (one weighted stage, or one per priority level when the weights grow past what doubles keep exact),
    then churn with fragmentation as its tie-breaker (a unit of churn outweighs the whole fragmentation range).
    Serving every pod is a proven optimum of a pods stage: a start that does needs no solve there. (One objective
    with churn as the pods' tie-breaker was tried: twice the solver time on 512 GPUs.)"""
    solver = model.solver
    counts = Counter(g.priority for g in model.pods for _ in g.pods)
    if max(model.weights.values(), default=1) <= MAX_COEFFICIENT:
        everything = sum(model.weights[level] * n for level, n in counts.items())
        stages = [Stage("pods", {c: -w for c, w in solver.costs["pods"].items()}, known=-everything,
                        then=solver.costs["churn"])]
    else:
        stages = [Stage(f"pods@{level}", {c: -1.0 for c, lv in model.levels.items() if lv == level},
                        known=-counts[level], then=solver.costs["churn"])
                  for level in sorted(model.weights, reverse=True)]
    span = sum(len(m.node_gpus) * (int(m.options.frag.max()) - int(m.options.frag.min())) for m in model.mig)
    costs = {c: v * (span + 1) for c, v in solver.costs["churn"].items()}
    for column, value in solver.costs["frag"].items():
        costs[column] = costs.get(column, 0.0) + value
    stages.append(Stage("churn", costs))
    return stages


def _start_from(model: Model, problem: Problem, greedy: Plan) -> list[float] | None:
    """The greedy plan as a solution of the model: the solver starts from it, so it never ends worse."""
    values = [0.0] * model.solver.columns
    plans = {(name, g.index): g for name, node in greedy.nodes.items() for g in node.gpus}
    for mig in model.mig:
        used = Counter(mig.used)
        offers = mig.options.free
        for node_gpu in mig.node_gpus:
            free = Counter(i.profile_id for i in (Counter(plans[node_gpu].instances) - used).elements())
            wanted = np.array([free[p] if w else 0 for p, w in zip(mig.profile_ids, mig.wanted, strict=True)])
            # the option with exactly these instances, else one that dominates it (pruned options were dominated)
            found = np.flatnonzero((offers == wanted).all(axis=1))
            if not len(found):
                found = np.flatnonzero((offers >= wanted).all(axis=1))
            if not len(found):
                return None
            values[mig.columns.start + int(found[0])] += 1
    for mps in model.mps:
        now = Counter(plans[(mps.node, mps.index)].slices) - Counter(mps.used)
        for size, n in now.items():
            kept = min(n, mps.current[size])
            if kept and size in mps.keep:
                values[mps.keep[size]] = kept
            if n - kept:
                if size not in mps.new:
                    return None
                values[mps.new[size]] = n - kept
    where = {pod_key(p): model.node_group[n] for p, n in ((p, greedy.assignments.get(pod_key(p)))
                                                          for g in model.pods for p in g.pods) if n}
    for group in model.pods:
        for pod in group.pods:
            at = where.get(pod_key(pod))
            if at is not None:
                if at not in group.columns:
                    return None
                values[group.columns[at]] += 1
    return values


def _bound(model: Model, outcome: Outcome) -> int:
    """Upper bound on the priority-weighted pods any plan can make schedulable: the solver's dual bound of the pod
    stages, and every pod of the levels it did not bound."""
    results = {r.name: r for r in outcome.results}
    counts = Counter(g.priority for g in model.pods for _ in g.pods)
    everything = sum(model.weights[level] * n for level, n in counts.items())
    if max(model.weights.values(), default=1) <= MAX_COEFFICIENT:
        found = results.get("pods")
        return min(everything, _floor(found)) if found is not None else everything
    total = 0
    for level, n in counts.items():
        result = results.get(f"pods@{level}")
        total += model.weights[level] * (min(n, _floor(result)) if result is not None else n)
    return total


def _floor(result: StageResult) -> int:
    """A pods stage minimises minus the pods: its lower bound, negated and rounded down (infinite: no bound).
    A stage proven optimal is its own bound (HiGHS may report a dual bound up to its gap tolerance away)."""
    value = -(result.value if result.optimal else result.bound)
    return math.floor(value + 1e-6) if math.isfinite(value) else 2**62
