"""A small column-wise builder for integer programs and a lexicographic driver for HiGHS (`highspy`).

Lexicographic: each stage minimises its own objective; before the next stage runs, a row keeps the value the
stage reached, and the solver starts from the previous stage's solution (so every stage has an incumbent and
the plan can only get better). All objective coefficients are integers, so an absolute gap under 1 is optimal.
The whole run shares one deadline; a stage stopped by it returns its best solution and the run ends there.
"""

from __future__ import annotations

import ctypes
import os
import sys
import threading
import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import highspy

_banner_lock = threading.Lock()
_banner_shown = False


def warm_up() -> None:
    """Build the first HiGHS instance (a second or so of library loading on a busy machine) so that it is not
    charged to a plan's time limit."""
    new_highs()


def new_highs() -> Any:
    """A silent `highspy.Highs`. HiGHS prints its banner on stdout when the first instance is built, which would
    corrupt `kubegpu plan -o json`; the first construction runs with file descriptor 1 pointed at /dev/null."""
    global _banner_shown
    with _banner_lock:
        if _banner_shown:
            highs = highspy.Highs()
        else:
            sys.stdout.flush()
            saved = os.dup(1)
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, 1)
            try:
                highs = highspy.Highs()
                highs.setOptionValue("output_flag", False)
                ctypes.CDLL(None).fflush(None)
            finally:
                os.dup2(saved, 1)
                os.close(saved)
                os.close(devnull)
            _banner_shown = True
    highs.setOptionValue("output_flag", False)
    return highs


class Solver:
    """Integer columns with named objective coefficients, and rows of (column, coefficient) entries."""

    def __init__(self) -> None:
        self.lower: list[float] = []
        self.upper: list[float] = []
        self.costs: dict[str, dict[int, float]] = defaultdict(dict)
        self.rows: list[tuple[float | None, float | None, list[tuple[int, float]]]] = []

    @property
    def columns(self) -> int:
        return len(self.lower)

    def column(self, lower: float, upper: float, **costs: float) -> int:
        index = len(self.lower)
        self.lower.append(float(lower))
        self.upper.append(float(upper))
        for name, value in costs.items():
            if value:
                self.costs[name][index] = float(value)
        return index

    def row(self, lower: float | None, upper: float | None, entries: list[tuple[int, float]]) -> None:
        self.rows.append((lower, upper, entries))


@dataclass
class Stage:
    name: str
    costs: dict[int, float]  # column → coefficient, minimised
    known: float | None = None  # a proven lower bound: a start reaching it needs no solve


@dataclass
class StageResult:
    name: str
    value: float  # objective of the solution kept
    bound: float  # the solver's proven lower bound on the objective
    optimal: bool


@dataclass
class Outcome:
    values: list[float] | None
    status: str
    results: list[StageResult] = field(default_factory=list)
    stages: int = 0

    @property
    def optimal(self) -> bool:
        return len(self.results) == self.stages and all(r.optimal for r in self.results)


