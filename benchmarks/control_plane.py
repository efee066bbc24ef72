"""Our controllers and our DRA allocator against the real control plane, each with a reference from the same run.

    python benchmarks/control_plane.py [--quick] [--what autoscaler|dra|all] [--pods 1000] [--dra-sets 200]

Starts one control plane (scripts/control-plane.sh's code; binaries from `scripts/control-plane.sh build`).

autoscaler: installs our CRDs and one GPU NodePool, creates N pending pods (1 `nvidia.com/gpu` each; 8-GPU
instance types), then runs the autoscaler — simulated kwok-style provider, real clock — until kube-scheduler has
bound every pod to the nodes it launched. Printed: wall time, API requests the autoscaler sent (counted in its HTTP
client, by method), NodeClaims, requests per decision (per NodeClaim) and per pod; and, as the reference from the
same run, the same autoscaler on the in-memory cluster (a binder standing in for kube-scheduler) with the ratio
real / in-memory wall time.

dra: the generated claim sets of the differential test (`kubegpu.testing.dragen`: each a node with our driver's
slices and one pod with 1-3 ResourceClaims) — kube-scheduler decides every pod (bound or not), and our allocator
decides the same pods' claims. Printed: the real scheduler's time from the first pod created to the last decision;
its own latency from its /metrics — `scheduler_scheduling_algorithm_duration_seconds` (PreFilter, Filter — where
DRA allocates — and Score, summed over every attempt, retries included) and the PreBind/Bind extension points of
`scheduler_framework_extension_point_duration_seconds` (its API writes: claim status, binding); our allocator's
wall and CPU time for the same claims (parsing included); the ratios; and whether the two agreed.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.autoscaler.builders: the shared builders

from kubegpu.autoscaler.controller import Autoscaler, Options
from kubegpu.autoscaler.provider import SimulatedProvider
from kubegpu.clock import RealClock
from kubegpu.dra.classes import shipped_class_objects
from kubegpu.errors import KubegpuError
from kubegpu.kube import Cluster
from kubegpu.scheduling.dra import parse_all
from kubegpu.testing import controlplane, dragen, drareal, k8sbuild
from kubegpu.testing.controlplane import ControlPlane
from kubegpu.testing.kubeconfig import RequestCounter, admin_client
from kubegpu.testing.session import RealCluster, install_crds, wait_for
from tests.autoscaler.builders import Harness, instance_type, nodepool, pod

ROOT = Path(__file__).resolve().parents[1]
A100 = "A100-SXM4-80GB"
TYPES = [instance_type("a100.x8", 96, 1024, 32.0, gpus=8, model=A100)]
POOL = "bench-gpu"


def pods(count: int, namespace: str) -> list[dict[str, Any]]:
    return [pod(f"bench-{i:05d}", cpu="1", memory="2Gi", namespace=namespace, limits={"nvidia.com/gpu": 1},
                spec={"nodeSelector": {"bench-pool": POOL}}) for i in range(count)]


def bound_count(cluster: Cluster, namespace: str) -> int:
    return sum(1 for p in cluster.list("Pod", namespace) if (p.get("spec") or {}).get("nodeName"))


def run_real(plane: ControlPlane, count: int, timeout: float, say: Callable[[str], None]) -> dict[str, float]:
    from kubegpu.kube.lightkube_cluster import LightkubeCluster

    real = RealCluster(plane)
    install_crds(real, sorted((ROOT / "deploy" / "crds").glob("*.yaml")))
    namespace = real.create_namespace("bench")
    setup = real.cluster()
    setup.create(nodepool(POOL, labels={"bench-pool": POOL}))
    created = time.monotonic()
    for manifest in pods(count, namespace):
        setup.create(manifest)
    say(f"{count} pending pods created in {time.monotonic() - created:.1f}s")

    client = admin_client(plane.kubeconfig)
    counter = RequestCounter().attach(client)
    cluster = LightkubeCluster(client)
    clock = RealClock()
    scaler = Autoscaler(cluster, SimulatedProvider(cluster, TYPES, clock, registration_delay=0.0), clock,
                        Options(batch_idle=1.0, batch_max=10.0, disruption=False))
    started = time.monotonic()
    passes = 0

    def step() -> bool:
        nonlocal passes
        scaler.step()
        passes += 1
        return bound_count(setup, namespace) == count

    try:
        wait_for(step, f"kube-scheduler to bind all {count} pods", timeout, interval=0.05)
    finally:
        scaler.close()
    wall = time.monotonic() - started
    claims = len(cluster.list("NodeClaim"))
    for method, number in sorted(counter.by_method.items()):
        say(f"  {method:6} {number}")
    return {"wall": wall, "requests": float(counter.total), "claims": float(claims), "passes": float(passes)}


def run_memory(count: int) -> dict[str, float]:
    """The reference: the same autoscaler and pods on the in-memory cluster, with the harness's binder."""
    harness = Harness(TYPES, registration_delay=0.0, disruption=False, validation_delay=0.0)
    harness.add(nodepool(POOL, labels={"bench-pool": POOL}))
    for manifest in pods(count, "default"):
        harness.add(manifest)
    started = time.monotonic()
    passes = 0
    while bound_count(harness.cluster, "default") < count:
        harness.run(1.0)
        passes += 1
        if passes > 600:
            raise KubegpuError("in-memory reference did not bind every pod in 600 simulated seconds")
    return {"wall": time.monotonic() - started, "claims": float(len(harness.claims())), "passes": float(passes)}


