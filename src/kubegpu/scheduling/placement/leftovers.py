"""What a GPU's leftover is worth to the expected workload's shares, and what placing a share there forgoes.

The expected shares (a count per size in thousandths) fill fewest GPUs in the cutting-stock LP: minimise the GPUs
used, each GPU cut by a *pattern* (a multiset of share sizes fitting in 1000 thousandths), so that every size gets
at least its count. The LP's dual price y_s of size s is the fraction of a GPU one share of that size is worth in
the best packing: every pattern's prices sum to at most one GPU, and the patterns of the best packing to exactly
one. A leftover of g thousandths can still be made worth V(g), the most the prices of a multiset of sizes fitting
in g sum to (an unbounded knapsack: g can always be left partly unused, so V only grows with g).

Placing a share of size s on a GPU with h free turns a leftover worth V(h) into one worth V(h - s) and gets y_s for
it: the placement forgoes `loss(s, h) = V(h) - V(h - s) - y_s`, never negative (the share beside V(h - s)'s best
multiset is one multiset fitting in h), and zero when the placement is a step of a best packing. A share placed
where its loss is least keeps the GPUs' leftovers worth most to the shares still to come; FGD's one-copy test of
the leftover, the policy's next key, sees only whether one copy of each popular shape still fits.

Pure: numpy and a HiGHS LP built through `kubegpu.highs.HighsLoader` (silent: `kubegpu trace replay -o json` prints
JSON on stdout). `best_pattern`, the bounded knapsack that prices the LP's columns, is also the pricing step of the
trace benchmark's LP ceiling (benchmarks/trace_ceiling.py).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import highspy
import numpy as np
import numpy.typing as npt

from kubegpu.highs import HighsLoader
from kubegpu.scheduling.placement.model import MILLI, IntArray, Request

FloatArray = npt.NDArray[np.float64]

GAIN_TOLERANCE = 1e-9
"""Fractions of a GPU a new pattern must save over the LP's patterns so far to be added (below: solver noise)."""
MAX_ROUNDS = 2_000
"""Column-generation rounds at most. A trace's few dozen share sizes converge in well under a hundred; a workload
that does not converge in this many is refused rather than priced by duals that are not yet prices."""
PRICED_SIZES = 64
"""The LP prices at most this many share sizes, the most common: its cost grows with the sizes (a few ms for a
trace's twenty, seconds for hundreds), and a live cluster that learns the workload rebuilds the prices while it
decides. A rarer size is priced like one the workload never asked for."""
_HIGHS = HighsLoader()


