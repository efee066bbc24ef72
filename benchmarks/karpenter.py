"""Karpenter beside kubegpu in the same run: its scheduling algorithm against our provisioning pass, and end to end.

    python benchmarks/karpenter.py [--quick] [--sizes 500,2000,5000] [--iterations 2]
    python benchmarks/karpenter.py --e2e [--pods 500,2000] [--trials 2] [--cpu-share 0.2] [--dra-share 0.5]
        [--keep-logs DIR]
                                   [--json FILE] [--from-json FILE,FILE]

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

`--e2e`: the end-to-end comparison on fresh real control planes (`benchmarks/karpenter_e2e.py`): Karpenter's kwok
provider (`sigs.k8s.io/karpenter/kwok`, built once from the same tools module into
`~/.cache/kubegpu/karpenter/v1.14.1/karpenter-kwok`, its CRDs beside it) and `kubegpu autoscaler --provider kwok`,
the same instance-types JSON (the shipped catalogue), the same burst of pending pods (per 10 GPU pods 4 x 1 GPU, 3 x 2,
2 x 4, 1 x 8, with CPU and memory; `--cpu-share` adds CPU-only pods), A/B/A/B, consolidation off in both. Printed:
seconds until kube-scheduler has bound every pod, first pod bound, NodeClaims launched and empty, price per hour,
each autoscaler's CPU seconds and peak RSS, control-plane CPU, and kubegpu / Karpenter for each. Each trial takes
minutes per 500 pods on a small machine.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import random
import re
import resource
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.provisioning import _pool, cpu_pods
from kubegpu.autoscaler.catalog import fake_instance_types
from kubegpu.autoscaler.provisioner import run_pass
from kubegpu.files import write_durable

if TYPE_CHECKING:
    from benchmarks.karpenter_e2e import Trial

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


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else float("nan")


def _whole(value: float) -> str:
    return f"{value:.0f}" if value == value else "–"   # nan: not measured (files from before these fields)


def _span(values: list[float]) -> str:
    return f"{min(values):.0f}–{max(values):.0f} s" if values else "–"


def _writes(trial: Trial) -> float:
    """kube-apiserver's write requests in a trial (every verb but GET, LIST and WATCH)."""
    return sum(v for k, v in trial.api_requests.items() if k.split()[0] not in ("GET", "LIST", "WATCH"))


