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
    GPU change), dynamic-MIG claims (instance created at prepare), and both on GPUs whose MIG mode has to switch,
    with the driver's state on tmpfs (its own cost) and on disk (every durable write's fsyncs included). Each call
    is reported whole and without the GPU's own work (the backend's MIG mode switch, reset and instance creation,
    timed inside the driver's process: on hardware that is the MIG creation delay, hundreds of milliseconds; here
    the simulated GPU's locked read and durable write of its node file); the issue's target, p99 < 5 ms without
    the MIG creation delay, is checked on the latter.

Run: python benchmarks/dra_allocate.py [--quick] [--seed N] [--prepare-only]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import grpc

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
from tests.dra.fake_kubelet import SERVICES, FakeDraKubelet

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


LATENCY_KINDS = {  # what each measured prepare does on the simulated H100s (8 GPUs, minor = index)
    "whole GPU": "GPUs 0-3, never cut: CDI spec and checkpoint only",
    "dynamic MIG": "a 1g.10gb instance created on GPU 4 or 5, next to 6 held ones",
    "whole GPU, MIG mode off": "GPU 6 or 7 after a MIG claim: MIG mode switched off at prepare",
    "dynamic MIG, MIG mode on": "GPU 6 or 7 after a whole-GPU claim: MIG mode on, then the instance",
}


def _claim(name: str, device: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "bench", "uid": name},
            "status": {"allocation": {"devices": {"results": [
                {"request": "r", "driver": "gpu.nvidia.com", "pool": "node-a", "device": device}]}}}}


def _latency_plan(rounds: int) -> tuple[list[tuple[str, str]], list[tuple[str, str, str]]]:
    """The held claims (name, device) and the measured ones (kind, name, device), in the order the kubelet sends
    them: per round one claim of each LATENCY_KINDS kind, each unprepared before the next."""
    held = [(f"held-{g}-{s}", f"gpu-{g}-mig-1g10gb-19-{s}") for g in (4, 5) for s in range(6)]
    measured = []
    for k in range(rounds):
        switch = 6 + k % 2
        for kind, device in (("whole GPU", f"gpu-{k % 4}"), ("dynamic MIG", f"gpu-{4 + k % 2}-mig-1g10gb-19-6"),
                             ("whole GPU, MIG mode off", f"gpu-{switch}"),
                             ("dynamic MIG, MIG mode on", f"gpu-{switch}-mig-1g10gb-19-6")):
            measured.append((kind, f"c{k}-{kind.replace(' ', '').replace(',', '-').lower()}", device))
    return held, measured


class TimedGpu(SimulatedBackend):
    """The simulated backend, timing what stands for the GPU's own work at prepare: MIG mode switches, resets and
    instance creation (`gpu_seconds`, summed since the driver's last prepare began)."""

    gpu_seconds = 0.0

    def _timed(self, call: Any, *args: Any) -> Any:
        started = time.perf_counter()
        try:
            return call(*args)
        finally:
            self.gpu_seconds += time.perf_counter() - started

    def set_mig_mode(self, index: int, enabled: bool) -> bool:
        return bool(self._timed(super().set_mig_mode, index, enabled))

    def reset_gpu(self, index: int) -> None:
        self._timed(super().reset_gpu, index)

    def create_mig_device(self, index: int, profile_id: int, start: int) -> Any:
        return self._timed(super().create_mig_device, index, profile_id, start)


class TimedDriver(DraDriver):
    """The driver, noting per claim how long its prepare spent in `TimedGpu`'s GPU work."""

    gpu_time: dict[str, float]

    def prepare(self, refs: Any) -> Any:
        assert isinstance(self.backend, TimedGpu)
        self.backend.gpu_seconds = 0.0
        try:
            return super().prepare(refs)
        finally:
            self.gpu_time[refs[0].uid] = self.backend.gpu_seconds


async def prepare_latency(rounds: int, state_base: str, volatile_base: str) -> dict[str, list[tuple[float, float]]]:
    """NodePrepareResources per kind (LATENCY_KINDS): (wall time, of which the GPU's own work) per call, each
    claim unprepared before the next; 12 other claims stay prepared throughout, so the checkpoint holds a node's
    worth of records. The driver's state (checkpoint, MPS limits) goes under `state_base`, as
    /var/lib/kubelet/plugins does on a node; its CDI specs and the simulated GPU under `volatile_base`, as /var/run/cdi
    (tmpfs) and the GPU itself.

    The kubelet is a process of its own, as on a node: its gRPC client and timing loop do not share the driver's
    interpreter (and GIL), so what is measured is the driver's answer plus the socket round trip."""
    held, measured = _latency_plan(rounds)
    with (tempfile.TemporaryDirectory(prefix="drab", dir=state_base) as state,
          tempfile.TemporaryDirectory(prefix="drab", dir=volatile_base) as volatile):
        root, run = Path(state), Path(volatile)
        SimulatedBackend.create(run / "node.json", gpus=f"8x{MODEL}", node_name="node-a")
        claims = {("bench", name): _claim(name, device) for name, device in held}
        claims.update({("bench", name): _claim(name, device) for _, name, device in measured})
        driver = TimedDriver(TimedGpu(run / "node.json"), "node-a", root / "plugin", run / "cdi",
                             lambda ns, name: claims.get((ns, name)), dynamic_mig=True)
        driver.gpu_time = {}
        server = DraPluginServer(driver, root / "plugin", root / "registry")
        await server.start()
        try:
            kubelet = await asyncio.create_subprocess_exec(
                sys.executable, __file__, "--kubelet", str(root / "registry"), str(rounds),
                stdout=asyncio.subprocess.PIPE)
            output, _ = await kubelet.communicate()
            if kubelet.returncode != 0:
                raise RuntimeError(f"the kubelet process failed (exit {kubelet.returncode})")
        finally:
            await server.stop()
    times: dict[str, list[tuple[float, float]]] = {kind: [] for kind in LATENCY_KINDS}
    for kind, name, seconds in json.loads(output):
        times[kind].append((seconds, driver.gpu_time[name]))
    return times


