"""Run a scenario under each of its strategies on one workload, and put the results in one serialisable report."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from kubegpu.errors import ConfigError, KubegpuError
from kubegpu.sim.engine import Simulation
from kubegpu.sim.guard import credit_guard
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


def check_strategies(scenario: Scenario, names: Sequence[str], source: str | None = None) -> None:
    """Set up the scenario's cluster once per strategy with no jobs, so that a bad name, layout or node group is
    one error before anything long runs (it costs milliseconds). With `source`, `names` are the scenario file's
    `strategies` and the error names the file and the entry."""
    for position, name in enumerate(names):
        try:
            Simulation(scenario, get_strategy(name), [], duration=0.0).run()
        except KubegpuError as exc:
            if source is None:
                raise
            raise ConfigError(f"{source}: strategies[{position}]: {exc}") from None


def run_scenario(
    scenario: Scenario,
    strategies: Sequence[str] | None = None,
    progress: ProgressFactory | None = None,
) -> SimulationReport:
    """Simulate every strategy over the same jobs (same seed → same workload → comparable numbers)."""
    names = strategy_names(scenario, strategies)
    check_strategies(scenario, names)
    built = [get_strategy(name) for name in names]
    jobs = scenario_jobs(scenario)
    results = []
    for strategy in built:
        callback = progress(strategy.name) if progress is not None else None
        results.append(Simulation(scenario, strategy, jobs).run(callback))
    credit_guard(results)
    return SimulationReport(scenario, jobs, results)