def table(trials: list[Trial]) -> list[str]:
    """Markdown: per size, kubegpu | Karpenter | kubegpu / Karpenter, means over the trials; with several kubegpu
    variants (`--kubegpu-args` given more than once), a kubegpu column and a ratio per variant."""
    sizes = sorted({t.pods for t in trials})
    variants = list(dict.fromkeys(t.variant for t in trials if t.system == "kubegpu"))
    karpenter = any(t.system == "karpenter" for t in trials)
    ratios_shown = bool(variants) and karpenter   # a system that did not run gets no column, nor a ratio
    header, rule = "| |", "|---|"
    names = [f"kubegpu {v}" if v else "kubegpu (defaults)" if len(variants) > 1 else "kubegpu" for v in variants]
    for size in sizes:
        header += "".join(f" {name} {size:,} |" for name in names) + (f" Karpenter {size:,} |" if karpenter else "")
        header += "".join(f" {name} / Karpenter |" for name in names) if ratios_shown else ""
        rule += "---|" * (len(variants) + karpenter + (len(variants) if ratios_shown else 0))
    rows = [header, rule]

    def row(label: str, cell: Callable[[list[Trial]], tuple[str, float]]) -> None:
        line = f"| {label} |"
        for size in sizes:
            ours = [cell([t for t in trials if t.pods == size and t.system == "kubegpu" and t.variant == v])
                    for v in variants]
            line += "".join(f" {o[0]} |" for o in ours)
            if karpenter:
                theirs = cell([t for t in trials if t.pods == size and t.system == "karpenter"])
                line += f" {theirs[0]} |"
            if ratios_shown:
                line += "".join(f" {o[1] / theirs[1]:.2f}× |" if theirs[1] and theirs[1] == theirs[1] else " – |"
                                for o in ours)
        rows.append(line)

    def timed(ts: list[Trial]) -> list[Trial]:
        return [t for t in ts if t.all_bound_s == t.all_bound_s]

    row("trials (all pods bound)", lambda ts: (f"{len(ts)} ({len(timed(ts))})", float(len(ts))))
    row("seconds until every pod is bound", lambda ts: (
        f"{_mean([t.all_bound_s for t in timed(ts)]):.1f}" if timed(ts) else "– (none within the timeout)",
        _mean([t.all_bound_s for t in timed(ts)])))
    row("first pod bound after", lambda ts: (_span([t.first_bound_s for t in ts if t.first_bound_s > 0]),
                                             _mean([t.first_bound_s for t in ts])))
    for label, attr in (("half the pods bound after (s)", "bound_p50_s"), ("9 in 10 bound after (s)", "bound_p90_s"),
                        ("last used NodeClaim created after (s)", "last_claim_s")):
        row(label, lambda ts, a=attr: (_whole(_mean([getattr(t, a) for t in ts])),   # type: ignore[misc]
                                       _mean([getattr(t, a) for t in ts])))
    row("NodeClaims launched", lambda ts: (f"{_mean([t.launched for t in ts]):.0f}", _mean([t.launched for t in ts])))
    row("NodeClaims empty at the end", lambda ts: (f"{_mean([t.empty for t in ts]):.1f}",
                                                   _mean([t.empty for t in ts])))
    row("none empty after the last bind (s)", lambda ts: (
        _span([t.empty_gone_s for t in ts if t.empty_gone_s == t.empty_gone_s])
        + (f" ({sum(1 for t in ts if t.empty_gone_s != t.empty_gone_s)} of {len(ts)}: not within the settle time)"
           if any(t.empty_gone_s != t.empty_gone_s for t in ts) else ""),
        _mean([t.empty_gone_s for t in ts])))
    row("price per hour (non-empty nodes)", lambda ts: (
        f"${_mean([t.price for t in ts]):,.0f} (${_mean([t.price_used for t in ts]):,.0f})",
        _mean([t.price for t in ts])))
    row("autoscaler CPU seconds", lambda ts: (f"{_mean([t.cpu_s for t in ts]):.1f}", _mean([t.cpu_s for t in ts])))
    row("autoscaler peak RSS", lambda ts: (f"{_mean([t.rss_mib for t in ts]):.0f} MiB",
                                           _mean([t.rss_mib for t in ts])))
    def component_cpu(name: str) -> Callable[[list[Trial]], tuple[str, float]]:
        def cell(ts: list[Trial]) -> tuple[str, float]:
            mean = _mean([t.plane_cpu.get(name, 0.0) for t in ts])
            return f"{mean:.1f}", mean
        return cell

    for component in ("kube-apiserver", "kube-scheduler"):
        row(f"{component} CPU seconds", component_cpu(component))
    row("CPU seconds, control plane and autoscaler together", lambda ts: (
        f"{_mean([sum(t.plane_cpu.values()) + t.cpu_s for t in ts]):.1f}",
        _mean([sum(t.plane_cpu.values()) + t.cpu_s for t in ts])))
    row("kube-apiserver writes", lambda ts: (f"{_mean([_writes(t) for t in ts]):,.0f}",
                                             _mean([_writes(t) for t in ts])))
    row("kube-scheduler attempts (unschedulable)", lambda ts: (
        f"{_mean([sum(t.attempts.values()) for t in ts]):,.0f} "
        f"({_mean([t.attempts.get('unschedulable', 0.0) for t in ts]):,.0f})",
        _mean([sum(t.attempts.values()) for t in ts])))
    row("pods lost (deleted after binding)", lambda ts: (f"{sum(t.lost for t in ts)}", float(sum(t.lost for t in ts))))
    return rows


