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
               at_least: tuple[int, int] | None = None) -> float | None:
    """The LP optimum (module docstring) as a % of the cluster's GPU thousandths: `shares` maps a share's size in
    thousandths of a GPU to how many such shares arrived, `whole_milli` the thousandths of whole GPUs the whole-GPU
    tasks arrived asked for, `gpus` the cluster's GPUs. `at_least=(size, k)`: only placements that place at least
    k shares of that size (the LP forces them in); None when no packing fits k of them in the GPUs.

    Rows: GPUs used <= `gpus`; shares of each size placed <= arrived (and >= k for the floor's size). Columns: the
    whole-GPU column (value 1000 a GPU, at most `whole_milli` / 1000 GPUs) and patterns (value: their thousandths),
    starting from each size packed alone, the rest found by `best_pattern` on the duals of the size rows."""
    if gpus < 0 or whole_milli < 0:
        raise ValueError(f"gpus {gpus}, whole_milli {whole_milli}: must not be negative")
    for size, count in shares.items():
        if not 0 < size < MILLI or count < 0:
            raise ValueError(f"share size {size} (count {count}): sizes lie in 1..{MILLI - 1}, counts >= 0")
    sizes = np.array(sorted(s for s, n in shares.items() if n > 0), dtype=np.int64)
    counts = np.array([shares[int(s)] for s in sizes], dtype=np.int64)
    most = np.minimum(counts, MILLI // sizes)  # copies of a size one GPU can hold
    floors = np.zeros(len(sizes))
    if at_least is not None:
        size, needed = at_least
        if needed > shares.get(size, 0):
            raise ValueError(f"at_least {needed} shares of {size}: only {shares.get(size, 0)} arrived")
        if needed > 0:
            where = int(np.searchsorted(sizes, size))
            if needed > gpus * int(most[where]):
                return None
            floors[where] = needed
    if gpus == 0:
        return 0.0
    highs = _HIGHS.new()  # minimises: costs are the negated thousandths placed
    inf = highspy.kHighsInf
    highs.addRow(-inf, float(gpus), 0, np.array([], dtype=np.int32), np.array([]))
    for floor, count in zip(floors, counts, strict=True):
        highs.addRow(float(floor), float(count), 0, np.array([], dtype=np.int32), np.array([]))

    def add(pattern: np.ndarray) -> None:
        rows = np.flatnonzero(pattern)
        highs.addCol(-float(pattern @ sizes), 0.0, inf, len(rows) + 1,
                     np.concatenate(([0], rows + 1)).astype(np.int32),
                     np.concatenate(([1.0], pattern[rows].astype(float))))

    highs.addCol(-float(MILLI), 0.0, whole_milli / MILLI, 1, np.array([0], dtype=np.int32), np.array([1.0]))
    for i in range(len(sizes)):
        add(np.where(np.arange(len(sizes)) == i, most, 0))
    seen: set[bytes] = set()
    for _ in range(MAX_ROUNDS):
        highs.run()
        if highs.getModelStatus() != highspy.HighsModelStatus.kOptimal:
            raise ValueError(f"the LP over {len(sizes)} share sizes on {gpus} GPUs: HiGHS ends "
                             f"{highs.modelStatusToString(highs.getModelStatus())}")
        # HiGHS's reduced cost of a column is its cost less column . duals; here costs are negated thousandths, so
        # a pattern gains (its thousandths + its sizes' duals) + the GPU row's dual over what the program has
        duals = np.asarray(highs.getSolution().row_dual)
        value, pattern = best_pattern(sizes + duals[1:], sizes, counts)
        gain = value + duals[0]
        if gain <= TOLERANCE or pattern.tobytes() in seen:  # a pattern priced again: solver tolerance, not a gain
            break
        seen.add(pattern.tobytes())
        add(pattern)
    else:
        raise ValueError(f"the LP over {len(sizes)} share sizes on {gpus} GPUs: no convergence in {MAX_ROUNDS} rounds")
    placed = -highs.getInfo().objective_function_value + gpus * max(gain, 0.0)
    return 100.0 * min(placed, gpus * MILLI) / (gpus * MILLI)