def best_pattern(values: FloatArray, sizes: IntArray, counts: IntArray,
                 capacity: int = MILLI) -> tuple[float, IntArray]:
    """The pattern (copies of each share size, at most its count, fitting in `capacity` thousandths) of the greatest
    total value: (value, copies per size). Sizes of no positive value are never taken. A bounded knapsack by dynamic
    programming over the GPU's thousandths, each size's copies split in powers of two (1, 2, 4, ...) so that any
    number up to the bound is a sum of distinct pieces, and the pattern read back from which pieces improved what."""
    pieces: list[tuple[int, int]] = []  # (size index, copies)
    for i, (value, size, count) in enumerate(zip(values, sizes, counts, strict=True)):
        left = min(int(count), capacity // int(size)) if value > 0 else 0
        step = 1
        while left > 0:
            take = min(step, left)
            pieces.append((i, take))
            left -= take
            step *= 2
    best = np.zeros(capacity + 1)  # best[c]: the greatest value in c thousandths with the pieces seen so far
    taken = []
    for i, copies in pieces:
        weight = copies * int(sizes[i])
        candidate = best[:capacity + 1 - weight] + copies * float(values[i])
        better = candidate > best[weight:]
        best[weight:] = np.where(better, candidate, best[weight:])
        taken.append(better)
    pattern = np.zeros(len(sizes), dtype=np.int64)
    room = capacity
    for (i, copies), better in zip(reversed(pieces), reversed(taken), strict=True):
        weight = copies * int(sizes[i])
        if room >= weight and better[room - weight]:
            pattern[i] += copies
            room -= weight
    return float(best[capacity]), pattern


def share_prices(counts: Mapping[int, int]) -> dict[int, float]:
    """The cutting-stock LP's dual price of each share size (module docstring), in GPUs: `counts` maps a size in
    thousandths (1..999) to how many shares of it the workload expects. Column generation: HiGHS solves the LP over
    the patterns found so far (at first each size packed alone), `best_pattern` on the duals finds the pattern whose
    prices sum highest, and while that sum exceeds one GPU the pattern would save GPUs and joins the LP. A pattern
    takes no more copies of a size than expected: the LP packs the workload, not an endless stream of one size."""
    for size, count in counts.items():
        if not 0 < size < MILLI or count < 0:
            raise ValueError(f"share size {size} (count {count}): sizes lie in 1..{MILLI - 1}, counts >= 0")
    sizes = np.array(sorted(s for s, n in counts.items() if n > 0), dtype=np.int64)
    if not len(sizes):
        return {}
    wanted = np.array([counts[int(s)] for s in sizes], dtype=np.int64)
    highs = _HIGHS.new()
    inf = highspy.kHighsInf
    for count in wanted:
        highs.addRow(float(count), inf, 0, np.array([], dtype=np.int32), np.array([]))

    def add(pattern: IntArray) -> None:
        rows = np.flatnonzero(pattern)
        highs.addCol(1.0, 0.0, inf, len(rows), rows.astype(np.int32), pattern[rows].astype(np.float64))

    for i in range(len(sizes)):
        add(np.where(np.arange(len(sizes)) == i, np.minimum(wanted, MILLI // sizes), 0))
    seen: set[bytes] = set()
    for _ in range(MAX_ROUNDS):
        highs.run()
        status = highs.getModelStatus()
        if status != highspy.HighsModelStatus.kOptimal:
            raise ValueError(f"the cutting-stock LP over {len(sizes)} share sizes: HiGHS ends "
                             f"{highs.modelStatusToString(status)}")
        duals = np.maximum(np.asarray(highs.getSolution().row_dual, dtype=np.float64), 0.0)
        value, pattern = best_pattern(duals, sizes, wanted)
        if value <= 1.0 + GAIN_TOLERANCE or pattern.tobytes() in seen:  # priced again: solver tolerance, no gain
            return {int(s): float(y) for s, y in zip(sizes, duals, strict=True)}
        seen.add(pattern.tobytes())
        add(pattern)
    raise ValueError(f"the cutting-stock LP over {len(sizes)} share sizes: no convergence in {MAX_ROUNDS} rounds")


def leftover_values(prices: Mapping[int, float]) -> FloatArray:
    """V(g) for g = 0..1000 (module docstring): the most the prices of a multiset of sizes fitting in g thousandths
    sum to, any number of copies of each. Unbounded, unlike the LP's patterns: a leftover's worth is what the
    shares still to come could make of it, whichever of them come."""
    priced = sorted((size, price) for size, price in prices.items() if price > 0)
    sizes = np.array([size for size, _ in priced], dtype=np.int64)
    worth = np.array([price for _, price in priced], dtype=np.float64)
    values = np.zeros(MILLI + 1)
    for g in range(1, MILLI + 1):
        fits = int(np.searchsorted(sizes, g, side="right"))  # sizes are sorted: the first `fits` fit in g
        best = (values[g - sizes[:fits]] + worth[:fits]).max() if fits else 0.0
        values[g] = max(values[g - 1], best)  # a leftover may stay partly unused
    return values


@dataclass(frozen=True)
class LeftoverPrices:
    """`value[g]`: what a leftover of g thousandths is worth (V); `price[s]`: what a share of s thousandths is worth.

    A size the workload never asked for (a live cluster may ask for any thousandths) is priced V(s), the most the
    workload's shares could make of its s thousandths: what it displaces. The ranking of one share's candidates does
    not depend on its price (it shifts every candidate's loss alike); this one keeps losses >= 0 (V only gains by
    combining leftovers) and zero where the share takes exactly what the workload's shares could make of a
    leftover's piece, as for the workload's own sizes."""

    value: FloatArray
    price: FloatArray

    def loss(self, size: int, free: IntArray) -> FloatArray:
        """What placing a share of `size` thousandths forgoes on GPUs with `free` thousandths free (each >= size), in
        GPUs: V(free) - V(free - size) - price(size), never negative."""
        free = _fitting(size, free)
        return np.maximum(self.value[free] - self.value[free - size] - self.price[size], 0.0)

    def loss_rank(self, size: int, free: IntArray) -> IntArray:
        """The rank of each `loss(size, free)` among the losses of every leftover a share of `size` fits (0: the
        least; equal to 1e-9 of a GPU: equal rank). A share's candidates rank by loss first, then by other keys:
        a rank (at most 1000) scaled above the other keys' range keeps that order exact in one float score, where
        the loss itself would need more digits than a float has beside them."""
        free = _fitting(size, free)
        every = np.round(self.loss(size, np.arange(size, MILLI + 1)), 9)
        _, rank = np.unique(every, return_inverse=True)
        return np.asarray(rank.reshape(-1)[free - size], dtype=np.int64)


def _fitting(size: int, free: IntArray) -> IntArray:
    """`free` as int64, refused unless `size` is a share and fits every GPU (an index out of range would wrap)."""
    if not 0 < size < MILLI:
        raise ValueError(f"share size {size}: a share takes 1..{MILLI - 1} thousandths")
    free = np.asarray(free, dtype=np.int64)
    if np.any((free < size) | (free > MILLI)):
        raise ValueError(f"free thousandths {free.tolist()}: each must lie in {size}..{MILLI} for a {size} share")
    return free


def leftover_prices(requests: Sequence[Request]) -> LeftoverPrices:
    """The prices for a workload: its shares' sizes and counts priced by `share_prices` (whole-GPU and CPU-only
    requests take no part in how shares pack a GPU), the `PRICED_SIZES` most common of them. No shares: every
    leftover is worth nothing and every loss 0."""
    counts = Counter(r.gpu_milli for r in requests if r.shares)
    return prices_of(share_prices(dict(counts.most_common(PRICED_SIZES))))


def prices_of(prices: Mapping[int, float]) -> LeftoverPrices:
    """`LeftoverPrices` from the dual price of each size the workload asks for (the others priced V(s))."""
    value = leftover_values(prices)
    price = value.copy()
    for size, y in prices.items():
        price[size] = y
    return LeftoverPrices(value, price)
