"""The autoscaler against the real API server: from N pending GPU pods to N pods bound by the real kube-scheduler.

    python benchmarks/control_plane.py [--quick] [--pods 1000]

Starts a control plane (scripts/control-plane.sh's code; binaries from `scripts/control-plane.sh build`), installs
our CRDs and one GPU NodePool, creates N pending pods (1 `nvidia.com/gpu` each; 8-GPU instance types), then runs the
autoscaler — simulated kwok-style provider, real clock — until kube-scheduler has bound every pod to the nodes it
launched. Printed: wall time, API requests the autoscaler sent (counted in its HTTP client, by method), NodeClaims,
requests per decision (per NodeClaim) and per pod; and, as the reference from the same run, the same autoscaler on
the in-memory cluster (a binder standing in for kube-scheduler) with the ratio real / in-memory wall time.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.autoscaler.builders: the shared builders

from kubegpu.autoscaler.controller import Autoscaler, Options
from kubegpu.autoscaler.provider import SimulatedProvider
from kubegpu.clock import RealClock
from kubegpu.errors import KubegpuError
from kubegpu.kube import Cluster
from kubegpu.testing import controlplane, k8sbuild
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


def run_real(count: int, timeout: float, say: Callable[[str], None]) -> dict[str, float]:
    from kubegpu.kube.lightkube_cluster import LightkubeCluster

    missing = k8sbuild.missing_binaries()
    if missing:
        raise KubegpuError(f"{k8sbuild.bin_dir()}: missing {', '.join(missing)}; run scripts/control-plane.sh build")
    with tempfile.TemporaryDirectory(prefix="kubegpu-bench-") as tmp:
        began = time.monotonic()
        plane = controlplane.up(Path(tmp), nodes=0)
        say(f"control plane up in {time.monotonic() - began:.1f}s")
        try:
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

            wait_for(step, f"kube-scheduler to bind all {count} pods", timeout, interval=0.05)
            wall = time.monotonic() - started
            claims = len(cluster.list("NodeClaim"))
            for method, number in sorted(counter.by_method.items()):
                say(f"  {method:6} {number}")
            return {"wall": wall, "requests": float(counter.total), "claims": float(claims), "passes": float(passes)}
        finally:
            controlplane.down(Path(tmp))


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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pods", type=int, default=1000)
    parser.add_argument("--quick", action="store_true", help="100 pods")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds to wait for every pod to be bound")
    args = parser.parse_args(argv)
    count = 100 if args.quick else args.pods
    if count < 1:
        parser.error("--pods must be at least 1")
    try:
        real = run_real(count, args.timeout, print)
    except KubegpuError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    memory = run_memory(count)
    print(f"autoscaler, {count} pending GPU pods -> bound by the real kube-scheduler")
    print(f"  real API server: {real['wall']:.1f}s wall, {real['passes']:.0f} passes, {real['claims']:.0f} NodeClaims, "
          f"{real['requests']:.0f} API requests = {real['requests'] / max(real['claims'], 1):.1f} per NodeClaim, "
          f"{real['requests'] / count:.2f} per pod")
    print(f"  in-memory reference: {memory['wall']:.1f}s wall, {memory['claims']:.0f} NodeClaims")
    print(f"  ratio real / in-memory wall time: {real['wall'] / max(memory['wall'], 1e-6):.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
