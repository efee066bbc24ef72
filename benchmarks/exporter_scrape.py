"""Exporter scrape latency and memory on a busy node: 8 GPUs x 7 MIG instances x 2 pods each.

Runs the real `kubegpu exporter` as its own process (so its resident memory is its own), against a simulated
A100-80GB node cut all-1g.10gb and a fake kubelet PodResources socket holding 112 pods (each MIG instance
time-sliced between two pods). It collects every 100 ms, so the scrapes overlap collections and the one re-render
that follows each (the worst case; the default interval is 30 s). Prints p50/p99 scrape latency and RSS, each as a
ratio against its target (50 ms, 80 MiB), and the p99 against the time bare prometheus_client takes to render the
same series in this process — the floor any Python exporter sits on.

Then the hostile network, each case beside 50 concurrent scrapers (2,000 scrapes, each on a new
connection): no hostile client (the baseline), 200 connections that send part of a header and wait (reopened when
closed), 2,000 silent connections, a request trickled one byte per 100 ms, requests with a 1 MiB header. Each row:
p50/p99, errors, the exporter's RSS, and p99 and RSS as ratios against the baseline row of the same run.
`--quick`: 50 sequential scrapes and the hostile cases at 400 scrapes from 20 threads.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from prometheus_client import CollectorRegistry, Gauge, generate_latest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kubegpu.gpu.simulated import SimulatedBackend
from tests.fakes.fake_podresources import FakePodResources
from tests.fakes.hostile_clients import HeldConnections, HugeHeader, Trickler, raise_fd_limit, scrape_load

P99_TARGET_S = 0.050
RSS_TARGET_MIB = 80.0


def make_node(path: Path) -> list[tuple[str, str, str, str, list[str]]]:
    node = SimulatedBackend.create(path, gpus="8xA100-SXM4-80GB")
    assignments = []
    for gpu in range(8):
        node.set_mig_mode(gpu, True)
        node.reset_gpu(gpu)
        for start in range(7):
            mig = node.create_mig_device(gpu, 19, start)
            node.set_load(gpu, 40.0 + start, 4000, gi_id=mig.gi_id)
            for replica in range(2):
                pod = f"infer-{gpu}-{start}-{replica}"
                assignments.append(("serving", pod, "model", "nvidia.com/mig-1g.10gb", [f"{mig.uuid}::{replica}"]))
    return assignments


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024.0
    raise RuntimeError("no VmRSS")


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def hostile_cases(port: int, pid: int, scrapes: int, threads: int, silent: int, slow: int) -> None:
    """Each hostile client beside `threads` concurrent scrapers; ratios against the no-hostile baseline."""
    host = "127.0.0.1"
    trickle = Trickler(host, port)
    cases: list[tuple[str, contextlib.AbstractContextManager[object]]] = [
        ("no hostile client (baseline)", contextlib.nullcontext()),
        (f"{slow} slow-header connections", HeldConnections(host, port, slow)),
        (f"{silent} silent connections", HeldConnections(host, port, silent, opening=b"", reconnect=False)),
        ("1 request trickled 1 B/100 ms", trickle),
        ("1 MiB header, repeatedly", HugeHeader(host, port)),
    ]
    print(f"\nhostile clients, each beside {threads} concurrent scrapers ({scrapes} scrapes, a new connection each); "
          f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    print(f"{'case':34s} {'p50 ms':>8s} {'p99 ms':>8s} {'errors':>7s} {'RSS MiB':>8s} {'p99/base':>9s} "
          f"{'RSS/base':>9s}")
    base_p99 = base_rss = 0.0
    notes = []
    for name, case in cases:
        with case as client:
            time.sleep(1.0)  # let the server take every hostile connection before the scrapes start
            result = scrape_load(host, port, scrapes, threads)
            rss = rss_mib(pid)
            if client is trickle:
                deadline = time.monotonic() + 15
                while not trickle.statuses and time.monotonic() < deadline:
                    time.sleep(0.1)
                first = trickle.statuses[0] if trickle.statuses else 0
                notes.append(f"trickled request: {f'HTTP {first}' if first else 'closed unanswered'}")
            if isinstance(client, HugeHeader):
                notes.append(f"1 MiB headers: {len(client.statuses)} sent, answered {sorted(set(client.statuses))}")
            if isinstance(client, HeldConnections):
                notes.append(f"{name}: {client.opened} opened, {client.closed_by_server} closed by the server")
        if not base_p99:
            base_p99, base_rss = result.p99, rss
        print(f"{name:34s} {result.p50 * 1000:8.1f} {result.p99 * 1000:8.1f} {len(result.errors):7d} {rss:8.1f} "
              f"{result.p99 / base_p99:9.2f} {rss / base_rss:9.2f}")
        if result.errors:
            print(f"    first errors: {result.errors[:3]}")
    for note in notes:
        print(f"  {note}")


def bare_render_seconds(series_per_metric: int, metrics: int, repeats: int) -> float:
    """p99 time for prometheus_client alone to render the same number of labelled series."""
    registry = CollectorRegistry()
    labels = ["gpu", "UUID", "pci_bus_id", "device", "modelName", "GPU_I_PROFILE", "GPU_I_ID", "Hostname",
              "DCGM_FI_DRIVER_VERSION", "pod", "namespace", "container", "vgpu"]
    for m in range(metrics):
        gauge = Gauge(f"bench_metric_{m}", "help", labels, registry=registry)
        for s in range(series_per_metric):
            gauge.labels(*[f"{label}-{s}" for label in labels]).set(s)
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        generate_latest(registry)
        times.append(time.perf_counter() - started)
    return percentile(times, 0.99)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--scrapes", type=int, default=500)
    parser.add_argument("--quick", action="store_true", help="50 scrapes")
    parser.add_argument("--no-hostile", action="store_true", help="skip the hostile-client cases")
    args = parser.parse_args()
    scrapes = 50 if args.quick else args.scrapes
    raise_fd_limit(8192)  # 2,000 silent connections and the scrapers' sockets
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        assignments = make_node(workdir / "node.json")
        sock = workdir / "pod-resources.sock"
        with FakePodResources(sock, assignments):
            port = 19400 + os.getpid() % 500
            process = subprocess.Popen(
                [sys.executable, "-m", "kubegpu", "exporter", "--gpu-backend", f"sim:{workdir / 'node.json'}",
                 "--address", f"127.0.0.1:{port}", "--kubernetes", "--pod-resources-kubelet-socket", str(sock),
                 "--collect-interval", "100"],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            )
            try:
                url = f"http://127.0.0.1:{port}/metrics"
                body = b""
                deadline = time.monotonic() + 30
                while time.monotonic() < deadline and b'pod="' not in body:
                    time.sleep(0.2)
                    try:
                        body = urllib.request.urlopen(url, timeout=2).read()
                    except OSError:
                        continue
                series = sum(1 for line in body.decode().splitlines() if line.startswith("DCGM_"))
                latencies = []
                for _ in range(scrapes):
                    started = time.perf_counter()
                    urllib.request.urlopen(url, timeout=5).read()
                    latencies.append(time.perf_counter() - started)
                rss = rss_mib(process.pid)
                if not args.no_hostile:
                    hostile_cases(port, process.pid, 400 if args.quick else 2000, 20 if args.quick else 50,
                                  silent=2000, slow=200)
            finally:
                process.terminate()
                process.wait(timeout=10)
    p50, p99 = statistics.median(latencies), percentile(latencies, 0.99)
    metric_names = len({line.split("{")[0] for line in body.decode().splitlines() if line.startswith("DCGM_")})
    floor = bare_render_seconds(series // max(1, metric_names), metric_names, 50)
    print(f"node: 8 GPUs x 7 MIG instances x 2 pods = {len(assignments)} pods; {series} DCGM series per scrape")
    print(f"scrape latency p50 {p50 * 1000:.1f} ms, p99 {p99 * 1000:.1f} ms "
          f"-> p99 / 50 ms target = {p99 / P99_TARGET_S:.2f}")
    print(f"p99 / bare prometheus_client render of the same series ({floor * 1000:.1f} ms) = {p99 / floor:.2f}")
    print(f"resident memory {rss:.1f} MiB -> RSS / 80 MiB target = {rss / RSS_TARGET_MIB:.2f} "
          f"(dcgm-exporter runs at 400-500 MiB: {rss / 450:.2f} of it)")


if __name__ == "__main__":
    main()
