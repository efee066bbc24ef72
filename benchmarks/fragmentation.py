"""kubegpu's placement against FGD (Weng et al., USENIX ATC '23) on Alibaba's GPU trace, in one run.

    python benchmarks/fragmentation.py --trace-dir DIR [--seeds 42-51] [--variants default,...] [--quick] [--json F]
    python benchmarks/fragmentation.py --artifact DIR --trace-dir DIR [--variants default] [--seeds 42] [--quick]
    python benchmarks/fragmentation.py --share-packing --trace-dir DIR [--variants ...] [--seeds 42-51]

`--trace-dir DIR`: a checkout of `cluster-trace-gpu-v2023/` (DIR or DIR/csv holding the CSV files). kubegpu replays
each variant and seed with the paper's protocol (`kubegpu trace replay`) and is set beside the means the artifact
ships for the same 17 variants (`PUBLISHED` below, from its `analysis_allo_discrete.csv`: % of GPUs allocated at
100 % arrived workload, mean of seeds 42-51). The goal: at least FGD's figure on every variant.

`--artifact DIR`: a checkout of FGD's simulator (github.com/hkust-adsl/kubernetes-scheduler-simulator). Its binary is
built there from its vendored modules (`GOFLAGS=-mod=vendor go build -o bin/simon ./cmd`, needs Go), its inputs
written under DIR/data/<variant>/ (the node YAML it ships, a pod YAML from the CSV in its annotation format), and
its FGD experiment run per variant and seed with the paper's flags; kubegpu replays the same variant and seed in the
same run. Printed: allocation at 100 % and 130 % arrived for both, wall time per experiment, and the ratios. One
FGD experiment takes about 20 minutes on two cores (about 10,000 placements on 1,213 nodes).

`--share-packing`: how high placement can go at 100 % arrived (`share_packing`): the shares arrived by then packed
offline by best fit decreasing, every one placed; the ceiling no placement, online or offline, exceeds (the exact
optimum of the LP relaxation in benchmarks/trace_ceiling.py: whole GPUs and shares packed into the cluster's GPUs,
CPU, memory, GPU models, node boundaries and arrival order forgotten); the same ceiling when every share of the
variant's most common size arrived by then is placed, as an online placement that turns none away while a GPU has
room for it does; the same ceiling when at least the shares `--policy` had placed by then (per size, from its replay
of the seed) are placed; and that policy's own allocation at 100 %. The last two side by side say what its packing
cost (with CPU, memory, models and nodes); the gap between the last ceiling and the plain one comes from holding
the shares it had placed by then, which the order of arrival chose (an online placement turns few away).

`--quick`: the default variant and seed 42 only (with --trace-dir alone: the five variants of the README's table).
"""

from __future__ import annotations

import argparse
import bisect
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks.trace_ceiling when run as a script

from benchmarks.trace_ceiling import lp_ceiling
from kubegpu.errors import KubegpuError
from kubegpu.sim.trace.reader import read_nodes, read_pods
from kubegpu.sim.trace.replay import ReplayResult, arrivals, replay

POLICIES = ("Random", "DotProd", "GpuClustering", "GpuPacking", "BestFit", "FGD")
PUBLISHED: dict[str, tuple[float, ...]] = {
    # variant: % allocated at 100 % arrived, mean of seeds 42-51, per POLICIES (the artifact's shipped results)
    "default": (86.30, 90.62, 91.65, 91.78, 92.86, 95.23),
    "cpu050": (89.02, 93.03, 93.52, 93.46, 93.56, 95.00),
    "cpu100": (87.44, 91.73, 92.42, 92.50, 93.26, 95.21),
    "cpu200": (83.03, 87.45, 89.67, 89.98, 92.15, 94.82),
    "cpu250": (80.00, 83.57, 87.75, 88.05, 91.21, 93.20),
    "gpushare40": (84.86, 89.30, 89.76, 89.77, 91.44, 93.96),
    "gpushare60": (82.81, 86.82, 86.90, 87.15, 89.06, 91.25),
    "gpushare80": (80.62, 84.14, 84.50, 84.65, 86.66, 89.08),
    "gpushare100": (78.90, 81.98, 82.22, 82.13, 84.62, 86.64),
    "gpuspec10": (86.26, 90.17, 91.96, 92.24, 93.10, 94.66),
    "gpuspec20": (85.90, 88.29, 89.11, 89.28, 88.46, 94.66),
    "gpuspec25": (85.42, 85.44, 86.41, 86.77, 85.67, 93.91),
    "gpuspec33": (83.87, 79.82, 81.09, 82.22, 80.39, 87.84),
    "multigpu20": (86.92, 91.85, 93.34, 93.50, 93.73, 95.53),
    "multigpu30": (86.63, 93.11, 94.55, 94.70, 94.57, 96.36),
    "multigpu40": (85.38, 94.04, 95.35, 95.59, 95.10, 96.91),
    "multigpu50": (81.28, 94.73, 95.69, 96.06, 95.62, 97.09),
}
README_VARIANTS = ("default", "gpushare100", "multigpu50", "gpuspec33", "cpu250")
NODE_CSV = "openb_node_list_gpu_node.csv"
ALLOC = re.compile(r"Used GPU Milli: (\d+); Total GPUs: (\d+); Arrived GPU Milli: (\d+)")
MILLI = 1000


