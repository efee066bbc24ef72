"""The exact planner on a generated large state (scaled down to 512 GPUs to stay within seconds): with a
budget far too tight for the whole plan it still returns a valid plan no worse than the greedy's, at least 0.999 of
its bound, and the bound it reports is honest (no plan does better, the proven optimum included); and the bound
that proves a stage comes from the relaxation's duals, valid whatever multipliers it is given."""

from __future__ import annotations

import math
import random
import time
from collections import Counter
from types import ModuleType
from typing import Any

import numpy as np
import pytest

from kubegpu.partitioner.planner import Plan, Planner, plan, plan_violations, pod_key, pod_priority
from kubegpu.partitioner.planner import exact as planner_exact
from kubegpu.partitioner.planner.bounds import dual_bound
from kubegpu.partitioner.planner.solver import Lexicographic, Solver, Stage


def per_level(result: Plan, pods: list[dict[str, Any]]) -> tuple[int, ...]:
    """Pods made schedulable per priority level, highest first: compared lexicographically, larger is better."""
    counts = Counter(pod_priority(p) for p in pods if pod_key(p) in result.assignments)
    return tuple(counts[level] for level in sorted({pod_priority(p) for p in pods}, reverse=True))


@pytest.mark.parametrize("pods", [600, 2400])  # every pod fits; demand above what a re-cut can serve
def test_a_large_state_under_a_tight_budget_is_no_worse_than_greedy_with_an_honest_bound(
        bench: ModuleType, pods: int, monkeypatch: pytest.MonkeyPatch) -> None:
    case = bench.generate_fleet(512, pods, random.Random(pods))
    greedy = plan(case.nodes, case.pods, planner="greedy")
    best = plan(case.nodes, case.pods, time_limit=60.0)
    assert best.optimal and best.score == best.bound
    greedy_calls = []
    original = planner_exact.greedy_solve

    def counted(*args: Any, **kwargs: Any) -> Plan:
        greedy_calls.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(planner_exact, "greedy_solve", counted)
    monkeypatch.setattr(planner_exact, "GRACE", 600.0)  # however loaded the machine, the pods stage finishes
    started = time.process_time()
    tight = Planner("exact", 0.05).plan(case.nodes, case.pods)
    cpu = time.process_time() - started
    assert plan_violations(case.nodes, case.pods, tight) == []
    assert per_level(tight, case.pods) >= per_level(greedy, case.pods)
    assert tight.score is not None and tight.bound is not None and best.score is not None
    assert tight.bound >= best.score >= tight.score >= 0.999 * tight.bound  # honest, and within 0.999 of it
    # the pods were proven within the grace: the greedy fallback (four pod orders) was not needed
    assert greedy_calls == [] and "time limit" in tight.note, tight.note
    assert cpu < 20.0


def test_the_bound_from_any_duals_is_below_the_optimum_and_tight_at_the_solvers() -> None:
    """min -3x - 2y - 4z, x + y + z <= 4.5, x + 3z <= 6, 0 <= x, y, z <= 3 (optimum -14 at x=3, y=0.5, z=1):
    every multiplier vector gives a bound at or below it, and the relaxation's own one reaches it."""
    cost = np.array([-3.0, -2.0, -4.0])
    lower, upper = np.zeros(3), np.full(3, 3.0)
    row_lower, row_upper = np.array([-math.inf, -math.inf]), np.array([4.5, 6.0])
    rows = np.array([0, 0, 0, 1, 1])
    index = np.array([0, 1, 2, 0, 2], dtype=np.int32)
    value = np.array([1.0, 1.0, 1.0, 1.0, 3.0])
    rng = np.random.default_rng(0)
    for _ in range(200):
        duals = rng.normal(0.0, 3.0, size=2)
        assert dual_bound(cost, lower, upper, row_lower, row_upper, duals, rows, index, value) <= -14.0 + 1e-9
    solver = Solver()
    columns = [solver.column(0, 3) for _ in range(3)]
    solver.row(None, 4.5, [(c, 1.0) for c in columns])
    solver.row(None, 6.0, [(columns[0], 1.0), (columns[2], 3.0)])
    driver = Lexicographic(solver, [Stage("s", dict(enumerate(cost.tolist())))])
    relaxed = driver._run(cost, driver.lower, driver.upper, False, time.perf_counter() + 10)
    assert relaxed.value == pytest.approx(-14.0) and -14.0 - 1e-6 <= relaxed.bound <= -14.0


def test_dominance_by_pairs_agrees_with_the_lattice(monkeypatch: pytest.MonkeyPatch) -> None:
    """Options are pruned by dominance two ways (packed pairs for the usual batches, a lattice for huge ones):
    both keep exactly the rows no better-ranked row of their group covers, checked against a plain loop."""
    from kubegpu.partitioner.planner import layouts

    rng = np.random.default_rng(1)
    for _ in range(60):
        rows: list[tuple[int, ...]] = []
        groups: list[int] = []
        for group in range(int(rng.integers(1, 6))):
            offers = {tuple(int(v) for v in rng.integers(0, 8, size=6)) for _ in range(int(rng.integers(1, 40)))}
            rows += sorted(offers, key=lambda _: rng.random())
            groups += [group] * len(offers)
        offered, group_of = np.array(rows, dtype=np.int64), np.array(groups)
        expected = [not any(group_of[j] == group_of[i] and all(a >= b for a, b in zip(rows[j], rows[i], strict=True))
                            for j in range(i)) for i in range(len(rows))]
        assert layouts._undominated(group_of, offered).tolist() == expected
        monkeypatch.setattr(layouts, "_PAIRS", -1)
        assert layouts._undominated(group_of, offered).tolist() == expected
        monkeypatch.undo()


