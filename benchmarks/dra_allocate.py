"""DRA with dynamic MIG: how fast our allocator (kube-scheduler's algorithm) places claims, how many it places
against the exact planner's optimum for the same demand, and how long NodePrepareResources takes.

  * 1,000 claims (one MIG device each, profile by a CEL selector; H100 mix 40 % 1g.10gb, 10 % 1g.20gb, 25 % 2g,
    15 % 3g, 5 % 4g, 5 % 7g, shuffled) against the dynamic-MIG ResourceSlices of 512 H100s (64 nodes x 8), allocated
    in order as the scheduler would, each against what earlier claims took; then the same claims against 224 H100s,
    too few for all of them, where how first-fit packs placements decides how many fit;
  * the same demand as pods asking `nvidia.com/mig-<profile>` planned by the exact planner (HiGHS) over the same
    empty GPUs: the most pods any layout can serve — the reference for what first-fit over partitionable devices
    loses;
  * NodePrepareResources p50/p99 through the real gRPC socket on the simulated backend, for whole-GPU claims (no
    MIG creation) and for dynamic-MIG claims (instance created at prepare), with the driver's state on tmpfs (its
    own cost) and on disk (checkpoint and CDI fsyncs included).

Run: python benchmarks/dra_allocate.py [--quick] [--seed N]
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kubegpu.dra.classes import shipped_class_objects
from kubegpu.dra.devices import NodeGpus, gpu_offers
from kubegpu.dra.driver import DraDriver
from kubegpu.dra.server import DraPluginServer
from kubegpu.dra.slices import build_slices
from kubegpu.gpu.catalog import get_model
from kubegpu.gpu.simulated import SimulatedBackend
from kubegpu.partitioner.planner import GpuInput, NodeInput, plan
from kubegpu.scheduling.dra import allocate_in_order, parse_all
from tests.dra.fake_kubelet import FakeDraKubelet

MODEL = "H100-SXM5-80GB"
MIX = {"1g.10gb": 40, "1g.20gb": 10, "2g.20gb": 25, "3g.40gb": 15, "4g.40gb": 5, "7g.80gb": 5}


def demand(claims: int, rng: random.Random) -> list[str]:
    profiles, weights = zip(*MIX.items(), strict=True)
    return [rng.choices(profiles, weights)[0] for _ in range(claims)]


def dra_slices(nodes: int) -> list[dict[str, Any]]:
    backend = SimulatedBackend(None, gpus=f"8x{MODEL}", node_name="template")
    inventory = NodeGpus(backend.driver_version(), backend.cuda_driver_version(), tuple(backend.devices()), {})
    offers = gpu_offers(inventory, dynamic_mig=True)
    return [s for n in range(nodes) for s in build_slices(f"node-{n:03d}", offers)]


def claim_objects(profiles: list[str]) -> list[dict[str, Any]]:
    return [{"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
             "metadata": {"name": f"claim-{i:04d}", "namespace": "bench"},
             "spec": {"devices": {"requests": [{"name": "mig", "exactly": {
                 "deviceClassName": "mig.nvidia.com",
                 "selectors": [{"cel": {"expression": f"device.attributes['gpu.nvidia.com'].profile == '{p}'"}}]}}]}}}
            for i, p in enumerate(profiles)]


def exact_optimum(nodes: int, profiles: list[str], time_limit: float) -> tuple[int, float, bool]:
    model = get_model(MODEL)
    inputs = [NodeInput(f"node-{n:03d}", "mig", {"metadata": {"name": f"node-{n:03d}", "labels": {}}},
                        tuple(GpuInput(i, model.key, model) for i in range(8))) for n in range(nodes)]
    pods = [{"metadata": {"name": f"pod-{i:04d}", "namespace": "bench"},
             "spec": {"containers": [{"name": "c", "resources": {"limits": {
                 f"nvidia.com/{model.profile(p).resource_name}": "1"}}}]}} for i, p in enumerate(profiles)]
    started = time.perf_counter()
    result = plan(inputs, pods, planner="exact", time_limit=time_limit)
    return len(result.assignments), time.perf_counter() - started, result.optimal


async def prepare_latency(rounds: int, base: str | None) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {"whole GPU": [], "dynamic MIG": []}
    with tempfile.TemporaryDirectory(prefix="drab", dir=base) as tmp:
        root = Path(tmp)
        SimulatedBackend.create(root / "node.json", gpus=f"8x{MODEL}", node_name="node-a")
        claims: dict[tuple[str, str], dict[str, Any]] = {}
        driver = DraDriver(SimulatedBackend(root / "node.json"), "node-a", root / "plugin", root / "cdi",
                           lambda ns, name: claims.get((ns, name)), dynamic_mig=True)
        server = DraPluginServer(driver, root / "plugin", root / "registry")
        await server.start()
        kubelet = FakeDraKubelet(root / "registry")
        await kubelet.register()
        try:
            for k in range(rounds):
                for kind, device in (("whole GPU", f"gpu-{k % 8}"), ("dynamic MIG", f"gpu-{k % 8}-mig-1g10gb-19-6")):
                    name = f"c{k}-{kind[0]}"
                    claims[("bench", name)] = {"metadata": {"name": name, "namespace": "bench", "uid": name},
                                               "status": {"allocation": {"devices": {"results": [
                                                   {"request": "r", "driver": "gpu.nvidia.com", "pool": "node-a",
                                                    "device": device}]}}}}
                    started = time.perf_counter()
                    response = await kubelet.prepare(("bench", name, name))
                    out[kind].append(time.perf_counter() - started)
                    assert response.claims[name].error == "", response.claims[name].error
                    await kubelet.unprepare(("bench", name, name))
        finally:
            await kubelet.close()
            await server.stop()
    return out


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="100 claims vs 64 and 24 GPUs, 30 prepare rounds")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    node_counts, claims, rounds = ((8, 3), 100, 30) if args.quick else ((64, 28), 1000, 200)
    rng = random.Random(args.seed)
    profiles = demand(claims, rng)
    classes = {c.name: c for c in parse_all(shipped_class_objects(), "DeviceClass", "classes")}
    for nodes in node_counts:  # the stated size, then a cluster too small for the demand (where packing matters)
        started = time.perf_counter()
        slices = parse_all(dra_slices(nodes), "ResourceSlice", "slices")
        parsed_claims = parse_all(claim_objects(profiles), "ResourceClaim", "claims")
        parse_s = time.perf_counter() - started
        started = time.perf_counter()
        outcomes = allocate_in_order(slices, classes, parsed_claims)
        allocate_s = time.perf_counter() - started
        allocated = sum(1 for o in outcomes.values() if o.results)
        devices = sum(len(s.devices) for s in slices)
        print(f"DRA allocator: {claims} claims vs {nodes * 8} {MODEL} ({devices} partitionable devices in "
              f"{len(slices)} slices)")
        print(f"  parse {parse_s:.2f} s, allocate {allocate_s:.2f} s ({allocate_s / claims * 1000:.2f} ms/claim), "
              f"allocated {allocated}/{claims}")
        optimum, exact_s, optimal = exact_optimum(nodes, profiles, time_limit=20.0)
        print(f"  exact planner optimum for the same demand: {optimum}/{claims} "
              f"({'proven' if optimal else 'best found'}, {exact_s:.2f} s); DRA first-fit reaches "
              f"{allocated / max(optimum, 1):.3f} of it")
    # state on tmpfs shows the driver's own cost; on disk, each checkpoint/CDI write adds its fsyncs
    places = [("tmpfs", "/dev/shm")] if Path("/dev/shm").is_dir() else []
    for where, base in [*places, ("disk", None)]:
        latency = asyncio.run(prepare_latency(rounds, base))
        for kind, values in latency.items():
            print(f"NodePrepareResources {kind} ({where}): p50 {_pct(values, 0.5):.2f} ms, "
                  f"p99 {_pct(values, 0.99):.2f} ms, mean {statistics.mean(values) * 1000:.2f} ms "
                  f"({len(values)} calls over gRPC, sim backend)")


if __name__ == "__main__":
    main()
