"""The FGD paper's experiment on a trace: inflate the task list, shuffle it, place each task once, read the
allocation as the arrived workload grows.

The protocol (as the paper's artifact runs it): the tasks are sorted by name and shuffled with the seed; then, when
their GPU requests fall short of `inflation` x the cluster's GPUs, copies of tasks drawn uniformly with replacement
are appended until one more would pass it (when they exceed it, tasks drawn at random are dropped until they do
not). Tasks arrive one at a time and never leave; each is placed at once or skipped for good. `a_i` is the share of
the cluster's GPU thousandths allocated when the arrived GPU requests (placed or not) first reach i % of capacity;
a level the workload never reaches reads the final allocation.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from kubegpu.scheduling.placement import ClusterState, PolicyContext, choose, make_policy
from kubegpu.sim.trace.reader import Task

LEVELS = 131
"""a_0 .. a_130: arrived workload from 0 to 130 % of capacity, by whole percent."""


def arrivals(tasks: Sequence[Task], capacity_milli: int, seed: int, inflation: float) -> list[Task]:
    """The arrival order for one seed: shuffled tasks, then inflated (or thinned) to `inflation` x capacity."""
    rng = np.random.default_rng(seed)
    ordered = sorted(tasks, key=lambda t: t.name)
    order = [ordered[i] for i in rng.permutation(len(ordered))]
    target = inflation * capacity_milli
    requested = sum(t.request.gpu_total_milli for t in order)
    if requested > target:
        while requested > target and order:
            requested -= order.pop(int(rng.integers(len(order)))).request.gpu_total_milli
        return order
    copies = 0
    while True:
        drawn = ordered[int(rng.integers(len(ordered)))]
        if requested + drawn.request.gpu_total_milli > target:
            break
        requested += drawn.request.gpu_total_milli
        order.append(Task(f"{drawn.name}-copy-{copies}", drawn.request))
        copies += 1
    return order


@dataclass
class ReplayResult:
    """One experiment: what the CLI prints."""

    policy: str
    seed: int
    total_gpus: int
    allocated_percent: list[float]
    skipped_pods: int
    placed_pods: int
    wall_seconds: float
    tasks: int = field(default=0)
    shares_placed_at_100: dict[int, int] = field(default_factory=dict)
    """Shares placed when the arrived workload first reached 100 % (as a_100 is read), count per size in
    thousandths: which shares any rearrangement at that moment would have to hold (benchmarks/fragmentation.py's
    ceiling with them as floors). Not part of `to_json`."""

    def to_json(self) -> dict[str, object]:
        return {"policy": self.policy, "seed": self.seed, "totalGpus": self.total_gpus,
                "allocatedPercent": self.allocated_percent, "skippedPods": self.skipped_pods,
                "wallSeconds": self.wall_seconds}


def replay(state: ClusterState, tasks: Sequence[Task], policy: str, seed: int,
           inflation: float = 1.3) -> ReplayResult:
    """Run the protocol with the named policy on a fresh state (mutated in place) and read a_0 .. a_130."""
    started = time.perf_counter()
    capacity = state.total_gpu_milli
    order = arrivals(tasks, capacity, seed, inflation)
    chooser = make_policy(policy, PolicyContext(seed=seed, workload=[t.request for t in tasks]))
    levels: list[float] = []
    arrived = allocated = skipped = 0
    placed_shares: Counter[int] = Counter()  # counted while a_100 is not yet read; then frozen below
    at_100: dict[int, int] | None = None

    def record() -> None:
        while len(levels) < LEVELS and arrived * 100 >= len(levels) * capacity:
            levels.append(round(100.0 * allocated / capacity, 4))

    record()
    for task in order:
        placement = choose(task.request, state, chooser)
        if placement is None:
            skipped += 1
        else:
            state.apply(task.request, placement)
            allocated += task.request.gpu_total_milli
            if at_100 is None and task.request.shares:
                placed_shares[task.request.gpu_milli] += 1
        arrived += task.request.gpu_total_milli
        record()
        if at_100 is None and len(levels) > 100:
            at_100 = dict(placed_shares)
    final = round(100.0 * allocated / capacity, 4)
    levels.extend([final] * (LEVELS - len(levels)))
    return ReplayResult(policy, seed, capacity // 1000, levels, skipped, len(order) - skipped,
                        round(time.perf_counter() - started, 3), len(order),
                        dict(placed_shares) if at_100 is None else at_100)