NOT_COMPARABLE = """\
Not comparable, stated plainly:
- kubegpu's simulated nodes publish their GPUs one pass after registration (as a real device plugin would: its
  DaemonSet pod cannot run before); Karpenter's kwok nodes carry their GPUs from creation. Both register at once
  (registration delay 0). A provider patched to publish them at creation bound no sooner (README).
- Karpenter is one Go process using every core; kubegpu's autoscaler is one Python process. Both share this machine
  with the control plane (kube-apiserver, etcd, kube-scheduler, kube-controller-manager, kwok) and the benchmark.
- "Empty at the end" is read once no claim is empty, or when the settle time after the last bind runs out (--settle,
  30 s); "none empty after" is when that happened. With consolidation off Karpenter never removes a node, while
  kubegpu deletes a claim that ends up without pods (a claim being deleted counts as empty until it is gone).
- Autoscaler CPU seconds are read when the last pod is bound and include process start (Python imports, Go runtime);
  peak RSS is the process's high-water mark (VmHWM) at the end.
- Pods lost: pods deleted after binding (kube-controller-manager's taint eviction racing the unregistered taint,
  kubernetes#119862); they count as bound for the timing.
- kubegpu's defaults weigh $6/h per new node (`--node-cost 6`: a burst goes onto 8-GPU nodes); a column named with
  flags ran with them (`--kubegpu-args`, e.g. `--node-cost 0`: the cheapest plan by price, docs/autoscaler.md)."""


