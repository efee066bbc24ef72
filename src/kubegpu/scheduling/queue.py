"""Pods waiting behind a quota, in the order they go through, searchable by size: `GatedQueue`.

A quota lets held pods through oldest first, each one that still fits; most of a long queue does not fit (the team
is at its limit, the cluster is full), so walking it pod by pod on every pass costs the length of the queue. Where
a pod's fit depends only on its size (one resource) and the room left only shrinks while pods go through, the next
pod that may fit is "the first one after here no bigger than the room", which a min-tree over the queue answers in
a logarithmic number of steps. The elastic-quota decision (`kubegpu.quota.elastic.ElasticLedger`) and the
simulator's plain namespace quotas (`kubegpu.sim.teams`) both search their queues this way.

Pods keep their place while they wait (a pod that leaves becomes a hole, filled again when the queue is compacted),
so a queue that grows at its end — every new pod younger than the rest, as in the simulator — never re-sorts.
"""

from __future__ import annotations

import sys
from bisect import bisect_right
from collections.abc import Iterator
from typing import Generic, TypeVar

T = TypeVar("T")

INF = float("inf")  # a hole's size
LARGEST = sys.float_info.max  # `first`'s default bound: any item, never a hole


def search_bound(room: float, *magnitudes: float) -> float:
    """`room` widened past any rounding in the sums it came from (`magnitudes`: the amounts in them), for
    `GatedQueue.first`: the search then never skips an item that fits, and the caller's exact test decides."""
    if room == INF:
        return LARGEST
    return room + 1.0 + 1e-9 * (abs(room) + sum(abs(m) for m in magnitudes))


class GatedQueue(Generic[T]):
    """Items ordered by (created, key), each with a size; holes where items left. Positions stay as they are between
    calls to `add` (which may renumber): a caller searches within one pass, adding nothing meanwhile."""

    def __init__(self) -> None:
        self._reset()

    def _reset(self) -> None:
        self._order: list[tuple[float, str]] = []  # ascending; a hole keeps its entry
        self._items: list[T | None] = []
        self._sizes: list[float] = []  # INF for a hole
        self._where: dict[str, int] = {}  # key → position
        self._holes = 0
        self._leaves = 1
        self._tree: list[float] = [INF, INF]  # min-tree: node i's children 2i, 2i+1; leaf of position p at
        # `_leaves + p`

    def __len__(self) -> int:
        return len(self._where)

    def __contains__(self, key: str) -> bool:
        return key in self._where

    def add(self, created: float, key: str, size: float, item: T) -> None:
        """Queue `item` (replacing the one with that key)."""
        if key in self._where:
            self.remove(key)
        entry = (created, key)
        if self._order and entry < self._order[-1]:  # older than the youngest: put it in its place, renumber
            at = bisect_right(self._order, entry)
            self._order.insert(at, entry)
            self._items.insert(at, item)
            self._sizes.insert(at, size)
            self._rebuild()
            return
        if self._holes > 32 and self._holes > len(self._where):
            self._compact()
        at = len(self._order)
        self._order.append(entry)
        self._items.append(item)
        self._sizes.append(size)
        self._where[key] = at
        if at >= self._leaves:
            self._rebuild()
        else:
            self._set(at, size)

    def remove(self, key: str) -> None:
        at = self._where.pop(key, None)
        if at is None:
            return
        if not self._where:
            self._reset()
            return
        self._items[at] = None
        self._sizes[at] = INF
        self._holes += 1
        self._set(at, INF)

    def first(self, start: int = 0, at_most: float = LARGEST) -> int:
        """The first position from `start` on whose item's size is at most `at_most` (holes never match), or -1."""
        if start >= len(self._order):
            return -1
        tree, leaves = self._tree, self._leaves
        i = start + leaves
        while tree[i] > at_most:
            while i & 1:  # a right child: climb to the first ancestor with a subtree to its right
                i >>= 1
            if i == 0:
                return -1
            i += 1
        while i < leaves:
            i = 2 * i if tree[2 * i] <= at_most else 2 * i + 1
        return i - leaves

    def item(self, at: int) -> T:
        item = self._items[at]
        assert item is not None, "a hole has no item"
        return item

    def order(self, at: int) -> tuple[float, str]:
        return self._order[at]

    def items(self) -> Iterator[T]:
        """Live items in order."""
        return (item for item in self._items if item is not None)

    def _set(self, at: int, size: float) -> None:
        tree = self._tree
        i = at + self._leaves
        tree[i] = size
        i >>= 1
        while i:
            left, right = tree[2 * i], tree[2 * i + 1]
            low = left if left <= right else right
            if tree[i] == low:  # unchanged here, so above too
                break
            tree[i] = low
            i >>= 1

    def _rebuild(self) -> None:
        """Renumber and build the tree afresh, with room to grow at the end."""
        self._where = {self._order[at][1]: at for at, item in enumerate(self._items) if item is not None}
        leaves = 1
        while leaves < 2 * len(self._sizes):
            leaves *= 2
        tree = [INF] * (2 * leaves)
        tree[leaves:leaves + len(self._sizes)] = self._sizes
        for i in range(leaves - 1, 0, -1):
            left, right = tree[2 * i], tree[2 * i + 1]
            tree[i] = left if left <= right else right
        self._tree, self._leaves = tree, leaves

    def _compact(self) -> None:
        """Drop the holes."""
        keep = [at for at, item in enumerate(self._items) if item is not None]
        self._order = [self._order[at] for at in keep]
        self._items = [self._items[at] for at in keep]
        self._sizes = [self._sizes[at] for at in keep]
        self._holes = 0
        self._rebuild()
