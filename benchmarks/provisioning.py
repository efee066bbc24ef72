"""Provisioning benchmark: Karpenter's scheduling-benchmark shape, plus a GPU variant.

    python benchmarks/provisioning.py [--quick] [--sizes 1000,5000,20000] [--seed 42] [--aws]

CPU variant (reference §A.8): one NodePool, Karpenter's 400 fake instance types (`fake.InstanceTypes(400)`),
pods with CPU from {100, 250, 500, 1000, 1500}m and memory from {100, 256, 512, 1024, 2048, 4096}Mi, Karpenter's
"diverse" mix: one fifth each of generic pods, zonal topology spread (maxSkew 1, DoNotSchedule), hostname topology
spread (maxSkew 1), zonal self-affinity (required podAffinity on the zone) and hostname anti-affinity.
GPU variant: the shipped GPU/CPU catalogue, four NodePools (CPU-only, time-sliced x4, MIG `all-balanced`, whole
GPUs) and pods asking for CPU only, whole GPUs, MIG profiles and shared replicas.

Printed per size: pods/s, nodes, cost, and cost / lower bound, the bound being the LP relaxation (HiGHS) solved
in the same run. On small instances the exact MILP optimum (HiGHS) is computed too and the ratio to it is printed.
Against Karpenter itself, same shape and same run: `benchmarks/karpenter.py` (its own Go benchmark beside this pass).
"""

from __future__ import annotations

import argparse
import math
import random
import sys
import time
from collections.abc import Sequence
from typing import Any

import highspy
import numpy as np

from kubegpu.autoscaler.api import NodePool, parse_nodepool
from kubegpu.autoscaler.catalog import fake_instance_types, shipped_catalogue
from kubegpu.autoscaler.gpu_capacity import CapacityModel
from kubegpu.autoscaler.instancetypes import InstanceType
from kubegpu.autoscaler.provisioner import run_pass
from kubegpu.autoscaler.requirements import Requirements
from kubegpu.autoscaler.scheduler import SchedulingResult
from kubegpu.scheduling import pod_requests

CPU_MILLI = (100, 250, 500, 1000, 1500)
MEMORY_MI = (100, 256, 512, 1024, 2048, 4096)
TIME_SLICING = ("version: v1\nsharing:\n  timeSlicing:\n    renameByDefault: true\n    resources:\n"
                "    - name: nvidia.com/gpu\n      replicas: 4\n")


def _pool(name: str, weight: int | None = None, requirements: Sequence[dict[str, Any]] = (),
          labels: dict[str, str] | None = None, annotations: dict[str, str] | None = None) -> NodePool:
    spec: dict[str, Any] = {"template": {"metadata": {"labels": labels or {}, "annotations": annotations or {}},
                                         "spec": {"requirements": list(requirements)}}}
    if weight:
        spec["weight"] = weight
    return parse_nodepool({"metadata": {"name": name}, "spec": spec})


ZONE_KEY = "topology.kubernetes.io/zone"
HOST_KEY = "kubernetes.io/hostname"
# Karpenter's "diverse" mix, one kind per pod in turn; each constrained kind selects its own label.
DIVERSE = ("generic", "zonal-spread", "hostname-spread", "zonal-affinity", "hostname-anti-affinity")


def _constraints(kind: str) -> tuple[dict[str, str], dict[str, Any]]:
    """(labels, spec fields) for one kind of the diverse mix."""
    if kind == "generic":
        return {}, {}
    labels = {"app": kind}
    selector = {"matchLabels": labels}
    if kind in ("zonal-spread", "hostname-spread"):
        key = ZONE_KEY if kind == "zonal-spread" else HOST_KEY
        return labels, {"topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": key,
                                                        "whenUnsatisfiable": "DoNotSchedule",
                                                        "labelSelector": selector}]}
    term = [{"topologyKey": ZONE_KEY if kind == "zonal-affinity" else HOST_KEY, "labelSelector": selector}]
    field = "podAffinity" if kind == "zonal-affinity" else "podAntiAffinity"
    return labels, {"affinity": {field: {"requiredDuringSchedulingIgnoredDuringExecution": term}}}


