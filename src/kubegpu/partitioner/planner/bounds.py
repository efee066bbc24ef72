"""Bounds for the lexicographic driver (`solver`): a relaxation's lower bound computed from its duals, valid
whatever the solver's tolerances, and reduced-cost fixing against an incumbent. Pure numpy."""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt

Vector = npt.NDArray[np.float64]


def dual_bound(cost: Vector, lower: Vector, upper: Vector, row_lower: Vector, row_upper: Vector, dual: Vector,
               rows: npt.NDArray[np.int64], index: npt.NDArray[np.int32], value: Vector) -> float:
    """A lower bound on the relaxation (so on every integer solution) from any row multipliers, computed here
    rather than taken from the solver: for every x within its bounds with the rows met, cost.x = (cost - A'y).x +
    y.Ax >= sum of min((cost - A'y)_j x_j) over the column's bounds + sum of min(y_i r_i) over the row's bounds.
    The solver's duals make it the relaxation's optimum up to its tolerances; this bound holds whatever they are,
    less a margin for the double-precision sums (the planner's weighted objectives reach 1e9 and more, where the
    solver's relative tolerances would blur the integral rounding that proves a plan optimal)."""
    y = dual.copy()
    y[np.isinf(row_lower) & (y > 0)] = 0.0  # a multiplier pulling on a missing side is dropped (still valid)
    y[np.isinf(row_upper) & (y < 0)] = 0.0
    reduced = cost - np.bincount(index, weights=value * y[rows], minlength=len(cost))
    with np.errstate(invalid="ignore"):
        columns = np.where(reduced > 0, reduced * lower, np.where(reduced < 0, reduced * upper, 0.0))
        sides = np.where(y > 0, y * row_lower, np.where(y < 0, y * row_upper, 0.0))
        # the rounding of every product and sum above is at most a few dozen machine epsilons of these magnitudes
        scale = np.maximum(np.abs(lower), np.abs(upper)) * (
            np.abs(cost) + np.bincount(index, weights=np.abs(value * y[rows]), minlength=len(cost)))
    total = float(columns.sum() + sides.sum())
    if not math.isfinite(total):
        return -math.inf
    return total - 1e-13 * float(scale.sum() + np.abs(sides).sum()) - 1e-9


def fixed_by_reduced_costs(lower: Vector, upper: Vector, reduced: Vector, bound: float, incumbent: float
                           ) -> tuple[Vector, Vector]:
    """Reduced-cost fixing: moving a column off the bound the relaxation left it at costs at least its reduced cost
    per unit, so a column whose reduced cost lifts `bound` past `incumbent` - 1 (the objective is integral) stays at
    that bound in every better solution. A margin keeps solver round-off from fixing a column it should not."""
    limit = max(incumbent - 1.0 - bound, 0.0) + 1e-4 + 1e-7 * (abs(bound) + abs(incumbent))
    at_lower = reduced > limit
    at_upper = -reduced > limit
    if not at_lower.any() and not at_upper.any():
        return lower, upper
    return np.where(at_upper, upper, lower), np.where(at_lower, lower, upper)
