"""What a simulation measured: exact time integrals (allocation, useful compute, memory, cost), per-pod waits and
job completion times, and a sampled time series for plots.

Definitions (docs/simulator.md):
- GPU allocation % = allocated GPU-hours / provisioned GPU-hours; a device ID counts as the share of a GPU it hands
  out (whole GPU 1, time-slicing replica 1/N, MIG slice its compute slices / 7);
- compute utilisation % = useful GPU-hours / provisioned GPU-hours, where a pod does need x speed GPU-hours of useful
  work per GPU per hour (what a dedicated GPU running it would have been busy for);
- memory utilisation % = GPU memory the running pods really use / provisioned GPU memory;
- pending time: per pod, from queued to bound (pods still waiting at the end count up to the end);
- job completion time: from the job's first arrival to its successful end, retries included;
- rejected: pods the kubelet fails at admission because the device plugin refuses them (more than one shared
  device with failRequestsGreaterThanOne, NVIDIA's default under MPS); such a job counts as failed.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kubegpu.sim.scenario import NodeGroup, Scenario
    from kubegpu.sim.workload import Job
    from kubegpu.sim.world import Attempt


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100); 0.0 for no values."""
    if not values:
        return 0.0
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100.0 * len(ordered)))
    return float(ordered[min(rank, len(ordered)) - 1])


@dataclass
class Sample:
    t: float
    allocation: float  # 0..1 of provisioned GPUs
    compute: float
    memory: float
    pending: int
    running: int
    gpus: int
    nodes: int = 0
    cost: float = 0.0  # dollars spent so far


@dataclass
class ClassStats:
    arrived: int = 0
    completed: int = 0
    oom_kills: int = 0
    pending_p95_s: float = 0.0
    jct_p50_s: float = 0.0


@dataclass
class TeamStats:
    """One team's (namespace's) share of a run: GPU-hours its pods held, how long they waited, how many were
    reclaimed from it (evicted for a team under its elastic `min`)."""

    gpu_hours: float = 0.0
    pods_started: int = 0
    pending_p50_s: float = 0.0
    pending_p95_s: float = 0.0
    pending_max_s: float = 0.0
    reclaims: int = 0


