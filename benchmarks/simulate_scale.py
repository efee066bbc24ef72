"""Simulator scale: a day of 100 nodes x 8 GPUs and ~50,000 pods, on one core.

Prints simulated seconds per wall second, pods per wall second, and the wall time as a ratio against the 60 s
target (below 1.0 means inside the target). `--quick` runs a tenth of the cluster and the workload.

    python benchmarks/simulate_scale.py [--quick] [--strategy time-slicing:4]
"""

from __future__ import annotations

import argparse
import time

from kubegpu.sim.engine import Simulation
from kubegpu.sim.scenario import parse_scenario
from kubegpu.sim.strategies import get_strategy
from kubegpu.sim.workload import scenario_jobs

TARGET_WALL_S = 60.0


def scenario(scale: float) -> dict[str, object]:
    def rate(per_hour: float) -> float:
        return per_hour * scale

    return {
        "name": "scale benchmark",
        "cluster": {"nodeGroups": [
            {"name": "h100", "count": round(50 * scale), "gpuModel": "H100-SXM5-80GB", "pricePerHour": 55.04},
            {"name": "a100", "count": round(50 * scale), "gpuModel": "A100-SXM4-80GB", "pricePerHour": 27.45},
        ]},
        "workload": {"classes": [
            {"name": "training", "arrivalsPerHour": rate(5), "gpus": [1, 2, 4, 8], "memoryGiB": [50, 76],
             "compute": [0.85, 1.0], "runtime": ["1h", "6h"], "priority": 100},
            {"name": "serving", "arrivalsPerHour": rate(20), "memoryGiB": [24, 38], "compute": [0.3, 0.55],
             "runtime": ["2h", "8h"], "priority": 200},
            {"name": "inference", "arrivalsPerHour": rate(400), "memoryGiB": [12, 19], "compute": [0.2, 0.4],
             "runtime": ["5m", "30m"], "priority": 50, "diurnalAmplitude": 0.5},
            {"name": "notebook", "arrivalsPerHour": rate(40), "memoryGiB": [3, 9], "compute": [0.02, 0.1],
             "runtime": ["1h", "5h"], "priority": 50, "diurnalAmplitude": 0.8},
            {"name": "ci", "arrivalsPerHour": rate(1620), "memoryGiB": [1, 6], "compute": [0.1, 0.3],
             "runtime": ["2m", "15m"], "priority": 10, "diurnalAmplitude": 0.6},
        ]},
        "duration": "24h",
        "sampleInterval": "5m",
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a tenth of the cluster and workload")
    parser.add_argument("--strategy", default="time-slicing:4", help="strategy to simulate (default: time-slicing:4)")
    args = parser.parse_args()
    scale = 0.1 if args.quick else 1.0
    spec = parse_scenario(scenario(scale), "simulate_scale")
    jobs = scenario_jobs(spec)
    gpus = sum(g.count * g.gpus_per_node for g in spec.cluster.node_groups)
    started, cpu_started = time.perf_counter(), time.process_time()
    result = Simulation(spec, get_strategy(args.strategy), jobs).run()
    wall = time.perf_counter() - started
    cpu = time.process_time() - cpu_started
    target = TARGET_WALL_S * scale
    print(f"strategy {args.strategy}: {gpus} GPUs, {len(jobs):,} pods, {spec.duration / 3600:.0f} simulated hours")
    print(f"  completed {result.pods_completed:,}, OOM kills {result.oom_kills}, "
          f"pending at end {result.pods_pending_at_end:,}, allocation {result.allocation_pct:.1f}%")
    print(f"  wall time            {wall:8.2f} s   (CPU time {cpu:.2f} s: the rest is other load on the machine)")
    print(f"  simulated s / wall s {spec.duration / wall:8.0f}")
    print(f"  pods / wall s        {len(jobs) / wall:8.0f}")
    print(f"  ratio wall / target  {wall / target:8.3f}   (target {target:.0f} s; below 1.0 is inside it)")


if __name__ == "__main__":
    main()
