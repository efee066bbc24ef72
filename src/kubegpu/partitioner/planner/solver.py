"""A small column-wise builder for integer programs and a lexicographic driver for HiGHS (`highspy`).

Lexicographic: each stage minimises its own objective; before the next stage runs, a row keeps the value the
stage reached, and the stage starts from the previous stage's solution (so every stage after the first has an
incumbent and the plan can only get better). All objective coefficients are integers, so an absolute gap under 1
is optimal.
The whole run shares one deadline; a stage stopped by it returns its best solution and the run ends there. A run
may have a later, grace deadline: for finding a first solution, and for the relaxations and small neighbourhood
programs of the pods stages (on a large model the optimum, proven at the root, costs a fraction of what the
fallback to a greedy would); never for branching.

A stage is solved in up to three steps, each exact:
  1. The linear relaxation (a few tens of milliseconds on the planner's largest models). Its optimum bounds the
     stage from below: an incumbent within 1 of it (the objective is integral) is proven optimal with no branching,
     and so is a relaxed solution that happens to be integral.
  2. Quick incumbents from small integer programs around the relaxation: over its support, over the columns where
     it and the incumbent disagree (the rest fixed at their common value), and over the union of both supports;
     any may reach the relaxation's bound and prove the stage. They break ties with the next stage's objective,
     so that stage starts from a good incumbent.
  3. Otherwise the integer program, after reduced-cost fixing against the incumbent: a column whose reduced cost
     alone lifts the relaxation's bound past the incumbent keeps its bound in every better solution, so it is fixed
     there (most of the model on the planner's states). The stage's bound is then the smaller of the solver's bound
     on the fixed model and the incumbent, never below the relaxation's.
Columns whose bounds meet are substituted into the rows, and the model goes to HiGHS as whole arrays (row-wise).
"""

from __future__ import annotations

import math
import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field

import highspy
import numpy as np
import numpy.typing as npt

from kubegpu.highs import HighsLoader
from kubegpu.partitioner.planner.bounds import dual_bound, fixed_by_reduced_costs

Vector = npt.NDArray[np.float64]
_ROWWISE, _MINIMIZE, _CONTINUOUS, _INTEGER = 2, 1, 0, 1  # highspy's MatrixFormat, ObjSense and HighsVarType values
_INTEGRAL = 1e-6  # a relaxed value this close to an integer is that integer
_DIVE_SHARE = 0.25  # of the time left, for the quick incumbent from the relaxation
_EXACT = 2.0**50  # integers below this stay exact in doubles, with room for sums
_LARGE = 20_000
"""Columns from which a relaxation is solved without presolve: on fleet-scale models (4,096 GPUs, ~45,000 columns)
HiGHS's presolve costs more than it saves (a third of the relaxation's time)."""
MAX_NODES = 100
"""Branch-and-bound nodes per integer run: an effort limit that, unlike the wall-clock deadline, stops at the same
point on a busy machine and an idle one. The planner's integer programs prove at the root node (every one of a
simulated day of 800 GPUs but one, and every state of the quality benchmark); the rare one that does not is a
fragmentation tie-breaker HiGHS cannot close in minutes, and is left with its best plan and proven bound."""


