"""End to end beside Karpenter on the real control plane: `python benchmarks/karpenter.py --e2e` (see there).

Each trial starts a FRESH control plane (`kubegpu.testing.controlplane.up`, no nodes: what
`scripts/control-plane.sh up DIR --nodes 0` does, with kube-controller-manager's and kube-scheduler's client rate
limits at 500 requests/s, as `controlplane` sets them for every caller), installs one autoscaler and its objects,
creates the same burst of pending pods, and measures until kube-scheduler (the real one, default profile) has bound
every pod:

- Karpenter: its kwok provider (`sigs.k8s.io/karpenter/kwok`, built from the pinned tools module into the cache),
  its CRDs (copied from the module at build time), a KWOKNodeClass (`nodeRegistrationDelay: 0s`, status patched
  Ready: nothing else sets it outside Karpenter's own test harness) and a NodePool (consolidation off, on-demand);
  settings from ../shared/reference/karpenter-kwok.md.
- kubegpu: its CRDs (deploy/crds), a NodePool (consolidation off, on-demand) and `kubegpu autoscaler --provider
  kwok --registration-delay 0 --no-disruption`.

Both read the SAME instance-types file: the shipped catalogue in the kwok JSON format, capacity type spelled
`karpenter.sh/capacity-type` (the key Karpenter's kwok provider reads; kubegpu reads both spellings).
Teardown after every trial: the autoscaler (SIGTERM, then SIGKILL), the control plane (`down`), the directory.
"""

from __future__ import annotations

import calendar
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx2 as httpx
import lightkube
from lightkube import codecs
from lightkube.generic_resource import create_global_resource
from lightkube.operators import not_equal
from lightkube.resources.core_v1 import Node, Pod

from kubegpu.autoscaler.catalog import shipped_catalogue
from kubegpu.autoscaler.instancetypes import to_kwok
from kubegpu.files import write_durable
from kubegpu.testing import controlplane
from kubegpu.testing.controlplane import free_port
from kubegpu.testing.kubeconfig import admin_client
from kubegpu.testing.processes import stop_child
from kubegpu.testing.session import RealCluster, install_crds, wait_for

ROOT = Path(__file__).resolve().parents[1]
KARPENTER_CAPACITY_KEY = "karpenter.sh/capacity-type"
KUBEGPU_CAPACITY_KEY = "kubegpu.io/capacity-type"
ZONE_KEY = "topology.kubernetes.io/zone"
TYPE_KEY = "node.kubernetes.io/instance-type"
GPU = "nvidia.com/gpu"
GPU_CYCLE = (1, 1, 1, 1, 2, 2, 2, 4, 4, 8)  # per 10 GPU pods: 4 x 1 GPU, 3 x 2, 2 x 4, 1 x 8
CPU_ONLY = (("500m", "1Gi"), ("1", "2Gi"), ("2", "4Gi"), ("4", "8Gi"))
POOL = "bench"
NAMESPACE = "burst"
SYSTEMS = ("kubegpu", "karpenter")
# kube-scheduler's profiles a trial can run under: its default (NodeResourcesFit scores LeastAllocated: a pod goes to
# the node with the most free CPU and memory, so small pods spread onto big nodes), or bin-packing (MostAllocated over
# CPU, memory and GPUs: a pod goes to the fullest node it fits, the scoring GPU clusters are often run with)
SCHEDULER_PROFILES: dict[str, list[dict[str, Any]] | None] = {
    "default": None,
    "bin-packing": [{"schedulerName": "default-scheduler", "pluginConfig": [{"name": "NodeResourcesFit", "args": {
        "scoringStrategy": {"type": "MostAllocated", "resources": [
            {"name": "cpu", "weight": 1}, {"name": "memory", "weight": 1}, {"name": GPU, "weight": 1}]}}}]}],
}
KarpenterNodeClaim = create_global_resource("karpenter.sh", "v1", "NodeClaim", "nodeclaims")
KarpenterNodePool = create_global_resource("karpenter.sh", "v1", "NodePool", "nodepools")
KWOKNodeClass = create_global_resource("karpenter.kwok.sh", "v1alpha1", "KWOKNodeClass", "kwoknodeclasses")
KubegpuNodeClaim = create_global_resource("kubegpu.io", "v1", "NodeClaim", "nodeclaims")


