"""The workload: jobs that arrive over time, each with its real needs and its amount of work.

A `Job` says what the work really needs (GPUs, memory GiB per GPU, compute fraction of a full GPU) and how much
work it is (GPU-seconds at full speed). What it *asks for* (`nvidia.com/gpu`, `nvidia.com/mig-2g.20gb`, ...) is
decided by the strategy under test, which is the point of comparing strategies on one workload.

Sources: a generator (job classes with Poisson arrivals and a day/night swing) or a trace file.

Trace format (YAML: a list of mappings, or a mapping with a ``jobs:`` list; CSV: a header row with the same names):
    arrival         seconds after the start, or a duration string ("1h30m")          required
    gpus            GPUs (devices) the pod needs                                    default 1
    memoryGiB       memory the pod really uses on each GPU                          required
    compute         fraction of a full GPU's compute it keeps busy, (0, 1]          required
    workGpuSeconds  GPU-seconds of work at full speed (runtime alone x gpus)        required (or runtime)
    runtime         alternative to workGpuSeconds: runtime alone on whole GPUs ("2h")
    memoryGrowthGiBPerHour  how fast its use creeps up after its first allocation   default 0
    class, namespace, priority, name, maxRetries                                    optional

Memory is what real workloads show: a first allocation shortly after the pod starts, then (for a class with
`memoryGrowthGiBPerHour`) use that creeps up for as long as the pod runs — a notebook that keeps tensors around, a
server whose caches grow — in the share of its jobs `memoryGrowthShare` says (default all). Whether a job creeps
and how fast are drawn by a generator of its own, seeded by the scenario's seed and the class, so adding growth to a
class changes nothing else of the workload.
"""

from __future__ import annotations

import csv
import dataclasses
import math
import random
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kubegpu.errors import ConfigError
from kubegpu.files import parse_yaml_text, read_text
from kubegpu.sim.scenario import JobClass, Scenario
from kubegpu.sim.units import parse_duration


@dataclass(frozen=True, slots=True)
class Job:
    name: str
    arrival: float
    klass: str
    namespace: str
    priority: int
    gpus: int
    memory_gib: float  # per GPU
    compute: float  # per GPU, fraction of a full GPU
    work: float  # GPU-seconds at full speed, all GPUs together
    max_retries: int = 2
    memory_growth_gib_per_hour: float = 0.0  # per GPU, from its first allocation on

    @property
    def runtime_alone(self) -> float:
        return self.work / self.gpus


def generate(classes: Sequence[JobClass], duration: float, seed: int) -> list[Job]:
    """Jobs of every class arriving in [0, duration), sorted by arrival; the same seed gives the same jobs."""
    jobs: list[Job] = []
    for job_class in classes:
        rng = random.Random(f"{seed}:{job_class.name}")
        growth = job_class.memory_growth_gib_per_hour
        if growth is None:
            jobs.extend(_class_jobs(job_class, duration, rng))
            continue
        creep = random.Random(f"{seed}:{job_class.name}:growth")  # its own draws: the rest of the class unchanged
        for job in _class_jobs(job_class, duration, rng):
            rate = round(creep.uniform(*growth), 3)
            creeps = job_class.memory_growth_share >= 1 or creep.random() < job_class.memory_growth_share
            jobs.append(dataclasses.replace(job, memory_growth_gib_per_hour=rate if creeps else 0.0))
    jobs.sort(key=lambda job: (job.arrival, job.name))
    return jobs


def arrival_rate(job_class: JobClass, t: float) -> float:
    """Arrivals per second at time t: the class's mean rate swung by a cosine peaking at its peak hour."""
    hour = (t / 3600.0) % 24.0
    swing = job_class.diurnal_amplitude * math.cos(2 * math.pi * (hour - job_class.peak_hour) / 24.0)
    return job_class.arrivals_per_hour / 3600.0 * (1.0 + swing)


def _class_jobs(job_class: JobClass, duration: float, rng: random.Random) -> Iterable[Job]:
    """Non-homogeneous Poisson arrivals by thinning: draw at the peak rate, keep each with rate(t)/peak."""
    peak = job_class.arrivals_per_hour / 3600.0 * (1.0 + job_class.diurnal_amplitude)
    t = 0.0
    index = 0
    while True:
        t += rng.expovariate(peak)
        if t >= duration:
            return
        if rng.random() * peak > arrival_rate(job_class, t):
            continue
        gpus = rng.choice(job_class.gpus)
        runtime = rng.uniform(*job_class.runtime)
        index += 1
        yield Job(
            name=f"{job_class.name}-{index}",
            arrival=t,
            klass=job_class.name,
            namespace=job_class.namespace,
            priority=job_class.priority,
            gpus=gpus,
            memory_gib=round(rng.uniform(*job_class.memory_gib), 2),
            compute=round(rng.uniform(*job_class.compute), 3),
            work=runtime * gpus,
            max_retries=job_class.max_retries,
        )