class Solver:
    """Integer columns with named objective coefficients, and rows of (column, coefficient) entries, kept as the
    flat row-wise arrays HiGHS takes."""

    def __init__(self) -> None:
        self.lower: list[float] = []
        self.upper: list[float] = []
        self.costs: dict[str, dict[int, float]] = defaultdict(dict)
        self.row_lower: list[float] = []
        self.row_upper: list[float] = []
        self.starts: list[int] = [0]
        self.index: list[int] = []
        self.value: list[float] = []

    @property
    def columns(self) -> int:
        return len(self.lower)

    @property
    def rows(self) -> int:
        return len(self.row_lower)

    def column(self, lower: float, upper: float, **costs: float) -> int:
        index = len(self.lower)
        self.lower.append(float(lower))
        self.upper.append(float(upper))
        for name, value in costs.items():
            if value:
                self.costs[name][index] = float(value)
        return index

    def columns_of(self, count: int, lower: float, upper: float, **costs: Sequence[float]) -> range:
        """`count` columns with the same bounds at once, each with its own objective coefficients."""
        first = len(self.lower)
        self.lower.extend([float(lower)] * count)
        self.upper.extend([float(upper)] * count)
        for name, values in costs.items():
            named = self.costs[name]
            for index, value in enumerate(values, first):
                if value:
                    named[index] = float(value)
        return range(first, first + count)

    def column_array(self, lower: Vector, upper: Vector, **costs: Vector) -> range:
        """Columns from arrays of bounds and objective coefficients (one entry per column), at once."""
        first = len(self.lower)
        self.lower.extend(np.asarray(lower, dtype=np.float64).tolist())
        self.upper.extend(np.asarray(upper, dtype=np.float64).tolist())
        for name, values in costs.items():
            nonzero = np.flatnonzero(values)
            self.costs[name].update(zip((nonzero + first).tolist(),
                                        np.asarray(values, dtype=np.float64)[nonzero].tolist(), strict=True))
        return range(first, len(self.lower))

    def rows_csr(self, lower: Vector, upper: Vector, starts: npt.NDArray[np.int64], index: npt.NDArray[np.int64],
                 value: Vector) -> None:
        """Rows at once, compressed: row r's entries are index/value[starts[r]:starts[r + 1]]."""
        base = len(self.index)
        self.row_lower.extend(np.asarray(lower, dtype=np.float64).tolist())
        self.row_upper.extend(np.asarray(upper, dtype=np.float64).tolist())
        self.index.extend(np.asarray(index).tolist())
        self.value.extend(np.asarray(value, dtype=np.float64).tolist())
        self.starts.extend((np.asarray(starts[1:], dtype=np.int64) + base).tolist())

    def row_arrays(self, lower: float | None, upper: float | None, index: npt.NDArray[np.int64],
                   value: Vector) -> None:
        """One row from arrays of columns and coefficients."""
        self.row_lower.append(-highspy.kHighsInf if lower is None else float(lower))
        self.row_upper.append(highspy.kHighsInf if upper is None else float(upper))
        self.index.extend(np.asarray(index).tolist())
        self.value.extend(np.asarray(value, dtype=np.float64).tolist())
        self.starts.append(len(self.index))

    def row(self, lower: float | None, upper: float | None, entries: list[tuple[int, float]]) -> None:
        self.row_lower.append(-highspy.kHighsInf if lower is None else float(lower))
        self.row_upper.append(highspy.kHighsInf if upper is None else float(upper))
        for column, value in entries:
            self.index.append(column)
            self.value.append(value)
        self.starts.append(len(self.index))


@dataclass
class Stage:
    name: str
    costs: dict[int, float]  # column → coefficient, minimised
    known: float | None = None  # a proven lower bound: a start reaching it needs no solve
    then: dict[int, float] = field(default_factory=dict)  # the next stage's objective: quick incumbents break ties
    # with it, so that the next stage starts from a good one


@dataclass
class StageResult:
    name: str
    value: float  # objective of the solution kept
    bound: float  # the proven lower bound on the objective
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


@dataclass
class _Run:
    """One HiGHS run: "optimal", "infeasible" or "stopped" (time limit or another status, `status` says which), the
    full solution when one was found, its objective, the solver's bound, and reduced costs (relaxations only)."""

    kind: str
    x: Vector | None
    value: float
    bound: float
    duals: Vector
    status: str
    consistent: bool = True  # the solution's recomputed objective matches the one HiGHS reports
    also: float = -math.inf  # a relaxation's bound on another objective, from its scaled duals (see `_run`)


@dataclass
class _Step:
    """What one stage produced: the solution kept (None: none found) and, when there is one, its result."""

    values: Vector | None
    result: StageResult | None
    status: str


