"""The lexicographic HiGHS driver (`planner.solver`) and the batched layout options (`planner.layouts`) against
brute force, and the exact planner's time budget.

The driver proves stages with the linear relaxation, finds incumbents in small neighbourhoods of it and fixes
columns by their reduced costs before branching; every one of those shortcuts must leave the optimum exact. Small
random integer programs are enumerated point by point and the driver must reach the same lexicographic optimum,
with and without a start solution."""

from __future__ import annotations

import itertools
import random
import time
from collections.abc import Callable
from typing import Any

import pytest

from kubegpu.gpu.catalog import get_model
from kubegpu.gpu.geometry import PlacedInstance, layout_errors
from kubegpu.partitioner.planner import NodeInput, plan, plan_violations
from kubegpu.partitioner.planner import exact as planner_exact
from kubegpu.partitioner.planner.disagg import plan_objective
from kubegpu.partitioner.planner.greedy import prepare
from kubegpu.partitioner.planner.layouts import LayoutCache
from kubegpu.partitioner.planner.solver import Lexicographic, Solver, Stage

MakePod = Callable[..., dict[str, Any]]
MigNode = Callable[..., NodeInput]

Row = tuple[float | None, float | None, list[tuple[int, float]]]


def random_program(rng: random.Random) -> tuple[Solver, list[Stage], list[tuple[int, ...]]]:
    """A small integer program (2-7 columns, bounds up to 3, 1-4 rows), two objectives, and its feasible points."""
    solver = Solver()
    columns = rng.randint(2, 7)
    bounds = [(rng.randint(0, 1), rng.randint(1, 3 if columns < 6 else 2)) for _ in range(columns)]
    for low, high in bounds:
        solver.column(low, high)
    rows: list[Row] = []
    for _ in range(rng.randint(1, 4)):
        entries = [(j, float(rng.randint(-4, 4))) for j in range(columns) if rng.random() < 0.7]
        kind = rng.choice(["le", "ge", "eq"])
        value = float(rng.randint(-2, 7))
        row: Row = (None, value, entries) if kind == "le" else (value, None, entries) if kind == "ge" \
            else (value, value, entries)
        solver.row(*row)
        rows.append(row)
    stages = [Stage(name, {j: float(rng.randint(-9, 9)) for j in range(columns) if rng.random() < 0.8})
              for name in ("first", "second")]
    points = [p for p in itertools.product(*(range(lo, hi + 1) for lo, hi in bounds))
              if all(_holds(row, p) for row in rows)]
    return solver, stages, points


def _holds(row: Row, point: tuple[int, ...]) -> bool:
    low, high, entries = row
    activity = sum(c * point[j] for j, c in entries)
    return (low is None or activity >= low) and (high is None or activity <= high)


def lexicographic_optimum(stages: list[Stage], points: list[tuple[int, ...]]) -> tuple[float, ...]:
    return min(tuple(sum(c * p[j] for j, c in s.costs.items()) for s in stages) for p in points)


@pytest.mark.parametrize("seed", range(300))
def test_the_driver_reaches_the_brute_force_optimum(seed: int) -> None:
    rng = random.Random(seed)
    solver, stages, points = random_program(rng)
    start = list(map(float, rng.choice(points))) if points and seed % 2 else None
    outcome = Lexicographic(solver, stages).run(start, deadline=time.perf_counter() + 30)
    if not points:
        assert not outcome.optimal
        return
    assert outcome.optimal, outcome.status
    assert outcome.values is not None
    point = tuple(round(v) for v in outcome.values)
    assert point in points
    best = lexicographic_optimum(stages, points)
    assert tuple(r.value for r in outcome.results) == best
    assert tuple(sum(c * point[j] for j, c in s.costs.items()) for s in stages) == best
    assert all(r.bound == r.value for r in outcome.results)


