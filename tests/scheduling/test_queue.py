"""`kubegpu.scheduling.queue.GatedQueue`: held pods in order, searchable by size — it finds what a scan finds, with
pods added out of order, removed, and the queue compacted and grown on the way."""

from __future__ import annotations

import random

from kubegpu.scheduling.queue import GatedQueue


def test_the_queue_finds_the_first_item_no_bigger_than_asked_as_a_scan_does() -> None:
    rng = random.Random(3)
    queue: GatedQueue[str] = GatedQueue()
    live: dict[str, tuple[float, float]] = {}  # key → (created, size)
    for step in range(3000):
        roll = rng.random()
        if roll < 0.55 or not live:
            key = f"k{step}"
            created = float(step if rng.random() < 0.9 else rng.randint(0, step))
            live[key] = (created, float(rng.randint(1, 100)))
            queue.add(created, key, live[key][1], key)
        elif roll < 0.9:
            key = rng.choice(sorted(live))
            del live[key]
            queue.remove(key)
        ordered = sorted(live, key=lambda k: (live[k][0], k))
        assert list(queue.items()) == ordered and len(queue) == len(live)
        limit = float(rng.randint(1, 100))
        at = queue.first(0, limit)
        scan = [k for k in ordered if live[k][1] <= limit]
        assert (queue.item(at) if at >= 0 else None) == (scan[0] if scan else None)
        if at >= 0:  # and from just after it on
            after = queue.first(at + 1, limit)
            assert (queue.item(after) if after >= 0 else None) == (scan[1] if len(scan) > 1 else None)
