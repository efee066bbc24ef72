"""The discrete-event engine: one strategy, one workload, one simulated cluster, on a virtual clock.

Events (a heap ordered by time, then insertion): pod arrivals, run completions, OOM kills, node and MIG changes,
strategy ticks and metric samples. After all events of one instant, a scheduling pass binds pending pods the way
kube-scheduler does: highest priority first, FIFO within a priority, each pod to the best-scoring node that
`kubegpu.scheduling.fits` (least- or most-allocated).

This module is the event loop and the clock; `Simulation` gets the rest from its parts: effects.py (nodes, their
devices and the MIG/MPS changes controllers make), accounting.py (pods: queue, binding, speed, work) and world.py
(the data they share). `InstanceInUseError`, `Attempt`, `SimNode` and `Partition` are importable from here.
"""

from __future__ import annotations

import contextlib
import gc
import heapq
import itertools
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from kubegpu.clock import VirtualClock
from kubegpu.errors import ConfigError
from kubegpu.gpu.catalog import get_model
from kubegpu.kube.memory import MemoryCluster
from kubegpu.scheduling import SCORERS
from kubegpu.sim.accounting import Accounting
from kubegpu.sim.effects import ClusterEffects
from kubegpu.sim.metrics import Collector, StrategyResult
from kubegpu.sim.perf import DEFAULT_PARAMS, PerfParams
from kubegpu.sim.scenario import Scenario
from kubegpu.sim.strategies import GpuRequest, Strategy
from kubegpu.sim.teams import TeamAccount
from kubegpu.sim.workload import Job
from kubegpu.sim.world import (
    _ARRIVAL,
    _FINISH,
    _GUARD,
    _NODE,
    _OOM,
    _SAMPLE,
    _TICK,
    MIG_RECONFIGURE_DELAY_S,
    NODE_PROVISION_DELAY_S,
    Attempt,
    InstanceInUseError,
    Partition,
    SimNode,
)

__all__ = ["MIG_RECONFIGURE_DELAY_S", "NODE_PROVISION_DELAY_S", "Attempt", "InstanceInUseError", "Partition",
           "SimNode", "Simulation"]


class Simulation(ClusterEffects, Accounting):
    """Runs one strategy over one workload; `run()` returns its `StrategyResult`. Implements `SimControl`."""

    def __init__(
        self,
        scenario: Scenario,
        strategy: Strategy,
        jobs: Sequence[Job],
        duration: float | None = None,
        params: PerfParams = DEFAULT_PARAMS,
        cluster: Any = None,
    ) -> None:
        self.scenario = scenario
        self.strategy = strategy
        self.jobs = jobs
        self.duration = scenario.duration if duration is None else duration
        self.params = params
        self.clock = VirtualClock()
        self.cluster = cluster if cluster is not None else MemoryCluster(self.clock)
        self.node_groups = scenario.cluster.node_groups
        self.mig_reconfigure_delay = MIG_RECONFIGURE_DELAY_S
        self.node_provision_delay = scenario.node_bring_up.total  # the operator's bring-up, stage by stage
        self.scoring = scenario.cluster.scoring
        self.models = [get_model(group.gpu_model) for group in self.node_groups]
        self._events: list[tuple[float, int, int, Any]] = []
        self._seq = itertools.count()
        self._nodes: dict[str, SimNode] = {}
        self._node_counter: dict[str, int] = {}
        self._queues: dict[GpuRequest, list[tuple[tuple[int, float, int], Attempt]]] = {}
        self._capacity_version: dict[str, int] = {}
        self._fleet_version = 0
        self._capacity_memo = (-1, 0.0)
        self._failed_at: dict[GpuRequest, int] = {}
        if self.scoring not in SCORERS:
            raise ConfigError(f"scoring policy {self.scoring!r} is not one of {', '.join(sorted(SCORERS))}")
        self._scorer = SCORERS[self.scoring]
        self._scores = {}
        self._state_ids = {}
        self._dirty = False
        self.metrics = Collector(strategy.name, self.duration)
        if getattr(strategy, "team_admission", None) is not None and not scenario.teams:
            raise ConfigError(f"strategy {strategy.name}: quotas need the scenario's teams: (name, min, max, share)")
        self._teams = (TeamAccount.for_strategy(scenario.teams, strategy, [g.gpu_model for g in self.node_groups])
                       if scenario.teams else None)

    # ------------------------------------------------------------------------------------------------ running
    def run(self, progress: Callable[[float], None] | None = None) -> StrategyResult:
        """Simulate from 0 to the duration; `progress(simulated seconds)` is called at each metric sample."""
        with _young_collections_only():
            return self._run(progress)

    def _run(self, progress: Callable[[float], None] | None) -> StrategyResult:
        for group in self.node_groups:
            for _ in range(group.count):
                self._join_node(group, ready=True)
        for job in self.jobs:
            self._push(job.arrival, _ARRIVAL, (job, 0, 0))
        self.strategy.on_start(self)
        if self.strategy.tick_interval:
            self._push(self.strategy.tick_interval, _TICK, None)
        self._push(0.0, _SAMPLE, None)
        while self._events and self._events[0][0] <= self.duration:
            now = self._events[0][0]
            self._advance(now)
            while self._events and self._events[0][0] == now:
                _, kind, _, payload = heapq.heappop(self._events)
                self._handle(kind, payload, progress)
            if self._dirty:
                self._schedule()
        self._advance(self.duration)
        self._finish_metrics()
        if self._teams is not None:
            self.metrics.team_reclaims = dict(self._teams.reclaims)
        if progress is not None:
            progress(self.duration)
        return self.metrics.result(self.scenario, self.jobs)

    def _push(self, t: float, kind: int, payload: Any) -> None:
        heapq.heappush(self._events, (t, kind, next(self._seq), payload))

    def _advance(self, now: float) -> None:
        self.metrics.advance(now)
        self.clock.advance_to(max(now, self.clock.now()))

    def _handle(self, kind: int, payload: Any, progress: Callable[[float], None] | None) -> None:
        now = self.clock.now()
        if kind == _ARRIVAL:
            job, attempt, ooms = payload
            self._enqueue(job, attempt, ooms, now)
        elif kind == _FINISH:
            run, version = payload
            if run.node is not None and run.version == version:
                self._stop(run, "completed")
        elif kind == _OOM:
            self._device_full(*payload)
        elif kind == _GUARD:
            self._guard_check(*payload)
        elif kind == _NODE:
            payload()
        elif kind == _TICK:
            self.strategy.on_tick(self)
            self._dirty = True
            interval = self.strategy.tick_interval
            if interval:
                self._push(now + interval, _TICK, None)
        elif kind == _SAMPLE:
            self.metrics.sample(now, self._pending_count())
            if progress is not None:
                progress(now)
            self._push(now + self.scenario.sample_interval, _SAMPLE, None)


@contextlib.contextmanager
def _young_collections_only() -> Iterator[None]:
    """No full collections of the cyclic garbage collector while a simulation runs; young ones as usual.

    A simulated day grows the heap to millions of objects that live for the whole run (nodes, pods, the store's
    objects and watch history), and each full collection walks all of them: at 800 GPUs, ~19 of them took a fifth of
    the run's CPU time. What a run drops is freed by reference counting or in the young generations; anything older
    waits for the first full collection after the run."""
    thresholds = gc.get_threshold()
    gc.set_threshold(thresholds[0], thresholds[1], 1_000_000_000)
    try:
        yield
    finally:
        gc.set_threshold(*thresholds)