# ------------------------------------------------------------------------------------------------ build and inputs


def kwok_binary(cache: Path, module: Path, version: str) -> Path:
    """Karpenter's kwok provider, built once from the pinned tools module; its CRDs copied beside it."""
    binary, crds = cache / "karpenter-kwok", cache / "crds"
    if binary.exists() and crds.is_dir():
        return binary
    go = shutil.which("go")
    if go is None:
        raise SystemExit("error: Go is needed to build Karpenter's kwok provider (see docs/testing.md)")
    cache.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "GOFLAGS": "-mod=mod -buildvcs=false"}
    started = time.monotonic()
    print(f"building Karpenter {version}'s kwok provider into {binary} (once; minutes)", flush=True)
    partial = binary.with_suffix(".partial")
    subprocess.run([go, "build", "-o", str(partial), "sigs.k8s.io/karpenter/kwok"], cwd=module, env=env, check=True)
    source = Path(subprocess.run([go, "list", "-m", "-f", "{{.Dir}}", "sigs.k8s.io/karpenter"], cwd=module, env=env,
                                 check=True, capture_output=True, text=True).stdout.strip())
    crds.mkdir(exist_ok=True)
    for path in [*(source / "pkg/apis/crds").glob("*.yaml"), *(source / "kwok/apis/crds").glob("*.yaml")]:
        shutil.copyfile(path, crds / path.name)
    os.replace(partial, binary)
    print(f"built Karpenter's kwok provider in {time.monotonic() - started:.0f}s", flush=True)
    return binary


def instance_types() -> list[dict[str, Any]]:
    """The shipped catalogue in kwok JSON, capacity type under Karpenter's key (the file both autoscalers read)."""
    entries = to_kwok(shipped_catalogue())
    for entry in entries:
        for offering in entry["offerings"]:
            for requirement in offering["Requirements"]:
                if requirement["key"] == KUBEGPU_CAPACITY_KEY:
                    requirement["key"] = KARPENTER_CAPACITY_KEY
    return entries


def price_table(entries: list[dict[str, Any]]) -> dict[tuple[str, str, str], float]:
    """(instance type, zone, capacity type) -> $/h, from the same file."""
    table = {}
    for entry in entries:
        for offering in entry["offerings"]:
            keys = {r["key"]: r["values"][0] for r in offering["Requirements"]}
            table[(entry["name"], keys[ZONE_KEY], keys[KARPENTER_CAPACITY_KEY])] = float(offering["Price"])
    return table


# per 10 pods whose GPUs come through DRA claims (--dra-share): 4 whole GPUs, 2 `mig-1g.10gb` partitions, 2 pairs of a
# 1g.10gb and a 3g.40gb partition of the same GPU (`matchAttribute` on the parent), 2 pods of a GPU shared through MPS
# (one ResourceClaim for every MPS_SHARE of them)
DRA_CYCLE = ("gpu", "gpu", "gpu", "gpu", "mig", "mig", "pair", "pair", "mps", "mps")
MPS_SHARE = 4
_PROFILE = "device.attributes['gpu.nvidia.com'].profile == '{}'"


def _claim_spec(*requests: tuple[str, str, str | None], match: bool = False) -> dict[str, Any]:
    """(request name, device class, profile or None) → a ResourceClaim spec."""
    made = [{"name": name, "exactly": {"deviceClassName": device_class, **(
        {"selectors": [{"cel": {"expression": _PROFILE.format(profile)}}]} if profile else {})}}
        for name, device_class, profile in requests]
    constraints = [{"requests": [r[0] for r in requests], "matchAttribute": "gpu.nvidia.com/parentUUID"}] \
        if match else []
    return {"devices": {"requests": made, **({"constraints": constraints} if constraints else {})}}


CLAIM_SPECS = {
    "gpu": _claim_spec(("gpu", "gpu.nvidia.com", None)),
    "mig": _claim_spec(("mig", "mig.nvidia.com", "1g.10gb")),
    "pair": _claim_spec(("small", "mig.nvidia.com", "1g.10gb"), ("large", "mig.nvidia.com", "3g.40gb"), match=True),
    "mps": _claim_spec(("gpu", "mps.gpu.kubegpu.io", None)),
}


