"""Running one API step over many objects, a bounded number at a time.

A burst's NodeClaims are created, launched, published, cordoned and terminated in the hundreds; one call at a time,
each waiting on a loaded API server, a pass would take minutes. Every stage that writes per object goes through
`each_at_once`, so the bound (the command's `parallelism`, 16) is the same everywhere and a step that raises stops
only itself: each caller's step catches and logs its own errors.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from kubegpu.errors import KubegpuError

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


def each_write(writes: Sequence[tuple[str, Callable[[], object]]], parallelism: int,
               failed: Callable[[str, KubegpuError], None]) -> list[bool]:
    """Each (object name, write), up to `parallelism` at a time; whether each went through (`failed` hears of the
    others, which the caller retries next pass)."""
    def attempt(item: tuple[str, Callable[[], object]]) -> bool:
        name, write = item
        try:
            write()
            return True
        except KubegpuError as exc:
            failed(name, exc)
            return False

    return each_at_once(attempt, writes, parallelism)