def test_kubegpu_plan_on_a_generated_fleet_state_file_matches_the_planner_and_its_bound(
        bench: ModuleType, tmp_path: Any, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """The acceptance path (`kubegpu plan --state FILE -o json`) on a fleet-shaped state written as the benchmark
    writes it: the JSON keeps its shape, its plan is valid, serves what the planner's API plan serves, no fewer
    than the greedy per priority level, and its score is at least 0.999 of the bound it states (which the proven
    optimum does not exceed); the garbage collector is left as the command found it."""
    import gc
    import json
    import sys

    from kubegpu.cli import main

    case = bench.generate_fleet(128, 400, random.Random(28))
    path = tmp_path / "state.json"
    path.write_text(json.dumps(bench.state_file(case)))
    monkeypatch.setattr(sys, "argv", ["kubegpu", "plan", "--state", str(path), "-o", "json", "--time-limit", "30"])
    assert gc.isenabled()
    try:
        main()
    except SystemExit as exc:
        assert not exc.code
    assert gc.isenabled()
    doc = json.loads(capsys.readouterr().out)
    assert {"nodes", "schedulable", "unschedulable", "assignments", "reasons", "created", "destroyed", "planner",
            "optimal", "bound", "score", "note", "objective"} <= set(doc)
    objective = doc["objective"]
    assert objective["score"] >= 0.999 * objective["bound"] and objective["ratioToBound"] >= 0.999
    best = plan(case.nodes, case.pods, time_limit=30.0)
    assert best.optimal and objective["bound"] >= best.score == objective["score"]
    greedy = plan(case.nodes, case.pods, planner="greedy")
    mine = Plan(nodes=best.nodes, assignments=doc["assignments"], unschedulable=doc["reasons"])
    assert per_level(mine, case.pods) >= per_level(greedy, case.pods)
    # the JSON's layouts are the API plan's, GPU by GPU, and legal with the pods it calls schedulable
    layouts = {(n["name"], g["index"]): [(i["profile"], i["start"]) for i in g["instances"]]
               for n in doc["nodes"] for g in n["gpus"]}
    models = {(n.name, g.index): g.model for n in case.nodes for g in n.gpus}
    from kubegpu.gpu.geometry import PlacedInstance
    from kubegpu.partitioner.planner import GpuPlan, NodePlan

    nodes = {}
    for node in case.nodes:
        gpus = []
        for gpu in node.gpus:
            model = models[(node.name, gpu.index)]
            assert model is not None
            gpus.append(GpuPlan(gpu.index, gpu.model_key, tuple(
                PlacedInstance(model.profile(p).profile_id, s) for p, s in layouts[(node.name, gpu.index)])))
        nodes[node.name] = NodePlan(node.name, node.mode, tuple(gpus))
    assert plan_violations(case.nodes, case.pods, Plan(nodes=nodes, assignments=doc["assignments"],
                                                       unschedulable=doc["reasons"])) == []


@pytest.mark.parametrize("pods", [60, 400])  # every pod fits; demand above what a re-cut can serve
def test_a_huge_model_starts_from_the_greedy_plan_and_stays_no_worse(
        bench: ModuleType, pods: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Past `exact.HUGE` columns the greedy runs first and its plan starts the solver: valid, no worse than the
    greedy, the greedy run once; where it serves every pod the pods stage is proven with no relaxation."""
    case = bench.generate_fleet(64, pods, random.Random(pods))
    greedy = plan(case.nodes, case.pods, planner="greedy")
    calls = []
    original = planner_exact.greedy_solve

    def counted(*args: Any, **kwargs: Any) -> Plan:
        calls.append(1)
        return original(*args, **kwargs)

    starts: list[list[float] | None] = []
    start_from = planner_exact._start_from

    def spied(*args: Any) -> list[float] | None:
        starts.append(start_from(*args))
        return starts[-1]

    monkeypatch.setattr(planner_exact, "greedy_solve", counted)
    monkeypatch.setattr(planner_exact, "_start_from", spied)
    monkeypatch.setattr(planner_exact, "HUGE", 0)
    result = plan(case.nodes, case.pods, time_limit=5.0)
    assert len(starts) == 1 and starts[0] is not None  # the greedy's plan, found among the model's options
    assert plan_violations(case.nodes, case.pods, result) == []
    assert per_level(result, case.pods) >= per_level(greedy, case.pods)
    assert calls == [1]
    assert result.score is not None and result.bound is not None and result.score >= 0.999 * result.bound
    if len(greedy.assignments) == len(case.pods):
        assert result.score == result.bound and "greedy plan is kept" not in result.note