def _seeds(text: str) -> list[int]:
    seeds: list[int] = []
    for part in text.split(","):
        low, _, high = part.partition("-")
        seeds.extend(range(int(low), int(high or low) + 1))
    return seeds


def _csv_dir(trace_dir: Path) -> Path:
    for candidate in (trace_dir / "csv", trace_dir):
        if (candidate / NODE_CSV).is_file():
            return candidate
    raise KubegpuError(f"--trace-dir {trace_dir}: no {NODE_CSV} there or in its csv/ folder")


def _kubegpu(csv_dir: Path, variant: str, seed: int, policy: str) -> ReplayResult:
    return replay(read_nodes(csv_dir / NODE_CSV), read_pods(csv_dir / f"openb_pod_list_{variant}.csv"), policy, seed)


# --- how high any placement can go ---------------------------------------------------------------------------------

def arrived_at_100(csv_dir: Path, variant: str, seed: int) -> tuple[int, Counter[int], int]:
    """The tasks arrived by 100 % for one seed (up to the one that brings the arrived thousandths to the cluster's,
    as the replay's level): (the cluster's GPUs, shares arrived per size in thousandths, whole-GPU thousandths). The
    same arrivals (capacity, seed, inflation 1.3) as `replay` of the seed sees, up to the moment it reads a_100."""
    capacity = read_nodes(csv_dir / NODE_CSV).total_gpu_milli
    shares: Counter[int] = Counter()
    whole = arrived = 0
    for task in arrivals(read_pods(csv_dir / f"openb_pod_list_{variant}.csv"), capacity, seed, 1.3):
        if arrived >= capacity:
            break
        if task.request.shares:
            shares[task.request.gpu_milli] += 1
        else:
            whole += task.request.gpu_total_milli
        arrived += task.request.gpu_total_milli
    return capacity // MILLI, shares, whole


def most_common_share(csv_dir: Path, variant: str) -> int:
    """The share size (thousandths) the variant's tasks ask for most often."""
    sizes = Counter(t.request.gpu_milli for t in read_pods(csv_dir / f"openb_pod_list_{variant}.csv")
                    if t.request.shares)
    if not sizes:
        raise KubegpuError(f"variant {variant}: no task shares a GPU")
    return sizes.most_common(1)[0][0]


class Packing(NamedTuple):
    """`share_packing`'s figures for one seed, % of GPUs allocated at 100 % arrived."""

    packed_offline: float
    ceiling: float
    ceiling_most_common: float | None  # every share of the most common size placed; None: they do not all fit
    ceiling_policy_shares: float | None  # at least the shares the policy had placed; None: HiGHS finds no room
    policy_at_100: float


