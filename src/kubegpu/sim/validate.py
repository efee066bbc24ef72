"""`kubegpu validate-config` support for scenario files (through kubegpu.config's kind registry)."""

from __future__ import annotations

from kubegpu.sim.runner import check_strategies
from kubegpu.sim.scenario import parse_scenario


def looks_like_scenario(data: object) -> bool:
    return isinstance(data, dict) and "cluster" in data and "workload" in data


def _validate(data: object, source: str, options: object) -> str:
    scenario = parse_scenario(data, source)
    check_strategies(scenario, scenario.strategies, source)
    gpus = sum(group.count * group.gpus_per_node for group in scenario.cluster.node_groups)
    return f"{gpus} GPUs, strategies: {', '.join(scenario.strategies)}"


def register_scenario_validator() -> None:
    from kubegpu.config import register_validator

    register_validator("scenario", looks_like_scenario, _validate)