def dra_objects(pods: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The DeviceClasses, one ResourceClaimTemplate per claim shape and the shared MPS claims the burst's pods use."""
    from kubegpu.dra.classes import shipped_class_objects

    shared = sorted({ref["resourceClaimName"] for p in pods for ref in p["spec"].get("resourceClaims") or ()
                     if "resourceClaimName" in ref})
    if not any(p["spec"].get("resourceClaims") for p in pods):
        return []
    templates = [{"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
                  "metadata": {"name": kind, "namespace": NAMESPACE}, "spec": {"spec": spec}}
                 for kind, spec in CLAIM_SPECS.items() if kind != "mps"]
    claims = [{"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
               "metadata": {"name": name, "namespace": NAMESPACE}, "spec": CLAIM_SPECS["mps"]} for name in shared]
    return [*shipped_class_objects(), *templates, *claims]


def burst(count: int, cpu_share: float = 0.0, dra_share: float = 0.0) -> list[dict[str, Any]]:
    """`count` pending pods: in every 10, round(10 x cpu_share) CPU-only ones, then round(10 x dra_share) whose GPUs
    come through claims (DRA_CYCLE), the rest GPU pods in the issue's mix (4 x 1 GPU, 3 x 2, 2 x 4, 1 x 8 per 10 GPU
    pods), each asking 2 CPU and 8Gi per GPU."""
    cpu_per_ten, dra_per_ten = round(10 * cpu_share), round(10 * dra_share)
    pods, gpu_pods, cpu_pods, dra_pods, mps_pods = [], 0, 0, 0, 0
    for i in range(count):
        claims: list[dict[str, Any]] = []
        if i % 10 < cpu_per_ten:
            cpu, memory = CPU_ONLY[cpu_pods % len(CPU_ONLY)]
            cpu_pods += 1
            resources: dict[str, Any] = {"requests": {"cpu": cpu, "memory": memory}}
        elif i % 10 < cpu_per_ten + dra_per_ten:
            kind = DRA_CYCLE[dra_pods % len(DRA_CYCLE)]
            dra_pods += 1
            if kind == "mps":
                claims = [{"name": "gpu", "resourceClaimName": f"mps-{mps_pods // MPS_SHARE:04d}"}]
                mps_pods += 1
            else:
                claims = [{"name": "gpu", "resourceClaimTemplateName": kind}]
            resources = {"requests": {"cpu": "2", "memory": "8Gi"}, "claims": [{"name": "gpu"}]}
        else:
            gpus = GPU_CYCLE[gpu_pods % len(GPU_CYCLE)]
            gpu_pods += 1
            resources = {"requests": {"cpu": str(2 * gpus), "memory": f"{8 * gpus}Gi", GPU: str(gpus)},
                         "limits": {GPU: str(gpus)}}
        pods.append({"apiVersion": "v1", "kind": "Pod",
                     "metadata": {"name": f"burst-{i:05d}", "namespace": NAMESPACE, "labels": {"app": "burst"}},
                     "spec": {"containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10",
                                              "resources": resources}],
                              **({"resourceClaims": claims} if claims else {}),
                              "terminationGracePeriodSeconds": 0}})
    return pods


# ------------------------------------------------------------------------------------------------ the autoscalers


@dataclass
class Launched:
    """One autoscaler process and what it needs torn down."""

    process: subprocess.Popen[bytes]
    claim_kind: Any
    log: Path


def _wait_http(url: str, process: subprocess.Popen[bytes], what: str, timeout: float = 60.0) -> None:
    def answered() -> bool:
        if process.poll() is not None:
            raise SystemExit(f"error: {what} exited with status {process.returncode} before it was ready")
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                return bool(response.status == 200)
        except OSError:
            return False

    wait_for(answered, f"{what} at {url}", timeout, interval=0.2)


def _spawn(args: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with open(log, "wb") as out:
        return subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True)


