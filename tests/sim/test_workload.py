"""The workload generator and trace files."""

from __future__ import annotations

from pathlib import Path

import pytest

from kubegpu.errors import ConfigError
from kubegpu.sim.scenario import JobClass
from kubegpu.sim.workload import arrival_rate, generate, load_trace, scenario_jobs
from tests.sim.helpers import tiny_scenario


def job_class(**extra: object) -> JobClass:
    data = {"name": "ci", "arrivalsPerHour": 30, "memoryGiB": [1, 8], "compute": [0.1, 0.5],
            "runtime": ["5m", "30m"], "gpus": [1, 2]}
    data.update(extra)
    return JobClass.model_validate(data)


def test_same_seed_same_jobs_other_seed_other_jobs() -> None:
    classes = [job_class()]
    assert generate(classes, 7200, seed=3) == generate(classes, 7200, seed=3)
    assert generate(classes, 7200, seed=3) != generate(classes, 7200, seed=4)


def test_generated_jobs_respect_the_class_ranges() -> None:
    jobs = generate([job_class()], 36000, seed=1)
    assert 200 < len(jobs) < 400  # 30/h for 10 h
    for job in jobs:
        assert 0 <= job.arrival < 36000
        assert 1 <= job.memory_gib <= 8 and 0.1 <= job.compute <= 0.5
        assert job.gpus in (1, 2)
        assert 300 <= job.runtime_alone <= 1800
    assert [job.arrival for job in jobs] == sorted(job.arrival for job in jobs)


def test_diurnal_swing_puts_more_arrivals_near_the_peak() -> None:
    swinging = job_class(diurnalAmplitude=0.9, peakHour=12, arrivalsPerHour=60)
    assert arrival_rate(swinging, 12 * 3600) > 10 * arrival_rate(swinging, 0)
    jobs = generate([swinging], 86400, seed=2)
    near_peak = sum(1 for job in jobs if 8 * 3600 <= job.arrival < 16 * 3600)
    at_night = sum(1 for job in jobs if job.arrival < 4 * 3600 or job.arrival >= 20 * 3600)
    assert near_peak > 3 * at_night


def test_yaml_trace(tmp_path: Path) -> None:
    trace = tmp_path / "jobs.yaml"
    trace.write_text(
        "jobs:\n"
        "  - {arrival: 1h, gpus: 2, memoryGiB: 40, compute: 0.9, runtime: 2h, class: train, priority: 5}\n"
        "  - {arrival: 30, memoryGiB: 5, compute: 0.1, workGpuSeconds: 600}\n"
    )
    first, second = load_trace(trace)
    assert (first.arrival, first.gpus, first.memory_gib, first.work) == (30.0, 1, 5.0, 600.0)
    assert (second.klass, second.priority, second.work, second.runtime_alone) == ("train", 5, 14400.0, 7200.0)


def test_csv_trace(tmp_path: Path) -> None:
    trace = tmp_path / "jobs.csv"
    trace.write_text("arrival,gpus,memoryGiB,compute,workGpuSeconds,class\n0,1,10,0.5,3600,infer\n60,,4,0.2,60,ci\n")
    jobs = load_trace(trace)
    assert [(j.klass, j.gpus, j.work) for j in jobs] == [("infer", 1, 3600.0), ("ci", 1, 60.0)]


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ("{memoryGiB: 1, compute: 0.1, workGpuSeconds: 5}", "jobs.yaml: jobs[0].arrival: required field is missing"),
        ("{arrival: 0, memoryGiB: 1, compute: 1.5, workGpuSeconds: 5}", "jobs.yaml: jobs[0].compute: compute need"),
        ("{arrival: 0, memoryGiB: x, compute: 0.5, workGpuSeconds: 5}", "jobs.yaml: jobs[0].memoryGiB: expected a"),
        ("{arrival: 0, memoryGiB: 1, compute: 0.5}", "jobs.yaml: jobs[0].workGpuSeconds: required field"),
        ("{arrival: 0, memoryGiB: 1, compute: 0.5, runtime: 5m, colour: red}", "jobs.yaml: jobs[0].colour: unknown"),
    ],
)
def test_bad_trace_rows_are_one_line_errors(tmp_path: Path, row: str, message: str) -> None:
    trace = tmp_path / "jobs.yaml"
    trace.write_text(f"- {row}\n")
    with pytest.raises(ConfigError) as info:
        load_trace(trace)
    assert str(info.value).startswith(message)
    assert "\n" not in str(info.value)


def test_scenario_trace_is_read_relative_to_the_scenario(tmp_path: Path) -> None:
    (tmp_path / "jobs.csv").write_text("arrival,memoryGiB,compute,runtime\n0,1,0.5,10m\n7200,1,0.5,10m\n")
    scenario = tiny_scenario(workload={"trace": "jobs.csv"}, duration="1h").model_copy(
        update={"source_dir": str(tmp_path)})
    jobs = scenario_jobs(scenario)
    assert len(jobs) == 1  # the second arrives after the scenario ends