def test_a_start_that_is_already_optimal_is_proven_without_branching(monkeypatch: pytest.MonkeyPatch) -> None:
    """max x + y with x + y <= 3: the relaxation's bound is the start's value, so no integer program runs."""
    solver = Solver()
    x, y = solver.column(0, 3), solver.column(0, 3)
    solver.row(None, 3.0, [(x, 1.0), (y, 1.0)])
    runs: list[bool] = []
    original = Lexicographic._run

    def spy(self: Lexicographic, *args: Any, **kwargs: Any) -> Any:
        runs.append(args[3])  # integer?
        return original(self, *args, **kwargs)

    monkeypatch.setattr(Lexicographic, "_run", spy)
    outcome = Lexicographic(solver, [Stage("pods", {x: -1.0, y: -1.0})]).run([2.0, 1.0], time.perf_counter() + 10)
    assert outcome.optimal and outcome.values == [2.0, 1.0]
    assert runs == [False]  # only the relaxation


def test_every_solver_run_ends_within_the_plan_budget(mig_node: MigNode, make_pod: MakePod,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """The budget covers the whole plan: once the solver has a plan, no HiGHS run is allowed past the plan's start
    plus its time limit (the solver stops a share earlier, kept for turning counts into per-GPU plans); before it
    has one, a run may go on for the grace (`grace_s`) rather than fall back to the slower greedy.
    The plan stays no worse than the greedy's."""
    nodes = [mig_node(f"n{k}", [("A100-SXM4-80GB", [("1g.10gb", s, s % 2 == 0) for s in range(7)])] * 4)
             for k in range(6)]
    pods = [make_pod(f"p{k}", {f"nvidia.com/mig-{('1g.10gb', '2g.20gb', '3g.40gb')[k % 3]}": 1})
            for k in range(80)]
    deadlines: list[float] = []  # of the runs made once the solver had a plan
    graced: list[float] = []  # of the runs made before
    found = [False]
    starts: list[float] = []
    original, original_solve = Lexicographic._run, planner_exact.exact_solve

    def spy(self: Lexicographic, cost: Any, lower: Any, upper: Any, integer: bool, deadline: float,
            start: Any = None) -> Any:
        (deadlines if found[0] else graced).append(deadline)
        run = original(self, cost, lower, upper, integer, deadline, start)
        found[0] = found[0] or (integer and run.x is not None)  # a plan: every later run keeps to the budget
        return run

    def solve_spy(problem: Any, time_limit: float, started: float | None = None, *args: Any) -> Any:
        assert started is not None  # the budget is counted from the plan call, parsing included
        starts.append(started)
        return original_solve(problem, time_limit, started, *args)

    monkeypatch.setattr(Lexicographic, "_run", spy)
    monkeypatch.setattr(planner_exact, "exact_solve", solve_spy)
    for limit in (0.2, 5.0):
        deadlines.clear()
        graced.clear()
        found[0] = False
        began = time.perf_counter()
        result = plan(nodes, pods, time_limit=limit)
        ended = time.perf_counter()
        assert began <= starts[-1] and all(starts[-1] <= d for d in deadlines + graced)
        assert all(d <= starts[-1] + (1 - planner_exact.FINISH_SHARE) * limit + 1e-9 for d in deadlines)
        assert all(g <= ended + planner_exact.grace_s(limit, planner_exact.SLOWDOWN) for g in graced)
        assert plan_violations(nodes, pods, result) == []
        problem = prepare(nodes, pods)
        assert plan_objective(problem, result) <= plan_objective(problem, plan(nodes, pods, planner="greedy"))
    assert deadlines + graced and result.optimal  # with 5 s, the solver ran and proved this small state optimal


def reference_options(model_key: str, used: tuple[PlacedInstance, ...], free: tuple[PlacedInstance, ...],
                      wanted: frozenset[int]) -> list[tuple[Any, ...]]:
    """One class's options the slow way: every enumerated layout, one by one."""
    model = get_model(model_key)
    world = LayoutCache().universe(model, any(p.media_extensions for p in model.mig_profiles if p.profile_id in wanted))
    allowed = wanted | {i.profile_id for i in free}
    best: dict[tuple[int, ...], tuple[Any, ...]] = {}
    for index, mask in enumerate(world.layouts):
        layout = set(world.instances(mask))
        if not set(used) <= layout or any(i.profile_id not in allowed for i in layout - set(used)):
            continue
        offer = tuple(sum(1 for i in layout - set(used) if i.profile_id == p) if p in wanted else 0
                      for p in world.profile_ids)
        created, destroyed = len(layout - set(used) - set(free)), len(set(free) - layout)
        rank = (created + destroyed, world.frag(index), index)
        if offer not in best or rank < best[offer][0]:
            best[offer] = (rank, created, destroyed)
    order = {offer: (r[0][0], r[0][1], -sum(offer), offer) for offer, r in best.items()}
    return sorted((offer, world.instances(world.layouts[r[0][2]]), r[1], r[2], r[0][1]) for offer, r in best.items()
                  if not any(order[o] < order[offer] and all(a >= b for a, b in zip(o, offer, strict=True))
                             for o in best))


@pytest.mark.parametrize("model_key", ["A100-SXM4-80GB", "A30-24GB"])
def test_batched_layout_options_match_one_by_one(model_key: str) -> None:
    model = get_model(model_key)
    rng = random.Random(model_key)
    placements = [PlacedInstance(p.profile_id, s) for p in model.mig_profiles if not p.media_extensions
                  for s in p.starts]
    requests = []
    for _ in range(12):
        layout: list[PlacedInstance] = []
        for inst in rng.sample(placements, len(placements)):
            if not layout_errors(model, [*layout, inst]):
                layout.append(inst)
        flags = [rng.random() < 0.4 for _ in layout]
        requests.append((tuple(sorted(i for i, u in zip(layout, flags, strict=True) if u)),
                         tuple(sorted(i for i, u in zip(layout, flags, strict=True) if not u)), False))
    wanted = frozenset(p.profile_id for p in rng.sample(
        [p for p in model.mig_profiles if not p.media_extensions], 3))
    for (used, free, _), (_, options) in zip(requests, LayoutCache().mig_options_many(model, wanted, requests),
                                                 strict=True):
        got = [(o.free, o.instances, o.created, o.destroyed, o.frag) for o in options]
        assert got == reference_options(model_key, used, free, wanted)
        assert any(o.created == o.destroyed == 0 for o in options)  # keeping the layout is always one


@pytest.mark.parametrize("model_key", ["A100-SXM4-80GB", "A30-24GB"])
def test_a_universes_fragmentation_at_once_is_geometrys_layout_by_layout(model_key: str) -> None:
    """The exact planner computes `free_space_score` of a whole layout universe over arrays: it must be the
    geometry's own measure on every layout, with and without `+me` profiles."""
    from kubegpu.gpu.geometry import free_space_score

    model = get_model(model_key)
    for media in (False, True):
        world = LayoutCache().universe(model, media)
        expected = [-free_space_score(model, list(world.instances(mask))) for mask in world.layouts]
        assert [world.frag(k) for k in range(len(world.layouts))] == expected


def test_packed_sort_keys_order_as_lexsort() -> None:
    """`layouts._order` packs sort keys into one integer when their ranges fit: the same order as `np.lexsort`
    (first key most significant, stable), negative keys and ranges too wide to pack included."""
    import numpy as np

    from kubegpu.partitioner.planner.layouts import _order

    rng = np.random.default_rng(3)
    for spans in ([3, 5, 2], [1 << 40, 1 << 30], [7, -9, 100, 1]):
        keys = tuple(rng.integers(-abs(s), abs(s) + 1, size=500).astype(np.int64) for s in spans)
        assert _order(keys).tolist() == np.lexsort(keys[::-1]).tolist()

