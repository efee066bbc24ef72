"""The `autoscaler` simulator strategy: NodePool-driven node groups on the virtual clock."""

from __future__ import annotations

import pytest

from kubegpu.autoscaler.sim_strategy import AutoscalerStrategy
from kubegpu.errors import ConfigError
from kubegpu.sim.effects import spot_lifetime
from kubegpu.sim.engine import Simulation
from kubegpu.sim.metrics import StrategyResult
from kubegpu.sim.runner import scenario_jobs
from kubegpu.sim.scenario import parse_scenario
from kubegpu.sim.strategies import get_strategy
from tests.sim.helpers import job

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


def _spot_run(spot: dict[str, object] | None, seed: int = 3) -> tuple[Simulation, AutoscalerStrategy, StrategyResult]:
    data: dict[str, object] = {
        "cluster": {"nodeGroups": [{"name": "l4", "count": 0, "gpuModel": "L4", "gpusPerNode": 1,
                                    "pricePerHour": 0.8, "cpu": 8, "memory": "32Gi"}]},
        "workload": {"classes": [{"name": "ci", "arrivalsPerHour": 1, "memoryGiB": 1, "compute": 0.5,
                                  "runtime": "1m"}]},
        "strategies": ["autoscaler"], "duration": "6h", "seed": seed, "sampleInterval": "5m"}
    if spot is not None:
        data["spotInterruptions"] = spot
    ours = AutoscalerStrategy("autoscaler:exclusive", None)
    sim = Simulation(parse_scenario(data, "spot.yaml"), ours, [job("train-0", runtime=3 * 3600.0)])
    return sim, ours, sim.run()


def test_an_interrupted_spot_node_is_replaced_through_a_new_nodeclaim() -> None:
    spot = {"perNodeHour": 0.5, "notice": "2m"}
    lifetime = spot_lifetime(3, "l4-0", 0.5)
    assert 3600 < lifetime < 3 * 3600 - 300 and lifetime + spot_lifetime(3, "l4-1", 0.5) > 6 * 3600  # premise
    _, _, calm = _spot_run(None)
    sim, ours, hit = _spot_run(spot)
    assert (calm.spot_interruptions, calm.evictions, calm.pods_completed) == (0, 0, 1)
    assert (hit.spot_interruptions, hit.evictions, hit.pods_completed) == (1, 1, 1)
    # the first pod waited for l4-0 as before; its requeued successor for the replacement's bring-up (300 s)
    assert hit.pending_p50_s == pytest.approx(calm.pending_max_s - 5, abs=10)
    assert 300 <= hit.pending_max_s <= 330
    assert hit.jct_p50_s == pytest.approx(calm.jct_p50_s + lifetime + 120, abs=30)  # the work started over
    # the interrupted node was paid for until it went, then the replacement for the whole job again
    assert hit.cost - calm.cost == pytest.approx(0.8 * (lifetime + 120) / 3600, abs=0.8 * 60 / 3600)
    assert [n["metadata"]["name"] for n in sim.cluster.list("Node")] == []   # the replacement consolidated at the end
    assert max(n for _, n, _ in ours.timeline) == 1 and not sim.cluster.list("NodeClaim")


def test_spot_interruptions_replay_the_same_for_a_seed() -> None:
    spot = {"perNodeHour": 0.5, "notice": "2m"}
    assert _spot_run(spot)[2].to_dict() == _spot_run(spot)[2].to_dict()


def test_dra_dynamic_mig_buys_mig_capable_nodes_for_pods_the_allocator_places() -> None:
    """`autoscaler:dra-dynamic-mig`: pods ask for MIG slices that only DRA serves (no node advertises them before a
    claim cuts them), so without planning them as claims the autoscaler would buy nothing and they would wait."""
    scenario = parse_scenario({**SCENARIO, "duration": "1h"}, "smoke.yaml")
    ours = get_strategy("autoscaler:dra-dynamic-mig")
    assert isinstance(ours, AutoscalerStrategy)
    result = Simulation(scenario, ours, scenario_jobs(scenario)).run()
    assert result.pods_completed > 0
    nodes = [n for _, n, _ in ours.timeline]
    assert max(nodes) >= 1
    assert min(nodes[nodes.index(max(nodes)):]) < max(nodes)   # empty nodes given back
    # MIG slices exist only on the A100 group (the L4 has no MIG): every node bought is an A100 node
    assert all(abs(price - 27.45 * count) < 1e-6 for _, count, price in ours.timeline)