async def kubelet_process(registry: Path, rounds: int) -> list[tuple[str, str, float]]:
    """The kubelet's side of `prepare_latency`: register (asynchronously, as the fake kubelet of the tests does),
    then prepare the held claims and time each measured one over a blocking channel: the real kubelet is Go, and
    an asyncio client's own event-loop overhead would be charged to the driver."""
    held, measured = _latency_plan(rounds)
    out: list[tuple[str, str, float]] = []  # (kind, claim, seconds) per measured call
    kubelet = FakeDraKubelet(registry)
    await kubelet.register()
    await kubelet.close()
    pb, module = SERVICES[kubelet.version]
    with grpc.insecure_channel(f"unix://{kubelet.info.endpoint}") as channel:
        stub = module.DRAPluginStub(channel)

        def call(method: str, name: str) -> Any:
            claim = pb.Claim(namespace="bench", uid=name, name=name)
            if method == "prepare":
                return stub.NodePrepareResources(pb.NodePrepareResourcesRequest(claims=[claim]), timeout=10)
            return stub.NodeUnprepareResources(pb.NodeUnprepareResourcesRequest(claims=[claim]), timeout=10)

        for name, _ in held:
            assert call("prepare", name).claims[name].error == ""
        for index, (kind, name, _) in enumerate(measured):
            started = time.perf_counter()
            response = call("prepare", name)
            elapsed = time.perf_counter() - started
            assert response.claims[name].error == "", response.claims[name].error
            if index >= 2 * len(LATENCY_KINDS) or kind in ("whole GPU", "dynamic MIG"):  # GPUs 6-7 start whole
                out.append((kind, name, elapsed))
            call("unprepare", name)
    return out


def _load() -> str:
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "unknown"


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="100 claims vs 64 and 24 GPUs, 30 prepare rounds")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--prepare-only", action="store_true", help="only the NodePrepareResources latencies")
    parser.add_argument("--kubelet", nargs=2, metavar=("REGISTRY", "ROUNDS"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.kubelet:  # the child process `prepare_latency` starts
        print(json.dumps(asyncio.run(kubelet_process(Path(args.kubelet[0]), int(args.kubelet[1])))))
        return
    claims, rounds = (100, 30) if args.quick else (1000, 200)
    node_counts: tuple[int, ...] = () if args.prepare_only else (8, 3) if args.quick else (64, 28)
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
    # everything on tmpfs shows the driver's own cost; the node layout puts its checkpoint on disk, where each save
    # adds its fsyncs. The target is p99 < 5 ms without the MIG creation delay: the GPU's own work
    # (TimedGpu) taken out of each call; the whole call is printed too.
    disk = tempfile.gettempdir()
    volatile = "/dev/shm" if Path("/dev/shm").is_dir() else disk
    print(f"NodePrepareResources over gRPC on the simulated backend ({rounds} rounds; load {_load()}):")
    for where, state_base in (("all on tmpfs", volatile), ("node layout: checkpoint on disk, CDI on tmpfs", disk)):
        latency = asyncio.run(prepare_latency(rounds, state_base, volatile))
        print(f"  {where}:")
        for kind, calls in latency.items():
            whole = [seconds for seconds, _ in calls]
            driver_only = [seconds - gpu for seconds, gpu in calls]
            p99 = _pct(driver_only, 0.99)
            print(f"    {kind} ({len(calls)} calls; {LATENCY_KINDS[kind]}):\n"
                  f"      whole call p50 {_pct(whole, 0.5):.2f} ms, p99 {_pct(whole, 0.99):.2f} ms, mean "
                  f"{statistics.mean(whole) * 1000:.2f} ms; GPU's own work p50 "
                  f"{_pct([gpu for _, gpu in calls], 0.5):.2f} ms\n"
                  f"      without it: p50 {_pct(driver_only, 0.5):.2f} ms, p99 {p99:.2f} ms"
                  f"  [target p99 < 5 ms: {'met' if p99 < 5 else 'NOT met'}]")


if __name__ == "__main__":
    main()