@dataclass
class StrategyResult:
    strategy: str
    duration_s: float
    gpus_provisioned_hours: float
    gpu_hours_allocated: float
    useful_gpu_hours: float
    allocation_pct: float
    compute_util_pct: float
    memory_util_pct: float
    jobs_arrived: int
    pods_completed: int
    oom_kills: int
    evictions: int
    rejected: int
    jobs_failed: int
    pods_pending_at_end: int
    pods_running_at_end: int
    pending_p50_s: float
    pending_p95_s: float
    pending_max_s: float
    jct_p50_s: float
    jct_p95_s: float
    cost: float
    cost_per_useful_gpu_hour: float
    spot_interruptions: int = 0  # bought nodes the cloud took back (scenario field spotInterruptions)
    innocent_oom_kills: int = 0  # OOM kills of pods within their share of a shared GPU (a neighbour's fault)
    guard_actions: int = 0  # pods the GPU-memory guard evicted for using more than their share (`+guard`)
    # `+guard` run beside its unguarded strategy on the same workload: the neighbours within their share that the
    # unguarded run lost to OOM kills and this one did not (None: no unguarded run to compare with)
    neighbours_saved: int | None = None
    classes: dict[str, ClassStats] = field(default_factory=dict)
    teams: dict[str, TeamStats] = field(default_factory=dict)  # scenario `teams:` only
    samples: list[Sample] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class Collector:
    """Accumulates a run's measurements; the engine calls it at every change, it integrates between changes."""

    def __init__(self, strategy: str, duration: float) -> None:
        self.strategy = strategy
        self.duration = duration
        self.now = 0.0
        self.alloc = 0.0
        self.useful_rate = 0.0
        self.memory = 0.0
        self.running = 0
        self.gpus = 0
        self.memory_capacity = 0.0
        self.cost_rate = 0.0  # per second
        self.int_alloc = self.int_useful = self.int_memory = self.int_gpus = self.int_memory_capacity = 0.0
        self.cost = 0.0
        self.node_gpus: dict[str, tuple[int, float, float]] = {}
        self.pending_waits: list[float] = []
        self.pending_by_class: dict[str, list[float]] = {}
        self.completed: dict[str, float] = {}  # job name → completion time
        self.first_arrival: dict[str, tuple[float, str]] = {}
        self.oom_kills = 0
        self.oom_by_class: dict[str, int] = {}
        self.innocent_oom_kills = 0
        self.guard_actions = 0
        self.evictions = 0
        self.rejected = 0
        self.failed = 0
        self.pending_at_end = 0
        self.spot_interruptions = 0
        self.samples: list[Sample] = []
        self.team_waits: dict[str, list[float]] = {}
        self.team_gpu_s: dict[str, float] = {}
        self.team_running: dict[int, tuple[float, float, str]] = {}  # id(run) → (start, GPUs held, namespace)
        self.team_reclaims: dict[str, int] = {}

    # integrals -------------------------------------------------------------------------------------------------
    def advance(self, t: float) -> None:
        dt = t - self.now
        if dt <= 0:
            return
        self.int_alloc += self.alloc * dt
        self.int_useful += self.useful_rate * dt
        self.int_memory += self.memory * dt
        self.int_gpus += self.gpus * dt
        self.int_memory_capacity += self.memory_capacity * dt
        self.cost += self.cost_rate * dt
        self.now = t

    def node_added(self, name: str, group: NodeGroup, t: float) -> None:
        from kubegpu.gpu.catalog import get_model

        memory = get_model(group.gpu_model).memory_mib / 1024 * group.gpus_per_node
        self.node_gpus[name] = (group.gpus_per_node, memory, group.price_per_hour / 3600.0)
        self.gpus += group.gpus_per_node
        self.memory_capacity += memory
        self.cost_rate += group.price_per_hour / 3600.0

    def node_removed(self, name: str, t: float) -> None:
        gpus, memory, rate = self.node_gpus.pop(name)
        self.gpus -= gpus
        self.memory_capacity -= memory
        self.cost_rate -= rate

    def spot_interrupted(self, name: str, t: float) -> None:
        self.spot_interruptions += 1

    # pods ------------------------------------------------------------------------------------------------------
    def queued(self, run: Attempt) -> None:
        self.first_arrival.setdefault(run.job.name, (run.job.arrival, run.job.klass))

    def started(self, run: Attempt, t: float) -> None:
        wait = t - run.queued_at
        self.pending_waits.append(wait)
        self.pending_by_class.setdefault(run.job.klass, []).append(wait)
        self.team_waits.setdefault(run.job.namespace, []).append(wait)
        self.team_running[id(run)] = (t, run.alloc_weight, run.job.namespace)
        self.alloc += run.alloc_weight
        self.memory += run.memory_in_use
        self.running += 1

    def speed_changed(self, run: Attempt, old: float, new: float) -> None:
        self.useful_rate += run.job.compute * run.job.gpus * (new - old)

    def stopped(self, run: Attempt, t: float, outcome: str) -> None:
        start, weight, namespace = self.team_running.pop(id(run), (t, 0.0, run.job.namespace))
        self.team_gpu_s[namespace] = self.team_gpu_s.get(namespace, 0.0) + weight * (t - start)
        self.alloc -= run.alloc_weight
        self.memory -= run.memory_in_use
        self.useful_rate -= run.job.compute * run.job.gpus * run.speed
        self.running -= 1
        if outcome == "completed":
            self.completed[run.job.name] = t
        elif outcome == "oom":
            self.oom_kills += 1
            self.oom_by_class[run.job.klass] = self.oom_by_class.get(run.job.klass, 0) + 1
            # MPS enforces each client's limit: an OOM kill there is always the pod's own (it reached its limit)
            if (run.share_gib is not None and not any(d.mps_memory_mib for d in run.devices)
                    and run.memory_use().at(t) <= run.share_gib + 1e-9):
                self.innocent_oom_kills += 1
            if run.ooms >= run.job.max_retries:
                self.failed += 1
        elif outcome == "guard":
            self.guard_actions += 1
            if run.ooms >= run.job.max_retries:
                self.failed += 1
        elif outcome == "rejected":
            self.rejected += 1
            self.failed += 1
        else:
            self.evictions += 1

    def still_pending(self, run: Attempt, t: float) -> None:
        wait = t - run.queued_at
        self.pending_waits.append(wait)
        self.pending_by_class.setdefault(run.job.klass, []).append(wait)
        self.team_waits.setdefault(run.job.namespace, []).append(wait)
        self.pending_at_end += 1

    def sample(self, t: float, pending: int) -> None:
        gpus = max(self.gpus, 1)
        memory = max(self.memory_capacity, 1e-9)
        self.samples.append(Sample(t, self.alloc / gpus, self.useful_rate / gpus, self.memory / memory, pending,
                                   self.running, self.gpus, len(self.node_gpus), round(self.cost, 2)))

    # result ----------------------------------------------------------------------------------------------------
    def _teams(self, scenario: Scenario) -> dict[str, TeamStats]:
        out: dict[str, TeamStats] = {}
        for team in getattr(scenario, "teams", None) or ():
            gpu_s = self.team_gpu_s.get(team.name, 0.0) + sum(
                weight * (self.now - start) for start, weight, ns in self.team_running.values() if ns == team.name)
            waits = self.team_waits.get(team.name, [])
            out[team.name] = TeamStats(gpu_hours=gpu_s / 3600.0, pods_started=len(waits),
                                       pending_p50_s=percentile(waits, 50), pending_p95_s=percentile(waits, 95),
                                       pending_max_s=max(waits, default=0.0),
                                       reclaims=self.team_reclaims.get(team.name, 0))
        return out

    def result(self, scenario: Scenario, jobs: Sequence[Job]) -> StrategyResult:
        gpu_seconds = max(self.int_gpus, 1e-9)
        useful_hours = self.int_useful / 3600.0
        jcts = [t - self.first_arrival[name][0] for name, t in self.completed.items()]
        classes: dict[str, ClassStats] = {}
        for job in jobs:
            classes.setdefault(job.klass, ClassStats()).arrived += 1
        jct_by_class: dict[str, list[float]] = {}
        for name, t in self.completed.items():
            arrival, klass = self.first_arrival[name]
            classes.setdefault(klass, ClassStats()).completed += 1
            jct_by_class.setdefault(klass, []).append(t - arrival)
        for klass, stats in classes.items():
            stats.oom_kills = self.oom_by_class.get(klass, 0)
            stats.pending_p95_s = percentile(self.pending_by_class.get(klass, []), 95)
            stats.jct_p50_s = percentile(jct_by_class.get(klass, []), 50)
        return StrategyResult(
            strategy=self.strategy,
            duration_s=self.duration,
            gpus_provisioned_hours=self.int_gpus / 3600.0,
            gpu_hours_allocated=self.int_alloc / 3600.0,
            useful_gpu_hours=useful_hours,
            allocation_pct=100.0 * self.int_alloc / gpu_seconds,
            compute_util_pct=100.0 * self.int_useful / gpu_seconds,
            memory_util_pct=100.0 * self.int_memory / max(self.int_memory_capacity, 1e-9),
            jobs_arrived=len(jobs),
            pods_completed=len(self.completed),
            oom_kills=self.oom_kills,
            evictions=self.evictions,
            rejected=self.rejected,
            jobs_failed=self.failed,
            pods_pending_at_end=self.pending_at_end,
            pods_running_at_end=self.running,
            pending_p50_s=percentile(self.pending_waits, 50),
            pending_p95_s=percentile(self.pending_waits, 95),
            pending_max_s=max(self.pending_waits, default=0.0),
            jct_p50_s=percentile(jcts, 50),
            jct_p95_s=percentile(jcts, 95),
            cost=self.cost,
            cost_per_useful_gpu_hour=self.cost / useful_hours if useful_hours > 0 else 0.0,
            spot_interruptions=self.spot_interruptions,
            innocent_oom_kills=self.innocent_oom_kills,
            guard_actions=self.guard_actions,
            classes=dict(sorted(classes.items())),
            teams=self._teams(scenario),
            samples=self.samples,
        )
