"""GPU-memory guard: time from a pod exceeding its share to the eviction request, and the agent's idle cost.

A simulated node of 64 A100-80GB GPUs, each time-sliced 8 ways and fully taken: 512 pods, each with one process on
its GPU within its 10 GiB share (the node file, a fake /proc with each process's pod cgroup, and a fake kubelet
PodResources socket that hands out the replicas, over a real unix socket).

1. Latency: the guard's real loop (`kubegpu.guard.agent.Guard`, the default 0.25 s interval) runs in a thread on an
   in-memory API store; the benchmark grows one random pod's process past its share (`set_process_memory`, as
   `kubegpu sim-node set-process-memory` does) and times until the guard calls the Eviction API for that pod. p50 and
   p99 over the trials, as ratios against the 1 s target and against the sampling interval (the floor: a leak is
   seen at the next sample at best).
2. Idle: the real `kubegpu gpu-guard` command as its own process against an emulated API server holding the 512
   pods, nobody over their share: CPU (share of one core) and resident memory, as ratios against 25 % of a core and
   150 MiB, and the CPU against a do-nothing Python loop waking at the same interval (measured in the same run).
"""

from __future__ import annotations

import argparse
import os
import random
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kubegpu.gpu.simulated import SimulatedBackend
from kubegpu.guard.agent import Guard, KillOutcome
from kubegpu.guard.cli import DEFAULT_INTERVAL_S
from kubegpu.guard.core import Policy
from kubegpu.guard.procs import ProcReader
from kubegpu.kube.memory import MemoryCluster
from kubegpu.sharing.attribution import PodResourcesClient
from tests.fakes.fake_podresources import FakePodResources
from tests.guard.helpers import fake_process, pod

P99_TARGET_S = 1.0
CPU_TARGET = 0.25
RSS_TARGET_MIB = 150.0
SHARED = "nvidia.com/gpu.shared"
NODE = "bench-node"
PID_BASE = 1_000_000  # above any pid_max: no host process is ever signalled