def _pod(i: int, requests: dict[str, str], limits: dict[str, str] | None = None,
         kind: str = "generic") -> dict[str, Any]:
    resources: dict[str, Any] = {"requests": requests}
    if limits:
        resources["limits"] = limits
    labels, extra = _constraints(kind)
    spec: dict[str, Any] = {"containers": [{"name": "c", "resources": resources}], **extra}
    meta: dict[str, Any] = {"name": f"pod-{i}", "namespace": "default", "uid": f"uid-{i}"}
    if labels:
        meta["labels"] = labels
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


def cpu_pods(count: int, rng: random.Random, diverse: bool = True) -> list[dict[str, Any]]:
    """Karpenter's CPU shape; `diverse`: one pod in five of each kind in DIVERSE, else all generic."""
    return [_pod(i, {"cpu": f"{rng.choice(CPU_MILLI)}m", "memory": f"{rng.choice(MEMORY_MI)}Mi"},
                 kind=DIVERSE[i % len(DIVERSE)] if diverse else "generic") for i in range(count)]


def _own_node(pod: dict[str, Any]) -> str | None:
    """The group whose pods need a node each (hostname anti-affinity or hostname spread with maxSkew 1), if any."""
    app = ((pod.get("metadata") or {}).get("labels") or {}).get("app")
    return app if app in ("hostname-spread", "hostname-anti-affinity") else None


def gpu_pods(count: int, rng: random.Random) -> list[dict[str, Any]]:
    pods = []
    for i in range(count):
        kind = i % 5
        if kind in (0, 1):
            pods.append(_pod(i, {"cpu": f"{rng.choice(CPU_MILLI)}m", "memory": f"{rng.choice(MEMORY_MI)}Mi"}))
        elif kind == 2:
            gpus = rng.choice((1, 1, 1, 2, 4))
            pods.append(_pod(i, {"cpu": str(2 * gpus), "memory": f"{8 * gpus}Gi"}, {"nvidia.com/gpu": str(gpus)}))
        elif kind == 3:
            profile = rng.choice(("1g.10gb", "1g.10gb", "2g.20gb", "3g.40gb"))
            pods.append(_pod(i, {"cpu": "1", "memory": "4Gi"}, {f"nvidia.com/mig-{profile}": "1"}))
        else:
            pods.append(_pod(i, {"cpu": "500m", "memory": "2Gi"}, {"nvidia.com/gpu.shared": "1"}))
    return pods


def gpu_pools() -> list[NodePool]:
    return [
        _pool("cpu", 40, [{"key": "kubegpu.io/instance-gpu-count", "operator": "In", "values": ["0"]}]),
        _pool("shared", 30, [{"key": "nvidia.com/gpu.product", "operator": "In",
                              "values": ["NVIDIA-L4", "Tesla-T4", "NVIDIA-A10G"]}],
              annotations={"kubegpu.io/device-plugin-config": TIME_SLICING}),
        _pool("mig", 20, [{"key": "nvidia.com/gpu.product", "operator": "In",
                           "values": ["NVIDIA-A100-SXM4-80GB", "NVIDIA-H100-80GB-HBM3"]}],
              labels={"nvidia.com/mig.config": "all-balanced"}),
        _pool("whole", 10, [{"key": "kubegpu.io/instance-gpu-count", "operator": "Gt", "values": ["0"]}]),
    ]


# -- bounds ------------------------------------------------------------------------------------------------------
def _options(pools: Sequence[NodePool], types: Sequence[InstanceType], model: CapacityModel,
             ) -> list[tuple[float, dict[str, float]]]:
    """Every (price, allocatable) a node could have: per pool, each type its requirements allow, cheapest offer."""
    out = []
    for pool in pools:
        reqs = Requirements.from_api([r.model_dump(exclude_none=True) for r in pool.spec.template.spec.requirements])
        for it in types:
            if not reqs.satisfied_by({k: v for k, v in it.labels.items() if reqs.get(k) is not None}):
                continue
            offer = it.cheapest_offering()
            if offer is not None:
                out.append((offer.price, dict(model(pool, it))))
    return out


