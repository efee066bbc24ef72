"""The `autoscaler` simulator strategy: NodePool-driven node groups on the virtual clock."""

from __future__ import annotations

import pytest

from kubegpu.autoscaler.sim_strategy import AutoscalerStrategy
from kubegpu.errors import ConfigError
from kubegpu.sim.engine import Simulation
from kubegpu.sim.runner import scenario_jobs
from kubegpu.sim.scenario import parse_scenario
from kubegpu.sim.strategies import get_strategy

SCENARIO = {
    "name": "autoscaler smoke",
    "cluster": {"nodeGroups": [
        {"name": "a100", "count": 0, "gpuModel": "A100-SXM4-80GB", "gpusPerNode": 8, "pricePerHour": 27.45,
         "cpu": 96, "memory": "1152Gi"},
        {"name": "l4", "count": 0, "gpuModel": "L4", "gpusPerNode": 1, "pricePerHour": 0.8, "cpu": 8,
         "memory": "32Gi"}]},
    "workload": {"classes": [
        {"name": "ci", "namespace": "ci", "priority": 10, "arrivalsPerHour": 30, "memoryGiB": [1, 6],
         "compute": [0.1, 0.3], "runtime": ["2m", "10m"]}]},
    "strategies": ["autoscaler"],
    "duration": "2h",
    "seed": 3,
    "sampleInterval": "5m",
}


def test_autoscaler_strategy_buys_cheap_nodes_and_returns_them() -> None:
    scenario = parse_scenario(SCENARIO, "smoke.yaml")
    assert isinstance(get_strategy("autoscaler"), AutoscalerStrategy)
    ours = AutoscalerStrategy("autoscaler:exclusive", None)
    result = Simulation(scenario, ours, scenario_jobs(scenario)).run()
    assert result.pods_completed > 0
    assert result.cost > 0
    nodes = [n for _, n, _ in ours.timeline]
    assert max(nodes) >= 1                        # nodes were bought for pending pods ...
    assert min(nodes[nodes.index(max(nodes)):]) < max(nodes)   # ... and empty ones given back
    # 1-GPU pods: the provisioner buys only the cheap one-GPU L4 nodes, never an 8x A100 node
    assert all(abs(price - 0.8 * count) < 1e-6 for _, count, price in ours.timeline)


def test_bad_strategy_argument_is_one_line() -> None:
    with pytest.raises(ConfigError, match="autoscaler:sometimes"):
        get_strategy("autoscaler:sometimes")
