"""Karpenter beside kubegpu in the same run: its scheduling algorithm against our provisioning pass.

    python benchmarks/karpenter.py [--quick] [--sizes 500,2000,5000] [--benchtime 3x]

Karpenter is pinned in the Go tools module `test/karpenter` (sigs.k8s.io/karpenter v1.14.1). Its own scheduling
benchmark (`BenchmarkScheduling<N>` in pkg/controllers/provisioning/scheduling, build tag `test_performance`:
400 fake instance types, `makeDiversePods(N)` — one fifth each of generic pods, zonal and hostname topology spread,
zonal pod affinity and hostname anti-affinity, CPU from {100, 250, 500, 1000, 1500}m and memory from
{100 … 4096}Mi) is compiled once with `go test -c` into the cache beside the control-plane binaries
(`~/.cache/kubegpu/karpenter/v1.14.1/scheduling.test`) and run for each size; then kubegpu's pass (`run_pass`,
both sizings, as the controller runs it) on the same shape (`benchmarks/provisioning.py` mirrors it: Karpenter's
`fake.InstanceTypes(400)` and the same five-kind mix). Printed per size: pods/s of each by wall time (Karpenter's
is its benchmark's own `pods/sec` metric; Go, GOMAXPROCS = the CPUs here) and by CPU time (what each process
spent per solve, which a shared machine's load distorts less), kubegpu / Karpenter for both, and the nodes each plan
opens (our pass picks the cheaper of two sizings; the fake types are priced linearly, so more, smaller nodes cost
the same). Ours is one Python process. The label values of the constrained kinds differ in detail (Karpenter draws
random label values per pod; the mirror gives each kind one app label), so node counts are comparable in size,
not identical.

Not in this script (yet): the end-to-end comparison on fresh real control planes (Karpenter's kwok provider and
`kubegpu autoscaler`, same instance-type JSON, same burst; ../shared/reference/karpenter-kwok.md has every setting
Karpenter needed) — each trial takes minutes per 500 pods.
"""

from __future__ import annotations

import argparse
import os
import random
import re
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.provisioning import _pool, cpu_pods
from kubegpu.autoscaler.catalog import fake_instance_types
from kubegpu.autoscaler.provisioner import run_pass

VERSION = "v1.14.1"
MODULE = Path(__file__).resolve().parents[1] / "test" / "karpenter"
PACKAGE = "sigs.k8s.io/karpenter/pkg/controllers/provisioning/scheduling"
CACHE = Path(os.environ.get("KUBEGPU_CACHE", Path.home() / ".cache" / "kubegpu")) / "karpenter" / VERSION
KARPENTER_SIZES = (1, 50, 100, 500, 1000, 2000, 5000, 10000, 20000)  # the BenchmarkScheduling<N> that exist


def benchmark_binary() -> Path:
    """Karpenter's scheduling test binary, compiled from the pinned module on first use."""
    binary = CACHE / "scheduling.test"
    if binary.exists():
        return binary
    go = shutil.which("go")
    if go is None:
        raise SystemExit("error: Go is needed to build Karpenter's benchmark (see docs/testing.md)")
    CACHE.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "GOFLAGS": "-mod=readonly -buildvcs=false"}
    print(f"building Karpenter {VERSION}'s scheduling benchmark into {binary} (once; minutes)", flush=True)
    subprocess.run([go, "test", "-c", "-tags=test_performance", "-o", str(binary), PACKAGE], cwd=MODULE, env=env,
                   check=True)
    return binary


def karpenter_pods_per_second(binary: Path, size: int, iterations: int) -> tuple[float, float, int]:
    """(pods/s of wall time, pods/s of CPU time, nodes) from Karpenter's own BenchmarkScheduling<size>.

    The wall figure is the benchmark's own `pods/sec`; the CPU figure divides the process's CPU time by the solves
    it ran (Go runs the benchmark once with N=1, then with N=`iterations`), so a shared machine's load weighs less.
    """
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    out = subprocess.run([str(binary), "-test.run=^$", f"-test.bench=^BenchmarkScheduling{size}$",
                          f"-test.benchtime={iterations}x"], capture_output=True, text=True, check=True,
                         cwd=CACHE).stdout
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime) / (1 + iterations)
    line = next((ln for ln in out.splitlines() if ln.startswith(f"BenchmarkScheduling{size}")), None)
    rate = re.search(r"([\d.]+) pods/sec", line or "")
    nodes = re.search(r"([\d.]+) nodes", line or "")
    if line is None or rate is None:
        raise SystemExit(f"error: no pods/sec in Karpenter's benchmark output:\n{out}")
    return float(rate.group(1)), size / cpu, int(float(nodes.group(1))) if nodes else -1


def kubegpu_pods_per_second(size: int, iterations: int, seed: int = 42) -> tuple[float, float, int]:
    """(pods/s of wall time, pods/s of CPU time, nodes) of our pass on the same shape, averaged over `iterations`
    passes after one warm-up, as Go's benchmark averages its N."""
    types = fake_instance_types(400)
    pools = [_pool("default")]
    run_pass(pools, lambda _p: types, cpu_pods(size, random.Random(seed)))
    wall = cpu = 0.0
    nodes = 0
    for _ in range(iterations):
        pods = cpu_pods(size, random.Random(seed))
        started, started_cpu = time.perf_counter(), time.process_time()
        result = run_pass(pools, lambda _p: types, pods)
        wall += time.perf_counter() - started
        cpu += time.process_time() - started_cpu
        nodes = len(result.claims)
    return size * iterations / wall, size * iterations / cpu, nodes


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="500 pods only")
    parser.add_argument("--sizes", default=None, help=f"comma-separated, each one of {KARPENTER_SIZES}")
    parser.add_argument("--iterations", type=int, default=None, help="timed solves per size (default 2; --quick 1)")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")] if args.sizes else ([500] if args.quick else [500, 1000, 2000])
    bad = [s for s in sizes if s not in KARPENTER_SIZES]
    if bad:
        raise SystemExit(f"error: --sizes: Karpenter has no BenchmarkScheduling for {bad}; one of {KARPENTER_SIZES}")
    iterations = args.iterations or (1 if args.quick else 2)
    binary = benchmark_binary()
    print(f"Karpenter {VERSION} scheduling benchmark vs kubegpu's provisioning pass, same run; "
          f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}")
    print(f"{'pods':>6} | {'Karpenter pods/s wall':>21} {'CPU':>6} {'nodes':>6} | {'kubegpu pods/s wall':>19} "
          f"{'CPU':>6} {'nodes':>6} | kubegpu / Karpenter wall, CPU")
    for size in sizes:
        theirs, theirs_cpu, their_nodes = karpenter_pods_per_second(binary, size, iterations)
        ours, ours_cpu, our_nodes = kubegpu_pods_per_second(size, iterations)
        print(f"{size:>6} | {theirs:>21.0f} {theirs_cpu:>6.0f} {their_nodes:>6} | {ours:>19.0f} {ours_cpu:>6.0f} "
              f"{our_nodes:>6} | {ours / theirs:.2f}x, {ours_cpu / theirs_cpu:.2f}x", flush=True)
    print(f"(load average {os.getloadavg()[0]:.1f} at the end)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
