"""How high any placement can go on a replayed trace: the exact optimum of the Gilmore–Gomory LP relaxation of
packing the tasks arrived by then into the cluster's GPUs (`lp_ceiling`).

The integer problem: each GPU (a bin of 1000 thousandths) holds either one whole-GPU task's GPU or a set of shares
that fit in it (a *pattern*); maximise the thousandths placed. Its LP relaxation lets every pattern and whole GPU be
used fractionally and forgets CPU, memory, GPU models, node boundaries (a multi-GPU task's GPUs may sit anywhere)
and the order of arrival. Every placement, online or offline, is a feasible point of the integer problem, and the
LP's optimum is at least the integer one: it bounds the allocation of any placement from above.

The LP has one column per pattern (far too many to list), so it is solved by column generation: HiGHS solves the
program over the patterns found so far, and a bounded knapsack over the share sizes, valued at their size less the
dual price of their count, finds the pattern whose use would raise the objective most. When none would, the
program's optimum is the LP's. The value returned is the Lagrangian bound (the program's optimum plus, for every
GPU, the best pattern's remaining gain), an upper bound at every step that equals the LP optimum at convergence.

Floors (at least so many shares of given sizes placed) narrow the placements bounded to those that place them: with
floors for every size, set to what one placement had placed, the LP says how high any rearrangement of those same
shares (plus any others arrived) could go, which parts the loss the placement's choices caused from the loss the
order of arrival left it.
"""

from __future__ import annotations

from collections.abc import Mapping

import highspy
import numpy as np

from kubegpu.highs import HighsLoader
from kubegpu.scheduling.placement.leftovers import best_pattern
from kubegpu.scheduling.placement.model import MILLI

TOLERANCE = 1e-6  # thousandths of gain per GPU below which a pattern is not worth adding
MAX_ROUNDS = 10_000
_HIGHS = HighsLoader()  # HiGHS prints a banner on stdout on its first use: the loader keeps it off