def share_packing(csv_dir: Path, variant: str, seed: int, size: int, policy: str = "kubegpu") -> Packing:
    """% of GPUs allocated at 100 % arrived, offline and online (`Packing`).

    Packed offline: the shares arrived by then, all known in advance and placed by best fit in decreasing size,
    leave their GPUs' leftovers free (whole-GPU tasks need a free GPU), and at 100 % arrived the free thousandths
    are the ones not allocated. Ceiling: `trace_ceiling.lp_ceiling` on the tasks arrived by then; no placement,
    online or offline, allocates more. Most common: the same LP when every share of `size` arrived by then is placed
    (None when they do not all fit). An online placement places a share of the trace's most common size as long
    as any GPU has room for it, and every such GPU's leftover takes only the rarer smaller shares: so, in practice,
    every share of that size arriving before the cluster fills is placed. Policy's shares: the same LP when at least
    as many shares of every size are placed as the policy's replay of the seed had placed at that moment (the replay
    and this function see the same arrivals); the policy's own allocation at 100 % sits beside it. Whatever the
    policy lost below that ceiling its placement lost (or CPU, memory, GPU models and node boundaries did, which
    the LP forgets); what lies between it and the plain ceiling is the cost of holding the shares placed by then,
    which the arrival order chose before the cluster filled."""
    gpus, shares, whole = arrived_at_100(csv_dir, variant, seed)
    leftovers: list[int] = []  # free thousandths of each GPU opened, sorted
    for share in sorted(shares.elements(), reverse=True):
        at = bisect.bisect_left(leftovers, share)
        free = leftovers.pop(at) if at < len(leftovers) else MILLI
        bisect.insort(leftovers, free - share)
    ceiling = lp_ceiling(shares, whole, gpus)
    assert ceiling is not None  # no floor: always feasible
    online = _kubegpu(csv_dir, variant, seed, policy)
    return Packing(100.0 * (1 - sum(leftovers) / (gpus * MILLI)), ceiling,
                   lp_ceiling(shares, whole, gpus, at_least={size: shares[size]}),
                   lp_ceiling(shares, whole, gpus, at_least=online.shares_placed_at_100), online.allocated_percent[100])


def _mean(values: Sequence[float | None]) -> float | None:
    return None if None in values else round(statistics.mean(v for v in values if v is not None), 3)


def packing(csv_dir: Path, variants: list[str], seeds: list[int], policy: str = "kubegpu") -> list[dict[str, object]]:
    rows = []
    print("| variant | every share placed, packed offline | ceiling: any placement | ceiling: every share of the "
          f"most common size placed | ceiling: {policy}'s shares at 100 % placed | {policy} at 100 % | {policy} / "
          "that ceiling |")
    print("|---|---|---|---|---|---|---|")
    for variant in variants:
        size = most_common_share(csv_dir, variant)
        runs = [share_packing(csv_dir, variant, seed, size, policy) for seed in seeds]
        packed, ceiling, forced, floored, online = zip(*runs, strict=True)
        bound = _mean(floored)
        ratio = None if bound is None else round(statistics.mean(online) / bound, 4)
        rows.append({"variant": variant, "seeds": seeds, "packedOfflineAt100": _mean(packed),
                     "ceilingAt100": _mean(ceiling), "mostCommonShareMilli": size,
                     "ceilingAllOfMostCommonShareAt100": _mean(forced), "ceilingKubegpuSharesAt100": _mean(floored),
                     "kubegpuAt100": _mean(online), "policy": policy, "kubegpuOverCeilingKubegpuShares": ratio,
                     "perSeedCeilingAt100": [round(c, 3) for c in ceiling],
                     "perSeedCeilingAllOfMostCommonShareAt100": [None if f is None else round(f, 3) for f in forced],
                     "perSeedCeilingKubegpuSharesAt100": [None if f is None else round(f, 3) for f in floored],
                     "perSeedKubegpuAt100": list(online)})
        last = [("they do not all fit" if m is None else f"{m:.2f}") for m in (_mean(forced), _mean(floored))]
        print(f"| {variant} | {statistics.mean(packed):.2f} | {statistics.mean(ceiling):.2f} | {last[0]} (size {size}) "
              f"| {last[1]} | {statistics.mean(online):.2f} | {'-' if ratio is None else f'{ratio:.3f}'} |", flush=True)
    return rows


# --- FGD's artifact -----------------------------------------------------------------------------------------------

def build_artifact(artifact: Path) -> Path:
    """Build FGD's simulator in its checkout from the vendored modules; the binary's path."""
    binary = artifact / "bin" / "simon"
    if not binary.is_file():
        print(f"building {binary} (GOFLAGS=-mod=vendor go build) ...", flush=True)
        env = dict(os.environ, GOFLAGS="-mod=vendor")
        done = subprocess.run(["go", "build", "-o", "bin/simon", "./cmd"], cwd=artifact, env=env,
                              capture_output=True, text=True)
        if done.returncode:
            raise KubegpuError(f"go build in {artifact} failed: {done.stderr.strip().splitlines()[-1:]}")
    return binary


