"""dynamic-mig and dynamic-mps in the simulator: the planner and the batch window on the virtual clock."""

from __future__ import annotations

import pytest

from kubegpu.errors import ConfigError
from kubegpu.partitioner.sim_strategy import DynamicMig, DynamicMps
from kubegpu.sim.engine import Simulation
from kubegpu.sim.scenario import Scenario, parse_scenario
from kubegpu.sim.strategies import get_strategy
from kubegpu.sim.workload import Job


def scenario(gpus: int = 2) -> Scenario:
    return parse_scenario({
        "name": "tiny", "duration": "3h", "sampleInterval": "10m", "strategies": ["dynamic-mig"],
        "cluster": {"nodeGroups": [{"name": "g", "count": 1, "gpuModel": "A100-SXM4-80GB", "gpusPerNode": gpus,
                                    "pricePerHour": 10.0}]},
        "workload": {"classes": [{"name": "ci", "arrivalsPerHour": 1, "memoryGiB": [1, 8], "compute": [0.1, 0.5],
                                  "runtime": ["5m", "30m"]}]},
    }, "tiny.yaml")


def job(name: str, memory: float, arrival: float = 0.0, runtime: float = 1800.0) -> Job:
    return Job(name=name, arrival=arrival, klass="ci", namespace="default", priority=0, gpus=1,
               memory_gib=memory, compute=0.3, work=runtime, max_retries=0)


@pytest.mark.parametrize("strategy_cls", [DynamicMig, DynamicMps])
def test_pods_get_slices_cut_for_them(strategy_cls: type[DynamicMig] | type[DynamicMps]) -> None:
    jobs = [job("small-a", 8), job("small-b", 8), job("mid", 30), job("big", 70)]
    strategy = strategy_cls("dyn")
    result = Simulation(scenario(), strategy, jobs).run(None)
    assert result.pods_completed == 4
    assert result.oom_kills == 0
    assert strategy.plans >= 1 and strategy.recuts >= 1
    # nothing existed at the start: every pod waited for a batch window (5 s ticks, 10 s idle) plus the re-cut
    assert 10 + strategy.delay <= result.pending_max_s <= 60 + strategy.delay + 10


def test_busy_gpus_are_not_recut() -> None:
    jobs = [job("first", 8), job("later", 70, arrival=600.0)]
    strategy = DynamicMig("dyn")
    result = Simulation(scenario(gpus=1), strategy, jobs).run(None)
    # the one GPU holds a running 1g pod when the 7g-sized pod arrives: it waits until the GPU is idle again
    assert result.pods_completed == 2 and result.evictions == 0
    assert result.pending_max_s >= 1800 - 600


def test_registered_and_arguments_rejected() -> None:
    assert get_strategy("dynamic-mig").name == "dynamic-mig"
    assert get_strategy("dynamic-mps").name == "dynamic-mps"
    with pytest.raises(ConfigError, match="dynamic-mig takes no argument"):
        get_strategy("dynamic-mig:fast")