def start_karpenter(real: RealCluster, directory: Path, types_file: Path, binary: Path) -> Launched:
    client = real.admin.client
    install_crds(real, sorted((binary.parent / "crds").glob("*.yaml")))
    client.create(KWOKNodeClass.from_dict({"apiVersion": "karpenter.kwok.sh/v1alpha1", "kind": "KWOKNodeClass",
                                           "metadata": {"name": "default"},
                                           "spec": {"nodeRegistrationDelay": "0s"}}))
    generation = (client.get(KWOKNodeClass, "default").to_dict()["metadata"].get("generation")) or 1
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    client.patch(KWOKNodeClass.Status, "default", {"status": {"conditions": [
        {"type": "Ready", "status": "True", "reason": "Ready", "message": "", "lastTransitionTime": now,
         "observedGeneration": generation}]}}, patch_type=lightkube.types.PatchType.MERGE)
    client.create(KarpenterNodePool.from_dict({
        "apiVersion": "karpenter.sh/v1", "kind": "NodePool", "metadata": {"name": POOL},
        "spec": {"template": {"spec": {
            "nodeClassRef": {"group": "karpenter.kwok.sh", "kind": "KWOKNodeClass", "name": "default"},
            "requirements": [{"key": KARPENTER_CAPACITY_KEY, "operator": "In", "values": ["on-demand"]}],
            "expireAfter": "Never"}},
            "disruption": {"consolidationPolicy": "WhenEmptyOrUnderutilized", "consolidateAfter": "Never"}}}))
    health = free_port()
    env = {**os.environ, "KUBECONFIG": str(real.kubeconfig), "DISABLE_LEADER_ELECTION": "true",
           "METRICS_PORT": str(free_port()), "HEALTH_PROBE_PORT": str(health),
           "INSTANCE_TYPES_FILE_PATH": str(types_file), "LOG_LEVEL": "info"}
    log = directory / "logs" / "karpenter.log"
    process = _spawn([str(binary)], env, log)
    launched = Launched(process, KarpenterNodeClaim, log)
    try:
        _wait_http(f"http://127.0.0.1:{health}/readyz", process, "Karpenter")

        def pool_ready() -> bool:
            status = client.get(KarpenterNodePool, POOL).to_dict().get("status") or {}
            return any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or [])

        wait_for(pool_ready, f"Karpenter NodePool {POOL} Ready", 60.0, interval=0.5)
    except BaseException:
        stop(launched)
        raise
    return launched


def start_kubegpu(real: RealCluster, directory: Path, types_file: Path, extra: Sequence[str] = ()) -> Launched:
    install_crds(real, sorted((ROOT / "deploy" / "crds").glob("*.yaml")))
    real.admin.create({"apiVersion": "kubegpu.io/v1", "kind": "NodePool", "metadata": {"name": POOL},
                       "spec": {"template": {"spec": {"requirements": [
                           {"key": KUBEGPU_CAPACITY_KEY, "operator": "In", "values": ["on-demand"]}],
                           "expireAfter": "Never"}},
                           "disruption": {"consolidationPolicy": "WhenEmptyOrUnderutilized",
                                          "consolidateAfter": "Never"}}})
    metrics = free_port()
    env = {**os.environ, "KUBECONFIG": str(real.kubeconfig)}
    log = directory / "logs" / "kubegpu-autoscaler.log"
    process = _spawn([sys.executable, "-m", "kubegpu", "autoscaler", "--provider", "kwok", "--instance-types",
                      str(types_file), "--registration-delay", "0", "--no-disruption", "--identity", "bench",
                      "--metrics-address", f"127.0.0.1:{metrics}", *extra], env, log)
    launched = Launched(process, KubegpuNodeClaim, log)
    try:
        _wait_http(f"http://127.0.0.1:{metrics}/metrics", process, "kubegpu autoscaler")
    except BaseException:
        stop(launched)
        raise
    return launched


def stop(launched: Launched) -> None:
    """SIGTERM the autoscaler's process group, SIGKILL after 20 s; always reaps it."""
    stop_child(launched.process, 20)


# ------------------------------------------------------------------------------------------------ measuring