class Lexicographic:
    def __init__(self, solver: Solver, stages: list[Stage], loader: HighsLoader | None = None) -> None:
        self.stages = stages
        self.loader = HighsLoader() if loader is None else loader
        self.columns = solver.columns
        self.lower = np.array(solver.lower, dtype=np.float64)
        self.upper = np.array(solver.upper, dtype=np.float64)
        self.row_lower = np.array(solver.row_lower, dtype=np.float64)
        self.row_upper = np.array(solver.row_upper, dtype=np.float64)
        self.starts = np.array(solver.starts, dtype=np.int32)
        self.index = np.array(solver.index, dtype=np.int32)
        self.value = np.array(solver.value, dtype=np.float64)

    def run(self, start: list[float] | None, deadline: float, grace: float | None = None) -> Outcome:
        """Solve the stages in order until `deadline`; while no solution is known (no start, and the first stage
        has found none yet) the run may go on until `grace` (a later deadline) to find one, and so may the
        relaxations and quick incumbents of a stage with a known bound (pods: their proof spares the caller's
        fallback), never its branching."""
        values = None if start is None else np.array(start, dtype=np.float64)
        final = deadline
        outcome = Outcome(start, "optimal", stages=len(self.stages))
        if self.columns == 0:  # nothing to decide (HiGHS calls an empty model "Empty", not optimal)
            outcome.values = []
            outcome.results = [StageResult(stage.name, 0.0, 0.0, True) for stage in self.stages]
            return outcome
        for stage in self.stages:
            cost = self._cost(stage)
            graced = grace is not None and (values is None or stage.known is not None)
            deadline = max(final, grace) if graced and grace is not None else final
            if time.perf_counter() >= deadline:
                outcome.status = f"time limit reached before the {stage.name} stage"
                break
            if stage.known is not None and values is not None:
                value = float(cost @ values)
                if value <= stage.known + 0.5:  # the start is already optimal for this stage
                    outcome.results.append(StageResult(stage.name, value, value, True))
                    self._keep(cost, value)
                    continue
            step = self._stage(stage.name, cost, values, (deadline, final), self._cost(Stage("", stage.then)),
                               stage.known)
            if step.values is None or step.result is None:  # no feasible solution: keep the previous stage's
                outcome.status = step.status
                break
            values = step.values
            outcome.values = values.tolist()
            outcome.results.append(step.result)
            if not step.result.optimal:
                outcome.status = step.status
                break
            if stage.costs:
                self._keep(cost, step.result.value)
        return outcome

    def _cost(self, stage: Stage) -> Vector:
        cost = np.zeros(self.columns, dtype=np.float64)
        if stage.costs:
            cost[np.fromiter(stage.costs.keys(), dtype=np.int64, count=len(stage.costs))] = list(stage.costs.values())
        return cost

    def _keep(self, cost: Vector, value: float) -> None:
        """A row holding the stage's objective at the value it reached, for the stages after it."""
        columns = np.flatnonzero(cost).astype(np.int32)
        self.row_lower = np.append(self.row_lower, -highspy.kHighsInf)
        self.row_upper = np.append(self.row_upper, value + 0.5)
        self.index = np.concatenate([self.index, columns])
        self.value = np.concatenate([self.value, cost[columns]])
        self.starts = np.append(self.starts, np.int32(len(self.index)))

    def _stage(self, name: str, cost: Vector, start: Vector | None, deadlines: tuple[float, float], then: Vector,
               known: float | None = None) -> _Step:
        """One stage (see module doc); `deadlines`: the one while no solution is known (a grace one), the one
        after."""
        incumbent = start

        def until() -> float:
            return deadlines[0] if incumbent is None else min(deadlines)

        def quick() -> float:
            """The deadline of the relaxations and small neighbourhood programs: a stage with a known bound (pods)
            may use the grace for them too, as its proof spares the greedy fallback; branching never does."""
            return deadlines[0] if known is not None else until()

        best = math.inf if start is None else float(cost @ start)
        lower, upper = self.lower, self.upper
        bound = -math.inf
        spread = float(np.abs(then) @ (self.upper - self.lower)) + 1.0
        steerable = bool(then.any()) and spread * float(np.abs(cost).max(initial=0.0)) < _EXACT
        steered = relaxed = None
        if known is not None and steerable:
            # the relaxation of the combined objective first: when it reaches the stage's known bound (every pod
            # served), that bound is the relaxation's too, and the stage's own relaxation is not needed
            steered = self._run(cost * spread + then, lower, upper, False, quick(), also=(cost, spread))
            if steered.kind == "optimal" and steered.x is not None and float(cost @ steered.x) <= known + 1e-6:
                relaxed = _Run("optimal", steered.x, known, known, np.zeros(0), steered.status)
            elif steered.kind == "optimal" and steered.x is not None and math.isfinite(steered.also):
                # bounded by the combined relaxation's duals, scaled back: within one unit of this stage's own
                # relaxation, and often as good once rounded; that one is solved only when it is needed
                relaxed = _Run("optimal", steered.x, float(cost @ steered.x), steered.also, np.zeros(0),
                               steered.status)
        if relaxed is None:
            relaxed = self._run(cost, lower, upper, False, quick())
        if relaxed.kind == "optimal" and relaxed.x is not None:
            bound = relaxed.bound  # computed from the duals, safe against the solver's tolerances
            proven = math.ceil(bound - 1e-9)  # the objective is integral
            if incumbent is not None and best <= proven + 1e-9:
                return _Step(incumbent, StageResult(name, best, best, True), "optimal")
            rounded = np.round(relaxed.x)
            if np.all(np.abs(relaxed.x - rounded) <= _INTEGRAL) and float(cost @ rounded) < best:
                incumbent, best = rounded, float(cost @ rounded)  # the relaxation's own optimum is integral
                if not then.any():
                    return _Step(incumbent, StageResult(name, best, best, True), "optimal")
            # quick, better incumbents, each from a small integer program around a relaxation: over its support
            # (the columns it leaves at their lower bound stay there); over the columns where the relaxation and
            # the incumbent disagree, the others fixed at their common value (a neighbourhood that holds the
            # incumbent); over the union of both relaxations' and the incumbent's supports. They minimise this
            # stage's objective, then the next one's (scaled so that one unit here outweighs the next objective's
            # whole range over the column bounds), around a relaxation of that combined objective: the next stage
            # then starts from a good incumbent.
            guided, around = cost, relaxed.x
            if steerable:
                guided = cost * spread + then
                if steered is None:
                    steered = self._run(guided, lower, upper, False, quick())
                if steered.kind == "optimal" and steered.x is not None:
                    around = steered.x
            rounded = np.round(around)
            for neighbourhood in ("support", "disagreement", "union"):
                if time.perf_counter() >= quick() or (neighbourhood != "support" and incumbent is None):
                    break
                if neighbourhood == "union" and not len(relaxed.duals):
                    # bounded by the combined relaxation so far: this stage's own one now, for its bound, for
                    # the union's support and for reduced-cost fixing
                    relaxed = self._run(cost, lower, upper, False, quick())
                    if relaxed.kind != "optimal" or relaxed.x is None:
                        break
                    bound = max(bound, relaxed.bound)
                    proven = math.ceil(bound - 1e-9)
                    if best <= proven + 1e-9:
                        return _Step(incumbent, StageResult(name, best, best, True), "optimal")
                around_incumbent = neighbourhood != "support"
                if neighbourhood == "disagreement":
                    assert incumbent is not None
                    agree = np.abs(around - incumbent) <= _INTEGRAL
                elif neighbourhood == "union":
                    assert incumbent is not None
                    assert relaxed.x is not None
                    agree = (around <= lower + _INTEGRAL) & (relaxed.x <= lower + _INTEGRAL) & (incumbent <= lower)
                else:
                    agree = around <= lower + _INTEGRAL
                now = time.perf_counter()
                # the last neighbourhood may take all the time left once branching has none (past the plain
                # deadline, in a pods stage's grace): nothing after it could use that time
                share = 1.0 if neighbourhood == "union" and now >= until() else _DIVE_SHARE
                dive = self._run(guided, np.where(agree, rounded, lower), np.where(agree, rounded, upper), True,
                                 now + share * (quick() - now), incumbent if around_incumbent else None)
                if dive.x is not None and dive.consistent and (
                        incumbent is None or (float(cost @ dive.x), float(then @ dive.x))
                        < (best, float(then @ incumbent))):
                    incumbent, best = dive.x, float(cost @ dive.x)
                if incumbent is not None and best <= proven + 1e-9:
                    return _Step(incumbent, StageResult(name, best, best, True), "optimal")
            if incumbent is not None and best <= proven + 1e-9:
                return _Step(incumbent, StageResult(name, best, best, True), "optimal")
            if incumbent is not None and not len(relaxed.duals):  # bounded by the steered one: its own wanted
                relaxed = self._run(cost, lower, upper, False, quick())
                if relaxed.kind == "optimal":
                    bound = max(bound, relaxed.bound)
                    proven = math.ceil(bound - 1e-9)
                    if best <= proven + 1e-9:
                        return _Step(incumbent, StageResult(name, best, best, True), "optimal")
            if incumbent is not None and relaxed.kind == "optimal" and len(relaxed.duals):
                lower, upper = fixed_by_reduced_costs(lower, upper, relaxed.duals, bound, best)
        if time.perf_counter() >= until():
            if incumbent is None:
                return _Step(None, None, f"time limit reached in the {name} stage")
            return _Step(incumbent, StageResult(name, best, bound, False), f"{name} stage: Time limit reached")
        seed = incumbent if incumbent is not None and np.all(incumbent >= lower) and np.all(incumbent <= upper) \
            else None
        run = self._run(cost, lower, upper, True, until(), seed)
        if seed is not None and not run.consistent:
            # HiGHS 1.16 with a start solution and presolve can report the better objective it found but hand
            # back the start's columns; solve the stage again without the start when that happens.
            run = self._run(cost, lower, upper, True, until())
        if not run.consistent:
            return _Step(None, None, f"{name} stage: the solver returned an inconsistent solution")
        fixed = lower is not self.lower
        if run.kind == "infeasible" and not fixed:
            return _Step(None, None, f"{name} stage: {run.status}")
        # On the fixed model, a better solution than the incumbent has every fixed column at its bound: the
        # stage's bound is the solver's bound there or the incumbent, whichever is smaller.
        solver_bound = math.inf if run.kind == "infeasible" else run.bound
        if run.kind == "optimal" and run.x is not None:
            solver_bound = run.value
        if fixed:
            solver_bound = min(solver_bound, best)
        bound = max(bound, solver_bound)
        if run.x is not None and run.value <= best:
            incumbent, best = run.x, run.value
        if incumbent is None:
            return _Step(None, None, f"{name} stage: {run.status}")
        optimal = best - bound < 1.0 - 1e-6
        text = "optimal" if optimal else f"{name} stage: {run.status}"
        return _Step(incumbent, StageResult(name, best, best if optimal else bound, optimal), text)

    def _run(self, cost: Vector, lower: Vector, upper: Vector, integer: bool, deadline: float,
             start: Vector | None = None, also: tuple[Vector, float] | None = None) -> _Run:
        """One HiGHS run, the relaxation or the integer program, with these column bounds, stopped at the
        deadline. Columns whose bounds meet are substituted into the rows first, so HiGHS only sees the columns
        still to decide (on a fixed model, a small fraction). `also` (another objective and a divisor): a
        relaxation also bounds that objective with its duals divided by the divisor (any multipliers give a valid
        bound, see `bounds.dual_bound`)."""
        free = lower < upper
        x = lower.copy()
        rows = np.repeat(np.arange(len(self.row_lower)), np.diff(self.starts))
        moving = free[self.index]
        settled = ~moving
        activity = np.bincount(rows[settled], weights=self.value[settled] * x[self.index[settled]],
                               minlength=len(self.row_lower))
        row_lower, row_upper = self.row_lower - activity, self.row_upper - activity
        offset = float(cost[~free] @ x[~free])
        columns = int(free.sum())
        if columns == 0:  # everything is decided: feasible or not
            feasible = bool(np.all(row_lower <= 1e-6) and np.all(row_upper >= -1e-6))
            return _Run("optimal" if feasible else "infeasible", x if feasible else None, offset, offset,
                        np.zeros(self.columns), "Optimal" if feasible else "Infeasible")
        remap = np.cumsum(free) - 1
        index = remap[self.index[moving]].astype(np.int32)
        starts = np.concatenate([[0], np.cumsum(np.bincount(rows[moving], minlength=len(self.row_lower)))])
        highs = self.loader.new()
        highs.setOptionValue("time_limit", max(deadline - time.perf_counter(), 0.001))
        if not integer and columns > _LARGE:
            highs.setOptionValue("presolve", "off")
        if integer:
            highs.setOptionValue("mip_rel_gap", 0.0)
            highs.setOptionValue("mip_abs_gap", 0.99)
            highs.setOptionValue("random_seed", 0)
            highs.setOptionValue("mip_max_nodes", MAX_NODES)
        kind = np.full(columns, _INTEGER if integer else _CONTINUOUS, dtype=np.int32)
        highs.passModel(columns, len(row_lower), len(index), _ROWWISE, _MINIMIZE, offset, cost[free], lower[free],
                        upper[free], row_lower, row_upper, starts[:-1].astype(np.int32), index,
                        self.value[moving], kind)
        if start is not None:
            solution = highspy.HighsSolution()
            solution.col_value = start[free].tolist()
            solution.value_valid = True
            highs.setSolution(solution)
        highs.run()
        status = highs.getModelStatus()
        info = highs.getInfo()
        text = highs.modelStatusToString(status)
        outcome = {highspy.HighsModelStatus.kOptimal: "optimal",
                   highspy.HighsModelStatus.kInfeasible: "infeasible"}.get(status, "stopped")
        if info.primal_solution_status != 2:
            return _Run(outcome, None, math.inf, float(info.mip_dual_bound) if integer else -math.inf,
                        np.zeros(self.columns), text)
        solution = highs.getSolution()
        values = np.array(solution.col_value, dtype=np.float64)
        x[free] = np.round(values) if integer else values
        duals = np.zeros(self.columns)
        other_bound = -math.inf
        value = float(cost @ x)
        bound = float(info.mip_dual_bound) if integer else value
        if not integer:
            duals[free] = solution.col_dual
            from_duals = dual_bound(cost[free], lower[free], upper[free], row_lower, row_upper,
                                     np.array(solution.row_dual, dtype=np.float64), rows[moving], index,
                                     self.value[moving])
            # the larger of the bound from the duals and the solver's value less its tolerances (the former is
            # the tighter one on large weighted objectives, the latter where many duals are large)
            bound = max(value - 1e-4 - 1e-9 * abs(value), offset + from_duals)
            if also is not None:
                other, divisor = also
                other_bound = float(other[~free] @ x[~free]) + dual_bound(
                    other[free], lower[free], upper[free], row_lower, row_upper,
                    np.array(solution.row_dual, dtype=np.float64) / divisor, rows[moving], index, self.value[moving])
        reported = float(info.objective_function_value)
        consistent = not integer or abs(value - reported) <= 0.5
        return _Run(outcome, x, value, bound, duals, text, consistent, other_bound)
