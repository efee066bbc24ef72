"""How many MIG instances a reconfiguration destroys: `kubegpu mig-parted apply` vs mig-parted's clear-and-recreate.

nvidia-mig-parted clears every GPU instance on a GPU whose layout differs from the target, then recreates the whole
target (reference/mig-geometry-and-partitioning.md §2.3), so every running job on that GPU dies. kubegpu's apply keeps
instances that are part of the target and destroys only what the target cannot hold. Both are run over the same
random sequences of target layouts (feasible multisets of every MIG model in the catalog) on a simulated node, and
the figure is the ratio of instances destroyed (lower is better). Two kinds of sequences: "any" jumps to any
feasible layout; "small" moves to a layout that differs from the current one by at most two instances (adding,
removing or swapping one), the typical change a partitioner or an operator makes. Run:
    python benchmarks/mig_reconfig_churn.py [--quick] [--seed N]
"""

from __future__ import annotations

import argparse
import random
import time
from collections import Counter

from kubegpu.config.migparted import parse_mig_parted_config
from kubegpu.gpu.catalog import CATALOG, GpuModel
from kubegpu.gpu.geometry import feasible_multisets
from kubegpu.gpu.simulated import SimulatedBackend
from kubegpu.sharing.migapply import execute, plan_apply, read_state


def config_for(model: GpuModel, layout: tuple[int, ...]) -> object:
    names = Counter(model.profile(p).name for p in layout)
    entry = {"devices": "all", "mig-enabled": True, "mig-devices": dict(names)}
    return parse_mig_parted_config({"version": "v1", "mig-configs": {"target": [entry]}}, "benchmark")


def _distance(a: Counter[int], b: Counter[int]) -> int:
    return sum(((a - b) + (b - a)).values())


def run_model(model: GpuModel, steps: int, rng: random.Random, small: bool) -> tuple[int, int, int]:
    """(destroyed by kubegpu, destroyed by clear-and-recreate, instances changed-to) over `steps` random targets."""
    backend = SimulatedBackend.create(None, [model])
    layouts = [m for m in feasible_multisets(model) if m]
    ours = theirs = created = 0
    for _ in range(steps):
        state = read_state(backend)
        current = Counter(d.profile_id for d in state.instances(0))
        near = [m for m in layouts if 0 < _distance(Counter(m), current) <= 2] if small and current else []
        target = rng.choice(near or layouts)
        if current != Counter(target):
            theirs += sum(current.values())  # mig-parted: ClearMigConfig, then create everything
        plan = plan_apply(config_for(model, target), "target", state)  # type: ignore[arg-type]
        ours += len(plan.gpus[0].destroy)
        created += len(target)
        execute(plan, backend)
    return ours, theirs, created


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer steps")
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    steps = 40 if args.quick else 400
    rng = random.Random(args.seed)
    started = time.perf_counter()
    print(f"{'changes':<7} {'model':<16} {'kubegpu destroyed':>18} {'clear+recreate destroyed':>25} {'ratio':>7}")
    totals: dict[str, tuple[int, int]] = {}
    for kind in ("any", "small"):
        total_ours = total_theirs = 0
        for key, model in sorted(CATALOG.items()):
            if not model.mig_capable:
                continue
            ours, theirs, _ = run_model(model, steps, rng, small=kind == "small")
            total_ours += ours
            total_theirs += theirs
            print(f"{kind:<7} {key:<16} {ours:>18} {theirs:>25} {ours / max(theirs, 1):>7.2f}")
        totals[kind] = (total_ours, total_theirs)
    elapsed = time.perf_counter() - started
    for kind, (ours, theirs) in totals.items():
        print(f"{kind} re-layouts: instances destroyed, kubegpu / mig-parted-style clear-and-recreate = "
              f"{ours / max(theirs, 1):.2f} ({ours} vs {theirs}; {steps} per model, seed {args.seed})")
    print(f"({elapsed:.1f}s)")


if __name__ == "__main__":
    main()