def _pod_yaml(csv_dir: Path, variant: str) -> str:
    """The variant's pods as the artifact reads them: cpu/memory requests, GPU count, thousandths and models as
    `alibabacloud.com/*` annotations."""
    documents = []
    for task in read_pods(csv_dir / f"openb_pod_list_{variant}.csv"):
        request = task.request
        resources = {"cpu": f"{request.cpu_milli}m", "memory": f"{request.memory_mib}Mi"}
        annotations = {}
        if request.gpu_count:
            annotations = {"alibabacloud.com/gpu-milli": str(request.gpu_milli),
                           "alibabacloud.com/gpu-count": str(request.gpu_count)}
            if request.models:
                annotations["alibabacloud.com/gpu-card-model"] = "|".join(sorted(request.models))
        pod = {"apiVersion": "v1", "kind": "Pod",
               "metadata": {"name": task.name, "namespace": "paib-gpu", **({"annotations": annotations}
                                                                            if annotations else {})},
               "spec": {"containers": [{"name": "main", "image": "tensorflow:latest",
                                        "resources": {"requests": resources, "limits": resources}}],
                        "restartPolicy": "OnFailure", "dnsPolicy": "Default"}}
        documents.append(json.dumps(pod))  # JSON is YAML
    return "\n---\n".join(documents) + "\n"


def _prepare_inputs(artifact: Path, csv_dir: Path, variant: str) -> str:
    folder = artifact / "data" / f"openb_pod_list_{variant}"
    folder.mkdir(parents=True, exist_ok=True)
    node_yaml = artifact / "data" / "node_yaml" / "openb_node_list_gpu_node.yaml"
    if not node_yaml.is_file():
        raise KubegpuError(f"--artifact {artifact}: {node_yaml.relative_to(artifact)} is missing")
    shutil.copyfile(node_yaml, folder / node_yaml.name)
    pods = folder / f"openb_pod_list_{variant}.yaml"
    if not pods.is_file():
        pods.write_text(_pod_yaml(csv_dir, variant))
    return str(folder.relative_to(artifact))


def allocation_levels(log_text: str) -> list[float]:
    """a_0 .. a_130 from the artifact's `[Alloc]` log lines (used and arrived GPU thousandths after each task), by
    the same first-reach rule as `kubegpu trace replay`."""
    levels: list[float] = []
    used = 0
    capacity = 0
    for match in ALLOC.finditer(log_text):
        used, capacity, arrived = int(match[1]), int(match[2]) * MILLI, int(match[3])
        while len(levels) < 131 and arrived * 100 >= len(levels) * capacity:
            levels.append(100.0 * used / capacity)
    if not capacity:
        raise KubegpuError("the artifact's log has no '[Alloc] ... Arrived GPU Milli' line")
    final = 100.0 * used / capacity
    return levels + [final] * (131 - len(levels))


def run_artifact(artifact: Path, data: str, variant: str, seed: int) -> tuple[list[float], float]:
    """One FGD experiment with the paper's flags: (a_0 .. a_130, wall seconds)."""
    expdir = artifact / "experiments" / "kubegpu-benchmark" / variant / "FGD" / str(seed)
    if expdir.exists():
        shutil.rmtree(expdir)
    expdir.mkdir(parents=True)
    command = [sys.executable, "scripts/generate_config_and_run.py", "-d", str(expdir.relative_to(artifact)), "-e",
               "-b", "-f", data, "-FGD", "1000", "-gpusel", "FGD", "-dimext", "share", "-norm", "max",
               "-tune", "1.3", "-tuneseed", str(seed), "--shuffle-pod=true"]
    started = time.perf_counter()
    done = subprocess.run(command, cwd=artifact, capture_output=True, text=True)
    wall = time.perf_counter() - started
    if done.returncode:
        raise KubegpuError(f"FGD's run failed ({done.returncode}): {done.stderr.strip().splitlines()[-1:]}")
    logs = sorted(expdir.glob("log*.log"))
    if not logs:
        raise KubegpuError(f"FGD's run wrote no log under {expdir}")
    return allocation_levels(logs[0].read_text(errors="replace")), wall


# --- reports ------------------------------------------------------------------------------------------------------