def cpu_seconds(pid: int) -> float:
    """User + system CPU of a live process, from /proc (0 when it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def peak_rss_mib(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def plane_cpu(directory: Path) -> dict[str, float]:
    """CPU seconds of each control-plane component so far (DIR/pids lists them)."""
    out: dict[str, float] = {}
    for line in (directory / "pids").read_text().splitlines():
        pid, name = line.split()[:2]
        out[name] = out.get(name, 0.0) + cpu_seconds(int(pid))
    return out


@dataclass
class Trial:
    system: str
    pods: int
    all_bound_s: float = float("nan")
    first_bound_s: float = float("nan")
    launched: int = 0
    claims: int = 0
    empty: int = 0
    lost: int = 0
    price: float = 0.0
    price_used: float = 0.0
    cpu_s: float = 0.0
    rss_mib: float = 0.0
    plane_cpu: dict[str, float] = field(default_factory=dict)
    load: tuple[float, float] = (0.0, 0.0)
    variant: str = ""   # the further `kubegpu autoscaler` flags this trial ran with (--kubegpu-args)
    scheduler: str = "default"   # kube-scheduler's profile (SCHEDULER_PROFILES)
    dra_share: float = 0.0       # share of pods whose GPUs come through DRA claims (--dra-share)
    # seconds from the first pod create (API timestamps, whole seconds): when half and nine tenths of the pods were
    # bound, and when the last NodeClaim that ended up used was created: where the time to bind every pod goes
    bound_p50_s: float = float("nan")
    bound_p90_s: float = float("nan")
    last_claim_s: float = float("nan")
    # kube-scheduler's own counters at the last bind: scheduling attempts by result, and pods moved back to its
    # active or backoff queue by the cluster event that moved them (where its CPU goes)
    attempts: dict[str, float] = field(default_factory=dict)
    requeues: dict[str, float] = field(default_factory=dict)
    api_requests: dict[str, float] = field(default_factory=dict)   # kube-apiserver's requests by "VERB resource"
    # seconds from the last bind until no NodeClaim was without pods (nan: some still were when the settle time
    # ran out; a claim being deleted counts until it is gone, as its instance is billed until then)
    empty_gone_s: float = float("nan")


def _create_all(clients: list[lightkube.Client], objects: list[Any], done: threading.Event,
                errors: list[str]) -> None:
    """Create the pods from several clients at once. The objects and clients are built before any thread starts:
    lightkube's model classes, converted for the first time from several threads at once, crashed the interpreter
    (a segmentation fault in its msgspec-based `from_dict`)."""
    threads = len(clients)

    def create(index: int) -> None:
        for obj in objects[index::threads]:
            try:
                clients[index].create(obj)
            except lightkube.ApiError as exc:
                errors.append(f"create {obj.metadata.name if obj.metadata else '?'}: {exc}")

    try:
        with ThreadPoolExecutor(threads) as pool:
            list(pool.map(create, range(threads)))
    finally:
        done.set()


def measure(real: RealCluster, launched: Launched, trial: Trial, pods: list[dict[str, Any]],
            prices: dict[tuple[str, str, str], float], timeout: float, settle: float,
            say: Callable[[str], None]) -> None:
    """Create the burst, wait until every pod is bound, then read claims, nodes and prices."""
    client = real.admin.client
    created, errors = threading.Event(), list[str]()
    seen: set[str] = set()
    objects = [codecs.from_dict(manifest) for manifest in pods]
    clients = [admin_client(real.kubeconfig) for _ in range(8)]
    _ = [p.to_dict() for p in client.list(Pod, namespace=NAMESPACE)]  # the list path once, before the threads
    started, wall = time.monotonic(), time.time()
    creator = threading.Thread(target=_create_all, args=(clients, objects, created, errors), daemon=True)
    creator.start()
    deadline, next_claims = started + timeout, 0.0
    while True:
        now = time.monotonic()
        if launched.process.poll() is not None:
            raise SystemExit(f"error: {trial.system} exited with status {launched.process.returncode}; "
                             f"log {launched.log}")
        try:
            if now >= next_claims:
                seen.update(c.to_dict()["metadata"]["name"] for c in client.list(launched.claim_kind))
                next_claims = now + 3.0
            if trial.first_bound_s != trial.first_bound_s:  # nan: nothing bound yet
                if any(True for _ in client.list(Pod, namespace=NAMESPACE,
                                                 fields={"spec.nodeName": not_equal("")})):
                    trial.first_bound_s = time.monotonic() - started
                    say(f"  first pod bound after {trial.first_bound_s:.1f}s")
            elif created.is_set() and not any(
                    True for _ in client.list(Pod, namespace=NAMESPACE, fields={"spec.nodeName": ""})):
                trial.all_bound_s = time.monotonic() - started
                break
        except httpx.TransportError as exc:   # the server busy with the burst timed a poll out: poll again
            say(f"  (a poll timed out: {type(exc).__name__}; polling again)")
        if now >= deadline:
            say(f"  timed out after {timeout:.0f}s")
            break
        time.sleep(1.0)
    creator.join()
    if errors:
        raise SystemExit(f"error: {len(errors)} pod(s) not created, e.g. {errors[0]}")
    trial.cpu_s = cpu_seconds(launched.process.pid)
    trial.plane_cpu = plane_cpu(real.plane.directory)
    try:
        trial.attempts, trial.requeues = scheduler_counters(real)
        trial.api_requests = apiserver_requests(real)
    except OSError as exc:
        say(f"  (kube-scheduler's metrics not read: {exc})")
    last_bind = time.monotonic()
    while True:   # what the autoscaler does right after the last bind (e.g. delete unused claims) counts
        if not _empty_claims(client, launched.claim_kind):
            trial.empty_gone_s = time.monotonic() - last_bind
            break
        if time.monotonic() - last_bind >= settle:
            break
        time.sleep(1.0)
    all_pods = [p.to_dict() for p in client.list(Pod, namespace=NAMESPACE)]
    binds = sorted(_stamp(c.get("lastTransitionTime")) - wall for p in all_pods
                   for c in (p.get("status") or {}).get("conditions") or []
                   if c.get("type") == "PodScheduled" and c.get("status") == "True")
    if binds:
        trial.bound_p50_s, trial.bound_p90_s = binds[len(binds) // 2], binds[min(len(binds) - 1, 9 * len(binds) // 10)]
    trial.lost = len(pods) - len(all_pods)
    used_nodes = {(p.get("spec") or {}).get("nodeName") for p in all_pods} - {None, ""}
    nodes = {n["metadata"]["name"]: n for n in (node.to_dict() for node in client.list(Node))}
    claims = [c.to_dict() for c in client.list(launched.claim_kind)]
    seen.update(c["metadata"]["name"] for c in claims)
    trial.launched, trial.claims = len(seen), len(claims)
    for name, listed in (("pods", all_pods), ("nodeclaims", claims)):   # kept with the logs (--keep-logs)
        write_durable(real.plane.directory / "logs" / f"{name}.json", json.dumps(listed))
    used_claims = [_stamp(c["metadata"].get("creationTimestamp")) - wall for c in claims
                   if (c.get("status") or {}).get("nodeName") in used_nodes]
    trial.last_claim_s = max(used_claims, default=float("nan"))
    for claim in claims:
        node_name = (claim.get("status") or {}).get("nodeName")
        labels = {**((nodes.get(node_name) or {}).get("metadata", {}).get("labels") or {}),
                  **(claim["metadata"].get("labels") or {})}
        capacity = labels.get(KARPENTER_CAPACITY_KEY) or labels.get(KUBEGPU_CAPACITY_KEY) or ""
        price = prices.get((labels.get(TYPE_KEY, ""), labels.get(ZONE_KEY, ""), capacity), 0.0)
        trial.price += price
        if node_name in used_nodes:
            trial.price_used += price
        else:
            trial.empty += 1
    trial.rss_mib = peak_rss_mib(launched.process.pid)


def _empty_claims(client: lightkube.Client, claim_kind: Any) -> int:
    """NodeClaims whose node has no pod of the burst (those without a node yet included)."""
    used = {p.spec.nodeName for p in client.list(Pod, namespace=NAMESPACE) if p.spec and p.spec.nodeName}
    return sum(1 for c in client.list(claim_kind) if (c.to_dict().get("status") or {}).get("nodeName") not in used)


def _metrics_text(real: RealCluster, component: str) -> str:
    """A control-plane component's /metrics, read from its secure port with the admin's certificate."""
    import ssl

    pki = real.plane.directory / "pki"
    context = ssl.create_default_context()
    context.check_hostname, context.verify_mode = False, ssl.CERT_NONE   # components' self-signed serving certs
    context.load_cert_chain(str(pki / "admin.crt"), str(pki / "admin.key"))
    url = f"https://127.0.0.1:{real.plane.ports[component]}/metrics"
    with urllib.request.urlopen(url, timeout=30, context=context) as response:
        return str(response.read().decode())


def counts_by(text: str, sample: str, key: Callable[[dict[str, str]], str | None]) -> dict[str, float]:
    """The samples named `sample` in a Prometheus text exposition, summed by `key(labels)` (None: left out)."""
    from prometheus_client.parser import text_string_to_metric_families

    counts: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for each in family.samples:
            if each.name == sample and (name := key(each.labels)) is not None:
                counts[name] = counts.get(name, 0.0) + each.value
    return counts


def request_key(labels: dict[str, str]) -> str:
    """`apiserver_request_total`'s labels as "VERB resource[/subresource]"."""
    sub = labels.get("subresource", "")
    return f"{labels.get('verb', '')} {labels.get('resource', '')}{'/' + sub if sub else ''}"


