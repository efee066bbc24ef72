"""GPU quotas on the real control plane: what the charge policy adds to admission, and how fast the quota controller
lifts gates, each against a reference from the same run.

    python benchmarks/quota.py [--quick] [--pods 500] [--pending 5000]

Starts one control plane (scripts/control-plane.sh's code) and applies deploy/kubernetes/quota/ (without the
controller's Deployment), with the charge policies' bindings narrowed to leave one namespace out.

admission: the same GPU pod (one `nvidia.com/mig-1g.10gb`) created N times in a namespace the policies charge and N
times in one they leave out, interleaved one by one so both see the same server, sequential requests from one
client. Printed: p50 / p99 create latency of each, the p99 (and p50) the policy adds, and the ratio.

gate lifting: P GPU pods created behind the quota gate in a namespace with an ElasticQuota whose `min` covers them
all (each also behind a second gate of the benchmark's own, so kube-scheduler leaves them alone), then one pass of
the quota controller (`QuotaController.tick`, 8 API workers) lifts every quota gate. Printed: pods lifted per second
and, as the reference, a plain loop from the same client with the same 8 workers patching each pod once
(a label) — what the API server allows; the ratio controller / plain patches; the decision's own time.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.quota.apply: the shipped manifests

from kubegpu.errors import KubegpuError
from kubegpu.quota.controller import QuotaController, has_quota_gate
from kubegpu.quota.elastic import decide
from kubegpu.testing import controlplane, k8sbuild
from kubegpu.testing.session import RealCluster, wait_for

SKIP_LABEL = "quota-bench.kubegpu.io/skip"
HOLD_GATE = "bench.kubegpu.io/hold"


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))]


def install(real: RealCluster) -> None:
    from lightkube import codecs

    from tests.quota.apply import apply_all, shipped

    objects = shipped()
    for obj in objects:  # leave the reference namespace out of the charge policies (not the gate)
        if obj["kind"] in ("MutatingAdmissionPolicyBinding", "ValidatingAdmissionPolicyBinding") and \
                obj["metadata"]["name"] == "kubegpu-gpu-memory":
            obj["spec"]["matchResources"] = {"namespaceSelector": {"matchExpressions": [
                {"key": SKIP_LABEL, "operator": "DoesNotExist"}]}}
    client = real.client()
    apply_all(client, objects)
    probe = gpu_pod("default", "probe")
    wait_for(lambda: "kubegpu.io/gpu-memory" in client.create(codecs.from_dict(probe), dry_run=True).to_dict()[
        "spec"]["containers"][0]["resources"].get("requests", {}), "the charge policy", 60)


def gpu_pod(namespace: str, name: str, gates: tuple[str, ...] = ()) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": [{"name": "main", "image": "busybox",
                                            "resources": {"limits": {"nvidia.com/mig-1g.10gb": 1}}}]}
    if gates:
        spec["schedulingGates"] = [{"name": g} for g in gates]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": namespace}, "spec": spec}


def admission(real: RealCluster, count: int) -> dict[str, list[float]]:
    cluster = real.admin
    charged = real.create_namespace("charged")
    plain = real.create_namespace("plain")
    from lightkube import codecs
    from lightkube.resources.core_v1 import Namespace

    client = real.client()
    client.patch(Namespace, plain, {"metadata": {"labels": {SKIP_LABEL: "true"}}})

    def charged_in(namespace: str) -> bool:
        created = client.create(codecs.from_dict(gpu_pod(namespace, "probe")), dry_run=True).to_dict()
        return "kubegpu.io/gpu-memory" in created["spec"]["containers"][0]["resources"].get("requests", {})

    wait_for(lambda: not charged_in(plain), "the binding to leave the plain namespace out", 30)
    times: dict[str, list[float]] = {"charged": [], "plain": []}
    for i in range(count):
        for key, namespace in (("charged", charged), ("plain", plain)) if i % 2 else (("plain", plain),
                                                                                     ("charged", charged)):
            began = time.perf_counter()
            created = cluster.create(gpu_pod(namespace, f"p-{i:05d}"))
            times[key].append(time.perf_counter() - began)
            has_charge = "kubegpu.io/gpu-memory" in created["spec"]["containers"][0]["resources"]["requests"]
            if has_charge != (key == "charged"):
                raise KubegpuError(f"pod {namespace}/p-{i:05d}: charged={has_charge}, expected {key}")
    return times


def gate_lifting(real: RealCluster, pending: int) -> dict[str, float]:
    cluster = real.admin
    team = real.create_namespace("team")
    cluster.create({"apiVersion": "kubegpu.io/v1", "kind": "ElasticQuota", "metadata": {"name": "t",
                    "namespace": team}, "spec": {"min": {"kubegpu.io/gpu-memory": f"{10 * pending}Gi"}}})
    from lightkube import codecs

    client = real.client()
    wait_for(lambda: has_quota_gate(client.create(codecs.from_dict(gpu_pod(team, "probe", (HOLD_GATE,))),
                                                  dry_run=True).to_dict()), "the gate policy", 30)
    began = time.monotonic()
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda i: cluster.create(gpu_pod(team, f"g-{i:05d}", (HOLD_GATE,))), range(pending)))
    created = time.monotonic() - began
    controller = QuotaController(cluster, identity="bench", leader_elect=False)
    from kubegpu.quota.controller import quota_pod, team_quota

    pods = cluster.list("Pod", team)
    views = [v for v in map(quota_pod, pods) if v is not None]
    quotas = [team_quota(q) for q in cluster.list("ElasticQuota")]
    began = time.perf_counter()
    decision = decide(quotas, views, 0.0)
    decide_s = time.perf_counter() - began
    began = time.monotonic()
    result = controller.tick(time.time())
    lift_s = time.monotonic() - began
    if result.lifted != pending:
        raise KubegpuError(f"the controller lifted {result.lifted} of {pending} gates")
    left = [p for p in cluster.list("Pod", team) if has_quota_gate(p)]
    if left:
        raise KubegpuError(f"{len(left)} pods still gated after one pass")
    names = [p["metadata"]["name"] for p in pods]
    began = time.monotonic()
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda n: cluster.patch("Pod", n, {"metadata": {"labels": {"bench": "1"}}}, namespace=team),
                      names))
    patch_s = time.monotonic() - began
    return {"pending": pending, "created_s": created, "decide_s": decide_s, "lift_s": lift_s, "patch_s": patch_s,
            "lifted_in_decision": len(decision.lift)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pods", type=int, default=500, help="admission: pods per namespace")
    parser.add_argument("--pending", type=int, default=5000, help="gate lifting: pending gated pods")
    parser.add_argument("--quick", action="store_true", help="60 pods, 300 pending")
    args = parser.parse_args(argv)
    count, pending = (60, 300) if args.quick else (args.pods, args.pending)
    if count < 2 or pending < 1:
        parser.error("--pods must be at least 2 and --pending at least 1")
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
            real = RealCluster(plane)
            install(real)
            times = admission(real, count)
            lifting = gate_lifting(real, pending)
        except KubegpuError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
        finally:
            controlplane.down(Path(tmp))
    ms = {key: [v * 1000 for v in values] for key, values in times.items()}
    p99 = {key: percentile(values, 99) for key, values in ms.items()}
    p50 = {key: statistics.median(values) for key, values in ms.items()}
    print(f"admission, {count} pods each (one mig-1g.10gb), interleaved, sequential")
    for key in ("plain", "charged"):
        print(f"  {key:8s} p50 {p50[key]:.2f} ms  p99 {p99[key]:.2f} ms")
    print(f"  added by the charge policies: p50 {p50['charged'] - p50['plain']:+.2f} ms, "
          f"p99 {p99['charged'] - p99['plain']:+.2f} ms; ratio charged / plain "
          f"p99 {p99['charged'] / p99['plain']:.2f}x, p50 {p50['charged'] / p50['plain']:.2f}x")
    rate = lifting["pending"] / lifting["lift_s"]
    reference = lifting["pending"] / lifting["patch_s"]
    print(f"gate lifting, {pending:.0f} gated pods ({lifting['created_s']:.1f}s to create)")
    print(f"  quota controller: one pass {lifting['lift_s']:.2f}s = {rate:.0f} pods/s "
          f"(its decision {lifting['decide_s'] * 1000:.0f} ms)")
    print(f"  reference, one plain patch per pod (same client, 8 workers): {lifting['patch_s']:.2f}s = "
          f"{reference:.0f} pods/s")
    print(f"  ratio controller / plain patches: {rate / reference:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