class Lexicographic:
    def __init__(self, solver: Solver, stages: list[Stage]) -> None:
        self.solver = solver
        self.stages = stages

    def run(self, start: list[float] | None, deadline: float) -> Outcome:
        values = start
        outcome = Outcome(values, "optimal", stages=len(self.stages))
        if self.solver.columns == 0:  # nothing to decide (HiGHS calls an empty model "Empty", not optimal)
            outcome.values = []
            outcome.results = [StageResult(stage.name, 0.0, 0.0, True) for stage in self.stages]
            return outcome
        kept: list[tuple[float | None, float | None, list[tuple[int, float]]]] = []  # the stages' values so far
        for stage in self.stages:
            left = deadline - time.perf_counter()
            if left <= 0.0:
                outcome.status = f"time limit reached before the {stage.name} stage"
                break
            if stage.known is not None and values is not None:
                value = sum(c * values[j] for j, c in stage.costs.items())
                if value <= stage.known + 0.5:  # the start is already optimal for this stage
                    outcome.results.append(StageResult(stage.name, value, value, True))
                    kept.append((None, value + 0.5, sorted(stage.costs.items())))
                    continue
            highs = self._solve(stage, kept, values, left)
            if values is not None and not _consistent(highs, stage):
                # HiGHS 1.16 with a start solution and presolve can report the better objective it found but hand
                # back the start's columns; solve the stage again without the start when that happens.
                highs = self._solve(stage, kept, None, max(deadline - time.perf_counter(), 0.001))
                if not _consistent(highs, stage):
                    outcome.status = f"{stage.name} stage: the solver returned an inconsistent solution"
                    break
            status = highs.getModelStatus()
            info = highs.getInfo()
            if info.primal_solution_status != 2:  # no feasible solution: keep the previous stage's
                outcome.status = f"{stage.name} stage: {highs.modelStatusToString(status)}"
                break
            values = [float(round(v)) for v in highs.getSolution().col_value]
            value = sum(c * values[j] for j, c in stage.costs.items())
            optimal = status == highspy.HighsModelStatus.kOptimal
            outcome.results.append(StageResult(stage.name, value, float(info.mip_dual_bound), optimal))
            outcome.values = values
            if not optimal:
                outcome.status = f"{stage.name} stage: {highs.modelStatusToString(status)}"
                break
            if stage.costs:
                kept.append((None, value + 0.5, sorted(stage.costs.items())))
        return outcome

    def _solve(self, stage: Stage, kept: list[tuple[float | None, float | None,
               list[tuple[int, float]]]], start: list[float] | None, seconds: float) -> Any:
        highs = new_highs()
        highs.setOptionValue("mip_rel_gap", 0.0)
        highs.setOptionValue("mip_abs_gap", 0.99)
        highs.setOptionValue("random_seed", 0)
        highs.setOptionValue("time_limit", seconds)
        highs.passModel(self._lp(stage.costs, kept))
        if start is not None:
            solution = highspy.HighsSolution()
            solution.col_value = list(start)
            solution.value_valid = True
            highs.setSolution(solution)
        highs.run()
        return highs

    def _lp(self, costs: dict[int, float],
            extra: list[tuple[float | None, float | None, list[tuple[int, float]]]]) -> Any:
        solver = self.solver
        by_column: list[list[tuple[int, float]]] = [[] for _ in range(solver.columns)]
        lp = highspy.HighsLp()
        lower, upper = [], []
        table = [*solver.rows, *extra]
        for r, (low, high, entries) in enumerate(table):
            lower.append(-highspy.kHighsInf if low is None else low)
            upper.append(highspy.kHighsInf if high is None else high)
            for column, value in entries:
                by_column[column].append((r, value))
        starts: list[int] = [0]
        rows: list[int] = []
        coefficients: list[float] = []
        for entries in by_column:
            for r, v in entries:
                rows.append(r)
                coefficients.append(v)
            starts.append(len(rows))
        lp.num_col_ = solver.columns
        lp.num_row_ = len(table)
        objective = [0.0] * solver.columns
        for column, cost in costs.items():
            objective[column] = cost
        lp.col_cost_ = objective
        lp.col_lower_ = solver.lower
        lp.col_upper_ = solver.upper
        lp.row_lower_ = lower
        lp.row_upper_ = upper
        lp.a_matrix_.format_ = highspy.MatrixFormat.kColwise
        lp.a_matrix_.start_ = starts
        lp.a_matrix_.index_ = rows
        lp.a_matrix_.value_ = coefficients
        lp.integrality_ = [highspy.HighsVarType.kInteger] * solver.columns
        return lp


def _consistent(highs: Any, stage: Stage) -> bool:
    """Whether the columns HiGHS returns have the objective value it reports (no solution counts as consistent)."""
    info = highs.getInfo()
    if info.primal_solution_status != 2:
        return True
    values = highs.getSolution().col_value
    value = sum(c * round(values[j]) for j, c in stage.costs.items())
    return abs(value - info.objective_function_value) <= 0.5
