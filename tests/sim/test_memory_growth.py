"""Creeping GPU memory in the simulator: the driver fails the allocation that finds a shared GPU full, whoever makes
it — a well-behaved neighbour, when a leaking notebook filled the GPU — and `+guard` evicts the leaker first."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import pytest
from rich.console import Console

from kubegpu.sim.engine import Simulation
from kubegpu.sim.metrics import StrategyResult
from kubegpu.sim.report import render_html, results_table
from kubegpu.sim.runner import run_scenario
from kubegpu.sim.scenario import default_scenario
from kubegpu.sim.strategies import get_strategy
from kubegpu.sim.workload import Job, generate
from tests.sim.helpers import job, tiny_scenario


def simulate(spec: str, jobs: Sequence[Job]) -> StrategyResult:
    return Simulation(tiny_scenario(duration="8h"), get_strategy(spec), jobs).run()


def leak_next_to_servers() -> list[Job]:
    """A notebook whose use creeps up 10 GiB an hour, next to two servers within their 20 GiB share: 41 GiB at the
    start, full after 3.9 hours, while the notebook runs for five."""
    notebook = dataclasses.replace(job("notebook-1", memory=5, compute=0.01, runtime=5 * 3600),
                                   memory_growth_gib_per_hour=10.0)
    return [notebook, job("serving-1", arrival=60, memory=18, compute=0.3, runtime=5 * 3600),
            job("serving-2", arrival=120, memory=18, compute=0.3, runtime=5 * 3600)]


def test_a_leak_kills_a_neighbour_within_its_share() -> None:
    result = simulate("time-slicing:4", leak_next_to_servers())
    assert result.oom_kills == 1 and result.innocent_oom_kills == 1  # a server's allocation found the GPU full
    assert result.classes["serving"].oom_kills == 1 and result.classes["serving"].completed == 1
    assert result.classes["notebook"].completed == 1  # the leaker itself runs on


def test_the_guard_evicts_the_leaker_before_the_gpu_fills() -> None:
    result = simulate("time-slicing:4+guard", leak_next_to_servers())
    assert result.oom_kills == 0 and result.innocent_oom_kills == 0
    assert result.guard_actions == 1 and result.classes["notebook"].completed == 0
    assert result.classes["serving"].completed == 2


def test_under_mps_a_leaker_reaches_its_own_limit_and_only_it_dies() -> None:
    plain, guarded = simulate("mps:4", leak_next_to_servers()), simulate("mps:4+guard", leak_next_to_servers())
    for result in (plain, guarded):
        assert result.oom_kills == 1 and result.innocent_oom_kills == 0 and result.guard_actions == 0
        assert result.classes["notebook"].oom_kills == 1 and result.classes["serving"].completed == 2


def test_without_growth_nothing_fills() -> None:
    steady = [dataclasses.replace(j, memory_growth_gib_per_hour=0.0) for j in leak_next_to_servers()]
    result = simulate("time-slicing:4", steady)
    assert result.oom_kills == 0 and result.pods_completed == 3


def test_growth_is_drawn_apart_so_the_rest_of_the_workload_stays() -> None:
    classes = default_scenario().workload.classes
    assert classes is not None
    creeping = [c for c in classes if c.memory_growth_gib_per_hour is not None]
    assert {c.name for c in creeping} == {"notebook", "llm-serving"}
    steady = [c.model_copy(update={"memory_growth_gib_per_hour": None}) for c in classes]
    with_growth, without = generate(classes, 6 * 3600, 7), generate(steady, 6 * 3600, 7)
    assert [dataclasses.replace(j, memory_growth_gib_per_hour=0.0) for j in with_growth] == without
    assert with_growth == generate(classes, 6 * 3600, 7)  # deterministic by seed
    rates = [j.memory_growth_gib_per_hour for j in with_growth if j.klass == "notebook"]
    assert rates and all(0 <= r <= 8 for r in rates) and len(set(rates)) > 1
    # memoryGrowthShare: only that share of a class's jobs creep; which ones is drawn apart as well
    half = [c.model_copy(update={"memory_growth_share": 0.5}) if c.name == "notebook" else c for c in classes]
    notebooks = [j for j in generate(half, 6 * 3600, 7) if j.klass == "notebook"]
    creeping = [j for j in notebooks if j.memory_growth_gib_per_hour > 0]
    assert 0 < len(creeping) < len(notebooks)
    assert [dataclasses.replace(j, memory_growth_gib_per_hour=0.0) for j in notebooks] == [
        dataclasses.replace(j, memory_growth_gib_per_hour=0.0) for j in with_growth if j.klass == "notebook"]


@pytest.mark.slow
def test_the_default_day_counts_the_neighbours_a_leak_kills_and_the_guard_saves() -> None:
    killed = 0
    for seed in (1, 2, 3):  # a few neighbours a day at most: one day alone may have none
        report = run_scenario(default_scenario().model_copy(update={"seed": seed}),
                              ["time-slicing:4", "time-slicing:4+guard"])
        plain, guarded = report.results
        assert plain.neighbours_saved is None
        assert guarded.oom_kills == 0 and guarded.innocent_oom_kills == 0
        assert guarded.neighbours_saved == plain.innocent_oom_kills
        killed += plain.innocent_oom_kills
    assert killed > 0
    data = report.to_dict()["strategies"]
    assert [s["neighbours_saved"] for s in data] == [None, plain.innocent_oom_kills]
    page = render_html(report)
    assert "neighbours saved" in page and f"<b>{plain.innocent_oom_kills}</b> saved by the guard" in page
    console = Console(record=True, width=200)
    console.print(results_table(report))
    text = console.export_text()
    assert "neighbours (within share)" in text and "neighbours saved" in text