def run_e2e(args: argparse.Namespace) -> int:
    """The `--e2e` entry point: A/B/A/B trials per size, a table, the caveats."""
    from benchmarks.karpenter_e2e import SYSTEMS, Trial, kwok_binary, price_table, run_trial, write_types
    from kubegpu.testing import controlplane

    if args.from_json:  # the table again from saved trials (several runs' files combined)
        loaded = [Trial(**{**t, "load": tuple(t["load"])}) for f in args.from_json.split(",")
                  for t in json.loads(Path(f).read_text())]
        for line in table(loaded):
            print(line)
        print(f"\n{NOT_COMPARABLE}")
        return 0
    try:
        sizes = [int(s) for s in args.pods.split(",")]
    except ValueError:
        sizes = []
    if not sizes or any(s <= 0 for s in sizes) or args.trials <= 0:
        raise SystemExit(f"error: --pods and --trials: positive whole numbers (got {args.pods!r}, {args.trials})")
    systems = [s for s in SYSTEMS if s in args.systems.split(",")]
    if not systems or set(args.systems.split(",")) - set(SYSTEMS):
        raise SystemExit(f"error: --systems: comma-separated, each one of {SYSTEMS} (got {args.systems!r})")
    variants = [" ".join(shlex.split(v)) for v in args.kubegpu_args or [""]]
    binary = kwok_binary(CACHE, MODULE, VERSION)
    # SIGTERM (and SIGINT, which a shell's background job ignores otherwise) end the run through the trial's
    # `finally`: the autoscaler, the control plane and its directory go with it
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda number, _frame: sys.exit(128 + number))
    keep = Path(args.keep_logs).resolve() if args.keep_logs else None

    def say(line: str) -> None:
        print(line, flush=True)

    trials: list[Trial] = []
    with tempfile.TemporaryDirectory(prefix="kubegpu-e2e-types-") as scratch:
        types_file = Path(scratch) / "instance-types.json"
        prices = price_table(write_types(types_file))
        say(f"end to end, Karpenter {VERSION} (kwok provider) vs kubegpu autoscaler (kwok provider): "
            f"{len(prices) // 8} instance types, {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}; "
            f"pods {sizes}, {args.trials} trial(s) each, CPU-only share {args.cpu_share}, DRA share {args.dra_share}; "
            f"kube-scheduler profile: {args.scheduler}; kube-controller-manager and kube-scheduler at "
            f"{controlplane.CONTROLLER_MANAGER_QPS} and {controlplane.SCHEDULER_QPS} requests/s")
        for size in sizes:
            for index in range(args.trials):
                runs = [(s, v) for s in systems for v in (variants if s == "kubegpu" else [""])]
                for system, variant in runs:  # A/B/A/B (A/A'/B/A/A'/B with two kubegpu variants)
                    say(f"{system}{' ' + variant if variant else ''}, {size} pods, trial {index + 1}/{args.trials}")
                    timeout = args.timeout or 300.0 + 0.6 * size
                    trial = run_trial(system, size, args.cpu_share, types_file, binary, prices, timeout,
                                      args.settle, keep, say, shlex.split(variant), args.scheduler, args.dra_share)
                    trial.variant = variant
                    trials.append(trial)
                    if args.json:  # after every trial, so a run cut short keeps what it measured
                        write_durable(args.json, json.dumps([dataclasses.asdict(t) for t in trials], indent=1))
                    say(f"  all bound after {trial.all_bound_s:.1f}s; {trial.launched} claims launched, "
                        f"{trial.empty} empty; ${trial.price:,.0f}/h (${trial.price_used:,.0f}/h used); "
                        f"CPU {trial.cpu_s:.1f}s, RSS {trial.rss_mib:.0f} MiB; lost {trial.lost}; "
                        f"load {trial.load[0]:.2f} -> {trial.load[1]:.2f}")
                    top = sorted(trial.requeues.items(), key=lambda item: -item[1])[:4]
                    say(f"  kube-scheduler: attempts {dict(sorted(trial.attempts.items()))}; pods requeued by "
                        + ", ".join(f"{event} {count:.0f}" for event, count in top))
                    writes = sorted(((k, v) for k, v in trial.api_requests.items()
                                     if k.split()[0] not in ("WATCH", "LIST", "GET")), key=lambda item: -item[1])
                    say(f"  kube-apiserver writes {sum(v for _, v in writes):,.0f}: "
                        + ", ".join(f"{k} {v:.0f}" for k, v in writes[:8]))
    say("")
    for line in table(trials):
        say(line)
    say("")
    say(NOT_COMPARABLE)
    say(f"(load average {os.getloadavg()[0]:.2f} at the end)")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="500 pods only")
    parser.add_argument("--sizes", default=None, help=f"comma-separated, each one of {KARPENTER_SIZES}")
    parser.add_argument("--iterations", type=int, default=None, help="timed solves per size (default 2; --quick 1)")
    e2e = parser.add_argument_group("end to end on the real control plane (--e2e)")
    e2e.add_argument("--e2e", action="store_true", help="run the end-to-end A/B instead of the scheduling benchmark")
    e2e.add_argument("--pods", default="500", help="comma-separated burst sizes (default 500)")
    e2e.add_argument("--trials", type=int, default=1, help="trials per autoscaler and size (default 1)")
    e2e.add_argument("--cpu-share", type=float, default=0.0, help="share of CPU-only pods, 0..1 in tenths")
    e2e.add_argument("--settle", type=float, default=30.0,
                     help="at most this many seconds after the last bind, until no claim is empty, before counting")
    e2e.add_argument("--timeout", type=float, default=None, help="seconds a trial may take (default 300 + 0.6/pod)")
    e2e.add_argument("--keep-logs", default=None, help="copy each trial's component logs under this directory")
    e2e.add_argument("--json", default=None, help="write every trial's figures to this file as they come")
    e2e.add_argument("--scheduler", choices=("default", "bin-packing"), default="default",
                     help="kube-scheduler's profile in every trial: its default (spreads by free CPU and memory) or "
                          "bin-packing (MostAllocated over CPU, memory and GPUs)")
    e2e.add_argument("--systems", default="kubegpu,karpenter",
                     help="comma-separated autoscalers to run (default both, alternating); one alone to iterate")
    e2e.add_argument("--kubegpu-args", action="append", default=None,
                     help="further `kubegpu autoscaler` flags, e.g. '--node-cost 0'; given again, another kubegpu "
                          "variant in the same A/B rotation (use '' for the defaults)")
    e2e.add_argument("--dra-share", type=float, default=0.0,
                     help="share of pods whose GPUs come only through DRA claims (whole GPUs, MIG partitions, a pair "
                          "on one GPU, MPS shared four ways), 0..1 in tenths")
    e2e.add_argument("--from-json", default=None, help="print the table from files --json wrote, comma-separated")
    args = parser.parse_args()
    if args.e2e:
        for flag, share in (("--cpu-share", args.cpu_share), ("--dra-share", args.dra_share)):
            if not 0.0 <= share <= 1.0:
                raise SystemExit(f"error: {flag}: must be from 0 to 1, got {share}")
        if args.cpu_share + args.dra_share > 1.0:
            raise SystemExit("error: --cpu-share and --dra-share: together at most 1")
        return run_e2e(args)
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
