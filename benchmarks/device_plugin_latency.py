"""Device plugin latency: Allocate and GetPreferredAllocation over a real unix socket, and re-registration time.

Runs the real plugin manager on a simulated 8×A100 node with the test suite's fake kubelet, all in a temp dir.
Prints p50/p99 per call against the targets (Allocate p99 < 1 ms, re-registration < 1 s) as ratios, and against
an empty RPC (GetDevicePluginOptions) measured in the same run, so the gRPC floor is visible.

    python benchmarks/device_plugin_latency.py [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import random
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import grpc

from kubegpu.deviceplugin.health import HealthPolicy
from kubegpu.deviceplugin.manager import DevicePluginManager, PluginSettings
from kubegpu.gpu.simulated import SimulatedBackend
from kubegpu.proto.deviceplugin.v1beta1 import api_pb2 as pb
from kubegpu.proto.deviceplugin.v1beta1 import api_pb2_grpc as pb_grpc

ALLOCATE_P99_TARGET_S = 0.001
REREGISTER_TARGET_S = 1.0


def _fake_kubelet() -> Any:
    path = Path(__file__).resolve().parent.parent / "tests" / "fakes" / "fake_kubelet.py"
    spec = importlib.util.spec_from_file_location("fake_kubelet", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["fake_kubelet"] = module
    spec.loader.exec_module(module)
    return module


async def _timed(call: Callable[[], Awaitable[Any]], n: int) -> list[float]:
    samples = []
    for _ in range(n):
        start = time.perf_counter()
        await call()
        samples.append(time.perf_counter() - start)
    return samples


def _pct(samples: list[float], q: float) -> float:
    return statistics.quantiles(samples, n=100, method="inclusive")[int(q) - 1]


def _report(name: str, samples: list[float], baseline: list[float], target: float | None) -> None:
    p50, p99 = _pct(samples, 50), _pct(samples, 99)
    line = (f"{name:<26} p50 {p50 * 1e3:7.3f} ms  p99 {p99 * 1e3:7.3f} ms  "
            f"vs empty RPC: p50 {p50 / _pct(baseline, 50):5.2f}x p99 {p99 / _pct(baseline, 99):5.2f}x")
    if target is not None:
        line += f"  p99/target({target * 1e3:.0f} ms) = {p99 / target:.3f}"
    print(line)


async def run(calls: int, restarts: int) -> None:
    directory = Path(tempfile.mkdtemp(prefix="kgbench-", dir="/tmp"))
    kubelet = _fake_kubelet().FakeKubelet(directory)
    await kubelet.start()
    backend = SimulatedBackend(None, gpus="8xA100-SXM4-80GB")
    config = {"version": "v1", "sharing": {"timeSlicing": {"resources": [
        {"name": "nvidia.com/gpu", "replicas": 4, "devices": [4, 5, 6, 7], "rename": "gpu-shared"}]}}}
    manager = DevicePluginManager(
        backend, lambda: config,
        PluginSettings(plugin_dir=directory, kubelet_socket=kubelet.socket, relist_interval_s=2.0),
        HealthPolicy(),
    )
    stop = asyncio.Event()
    try:
        await manager.start()
        runner = asyncio.create_task(manager.run(stop))
        await kubelet.wait_for(lambda: kubelet.capacity("nvidia.com/gpu") == 4
                               and kubelet.capacity("nvidia.com/gpu-shared") == 16)
        whole = list(kubelet.plugins["nvidia.com/gpu"].devices)
        shared = list(kubelet.plugins["nvidia.com/gpu-shared"].devices)
        async with grpc.aio.insecure_channel(f"unix://{directory / 'nvidia-gpu.sock'}") as channel, \
                grpc.aio.insecure_channel(f"unix://{directory / 'nvidia-gpu-shared.sock'}") as shared_channel:
            stub, shared_stub = pb_grpc.DevicePluginStub(channel), pb_grpc.DevicePluginStub(shared_channel)
            rng = random.Random(0)
            await _timed(lambda: stub.GetDevicePluginOptions(pb.Empty()), 200)  # warm-up
            empty = await _timed(lambda: stub.GetDevicePluginOptions(pb.Empty()), calls)

            def allocate() -> Awaitable[Any]:
                ids = rng.sample(whole, 2)
                request = pb.AllocateRequest(container_requests=[pb.ContainerAllocateRequest(devices_ids=ids)])
                return stub.Allocate(request)

            def preferred_whole() -> Awaitable[Any]:
                request = pb.ContainerPreferredAllocationRequest(available_deviceIDs=whole, allocation_size=2,
                                                                 must_include_deviceIDs=[rng.choice(whole)])
                return stub.GetPreferredAllocation(pb.PreferredAllocationRequest(container_requests=[request]))

            def preferred_shared() -> Awaitable[Any]:
                available = rng.sample(shared, 10)
                request = pb.ContainerPreferredAllocationRequest(available_deviceIDs=available, allocation_size=3)
                return shared_stub.GetPreferredAllocation(pb.PreferredAllocationRequest(container_requests=[request]))

            print(f"{calls} calls each on a unix socket (8×A100 sim node: 4 whole GPUs, 4 GPUs × 4 replicas)")
            _report("empty RPC (reference)", empty, empty, None)
            _report("Allocate", await _timed(allocate, calls), empty, ALLOCATE_P99_TARGET_S)
            _report("GetPreferredAllocation", await _timed(preferred_whole, calls), empty, ALLOCATE_P99_TARGET_S)
            _report("GetPreferredAllocation x4", await _timed(preferred_shared, calls), empty, ALLOCATE_P99_TARGET_S)

        delays = []
        for _ in range(restarts):
            before = len(kubelet.registrations)
            created = await kubelet.restart()
            await kubelet.wait_for(lambda b=before: len(kubelet.registrations) >= b + 2, timeout=10)
            delays.append(max(r.at for r in kubelet.registrations[before:]) - created)
        worst = max(delays)
        print(f"{'re-registration':<26} mean {statistics.mean(delays) * 1e3:7.1f} ms  max {worst * 1e3:7.1f} ms  "
              f"({restarts} kubelet restarts)  max/target(1 s) = {worst / REREGISTER_TARGET_S:.3f}")
        stop.set()
        await runner
    finally:
        stop.set()
        await kubelet.stop()
        shutil.rmtree(directory, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="1,000 calls and 3 restarts instead of 10,000 and 10")
    args = parser.parse_args()
    asyncio.run(run(1000 if args.quick else 10_000, 3 if args.quick else 10))


if __name__ == "__main__":
    main()
