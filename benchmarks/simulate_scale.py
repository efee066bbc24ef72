"""Simulator scale: a day of 100 nodes x 8 GPUs and ~50,000 pods, on one core.

Prints simulated seconds per wall second, pods per wall second, and the wall time as a ratio against the 60 s
target (below 1.0 means inside the target). `--quick` runs a tenth of the cluster and the workload. `--all` runs
every strategy of the default scenario plus the autoscaler's sharing variants (and any optional strategies that are
registered, such as modifiers), one after another in this process, and prints one table: wall time, CPU time (the
difference is other load on the machine) and the wall time's ratio to the target, with the machine's load average.
Quota rows (`exclusive` under plain team quotas, `exclusive+quota` and `dynamic-mig+quota` under elastic ones) run
the same day with three teams (`--teams` does that for `--strategy`; a `+quota` strategy implies it): each guaranteed
part of the cluster's GPU memory and allowed to borrow beyond it.

    python benchmarks/simulate_scale.py [--quick] [--strategy time-slicing:4 | --all]
"""

from __future__ import annotations

import argparse
import os
import time

from kubegpu.sim.engine import Simulation
from kubegpu.sim.metrics import StrategyResult
from kubegpu.sim.runner import strategy_names
from kubegpu.sim.scenario import Scenario, default_scenario, parse_scenario
from kubegpu.sim.strategies import get_strategy
from kubegpu.sim.workload import Job, scenario_jobs

TARGET_WALL_S = 60.0


def scenario(scale: float, teams: bool = False) -> dict[str, object]:
    def rate(per_hour: float) -> float:
        return per_hour * scale

    data: dict[str, object] = {
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
    if teams:
        data["teams"] = scale_teams(round(50 * scale) * 2 * 8 * 80)
    return data


def scale_teams(cluster_gib: int) -> list[dict[str, object]]:
    """Three teams over the cluster's GPU memory: "research" (half the jobs, guaranteed 40 %, may borrow up to all of
    it), "product" (30 %, guaranteed 40 %, up to 70 %) and "platform" (15 %, guaranteed 10 %, up to 30 %); the last
    5 % of the jobs stay in `default`, outside any quota, and count against the capacity."""
    def gib(part: float) -> str:
        return f"{round(cluster_gib * part)}Gi"

    return [{"name": "research", "min": gib(0.4), "max": gib(1.0), "share": 0.5},
            {"name": "product", "min": gib(0.4), "max": gib(0.7), "share": 0.3},
            {"name": "platform", "min": gib(0.1), "max": gib(0.3), "share": 0.15}]


AUTOSCALER_VARIANTS = ("autoscaler:exclusive", "autoscaler:time-slicing-4", "autoscaler:mig-all-balanced")
TEAM_ROWS = ("exclusive", "exclusive+quota", "dynamic-mig+quota")  # run on the scenario with teams


def all_strategies() -> list[str]:
    """The default scenario's strategies (its optional ones when registered) and the autoscaler's sharing variants:
    the scale scenario's node groups are named like the default one's, so `@a100` selects the same GPUs."""
    names = strategy_names(default_scenario())
    spelled = {"autoscaler:exclusive" if n == "autoscaler" else n for n in names}
    return [*names, *(v for v in AUTOSCALER_VARIANTS if v not in spelled)]


def run(spec: Scenario, jobs: list[Job], strategy: str) -> tuple[float, float, StrategyResult]:
    started, cpu_started = time.perf_counter(), time.process_time()
    result = Simulation(spec, get_strategy(strategy), jobs).run()
    return time.perf_counter() - started, time.process_time() - cpu_started, result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a tenth of the cluster and workload")
    parser.add_argument("--strategy", default="time-slicing:4", help="strategy to simulate (default: time-slicing:4)")
    parser.add_argument("--all", action="store_true", help="every strategy, one table")
    parser.add_argument("--teams", action="store_true",
                        help="the day with three teams under quotas (implied by a +quota strategy)")
    args = parser.parse_args()
    scale = 0.1 if args.quick else 1.0
    teams = args.teams or "+quota" in args.strategy
    spec = parse_scenario(scenario(scale, teams), "simulate_scale")
    jobs = scenario_jobs(spec)
    gpus = sum(g.count * g.gpus_per_node for g in spec.cluster.node_groups)
    target = TARGET_WALL_S * scale
    if args.all:
        team_spec = parse_scenario(scenario(scale, teams=True), "simulate_scale")
        team_jobs = scenario_jobs(team_spec)
        rows = [(name, spec, jobs) for name in all_strategies()]
        rows += [(f"{name} (teams)", team_spec, team_jobs) for name in TEAM_ROWS]
        print(f"{gpus} GPUs, {len(jobs):,} pods, {spec.duration / 3600:.0f} simulated hours; target {target:.0f} s "
              f"wall per strategy; load average at start {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
        print(f"{'strategy':<32}{'wall s':>9}{'CPU s':>9}{'wall/target':>13}{'CPU/target':>12}{'completed':>11}"
              f"{'load':>6}")
        worst = 0.0
        for label, row_spec, row_jobs in rows:
            wall, cpu, result = run(row_spec, row_jobs, label.removesuffix(" (teams)"))
            worst = max(worst, wall / target)
            print(f"{label:<32}{wall:>9.2f}{cpu:>9.2f}{wall / target:>13.3f}{cpu / target:>12.3f}"
                  f"{result.pods_completed:>11,}{os.getloadavg()[0]:>6.1f}", flush=True)
        print(f"worst wall / target: {worst:.3f} (below 1.0 is inside it; wall includes other load on the machine)")
        return
    wall, cpu, result = run(spec, jobs, args.strategy)
    print(f"strategy {args.strategy}: {gpus} GPUs, {len(jobs):,} pods, {spec.duration / 3600:.0f} simulated hours"
          + (f", teams {', '.join(t.name for t in spec.teams)}" if teams else ""))
    print(f"  completed {result.pods_completed:,}, OOM kills {result.oom_kills}, "
          f"pending at end {result.pods_pending_at_end:,}, "
          f"allocation {result.allocation_pct:.1f}%")
    print(f"  wall time            {wall:8.2f} s   (CPU time {cpu:.2f} s: the rest is other load on the machine)")
    print(f"  simulated s / wall s {spec.duration / wall:8.0f}")
    print(f"  pods / wall s        {len(jobs) / wall:8.0f}")
    print(f"  ratio wall / target  {wall / target:8.3f}   (target {target:.0f} s; below 1.0 is inside it)")


if __name__ == "__main__":
    main()
