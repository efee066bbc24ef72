"""Small scenarios and hand-written jobs for the simulator tests."""

from __future__ import annotations

from typing import Any

from kubegpu.sim.scenario import Scenario, parse_scenario
from kubegpu.sim.workload import Job


def tiny_scenario(
    gpus: int = 1, nodes: int = 1, model: str = "A100-SXM4-80GB", duration: str = "6h", **extra: Any
) -> Scenario:
    data: dict[str, Any] = {
        "name": "tiny",
        "cluster": {"nodeGroups": [{"name": "g", "count": nodes, "gpuModel": model, "gpusPerNode": gpus,
                                    "pricePerHour": 10.0}]},
        "workload": {"classes": [{"name": "ci", "arrivalsPerHour": 20, "memoryGiB": [1, 8],
                                  "compute": [0.1, 0.5], "runtime": ["5m", "30m"]}]},
        "strategies": ["exclusive"],
        "duration": duration,
        "sampleInterval": "10m",
    }
    data.update(extra)
    return parse_scenario(data, "tiny.yaml")


def job(name: str, arrival: float = 0.0, *, memory: float = 10.0, compute: float = 1.0, runtime: float = 3600.0,
        gpus: int = 1, priority: int = 0, retries: int = 0) -> Job:
    return Job(name=name, arrival=arrival, klass=name.split("-")[0], namespace="default", priority=priority,
               gpus=gpus, memory_gib=memory, compute=compute, work=runtime * gpus, max_retries=retries)
