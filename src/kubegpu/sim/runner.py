"""Run a scenario under each of its strategies on one workload, and put the results in one serialisable report."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from kubegpu.sim.engine import Simulation
from kubegpu.sim.metrics import StrategyResult
from kubegpu.sim.scenario import Scenario
from kubegpu.sim.strategies import available_strategies, get_strategy
from kubegpu.sim.workload import Job, scenario_jobs

ProgressFactory = Callable[[str], Callable[[float], None] | None]


@dataclass
class SimulationReport:
    scenario: Scenario
    jobs: Sequence[Job]
    results: list[StrategyResult]

    @property
    def gpus(self) -> int:
        return sum(group.count * group.gpus_per_node for group in self.scenario.cluster.node_groups)

    def to_dict(self) -> dict[str, Any]:
        """Everything measured, with no wall-clock values: the same seed gives byte-identical JSON."""
        return {
            "scenario": self.scenario.name,
            "seed": self.scenario.seed,
            "durationHours": self.scenario.duration / 3600.0,
            "sampleIntervalSeconds": self.scenario.sample_interval,
            "cluster": [group.model_dump(by_alias=True) for group in self.scenario.cluster.node_groups],
            "gpus": self.gpus,
            "jobs": len(self.jobs),
            "strategies": [result.to_dict() for result in self.results],
        }


def strategy_names(scenario: Scenario, override: Sequence[str] | None = None) -> list[str]:
    """The strategies to run: the override, else the scenario's list plus its optional ones that are registered."""
    if override:
        return list(override)
    registered = set(available_strategies())
    extra = [name for name in scenario.optional_strategies if name.partition(":")[0] in registered]
    return [*scenario.strategies, *(name for name in extra if name not in scenario.strategies)]


def run_scenario(
    scenario: Scenario,
    strategies: Sequence[str] | None = None,
    progress: ProgressFactory | None = None,
) -> SimulationReport:
    """Simulate every strategy over the same jobs (same seed → same workload → comparable numbers)."""
    names = strategy_names(scenario, strategies)
    built = [get_strategy(name) for name in names]  # fail on a bad name before any simulation runs
    jobs = scenario_jobs(scenario)
    results = []
    for strategy in built:
        callback = progress(strategy.name) if progress is not None else None
        results.append(Simulation(scenario, strategy, jobs).run(callback))
    return SimulationReport(scenario, jobs, results)