def lp_lower_bound(pods: Sequence[dict[str, Any]], options: Sequence[tuple[float, dict[str, float]]]) -> float:
    """min Σ price·x s.t. Σ x·allocatable ≥ Σ requests per resource, x ≥ 0, and as many nodes as the largest group
    of pods that need a node each (hostname anti-affinity, hostname spread with maxSkew 1)."""
    demand: dict[str, float] = {}
    groups: dict[str, int] = {}
    for pod in pods:
        for k, v in pod_requests(pod).items():
            demand[k] = demand.get(k, 0.0) + v
        group = _own_node(pod)
        if group:
            groups[group] = groups.get(group, 0) + 1
    anti = max(groups.values(), default=0)
    h = highspy.Highs()
    h.setOptionValue("output_flag", False)
    inf = highspy.kHighsInf
    h.addVars(len(options), np.zeros(len(options)), np.full(len(options), inf))
    h.changeColsCost(len(options), np.arange(len(options), dtype=np.int32), np.array([p for p, _ in options]))
    for resource, need in demand.items():
        idx = [j for j, (_, alloc) in enumerate(options) if alloc.get(resource, 0.0) > 0]
        vals = [options[j][1][resource] for j in idx]
        h.addRow(need, inf, len(idx), np.array(idx, dtype=np.int32), np.array(vals))
    if anti:
        h.addRow(float(anti), inf, len(options), np.arange(len(options), dtype=np.int32), np.ones(len(options)))
    h.run()
    return float(h.getInfo().objective_function_value)


def milp_optimum(pods: Sequence[dict[str, Any]], options: Sequence[tuple[float, dict[str, float]]],
                 time_limit: float = 60.0) -> float:
    """Exact bin packing with heterogeneous bins: y[b] opens bin b, x[i,b] puts pod i in it. Small instances only."""
    requests = [pod_requests(p) for p in pods]
    own = [_own_node(p) for p in pods]
    bins = []
    for j, (_, alloc) in enumerate(options):
        fits = [all(alloc.get(k, 0.0) >= v - 1e-9 for k, v in r.items()) for r in requests]
        copies = sum(fits)
        bins.extend([j] * copies)
    n, m = len(pods), len(bins)
    h = highspy.Highs()
    h.setOptionValue("output_flag", False)
    h.setOptionValue("time_limit", time_limit)
    total = m + n * m
    h.addVars(total, np.zeros(total), np.ones(total))
    h.changeColsCost(m, np.arange(m, dtype=np.int32), np.array([options[b][0] for b in bins]))
    x0 = m
    h.changeColsIntegrality(n * m + m, np.arange(n * m + m, dtype=np.int32),
                            np.array([highspy.HighsVarType.kInteger] * (n * m + m)))
    for i in range(n):  # every pod placed once
        h.addRow(1.0, 1.0, m, np.array([x0 + i * m + b for b in range(m)], dtype=np.int32), np.ones(m))
    resources = sorted({k for r in requests for k in r})
    for b, j in enumerate(bins):
        alloc = options[j][1]
        for k in resources:  # Σ requests ≤ allocatable · y
            idx = [x0 + i * m + b for i in range(n) if requests[i].get(k, 0.0) > 0]
            vals = [requests[i][k] for i in range(n) if requests[i].get(k, 0.0) > 0]
            h.addRow(-highspy.kHighsInf, 0.0, len(idx) + 1, np.array([*idx, b], dtype=np.int32),
                     np.array([*vals, -alloc.get(k, 0.0)]))
        for group in {g for g in own if g}:  # at most one pod of each such group per node
            spread = [x0 + i * m + b for i in range(n) if own[i] == group]
            h.addRow(-highspy.kHighsInf, 1.0, len(spread), np.array(spread, dtype=np.int32), np.ones(len(spread)))
    for b in range(1, m):  # symmetry: copies of one type open in order
        if bins[b] == bins[b - 1]:
            h.addRow(-highspy.kHighsInf, 0.0, 2, np.array([b, b - 1], dtype=np.int32), np.array([1.0, -1.0]))
    h.run()
    return float(h.getInfo().objective_function_value)