def load_trace(path: str | Path) -> list[Job]:
    """Jobs from a YAML or CSV trace (format in the module docstring); one-line ConfigError naming the row."""
    file = Path(path)
    text = read_text(file)  # bounded, UTF-8
    if file.suffix.lower() == ".csv":
        rows: list[Any] = list(csv.DictReader(text.splitlines()))
    else:
        data = parse_yaml_text(text, str(file))
        listed = data.get("jobs") if isinstance(data, dict) else data
        if not isinstance(listed, list):
            raise ConfigError(f"{file}: expected a list of jobs (or a mapping with 'jobs:')")
        rows = listed
    jobs = [_trace_job(row, f"{file.name}: jobs[{index}]", index) for index, row in enumerate(rows)]
    jobs.sort(key=lambda job: (job.arrival, job.name))
    return jobs


def _trace_job(row: object, where: str, index: int) -> Job:
    if not isinstance(row, Mapping):
        raise ConfigError(f"{where}: expected a mapping")
    known = {"arrival", "gpus", "memoryGiB", "compute", "workGpuSeconds", "runtime", "class", "namespace",
             "priority", "name", "maxRetries", "memoryGrowthGiBPerHour"}
    for key in row:
        if key not in known:
            raise ConfigError(f"{where}.{key}: unknown field")

    def number(key: str, default: float | None = None) -> float:
        value = row.get(key, default)
        if value is None or value == "":
            if default is None:
                raise ConfigError(f"{where}.{key}: required field is missing")
            return default
        try:
            result = float(value)
        except (TypeError, ValueError, OverflowError):
            raise ConfigError(f"{where}.{key}: expected a number, got {str(value)[:40]!r}") from None
        if not abs(result) <= 1e12:  # NaN and inf too: no count, GiB or GPU-second in a trace comes near
            raise ConfigError(f"{where}.{key}: must be a finite number of magnitude at most 1e12, got {value!r}")
        return result

    def duration(key: str) -> float:
        try:
            return parse_duration(row[key])
        except ValueError as exc:
            raise ConfigError(f"{where}.{key}: {exc}") from None

    if "arrival" not in row:
        raise ConfigError(f"{where}.arrival: required field is missing")
    arrival = duration("arrival")
    gpus = int(number("gpus", 1.0))
    if gpus < 1:
        raise ConfigError(f"{where}.gpus: must be at least 1")
    compute = number("compute")
    if not 0 < compute <= 1:
        raise ConfigError(f"{where}.compute: compute need is a fraction of a full GPU in (0, 1]")
    memory = number("memoryGiB")
    if memory < 0:
        raise ConfigError(f"{where}.memoryGiB: cannot be negative")
    if row.get("workGpuSeconds") not in (None, ""):
        work = number("workGpuSeconds")
    elif row.get("runtime") not in (None, ""):
        work = duration("runtime") * gpus
    else:
        raise ConfigError(f"{where}.workGpuSeconds: required field is missing (or give runtime)")
    if work <= 0:
        raise ConfigError(f"{where}.workGpuSeconds: must be positive")
    growth = number("memoryGrowthGiBPerHour", 0.0)
    if growth < 0:
        raise ConfigError(f"{where}.memoryGrowthGiBPerHour: cannot be negative")
    klass = str(row.get("class") or "trace")
    return Job(
        name=str(row.get("name") or f"{klass}-{index + 1}"),
        arrival=arrival,
        klass=klass,
        namespace=str(row.get("namespace") or "default"),
        priority=int(number("priority", 0.0)),
        gpus=gpus,
        memory_gib=memory,
        compute=compute,
        work=work,
        max_retries=int(number("maxRetries", 2.0)),
        memory_growth_gib_per_hour=growth,
    )


def scenario_jobs(scenario: Scenario, duration: float | None = None) -> list[Job]:
    """The scenario's jobs: generated for its duration and seed, or read from its trace (relative to the file)."""
    horizon = scenario.duration if duration is None else duration
    if scenario.workload.classes is not None:
        return assign_teams(generate(scenario.workload.classes, horizon, scenario.seed), scenario)
    trace = Path(scenario.workload.trace or "")
    if not trace.is_absolute():
        trace = Path(scenario.source_dir) / trace
    return assign_teams([job for job in load_trace(trace) if job.arrival < horizon], scenario)


def assign_teams(jobs: list[Job], scenario: Scenario) -> list[Job]:
    """Each job to a team's namespace by the teams' shares (seeded; shares under 1 leave the rest where they were)."""
    if not scenario.teams:
        return jobs
    rng = random.Random(scenario.seed * 7919 + 17)
    out = []
    for job in jobs:
        draw, chosen = rng.random(), None
        for team in scenario.teams:
            if draw < team.share:
                chosen = team.name
                break
            draw -= team.share
        out.append(dataclasses.replace(job, namespace=chosen) if chosen else job)
    return out