def apiserver_requests(real: RealCluster) -> dict[str, float]:
    """kube-apiserver's `apiserver_request_total` summed by "VERB resource[/subresource]" (WATCH and LIST too)."""
    return counts_by(_metrics_text(real, "kube-apiserver"), "apiserver_request_total", request_key)


def scheduler_counters(real: RealCluster) -> tuple[dict[str, float], dict[str, float]]:
    """kube-scheduler's `scheduler_schedule_attempts_total` by result and `scheduler_queue_incoming_pods_total` by
    event (only the moves into the active and backoff queues: what sends a pod to another attempt)."""
    text = _metrics_text(real, "kube-scheduler")
    attempts = counts_by(text, "scheduler_schedule_attempts_total", lambda labels: labels.get("result", ""))
    requeues = counts_by(text, "scheduler_queue_incoming_pods_total",
                         lambda labels: labels.get("event", "") if labels.get("queue") in ("active", "backoff")
                         else None)
    return attempts, requeues


def _stamp(text: str | None) -> float:
    """An API timestamp (RFC 3339, UTC) as seconds since the epoch; nan when absent."""
    if not text:
        return float("nan")
    return calendar.timegm(time.strptime(text.replace("Z", ""), "%Y-%m-%dT%H:%M:%S"))


def run_trial(system: str, count: int, cpu_share: float, types_file: Path, binary: Path | None,
              prices: dict[tuple[str, str, str], float], timeout: float, settle: float, keep: Path | None,
              say: Callable[[str], None], kubegpu_args: Sequence[str] = (), scheduler: str = "default",
              dra_share: float = 0.0) -> Trial:
    """One fresh control plane, one autoscaler, one burst; everything torn down before returning."""
    trial = Trial(system, count, scheduler=scheduler, dra_share=dra_share)
    pods = burst(count, cpu_share, dra_share)
    directory = Path(tempfile.mkdtemp(prefix=f"kubegpu-e2e-{system}-"))
    launched: Launched | None = None
    load_before = os.getloadavg()[0]
    try:
        plane = controlplane.up(directory, nodes=0, scheduler_profiles=SCHEDULER_PROFILES[scheduler])
        real = RealCluster(plane)
        real.admin.client.create(codecs.from_dict({"apiVersion": "v1", "kind": "Namespace",
                                                   "metadata": {"name": NAMESPACE}}))
        wait_for(lambda: _has_default_account(real), f"ServiceAccount {NAMESPACE}/default")
        if system == "karpenter":
            assert binary is not None
            launched = start_karpenter(real, directory, types_file, binary)
        else:
            launched = start_kubegpu(real, directory, types_file, kubegpu_args)
        for obj in dra_objects(pods):   # DeviceClasses, claim templates, shared claims: before the burst
            real.admin.client.create(codecs.from_dict(obj))
        measure(real, launched, trial, pods, prices, timeout, settle, say)
    finally:
        if launched is not None:
            stop(launched)
        controlplane.down(directory)
        if keep is not None:
            shutil.copytree(directory / "logs", keep / f"{system}-{count}-{int(time.time())}", dirs_exist_ok=True)
        shutil.rmtree(directory, ignore_errors=True)
    trial.load = (load_before, os.getloadavg()[0])
    return trial


def _has_default_account(real: RealCluster) -> bool:
    from lightkube.resources.core_v1 import ServiceAccount

    try:
        real.admin.client.get(ServiceAccount, "default", namespace=NAMESPACE)
    except lightkube.ApiError:
        return False
    return True


def write_types(path: Path) -> list[dict[str, Any]]:
    entries = instance_types()
    write_durable(path, json.dumps(entries, indent=1) + "\n")
    return entries