def run_dra(plane: ControlPlane, count: int, seed: int, timeout: float) -> dict[str, Any]:
    """kube-scheduler vs our allocator on `count` generated claim sets (one node and one pod each)."""
    api = drareal.RawApi(admin_client(plane.kubeconfig))
    classes = shipped_class_objects()
    for device_class in classes:
        with contextlib.suppress(KubegpuError):
            api.create(device_class)
    parsed = {c.name: c for c in parse_all(classes, "DeviceClass", "classes")}
    namespace = RealCluster(plane).create_namespace("dra-bench")
    prefix = f"drb{uuid.uuid4().hex[:5]}"
    # no holder pods here: one wave of pods, timed from the first created to the last decided
    sets = [dataclasses.replace(s, holder=None) for s in dragen.generate(count, seed, namespace, prefix)]
    port = plane.ports["kube-scheduler"]
    try:
        nodes = drareal.create_all(api, [dragen.node_object(s, prefix) for s in sets])
        drareal.submit_slices_and_claims(api, sets, nodes)
        before = drareal.scheduler_metrics(plane.directory, port)
        first_pod = time.monotonic()
        drareal.create_all(api, [dragen.pod_object(s, namespace) for s in sets])
        real, decided_at = drareal.wait_decided(api, {s.pod_name: s.pod_claims() for s in sets}, namespace,
                                                timeout=timeout, settle=1.0, interval=0.2)
        after = drareal.scheduler_metrics(plane.directory, port)
    finally:
        drareal.cleanup(api, prefix)
    wall, cpu = time.monotonic(), time.process_time()
    ours = {s.pod_name: dragen.ours(s, parsed) for s in sets}
    ours_wall, ours_cpu = time.monotonic() - wall, time.process_time() - cpu
    attempts = _delta(after, before, "scheduler_scheduling_attempt_duration_seconds")
    algorithm = _delta(after, before, "scheduler_scheduling_algorithm_duration_seconds")
    points = _delta(after, before, "scheduler_framework_extension_point_duration_seconds")
    return {"sets": count, "real_wall": decided_at - first_pod, "attempts": attempts, "algorithm": algorithm,
            "points": points,
            "ours_wall": ours_wall, "ours_cpu": ours_cpu, "comparison": dragen.compare(sets, ours, real)}


def _delta(after: str, before: str, name: str, **labels: str) -> dict[str, tuple[float, float]]:
    """Per series (sum, count) of a histogram between two scrapes."""
    old = drareal.histogram_totals(before, name, **labels)
    return {key: (total - old.get(key, (0.0, 0.0))[0], n - old.get(key, (0.0, 0.0))[1])
            for key, (total, n) in drareal.histogram_totals(after, name, **labels).items()}