def against_published(csv_dir: Path, variants: list[str], seeds: list[int], policy: str) -> list[dict[str, object]]:
    rows = []
    print(f"| variant | {policy} at 100 % | at 130 % | FGD published | ahead by | wall s (mean) |")
    print("|---|---|---|---|---|---|")
    for variant in variants:
        runs = [_kubegpu(csv_dir, variant, seed, policy) for seed in seeds]
        at100 = statistics.mean(r.allocated_percent[100] for r in runs)
        at130 = statistics.mean(r.allocated_percent[130] for r in runs)
        wall = statistics.mean(r.wall_seconds for r in runs)
        fgd = PUBLISHED[variant][-1]
        print(f"| {variant} | {at100:.2f} | {at130:.2f} | {fgd:.2f} | {at100 - fgd:+.2f} | {wall:.1f} |", flush=True)
        rows.append({"variant": variant, "seeds": seeds, "policy": policy, "allocatedAt100": round(at100, 3),
                     "allocatedAt130": round(at130, 3), "fgdPublishedAt100": fgd, "wallSeconds": round(wall, 2),
                     "perSeedAt100": [r.allocated_percent[100] for r in runs]})
    ahead = sum(1 for r in rows if float(str(r["allocatedAt100"])) >= float(str(r["fgdPublishedAt100"])))
    print(f"\n{policy} at or above FGD's published mean on {ahead} of {len(rows)} variants")
    return rows


def against_artifact(artifact: Path, csv_dir: Path, variants: list[str], seeds: list[int],
                     policy: str) -> list[dict[str, object]]:
    build_artifact(artifact)
    rows = []
    print(f"| variant | seed | FGD 100 % | {policy} 100 % | FGD 130 % | {policy} 130 % | FGD wall s | {policy} wall s "
          "| wall ratio |")
    print("|---|---|---|---|---|---|---|---|---|")
    for variant in variants:
        data = _prepare_inputs(artifact, csv_dir, variant)
        for seed in seeds:
            fgd, fgd_wall = run_artifact(artifact, data, variant, seed)
            ours = _kubegpu(csv_dir, variant, seed, policy)
            a, b = ours.allocated_percent, fgd
            print(f"| {variant} | {seed} | {b[100]:.2f} | {a[100]:.2f} | {b[130]:.2f} | {a[130]:.2f} | "
                  f"{fgd_wall:.0f} | {ours.wall_seconds:.1f} | {ours.wall_seconds / fgd_wall:.3f} |", flush=True)
            rows.append({"variant": variant, "seed": seed, "fgdAt100": b[100], "fgdAt130": b[130],
                         "kubegpuAt100": a[100], "kubegpuAt130": a[130], "fgdWallSeconds": round(fgd_wall, 1),
                         "kubegpuWallSeconds": ours.wall_seconds, "allocationRatioAt100": a[100] / b[100],
                         "allocationRatioAt130": a[130] / b[130], "wallRatio": ours.wall_seconds / fgd_wall})
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trace-dir", type=Path, required=True, help="cluster-trace-gpu-v2023 checkout (or its csv/)")
    parser.add_argument("--artifact", type=Path, help="FGD simulator checkout: build and run it beside kubegpu")
    parser.add_argument("--variants", help="comma-separated (default: all 17 of the published table)")
    parser.add_argument("--seeds", default="42-51", help="e.g. 42-51 or 42,43 (default 42-51)")
    parser.add_argument("--policy", default="kubegpu", help="kubegpu's policy to compare (default kubegpu)")
    parser.add_argument("--quick", action="store_true", help="default variant, seed 42 (see the docstring)")
    parser.add_argument("--share-packing", action="store_true",
                        help="instead: at 100 %% arrived, shares packed offline, the LP ceiling of any placement, "
                             "the ceilings with every share of the most common size and with --policy's placed "
                             "shares as floors, and --policy's own allocation (see share_packing)")
    parser.add_argument("--json", type=Path, help="also write the rows as JSON here")
    args = parser.parse_args(argv)
    try:
        csv_dir = _csv_dir(args.trace_dir)
        variants = args.variants.split(",") if args.variants else list(PUBLISHED)
        seeds = _seeds(args.seeds)
        if args.quick:
            variants, seeds = (["default"] if args.artifact else list(README_VARIANTS)), [42]
        unknown = [v for v in variants if v not in PUBLISHED]
        if unknown:
            raise KubegpuError(f"--variants: {', '.join(unknown)} not in the published table ({', '.join(PUBLISHED)})")
        if args.share_packing:
            rows = packing(csv_dir, variants, seeds, args.policy)
        elif args.artifact:
            rows = against_artifact(args.artifact, csv_dir, variants, seeds, args.policy)
        else:
            rows = against_published(csv_dir, variants, seeds, args.policy)
    except (KubegpuError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