def make_node(directory: Path, gpus: int, pods_per_gpu: int, cluster: MemoryCluster | None) -> tuple[
        SimulatedBackend, list[tuple[str, str, str, str, list[str]]], list[tuple[str, list[str]]], dict[int, str]]:
    backend = SimulatedBackend.create(directory / "node.json", gpus=f"{gpus}xA100-SXM4-80GB", node_name=NODE)
    assignments, allocatable, pod_of_pid = [], [], {}
    share = 81920 // pods_per_gpu
    for device in backend.devices():
        ids = [f"{device.uuid}::{k}" for k in range(pods_per_gpu)]
        allocatable.append((SHARED, ids))
        for k in range(pods_per_gpu):
            name = f"p-{device.index}-{k}"
            uid = f"{device.index:08x}-0000-4000-8000-{k:012x}"
            obj = pod(name, node=NODE)
            obj["metadata"]["uid"] = uid
            if cluster is not None:
                obj = cluster.create(obj)
                uid = obj["metadata"]["uid"]
            pid = PID_BASE + device.index * pods_per_gpu + k
            fake_process(directory / "proc", pid, uid)
            backend.add_process(device.index, pid, share * 3 // 4)
            assignments.append(("ml", name, "main", SHARED, [ids[k]]))
            pod_of_pid[pid] = name
    return backend, assignments, allocatable, pod_of_pid


def latency(gpus: int, pods_per_gpu: int, trials: int, seed: int) -> list[float]:
    with tempfile.TemporaryDirectory(prefix="kubegpu-guard-bench-") as tmp:
        directory = Path(tmp)
        cluster = MemoryCluster()
        backend, assignments, allocatable, pod_of_pid = make_node(directory, gpus, pods_per_gpu, cluster)
        evicted: dict[str, float] = {}
        lock = threading.Lock()

        def evict(namespace: str, name: str) -> bool:
            with lock:
                evicted.setdefault(name, time.perf_counter())
            return True  # the API accepted it; the pod stays so the node stays full for the next trial

        socket = directory / "pr.sock"
        stop = threading.Event()
        with FakePodResources(socket, assignments, allocatable=allocatable):
            guard = Guard(backend, cluster, NODE, PodResourcesClient(socket), evict, Policy(),
                          proc=ProcReader(directory / "proc"), kill=lambda pid, still_ours: KillOutcome.NOT_OURS)

            def loop() -> None:
                while not stop.is_set():
                    guard.run_once()
                    stop.wait(DEFAULT_INTERVAL_S)

            worker = threading.Thread(target=loop, daemon=True)
            worker.start()
            time.sleep(2 * DEFAULT_INTERVAL_S)  # the first rounds list the pods
            rng = random.Random(seed)
            share = 81920 // pods_per_gpu
            out = []
            for _ in range(trials):
                pid = rng.choice(sorted(pod_of_pid))
                name = pod_of_pid[pid]
                with lock:
                    evicted.pop(name, None)
                backend.set_process_memory(pid, share + 1024)
                start = time.perf_counter()
                deadline = start + 10.0
                while time.perf_counter() < deadline:
                    with lock:
                        seen = evicted.get(name)
                    if seen is not None:
                        out.append(seen - start)
                        break
                    time.sleep(0.002)
                else:
                    raise SystemExit(f"no eviction of {name} within 10 s")
                backend.set_process_memory(pid, share * 3 // 4)
                time.sleep(rng.uniform(0.0, DEFAULT_INTERVAL_S))  # land anywhere in the guard's cycle
            stop.set()
            worker.join()
        return out


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024.0
    raise RuntimeError("no VmRSS")


def measure(process: subprocess.Popen[bytes], settle: float, window: float) -> tuple[float, float]:
    time.sleep(settle)
    if process.poll() is not None:
        detail = process.stderr.read().decode(errors="replace")[-500:] if process.stderr else ""
        raise SystemExit(f"process exited early ({process.returncode}): {detail}")
    before = cpu_seconds(process.pid)
    time.sleep(window)
    return (cpu_seconds(process.pid) - before) / window, rss_mib(process.pid)


def idle(gpus: int, pods_per_gpu: int, window: float) -> tuple[float, float, float]:
    from tests.fakes.apiserver import start_apiserver, write_kubeconfig

    server = start_apiserver()
    try:
        with tempfile.TemporaryDirectory(prefix="kubegpu-guard-idle-") as tmp:
            directory = Path(tmp)
            cluster = server.cluster()
            backend, assignments, allocatable, _ = make_node(directory, gpus, pods_per_gpu, None)
            for namespace_, name, *_rest in assignments:
                obj = pod(name, node=NODE, namespace=namespace_)
                obj["metadata"].pop("finalizers")
                cluster.create(obj)
            kubeconfig = write_kubeconfig(directory, server.url)
            socket = directory / "pr.sock"
            with FakePodResources(socket, assignments, allocatable=allocatable):
                env = {**os.environ, "KUBECONFIG": str(kubeconfig)}
                guard = subprocess.Popen(
                    [sys.executable, "-m", "kubegpu", "gpu-guard", "--gpu-backend", f"sim:{backend.path}",
                     "--node-name", NODE, "--pod-resources-socket", str(socket), "--proc-root",
                     str(directory / "proc"), "--log-level", "warning"],
                    env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
                try:
                    cpu, rss = measure(guard, 5.0, window)
                finally:
                    guard.terminate()
                    guard.wait(10)
            sleeper = subprocess.Popen([sys.executable, "-c", "import threading\nwhile True: "
                                        f"threading.Event().wait({DEFAULT_INTERVAL_S})"],
                                       stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
            try:
                floor, _ = measure(sleeper, 1.0, window)
            finally:
                sleeper.terminate()
                sleeper.wait(10)
            return cpu, rss, floor
    finally:
        server.stop()


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gpus", type=int, default=64)
    parser.add_argument("--pods-per-gpu", type=int, default=8)
    parser.add_argument("--trials", type=int, default=200)
    parser.add_argument("--idle-window", type=float, default=20.0, help="seconds of idle CPU measured")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    samples = latency(args.gpus, args.pods_per_gpu, args.trials, args.seed)
    p50, p99 = percentile(samples, 0.50), percentile(samples, 0.99)
    print(f"node: {args.gpus} GPUs x {args.pods_per_gpu} pods ({args.gpus * args.pods_per_gpu} pods), "
          f"sampling every {DEFAULT_INTERVAL_S:.2f} s, {len(samples)} leaks")
    print(f"share exceeded -> eviction request: p50 {p50 * 1000:.0f} ms, p99 {p99 * 1000:.0f} ms, "
          f"max {max(samples) * 1000:.0f} ms")
    print(f"  p99 / target ({P99_TARGET_S:.1f} s): {p99 / P99_TARGET_S:.2f}  "
          f"(p99 / sampling interval: {p99 / DEFAULT_INTERVAL_S:.2f})")
    cpu, rss, floor = idle(args.gpus, args.pods_per_gpu, args.idle_window)
    print(f"idle agent (kubegpu gpu-guard, own process): {cpu * 100:.1f} % of a core, {rss:.0f} MiB resident")
    versus = f"{cpu / floor:.0f}x" if floor >= 0.001 else "too little to measure"
    print(f"  CPU / target ({CPU_TARGET * 100:.0f} % of a core): {cpu / CPU_TARGET:.2f}  "
          f"(a Python loop waking as often: {floor * 100:.2f} % of a core; ratio {versus})")
    print(f"  RSS / target ({RSS_TARGET_MIB:.0f} MiB): {rss / RSS_TARGET_MIB:.2f}")


if __name__ == "__main__":
    main()
