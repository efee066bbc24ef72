"""Reliability as measured figures: kubelet restarts, kill -9 of every state writer, API faults, exporter under load.

    python benchmarks/reliability.py [--quick] [--only restarts|kills|faults|crashes|exporter]

Each section prints its figures and a PASS/FAIL line against the bar of issue #18:

- kubelet restarts: the fake kubelet (tests/fakes/fake_kubelet.py) restarts N times in a row (200; quick 30) under a
  running device plugin; re-registrations, latency from restart to a re-registered, fully listed plugin (p50/p99),
  lost = restarts never followed by a re-registration within 10 s. Bar: lost = 0.
- kill -9: each state writer (durable outputs of export/generate-config/simulate, the sim node file, MPS slices, the
  NFD label file, MPS limits, CDI specs) runs in a forked child rewriting its file; the parent SIGKILLs it at a
  random moment (1-30 ms) and checks the file with its real reader (checksums verified where the file has one):
  it must read as one of the versions written. ≥ 500 kills (quick 60).
  Bar: corrupt files = 0. Temps left by killed writers are counted and must all be swept by the next write after
  the staleness window.
- API faults: tests/fakes/faultproxy.py injects 429/500/503 and connections dropped before or after the server acted,
  in front of the emulated API server, until ≥ 1,000 faults (quick 150): concurrent read-modify-write controllers
  (lost and doubled updates), NodeClaim creation per decision (duplicates), the partition agent following plans
  (plans applied twice). Bar: all zero.
- autoscaler crashes: the autoscaler killed after each write of a consolidation and of a termination on the kwok
  provider (tests/reliability/test_crash_points.py; the AWS-on-moto runs are in that test), a fresh replica taking
  over; counted after its passes settle: orphan taints, stuck NodeClaims, leaked instances, pods lost. Bar: all zero.
- exporter: a forked exporter process (8 simulated GPUs) under 50 concurrent scrapers for 30 s (quick 5 s) plus
  200 idle connections; p50/p99/max latency, errors, RSS growth of the exporter process. Bar: p99 < 50 ms,
  errors 0, RSS growth < 10 MiB.
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import json
import os
import random
import signal
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

RESULTS: list[tuple[str, bool]] = []


def verdict(name: str, ok: bool, line: str) -> None:
    RESULTS.append((name, ok))
    print(f"  {'PASS' if ok else 'FAIL'}: {line}")


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


# ---------------------------------------------------------------------------------------------- kubelet restarts


def kubelet_restarts(count: int) -> None:
    from kubegpu.config.deviceplugin import effective_device_plugin_config
    from kubegpu.deviceplugin.health import HealthPolicy
    from kubegpu.deviceplugin.manager import DevicePluginManager, PluginSettings
    from kubegpu.gpu.simulated import SimulatedBackend
    from tests.fakes.fake_kubelet import FakeKubelet

    print(f"kubelet restarts ({count} in a row, device plugin with 8 simulated A100s)")

    async def run(directory: Path) -> tuple[list[float], int, int]:
        kubelet = FakeKubelet(directory)
        await kubelet.start()
        config = directory / "config.yaml"
        config.write_text("version: v1\n")
        manager = DevicePluginManager(
            SimulatedBackend.create(None, "8xA100-SXM4-80GB"), lambda: effective_device_plugin_config(config, {}, {}),
            PluginSettings(plugin_dir=directory, kubelet_socket=kubelet.socket, cdi_dir=directory / "cdi",
                           relist_interval_s=0.1, health_interval_s=0.05, config_file=config),
            HealthPolicy(quiet_period_s=300.0))
        await manager.start()
        stop = asyncio.Event()
        task = asyncio.create_task(manager.run(stop))
        await kubelet.wait_for_devices("nvidia.com/gpu", 8, timeout=10)
        latencies: list[float] = []
        lost = 0
        for _ in range(count):
            before = len(kubelet.registrations)
            restarted = await kubelet.restart()
            try:
                await kubelet.wait_for(lambda before=before: len(kubelet.registrations) > before, timeout=10)
                await kubelet.wait_for_devices("nvidia.com/gpu", 8, healthy=8, timeout=10)
                latencies.append(time.monotonic() - restarted)
            except TimeoutError:
                lost += 1
        registrations = len(kubelet.registrations) - 1
        stop.set()
        await task
        await kubelet.stop()
        return latencies, lost, registrations

    with tempfile.TemporaryDirectory(prefix="kg", dir="/tmp") as name:  # short: unix socket paths are limited
        latencies, lost, registrations = asyncio.run(run(Path(name)))
    print(f"  restarts {count}, re-registrations {registrations}, lost {lost}, "
          f"p50 {pct(latencies, 0.5) * 1000:.0f} ms, p99 {pct(latencies, 0.99) * 1000:.0f} ms, "
          f"max {max(latencies, default=0) * 1000:.0f} ms")
    verdict("kubelet restarts", lost == 0 and registrations >= count,
            f"{registrations} re-registrations for {count} restarts, lost = {lost}")


# ---------------------------------------------------------------------------------------------- kill -9


def _writers(directory: Path) -> list[tuple[str, Path, Callable[[Path, int], None], Callable[[Path], int]]]:
    """(name, target, write(path, version), read(path) -> version or raise) for every state writer."""
    from kubegpu.deviceplugin.mps import LIMITS_FILE, MpsControl
    from kubegpu.discovery.agent import FeatureFileSink
    from kubegpu.discovery.labels import parse_features_file
    from kubegpu.files import load_json_file, read_text, write_durable
    from kubegpu.gpu.simulated import SimulatedBackend
    from kubegpu.sharing.cdi import write_cdi_spec
    from kubegpu.sharing.mps import GpuLimits, MpsPlan, parse_limits, read_slices, write_slices

    padding = "x" * 200_000  # a report-sized file: writes take long enough to be killed in the middle

    def durable_write(path: Path, version: int) -> None:  # export -o, generate-config -o, simulate --json/--report
        write_durable(path, f"version: {version}\npadding: {padding}\nend: true\n")

    def durable_read(path: Path) -> int:
        text = read_text(path)
        assert text.endswith("end: true\n") and len(text) > 200_000, "torn"
        return int(text.split("\n", 1)[0].split(": ")[1])

    node_path = directory / "node.json"

    def node_write(path: Path, version: int) -> None:
        SimulatedBackend(path).set_load(0, util=float(version % 100), mem_mib=version)

    def node_read(path: Path) -> int:
        return int(SimulatedBackend(path).snapshot()["gpus"][0]["load"]["memory_used_mib"])

    def slices_write(path: Path, version: int) -> None:  # the version in two slice sizes (each 1..4000 GB)
        high, low = divmod(version, 4000)
        write_slices(path, {i: [high + 1, low + 1, 1] for i in range(8)})

    def slices_read(path: Path) -> int:
        slices = read_slices(path)  # checksummed: a torn or mixed file raises CorruptStateError
        assert len(slices) == 8 and len({tuple(v) for v in slices.values()}) == 1, "torn"
        return (slices[0][0] - 1) * 4000 + slices[0][1] - 1

    def labels_write(path: Path, version: int) -> None:
        FeatureFileSink(path).write({f"nvidia.com/gpu.label-{i}": str(version) for i in range(2000)})

    def labels_read(path: Path) -> int:
        labels = parse_features_file(read_text(path), str(path))  # checks the `# kubegpu-sha256=` line
        assert len(labels) == 2000, "torn"
        values = set(labels.values())
        assert len(values) == 1, "mixed"
        return int(values.pop())

    mps_root = directory / "mps"

    def limits_write(path: Path, version: int) -> None:  # the version as GPU 0's pinned-memory limit
        gpus = tuple(GpuLimits(i, f"GPU-{i}", 4, version if i == 0 else 20480, 25) for i in range(8))
        MpsControl(mps_root, None).record([MpsPlan(f"nvidia.com/gpu-{n}", f"/run/mps/{n}/pipe", f"/run/mps/{n}/log",
                                                   gpus) for n in range(16)])

    def limits_read(path: Path) -> int:
        record = parse_limits(read_text(path), str(path))  # checksummed
        return int(record["daemons"][0]["gpus"][0]["pinned_memory_mib"])

    cdi_dir = directory / "cdi"

    def cdi_write(path: Path, version: int) -> None:
        write_cdi_spec(cdi_dir, {"cdiVersion": "0.6.0", "kind": "nvidia.com/gpu", "version": version,
                                 "devices": [{"name": f"gpu{i}", "containerEdits": {"env": [padding[:2000]]}}
                                             for i in range(64)]})

    def cdi_read(path: Path) -> int:
        [spec] = list(cdi_dir.glob("*.json"))
        data = load_json_file(spec)
        assert isinstance(data, dict) and len(data["devices"]) == 64
        return int(data["version"])

    SimulatedBackend.create(node_path, gpus="8xA100-SXM4-80GB")
    return [
        ("export/generate-config/simulate -o", directory / "out.yaml", durable_write, durable_read),
        ("sim node state file", node_path, node_write, node_read),
        ("MPS slices file", directory / "mps-slices.json", slices_write, slices_read),
        ("NFD label file", directory / "features.d" / "gfd", labels_write, labels_read),
        ("MPS limits record", mps_root / LIMITS_FILE, limits_write, limits_read),
        ("CDI spec", cdi_dir / "spec", cdi_write, cdi_read),
    ]


def kill_writers(kills: int) -> None:
    from kubegpu import files
    from kubegpu.files import STALE_TEMP_SECONDS

    print(f"kill -9 at random points of every state writer ({kills} kills)")
    rng = random.Random(18)
    total_corrupt = total_kills = 0
    temps_left = 0
    progressed = all_swept = True
    with tempfile.TemporaryDirectory(prefix="kubegpu-kill-") as name:
        writers = _writers(Path(name))
        per = max(1, kills // len(writers) + (kills % len(writers) > 0))
        for label, target, write, read in writers:
            target.parent.mkdir(parents=True, exist_ok=True)
            write(target, 0)
            corrupt = 0
            seen: set[int] = set()
            for kill in range(per):
                base = (kill + 1) * 100_000  # versions written by this child; the read-back shows its progress
                pid = os.fork()
                if pid == 0:  # the writer: rewrite forever until killed
                    try:
                        version = base
                        while True:
                            write(target, version)
                            version += 1
                    finally:
                        os._exit(0)
                time.sleep(rng.uniform(0.001, 0.03))
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                total_kills += 1
                try:
                    if read(target) >= base:
                        seen.add(kill)
                except Exception:
                    corrupt += 1
            leftovers = [p for p in target.parent.rglob(".*.tmp")]
            temps_left += len(leftovers)
            for path in leftovers:  # age them past the staleness window: the next write must sweep them
                os.utime(path, (time.time() - STALE_TEMP_SECONDS - 1,) * 2)
            files._last_sweep.clear()  # that write comes from the writer restarted after the kill: a new process
            write(target, 10**6)
            swept = not list(target.parent.rglob(".*.tmp"))
            total_corrupt += corrupt
            progressed &= len(seen) > 0  # the writers really were rewriting the file when killed
            all_swept &= swept
            print(f"  {label:<36} kills {per:>4}  corrupt {corrupt}  kills after a complete write {len(seen):>4}  "
                  f"temps left {len(leftovers):>3} "
                  f"({'swept by the next write' if swept else 'NOT swept'})")
    verdict("kill -9", total_corrupt == 0 and total_kills >= kills and progressed and all_swept,
            f"{total_kills} kills, corrupt files = {total_corrupt}, temps left by killed writers = {temps_left}")


# ---------------------------------------------------------------------------------------------- API faults


def _plans_applied_twice(url: str, clean: Any, plans: int, directory: Path) -> tuple[int, int]:
    from kubegpu.gpu.simulated import SimulatedBackend
    from kubegpu.kube.errors import ApiError
    from kubegpu.partitionagent import annotations as ann
    from kubegpu.partitionagent.agent import PartitionAgent
    from tests.reliability.faults import faulty_cluster

    node = f"faults-{random.randrange(10**6)}"
    clean.create({"apiVersion": "v1", "kind": "Node", "metadata": {"name": node,
                                                                   "labels": {ann.PARTITIONING_LABEL: "mps"}}})
    backend = SimulatedBackend.create(None, "1xA100-SXM4-80GB", node_name=node)
    agent = PartitionAgent(faulty_cluster(url, seed=3), backend, node, directory / f"{node}-slices.json")
    applied: dict[str, int] = {}
    original = agent.apply

    def counting_apply(node_obj: dict[str, Any], mode: str, annotations: Any) -> Any:
        plan = annotations.get(ann.SPEC_PLAN)
        applied[plan] = applied.get(plan, 0) + 1
        return original(node_obj, mode, annotations)

    agent.apply = counting_apply  # type: ignore[method-assign]
    for plan in range(1, plans + 1):
        layout = "20gb,20gb" if plan % 2 else "40gb"
        clean.patch("Node", node, {"metadata": {"annotations": {ann.SPEC_PLAN: str(plan),
                                                                "kubegpu.io/spec-gpu-0-layout": layout}}})
        for _ in range(3):  # the agent's loop ticks again after a failed tick
            try:
                agent.tick()
            except ApiError:
                continue
    twice = sum(1 for count in applied.values() if count > 1)
    return len(applied), twice


def api_faults(target: int) -> None:
    from tests.fakes.apiserver import start_apiserver
    from tests.fakes.faultproxy import FaultProxy
    from tests.reliability.faults import concurrent_updates, nodeclaim_decisions

    print(f"API-server fault injection (≥ {target} faults: 429, 500, 503, dropped before/after the server acted)")
    server = start_apiserver()
    proxy = FaultProxy(server.url, rate=0.3, seed=18)
    clean = server.cluster()
    applied = lost = doubled = claims = duplicates = plans = plans_twice = 0
    rounds = 0
    started = time.perf_counter()
    try:
        with tempfile.TemporaryDirectory(prefix="kubegpu-faults-") as name:
            while proxy.injected < target:
                rounds += 1
                result = concurrent_updates(proxy.url, clean, workers=4, ops=10, name=f"rmw-{rounds}")
                applied, lost, doubled = applied + result.applied, lost + result.lost, doubled + result.duplicated
                made, dup = nodeclaim_decisions(proxy.url, clean, decisions=20, seed=rounds)
                claims, duplicates = claims + made, duplicates + dup
                count, twice = _plans_applied_twice(proxy.url, clean, plans=10, directory=Path(name))
                plans, plans_twice = plans + count, plans_twice + twice
    finally:
        proxy.stop()
        server.stop()
    faults = ", ".join(f"{k} {v}" for k, v in sorted(proxy.faults.items()))
    print(f"  faults injected {proxy.injected} ({faults}); requests reaching the server {proxy.forwarded}; "
          f"{time.perf_counter() - started:.0f} s")
    print(f"  read-modify-write: {applied} updates applied, lost {lost}, applied twice {doubled}")
    print(f"  NodeClaims: {claims} created for {claims - duplicates} decisions, duplicates {duplicates}")
    print(f"  partition agent: {plans} plans followed, applied twice {plans_twice}")
    verdict("API faults", proxy.injected >= target and lost == doubled == duplicates == plans_twice == 0,
            f"{proxy.injected} faults: lost updates {lost}, duplicate NodeClaims {duplicates}, "
            f"plans applied twice {plans_twice}")


# ---------------------------------------------------------------------------------------------- exporter


def _rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def _scrape(port: int, deadline: float, interval: float, rng: random.Random) -> tuple[list[float], int]:
    """One scraper: GET /metrics every `interval` seconds (first at a random offset), as Prometheus does."""
    latencies: list[float] = []
    failed = 0
    next_at = time.monotonic() + rng.uniform(0, interval)
    while True:
        time.sleep(max(0.0, next_at - time.monotonic()))
        if time.monotonic() >= deadline:
            return latencies, failed
        next_at += interval
        t0 = time.perf_counter()
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
            conn.request("GET", "/metrics")
            response = conn.getresponse()
            body = response.read()
            conn.close()
            if response.status != 200 or b"DCGM_FI_DEV_GPU_UTIL" not in body:
                failed += 1
        except OSError:
            failed += 1
        latencies.append(time.perf_counter() - t0)


def _scrape_from_processes(port: int, scrapers: int, deadline: float, interval: float,
                           processes: int = 5) -> tuple[list[float], int]:
    """The scrapers as threads in several client processes, so one client's GIL does not inflate the latencies."""
    children = []
    for p in range(processes):
        read_fd, write_fd = os.pipe()
        pid = os.fork()
        if pid == 0:
            try:
                os.close(read_fd)
                results: list[tuple[list[float], int]] = []

                def one(seed: int, results: list[tuple[list[float], int]] = results) -> None:
                    results.append(_scrape(port, deadline, interval, random.Random(seed)))

                threads = [threading.Thread(target=one, args=(p * 1000 + i,))
                           for i in range(scrapers // processes + (p < scrapers % processes))]
                for t in threads:
                    t.start()
                for t in threads:
                    t.join()
                payload = json.dumps([[x for r in results for x in r[0]], sum(r[1] for r in results)]).encode()
                with os.fdopen(write_fd, "wb") as out:
                    out.write(payload)
            finally:
                os._exit(0)
        os.close(write_fd)
        children.append((pid, read_fd))
    latencies: list[float] = []
    errors = 0
    for pid, read_fd in children:
        with os.fdopen(read_fd, "rb") as handle:
            mine, failed = json.loads(handle.read() or b"[[], 1]")
        os.waitpid(pid, 0)
        latencies.extend(mine)
        errors += failed
    return latencies, errors


def exporter_load(seconds: float, scrapers: int = 50, idle: int = 200, interval: float = 0.1) -> None:
    print(f"exporter: {scrapers} concurrent scrapers, each every {interval * 1000:.0f} ms, for {seconds:.0f} s "
          f"+ {idle} idle connections (8 simulated GPUs)")
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            from kubegpu.exporter.counters import load_counters
            from kubegpu.exporter.server import Exporter, serve
            from kubegpu.gpu.simulated import SimulatedBackend

            exporter = Exporter(SimulatedBackend.create(None, "8xA100-SXM4-80GB"), load_counters(None), "bench",
                                None, 30.0)  # the manifests' --collect-interval=30000, dcgm-exporter's default
            exporter.collect_once()
            server = serve(exporter, "127.0.0.1", 0)
            os.write(write_fd, str(server.port).encode())
            exporter.run()
        finally:
            os._exit(0)
    port = int(os.read(read_fd, 32).decode())
    idle_socks = [socket.create_connection(("127.0.0.1", port)) for _ in range(idle)]
    time.sleep(1.0)
    rss_before = _rss_kib(pid)
    deadline = time.monotonic() + seconds
    latencies, errors = _scrape_from_processes(port, scrapers, deadline, interval)
    rss_after = _rss_kib(pid)
    for sock in idle_socks:
        sock.close()
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    growth = (rss_after - rss_before) / 1024
    p99 = pct(latencies, 0.99) * 1000
    print(f"  scrapes {len(latencies)} ({len(latencies) / seconds:.0f}/s), errors {errors}, "
          f"p50 {pct(latencies, 0.5) * 1000:.1f} ms, p99 {p99:.1f} ms, max {max(latencies) * 1000:.1f} ms, "
          f"RSS {rss_before / 1024:.1f} → {rss_after / 1024:.1f} MiB (growth {growth:.1f} MiB)")
    print(f"  machine: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} during the run")
    verdict("exporter", p99 < 50 and errors == 0 and growth < 10,
            f"p99 {p99:.1f} ms < 50, errors {errors} = 0, RSS growth {growth:.1f} MiB < 10")


def autoscaler_crashes() -> None:
    print("== autoscaler killed at every write (kwok provider)")
    from tests.reliability.crashes import category
    from tests.reliability.test_crash_points import SCENARIOS, kwok_profile, run

    counts = dict.fromkeys(("orphan taints", "stuck NodeClaims", "leaked instances", "pods lost"), 0)
    points = 0
    started = time.monotonic()
    for scenario in SCENARIOS:
        profile = kwok_profile()
        world, _ = run(scenario, profile, None)
        for crash_at in range(1, len(world.writes.log) + 1):
            crashed, _ = run(scenario, profile, crash_at)
            points += 1
            for problem in crashed.problems(profile.instances):
                counts[category(problem)] += 1
    print(f"  {points} crash points in {time.monotonic() - started:.1f} s: "
          + ", ".join(f"{name} {n}" for name, n in counts.items()))
    verdict("crashes", points >= 20 and not any(counts.values()), f"{points} points ≥ 20, every count 0")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller counts, a 5 s load test")
    parser.add_argument("--only", choices=["restarts", "kills", "faults", "crashes", "exporter"], action="append")
    args = parser.parse_args()
    only = set(args.only or ["restarts", "kills", "faults", "crashes", "exporter"])
    if "restarts" in only:
        kubelet_restarts(30 if args.quick else 200)
    if "kills" in only:
        kill_writers(60 if args.quick else 510)
    if "faults" in only:
        api_faults(150 if args.quick else 1000)
    if "crashes" in only:
        autoscaler_crashes()
    if "exporter" in only:
        exporter_load(5.0 if args.quick else 30.0)
    failed = [name for name, ok in RESULTS if not ok]
    print("all figures within their bars" if not failed else f"FAILED: {', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