def report_dra(result: dict[str, Any]) -> None:
    attempts = result["attempts"]
    by_result = ", ".join(f"{key.split('result=')[-1]} {n:.0f}" for key, (_, n) in sorted(attempts.items()) if n)
    algorithm = sum(total for total, _ in result["algorithm"].values())
    points: dict[str, float] = {}
    for key, (total, _) in result["points"].items():
        point = dict(part.split("=", 1) for part in key.split(",") if "=" in part).get("extension_point", "?")
        points[point] = points.get(point, 0.0) + total
    writes = points.get("PreBind", 0.0) + points.get("Bind", 0.0)
    ours = result["ours_wall"]
    print(f"DRA allocation, {result['sets']} generated pods (1-3 claims each, one node each): "
          f"{result['comparison'].summary()}")
    print(f"  kube-scheduler: {result['real_wall']:.2f}s from the first pod created to the last decided "
          f"(attempts: {by_result}); from its /metrics: scheduling algorithm {algorithm:.2f}s (PreFilter "
          f"{points.get('PreFilter', 0.0):.2f}s, Filter {points.get('Filter', 0.0):.2f}s: the DRA allocation), "
          f"API writes {writes:.2f}s (PreBind: claim status, Bind)")
    print(f"  our allocator (kubegpu.scheduling.dra): {ours:.2f}s wall, {result['ours_cpu']:.2f}s CPU "
          "for the same claims (parsing included)")
    print(f"  ratio kube-scheduler / ours: end to end {result['real_wall'] / max(ours, 1e-6):.2f}x, "
          f"scheduling algorithm alone {algorithm / max(ours, 1e-6):.2f}x")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--what", choices=("autoscaler", "dra", "all"), default="all")
    parser.add_argument("--pods", type=int, default=1000, help="autoscaler: pending pods")
    parser.add_argument("--dra-sets", type=int, default=200, help="dra: generated claim sets (one pod each)")
    parser.add_argument("--seed", type=int, default=1, help="dra: generator seed")
    parser.add_argument("--quick", action="store_true", help="100 pods, 60 claim sets")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds to wait for the real scheduler")
    args = parser.parse_args(argv)
    count = 100 if args.quick else args.pods
    sets = 60 if args.quick else args.dra_sets
    if count < 1 or sets < 1:
        parser.error("--pods and --dra-sets must be at least 1")
    missing = k8sbuild.missing_binaries()
    if missing:
        print(f"error: {k8sbuild.bin_dir()}: missing {', '.join(missing)}; run scripts/control-plane.sh build",
              file=sys.stderr)
        return 1
    with tempfile.TemporaryDirectory(prefix="kubegpu-bench-") as tmp:
        began = time.monotonic()
        try:
            plane = controlplane.up(Path(tmp), nodes=0)
            print(f"control plane up in {time.monotonic() - began:.1f}s")
            real = run_real(plane, count, args.timeout, print) if args.what != "dra" else None
            dra = run_dra(plane, sets, args.seed, args.timeout) if args.what != "autoscaler" else None
        except KubegpuError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
        finally:
            controlplane.down(Path(tmp))
    if real is not None:
        memory = run_memory(count)
        print(f"autoscaler, {count} pending GPU pods -> bound by the real kube-scheduler")
        print(f"  real API server: {real['wall']:.1f}s wall, {real['passes']:.0f} passes, {real['claims']:.0f} "
              f"NodeClaims, {real['requests']:.0f} API requests = "
              f"{real['requests'] / max(real['claims'], 1):.1f} per NodeClaim, {real['requests'] / count:.2f} per pod")
        print(f"  in-memory reference: {memory['wall']:.1f}s wall, {memory['claims']:.0f} NodeClaims")
        print(f"  ratio real / in-memory wall time: {real['wall'] / max(memory['wall'], 1e-6):.2f}x")
    if dra is not None:
        report_dra(dra)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