def lp_ceiling(shares: Mapping[int, int], whole_milli: int, gpus: int,
               at_least: Mapping[int, int] | None = None) -> float | None:
    """The LP optimum (module docstring) as a % of the cluster's GPU thousandths: `shares` maps a share's size in
    thousandths of a GPU to how many such shares arrived, `whole_milli` the thousandths of whole GPUs the whole-GPU
    tasks arrived asked for, `gpus` the cluster's GPUs. `at_least` maps sizes to floors: only placements that place
    at least that many shares of each size (the LP forces them in); None when the floors cannot all be met at once,
    even fractionally.

    Rows: GPUs used <= `gpus`; shares of each size placed <= arrived (and >= its floor). Columns: the whole-GPU
    column (value 1000 a GPU, at most `whole_milli` / 1000 GPUs) and patterns (value: their thousandths), starting
    from each size packed alone, the rest found by `best_pattern` on the duals of the size rows. Floors may need
    patterns that mix sizes before any placement meets them, so they are met first (phase one): an artificial
    column per floor row stands in for the shares missing, and column generation drives their sum to zero or shows
    it cannot (then None); with the artificials fixed at zero, phase two maximises the thousandths placed."""
    if gpus < 0 or whole_milli < 0:
        raise ValueError(f"gpus {gpus}, whole_milli {whole_milli}: must not be negative")
    for size, count in shares.items():
        if not 0 < size < MILLI or count < 0:
            raise ValueError(f"share size {size} (count {count}): sizes lie in 1..{MILLI - 1}, counts >= 0")
    for size, needed in (at_least or {}).items():
        if not 0 <= needed <= shares.get(size, 0):
            raise ValueError(f"at_least {needed} shares of {size}: only {shares.get(size, 0)} arrived"
                             if needed > 0 else f"at_least {needed} shares of {size}: must not be negative")
    sizes = np.array(sorted(s for s, n in shares.items() if n > 0), dtype=np.int64)
    counts = np.array([shares[int(s)] for s in sizes], dtype=np.int64)
    floors = np.array([(at_least or {}).get(int(s), 0) for s in sizes], dtype=np.int64)
    if gpus == 0:
        return None if floors.any() else 0.0
    most = np.minimum(counts, MILLI // sizes)  # copies of a size one GPU can hold
    highs = _HIGHS.new()  # minimises: costs are the negated thousandths placed (phase one: the artificials' sum)
    inf = highspy.kHighsInf
    highs.addRow(-inf, float(gpus), 0, np.array([], dtype=np.int32), np.array([]))
    for floor, count in zip(floors, counts, strict=True):
        highs.addRow(float(floor), float(count), 0, np.array([], dtype=np.int32), np.array([]))
    floored = np.flatnonzero(floors)
    first = np.zeros(len(sizes)) if len(floored) else sizes.astype(float)  # a share's worth in the first phase
    highs.addCol(0.0 if len(floored) else -float(MILLI), 0.0, whole_milli / MILLI, 1, np.array([0], dtype=np.int32),
                 np.array([1.0]))
    for row in floored:  # columns 1 .. len(floored): the artificials, standing in for a share short of a floor
        highs.addCol(1.0, 0.0, inf, 1, np.array([row + 1], dtype=np.int32), np.array([1.0]))
    patterns: list[np.ndarray] = []
    seen: set[bytes] = set()

    def add(pattern: np.ndarray, worth: np.ndarray) -> None:
        rows = np.flatnonzero(pattern)
        highs.addCol(-float(pattern @ worth), 0.0, inf, len(rows) + 1,
                     np.concatenate(([0], rows + 1)).astype(np.int32),
                     np.concatenate(([1.0], pattern[rows].astype(float))))
        patterns.append(pattern)
        seen.add(pattern.tobytes())

    def generate(worth: np.ndarray) -> float:
        """Column generation until no pattern gains: `worth` is a share's value per size in the phase's objective;
        the best pattern's gain per GPU at the end (<= TOLERANCE, or that of a pattern priced again)."""
        for _ in range(MAX_ROUNDS):
            highs.run()
            if highs.getModelStatus() != highspy.HighsModelStatus.kOptimal:
                raise ValueError(f"the LP over {len(sizes)} share sizes on {gpus} GPUs: HiGHS ends "
                                 f"{highs.modelStatusToString(highs.getModelStatus())}")
            # HiGHS's reduced cost of a column is its cost less column . duals; costs being negated worths, a
            # pattern gains (its worth + its sizes' duals) + the GPU row's dual over what the program has
            duals = np.asarray(highs.getSolution().row_dual)
            value, pattern = best_pattern(worth + duals[1:], sizes, counts)
            gain = value + duals[0]
            if gain <= TOLERANCE or pattern.tobytes() in seen:  # priced again: solver tolerance, not a gain
                return float(gain)
            add(pattern, worth)
        raise ValueError(f"the LP over {len(sizes)} share sizes on {gpus} GPUs: no convergence in {MAX_ROUNDS} rounds")

    for i in range(len(sizes)):
        add(np.where(np.arange(len(sizes)) == i, most, 0), first)
    if len(floored):
        generate(first)
        if highs.getInfo().objective_function_value > TOLERANCE:  # shares still missing: the floors do not fit
            return None
        artificials = np.arange(1, len(floored) + 1, dtype=np.int32)
        highs.changeColsBounds(len(floored), artificials, np.zeros(len(floored)), np.zeros(len(floored)))
        columns = np.arange(len(floored) + 1 + len(patterns), dtype=np.int32)
        highs.changeColsCost(len(columns), columns, np.concatenate(
            ([-float(MILLI)], np.zeros(len(floored)), [-float(p @ sizes) for p in patterns])))
    gain = generate(sizes.astype(float))
    placed = -highs.getInfo().objective_function_value + gpus * max(gain, 0.0)
    return 100.0 * min(placed, gpus * MILLI) / (gpus * MILLI)