# -- runs ----------------------------------------------------------------------------------------------------------
def timed(pools: Sequence[NodePool], types: Sequence[InstanceType], pods: Sequence[dict[str, Any]],
          ) -> tuple[SchedulingResult, float]:
    start = time.perf_counter()
    result = run_pass(pools, lambda _p: types, pods)
    return result, time.perf_counter() - start


def report(label: str, pods: Sequence[dict[str, Any]], result: SchedulingResult, seconds: float,
           bound: float) -> None:
    rate = len(pods) / seconds
    placed = sum(len(c.pods) for c in result.claims)
    print(f"{label:<6} {len(pods):>6} pods  {rate:>9.0f} pods/s  {len(result.claims):>5} nodes  "
          f"placed {placed:>6}  unschedulable "
          f"{len(result.unschedulable):>3}  cost {result.cost:>10.2f}  LP bound {bound:>10.2f}  "
          f"cost/LP {result.cost / bound if bound else math.nan:.3f}")


def small_instances(seed: int, count: int) -> list[tuple[str, float]]:
    """(label, greedy cost / exact optimum) on instances small enough for the MILP."""
    out = []
    for k in range(count):
        rng = random.Random(seed + k)
        cpu_types = fake_instance_types(12)
        pods = cpu_pods(10, rng, diverse=False)
        pools = [_pool("default")]
        result, _ = timed(pools, cpu_types, pods)
        optimum = milp_optimum(pods, _options(pools, cpu_types, CapacityModel()))
        out.append((f"cpu-{k}", result.cost / optimum))
        gpu_types = [t for t in shipped_catalogue() if t.name.startswith(("g4dn.", "g6.", "c6i.", "p4de"))]
        gpods = gpu_pods(8, rng)
        gpools = gpu_pools()
        result, _ = timed(gpools, gpu_types, gpods)
        optimum = milp_optimum(gpods, _options(gpools, gpu_types, CapacityModel()))
        out.append((f"gpu-{k}", result.cost / optimum))
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes (CI smoke run)")
    parser.add_argument("--sizes", default=None, help="comma-separated pod counts")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--aws", action="store_true",
                        help="also run the GPU variant on instance types discovered from moto's local EC2 "
                             "(benchmarks/provisioning_aws.py; needs kubegpu[aws] and moto[server])")
    args = parser.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")] if args.sizes else (
        [200, 1000] if args.quick else [1000, 5000, 20000])
    cpu_types = fake_instance_types(400)
    cpu_pools = [_pool("default")]
    cpu_options = _options(cpu_pools, cpu_types, CapacityModel())
    gpu_types = shipped_catalogue()
    pools = gpu_pools()
    gpu_options = _options(pools, gpu_types, CapacityModel())
    print("variant   pods   throughput                       nodes                              cost")
    for size in sizes:
        pods = cpu_pods(size, random.Random(args.seed))
        result, seconds = timed(cpu_pools, cpu_types, pods)
        report("cpu", pods, result, seconds, lp_lower_bound(pods, cpu_options))
        pods = gpu_pods(size, random.Random(args.seed))
        result, seconds = timed(pools, gpu_types, pods)
        report("gpu", pods, result, seconds, lp_lower_bound(pods, gpu_options))
    ratios = small_instances(args.seed, 2 if args.quick else 5)
    print("small instances, cost / exact MILP optimum: "
          + ", ".join(f"{label} {ratio:.3f}" for label, ratio in ratios))
    worst = max(r for _, r in ratios)
    print(f"worst {worst:.3f} ({'within' if worst <= 1.05 + 1e-9 else 'NOT within'} 5% of the optimum)")
    if args.aws:
        from benchmarks.provisioning_aws import main as aws_main

        print("\n-- instance types discovered from a local AWS endpoint (moto)")
        forwarded = ["--seed", str(args.seed)] + (["--quick"] if args.quick else []) + (
            ["--sizes", args.sizes] if args.sizes else [])
        return aws_main(forwarded)
    return 0


if __name__ == "__main__":
    sys.exit(main())
