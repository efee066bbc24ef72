"""Running one API step over many objects, a bounded number at a time.

A burst's NodeClaims are created, launched, published, cordoned and terminated in the hundreds; one call at a time,
each waiting on a loaded API server, a pass would take minutes. Every stage that writes per object goes through
`each_at_once`, so the bound (the command's `parallelism`, 16) is the same everywhere and a step that raises stops
only itself: each caller's step catches and logs its own errors.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")
R = TypeVar("R")


def each_at_once(step: Callable[[T], R], items: Iterable[T], parallelism: int) -> list[R]:
    """`step` on every item, up to `parallelism` at a time (in order, on this thread, when 1 or a single item);
    the results in the items' order."""
    todo = list(items)
    if parallelism <= 1 or len(todo) <= 1:
        return [step(item) for item in todo]
    with ThreadPoolExecutor(max_workers=min(parallelism, len(todo))) as pool:
        return list(pool.map(step, todo))
