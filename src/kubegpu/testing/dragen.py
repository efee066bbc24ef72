"""Generated DRA claim sets for the differential test against the real kube-scheduler (and its benchmark).

One `ClaimSet` is a node of its own — a few GPUs of one or two catalog models, published the way our DRA driver
publishes them (`kubegpu.dra.devices` + `build_slices`): whole GPUs, static MIG (a random valid layout already
created on the simulated GPUs) or dynamic MIG (every placement, partitionable devices with shared counters), now
and then one GPU tainted by a critical XID — and one pod on that node with 1–3 ResourceClaims: ExactCount counts,
`All`, CEL selectors on attributes and capacity (product, memory, compute capability, profile, live uuid),
`firstAvailable` subrequests, `matchAttribute`/`distinctAttribute` constraints, taint tolerations. Some sets cannot
be satisfied (too many devices, a profile of another model, a constraint no pair meets, a counter conflict).

Deterministic: the same seed gives the same sets (the simulated GPUs' UUIDs derive from the node name, so the
`prefix` that keeps node names unique in a shared cluster is part of the input). Pure apart from building the
in-memory simulated node; `ours()` answers with our allocator, allocating all of a pod's claims together as the
scheduler does.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kubegpu.dra.devices import gpu_offers, read_node
from kubegpu.dra.slices import GpuHealth, build_slices
from kubegpu.gpu.backend import GpuBackendError
from kubegpu.gpu.catalog import CATALOG, GpuModel
from kubegpu.gpu.simulated import SimulatedBackend
from kubegpu.scheduling.dra import Allocator, ClaimError, DeviceClass, DeviceId, parse_all
from kubegpu.scheduling.quantity import parse_quantity

LABEL = "kubegpu.io/dra-differential"
D = "device.attributes['gpu.nvidia.com']"
C = "device.capacity['gpu.nvidia.com']"
MODELS = ("A100-SXM4-80GB", "A100-SXM4-40GB", "H100-SXM5-80GB", "A30-24GB", "H200-141GB", "L4")
XIDS = (79, 31)  # fatal (NoExecute taint) and not (NoSchedule)


@dataclass(frozen=True)
class ClaimSet:
    """One node's slices and one pod's claims (in the pod's order); `node` is unique per set. With a `holder`
    claim, a first pod holding one device (and its share of the GPU's counters) is decided before the main pod."""

    index: int
    node: str
    gpus: str
    mode: str  # whole | static | dynamic
    slices: tuple[dict[str, Any], ...]
    claims: tuple[dict[str, Any], ...]
    holder: dict[str, Any] | None = None

    @property
    def pod_name(self) -> str:
        return f"pod-{self.index:04d}"

    @property
    def holder_pod(self) -> str:
        return f"hold-{self.index:04d}"

    def pod_claims(self, holder: bool = False) -> list[str]:
        return [c["metadata"]["name"] for c in ((self.holder,) if holder and self.holder else self.claims)]




@dataclass(frozen=True)
class Decision:
    """A scheduler's answer for one set's pod: `bound` (with each claim's results), `unschedulable` (no fit on the
    node), or `error` (a claim that can never be allocated as written: kube-scheduler's SchedulerError)."""

    status: str
    allocations: Mapping[str, list[dict[str, str]]] = field(default_factory=dict)
    message: str = ""

    @property
    def bound(self) -> bool:
        return self.status == "bound"


def generate(count: int, seed: int, namespace: str, prefix: str = "drd", gpus_max: int = 3) -> list[ClaimSet]:
    """`count` claim sets; set i depends only on (seed, i, prefix, namespace)."""
    return [_one(random.Random(f"{seed}/{index}"), index, namespace, prefix, gpus_max) for index in range(count)]


def _one(rng: random.Random, index: int, namespace: str, prefix: str, gpus_max: int) -> ClaimSet:
    node = f"{prefix}-{index:04d}"
    mode = rng.choice(("whole", "static", "dynamic", "dynamic"))
    first = rng.choice(MODELS)
    # a dynamic-MIG GPU offers ~26 placements: two of them already make a large search space
    count = min(gpus_max if mode != "dynamic" else 2, rng.choice((1, 1, 2, 2, 2, 3)))
    models = [first] * count
    if count > 1 and rng.random() < 0.25:
        models[-1] = rng.choice(MODELS)
    backend = SimulatedBackend(None, gpus=",".join(f"1x{m}" for m in models), node_name=node)
    try:
        if mode == "static":
            for gpu in backend.devices():
                if CATALOG[models[gpu.index]].mig_capable and rng.random() < 0.85:
                    backend.set_mig_mode(gpu.index, True)
                    _random_layout(rng, backend, gpu.index, CATALOG[models[gpu.index]])
        unhealthy = {rng.randrange(count): GpuHealth(rng.choice(XIDS))} if rng.random() < 0.15 else {}
        offers = gpu_offers(read_node(backend), dynamic_mig=mode == "dynamic")
    finally:
        backend.close()
    slices = build_slices(node, offers, unhealthy)
    incomplete = rng.random() < 0.04  # a pool caught mid-publication: one slice still to come
    for item in slices:
        item["metadata"]["labels"] = {LABEL: prefix}
        item["spec"]["pool"]["resourceSliceCount"] += int(incomplete)
    devices = [d for item in slices for d in item["spec"].get("devices", ())]
    broad = [2]
    claims = [_claim(rng, f"s{index:04d}-c{j}", namespace, devices, models, broad)
              for j in range(rng.choice((1, 1, 1, 1, 2, 2, 3)))]
    holder = None
    healthy = [d for d in devices if "taints" not in d]
    if healthy and rng.random() < 0.3:  # one device (a MIG placement, mostly) already held by another pod
        device = rng.choice(healthy)
        exactly: dict[str, Any] = {"deviceClassName": f"{_attr(device, 'type')}.nvidia.com"}
        if _attr(device, "type") == "mig":
            exactly["selectors"] = [{"cel": {"expression": f"{D}.profile == '{_attr(device, 'profile')}'"}}]
        holder = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                  "metadata": {"name": f"s{index:04d}-h", "namespace": namespace},
                  "spec": {"devices": {"requests": [{"name": "held", "exactly": exactly}]}}}
    return ClaimSet(index, node, ",".join(models), mode, tuple(slices), tuple(claims), holder)


def _random_layout(rng: random.Random, backend: SimulatedBackend, gpu: int, model: GpuModel) -> None:
    for _ in range(rng.randint(2, 9)):
        profile = rng.choice(model.mig_profiles)
        start = rng.choice(profile.starts)
        try:
            backend.create_mig_device(gpu, profile.profile_id, start)
        except GpuBackendError:  # overlaps an instance already there: the layout simply stays smaller
            continue


# --- claims ---------------------------------------------------------------------------------------------------------


def _attr(device: Mapping[str, Any], name: str) -> Any:
    value = device.get("attributes", {}).get(name) or {}
    return next(iter(value.values()), None)


def _profiles(devices: Sequence[Mapping[str, Any]], models: Sequence[str]) -> list[str]:
    """Profiles the node offers, plus (now and then) one of a model it does not have."""
    offered = sorted({p for d in devices if (p := _attr(d, "profile"))})
    other = [p.name for m in MODELS for p in CATALOG[m].mig_profiles]
    return offered + [p for p in other if p not in offered][:1] if offered else other[:6]


def _wild_selector(rng: random.Random, kind: str, devices: Sequence[Mapping[str, Any]],
                   models: Sequence[str]) -> list[str]:
    """A selector that may or may not match anything on the node."""
    if kind == "mig":
        profile = rng.choice(_profiles(devices, models))
        choices = [f"{D}.profile == '{profile}'",
                   f"{D}.profile == '{profile}' && {C}.memory.compareTo(quantity('{rng.choice((10, 20, 40))}Gi')) >= 0",
                   f"{C}.multiprocessors.compareTo(quantity('{rng.choice((14, 28, 42))}')) >= 0",
                   f"has({D}.uuid)",
                   f"cel.bind(a, {D}, a.profile.startsWith('{rng.choice(('1g', '2g', '3g'))}'))"]
        return [rng.choice(choices)]
    products = [*sorted({CATALOG[m].product_name for m in models}), "NVIDIA H100 80GB HBM3"]
    choices = [f"{D}.productName == '{rng.choice(products)}'",
               f"{C}.memory.compareTo(quantity('{rng.choice((24, 40, 80))}Gi')) >= 0",
               f"{D}.cudaComputeCapability.isGreaterThan(semver('{rng.choice(('8.0.0', '8.5.0', '9.0.0'))}'))",
               f"{D}.productName.contains('{rng.choice(('A100', 'H', 'L4'))}')"]
    return [rng.choice(choices)] if rng.random() < 0.6 else []


def _fitting_selector(rng: random.Random, device: Mapping[str, Any]) -> list[str]:
    """A selector the given device matches (others may too)."""
    memory_gi = int(parse_quantity(device["capacity"]["memory"]["value"]) // 2**30)
    choices = [f"{C}.memory.compareTo(quantity('{memory_gi}Gi')) >= 0",
               f"{D}.productName == '{_attr(device, 'productName')}'",
               f"{D}.cudaComputeCapability.isLessThan(semver('11.0.0'))"]
    if _attr(device, "type") == "mig":
        choices += [f"{D}.profile == '{_attr(device, 'profile')}'"] * 4
    else:
        choices.append(f"{D}.productName.startsWith('{_attr(device, 'productName')[:9]}')")
    picked = rng.choice(choices)
    return [picked] if _attr(device, "type") == "mig" or rng.random() < 0.6 else []


def _exactly(rng: random.Random, devices: Sequence[Mapping[str, Any]], models: Sequence[str],
             taint: str, broad: list[int]) -> dict[str, Any]:
    """One request. `broad`: how many more "any MIG device" requests this pod may have — with dynamic MIG each has
    ~50 candidates, and three or four of them in a pod that cannot fit make an exhaustive search that runs into
    kube-scheduler's 10 s Filter timeout (and our step budget): no verdict, just CPU."""
    healthy = [d for d in devices if "taints" not in d] or list(devices)
    if devices and rng.random() < 0.85:
        device = rng.choice(healthy)
        kind = str(_attr(device, "type"))
        selectors = _fitting_selector(rng, device)
    elif rng.random() < 0.1:  # fails at run time on a whole GPU (no such key): a fatal error for the claim
        kind, selectors = "gpu", [f"{D}.profile.startsWith('1g')"]
    else:
        kind = rng.choice(("gpu", "mig"))
        selectors = _wild_selector(rng, kind, devices, models)
    if kind == "mig" and not any(".profile ==" in s for s in selectors):
        if broad[0] > 0:
            broad[0] -= 1
        else:
            selectors = [f"{D}.profile == '{rng.choice(_profiles(devices, models))}'"]
    out: dict[str, Any] = {"deviceClassName": f"{kind}.nvidia.com"}
    if selectors:
        out["selectors"] = [{"cel": {"expression": s}} for s in selectors]
    if rng.random() < 0.08:
        out["allocationMode"] = "All"
    else:
        count = rng.choice((1, 1, 1, 1, 2, 2, 3) if kind == "mig" else (1, 1, 1, 1, 1, 1, 2, 3))
        if kind == "mig" and not any(".profile ==" in s for s in selectors):
            count = 1  # "any 2 of ~50 placements" that cannot fit is a long exhaustive search; one is enough
        if count > 1:
            out["count"] = count
    if taint and rng.random() < 0.5:
        # an empty effect tolerates a NoExecute taint for the allocator, but kube-controller-manager's device taint
        # eviction (1.37) only honours tolerations that name NoExecute and evicts the pod right after binding
        effects = ("NoExecute", "NoSchedule") if taint == "NoExecute" else ("", "NoSchedule", "NoExecute")
        toleration = {"key": "gpu.nvidia.com/xid", "operator": "Exists"}
        if effect := rng.choice(effects):
            toleration["effect"] = effect
        out["tolerations"] = [toleration]
    return out


def _claim(rng: random.Random, name: str, namespace: str, devices: Sequence[Mapping[str, Any]],
           models: Sequence[str], broad: list[int]) -> dict[str, Any]:
    taint = next((t["effect"] for d in devices for t in d.get("taints", ())), "")
    requests: list[dict[str, Any]] = []
    for r in range(rng.choice((1, 1, 1, 1, 1, 2, 2, 3))):
        if rng.random() < 0.25:
            subs = [{"name": f"s{k}", **_exactly(rng, devices, models, taint, broad)} for k in range(rng.randint(2, 3))]
            requests.append({"name": f"r{r}", "firstAvailable": subs})
        else:
            requests.append({"name": f"r{r}", "exactly": _exactly(rng, devices, models, taint, broad)})
    spec: dict[str, Any] = {"requests": requests}
    if rng.random() < 0.25:
        if rng.random() < 0.7:
            attribute = rng.choice(("gpu.nvidia.com/parentUUID", "gpu.nvidia.com/productName",
                                    "gpu.nvidia.com/cudaComputeCapability", "gpu.nvidia.com/profile"))
            constraint: dict[str, Any] = {"matchAttribute": attribute}
        else:
            constraint = {"distinctAttribute": rng.choice(("gpu.nvidia.com/parentUUID",
                                                           "resource.kubernetes.io/pciBusID"))}
        if len(requests) > 2 and rng.random() < 0.5:
            constraint["requests"] = [r["name"] for r in requests[:2]]
        spec["constraints"] = [constraint]
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": namespace}, "spec": {"devices": spec}}


# --- the objects for the cluster, and our answer --------------------------------------------------------------------


def node_object(claim_set: ClaimSet, prefix: str) -> dict[str, Any]:
    """A bare Node (no kubelet, no kwok): room for pods, nothing else; the scheduler decides from its slices. Tainted,
    so that no other pod of a shared cluster lands there while it exists."""
    capacity: dict[str, Any] = {"cpu": "8", "memory": "64Gi", "pods": "10"}
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": claim_set.node, "labels": {LABEL: prefix, "kubernetes.io/hostname": claim_set.node}},
            "spec": {"taints": [{"key": LABEL, "value": prefix, "effect": "NoSchedule"}]},
            "status": {"capacity": capacity, "allocatable": capacity}}


def pod_object(claim_set: ClaimSet, namespace: str, holder: bool = False) -> dict[str, Any]:
    """The set's pod (or its holder pod), pinned to its node by a field affinity (the scheduler's PreFilter narrows
    to that one node) and tolerating every node taint (the bare node is never Ready)."""
    claims = [{"name": f"c{j}", "resourceClaimName": name} for j, name in enumerate(claim_set.pod_claims(holder))]
    name = claim_set.holder_pod if holder else claim_set.pod_name
    affinity = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [claim_set.node]}]}]}}}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": namespace},
            "spec": {"affinity": affinity, "tolerations": [{"operator": "Exists"}], "resourceClaims": claims,
                     "terminationGracePeriodSeconds": 0,
                     "containers": [{"name": "c", "image": "busybox",
                                     "resources": {"claims": [{"name": c["name"]} for c in claims]}}]}}


def ours(claim_set: ClaimSet, classes: Mapping[str, DeviceClass], holder: bool = False,
         held: Decision | None = None) -> Decision:
    """Our allocator on the set's pod (or holder pod): every claim of the pod allocated together on its node, with
    the devices `held` (the holder pod's allocation, when it got one) in use."""
    allocator = Allocator(parse_all(claim_set.slices, "ResourceSlice", claim_set.node), classes)
    objects = [claim_set.holder] if holder and claim_set.holder else list(claim_set.claims)
    claims = parse_all(objects, "ResourceClaim", claim_set.node)
    in_use = {DeviceId(r["driver"], r["pool"], r["device"]) for results in (held.allocations.values() if held else ())
              for r in results}
    try:
        answer = allocator.allocate(claim_set.node, claims, in_use)
    except ClaimError as exc:
        return Decision("error", message=str(exc))
    if answer is None:
        return Decision("unschedulable", message=allocator.last_failure)
    return Decision("bound", {key.split("/", 1)[1]: [r.to_json() for r in results] for key, results in answer.items()})


# --- comparing the two schedulers -----------------------------------------------------------------------------------

TIMED_OUT = "timed out trying to allocate devices"  # kube-scheduler's DRA Filter timeout: no verdict at all


@dataclass
class Comparison:
    """Per set: satisfiable alike, the same kind of failure (no fit / fatal error), the same devices when bound."""

    total: int = 0
    agree: int = 0
    bound: int = 0
    same_status: int = 0
    same_devices: int = 0
    inconclusive: list[str] = field(default_factory=list)  # the real scheduler timed out
    disagree: list[str] = field(default_factory=list)  # satisfiable for one, not for the other
    other_status: list[str] = field(default_factory=list)  # both not bound, one says no fit, the other error
    other_devices: list[str] = field(default_factory=list)

    def summary(self) -> str:
        decided = self.total - len(self.inconclusive)
        return (f"{self.agree}/{decided} pods agree on satisfiability ({self.bound} bound, "
                f"{decided - self.bound} not), {self.same_status}/{decided} on the kind of failure, "
                f"{self.same_devices}/{self.bound} bound with the same devices; {len(self.inconclusive)} "
                "inconclusive (kube-scheduler's Filter timed out)")


def compare(sets: Sequence[ClaimSet], ours: Mapping[str, Decision], real: Mapping[str, Decision]) -> Comparison:
    """Both schedulers' decisions per pod name (holder pods included)."""
    result = Comparison()
    for claim_set in sets:
        for pod in ([claim_set.holder_pod] if claim_set.holder else []) + [claim_set.pod_name]:
            _compare_one(result, f"{pod} ({claim_set.mode} {claim_set.gpus})", ours[pod], real[pod])
    return result


def _compare_one(result: Comparison, where: str, mine: Decision, theirs: Decision) -> None:
    result.total += 1
    if theirs.status == "error" and TIMED_OUT in theirs.message:
        result.inconclusive.append(where)
        return
    if mine.bound != theirs.bound:
        result.disagree.append(f"{where}: kube-scheduler {theirs.status} ({theirs.message[:300]}), "
                               f"ours {mine.status} ({mine.message[:200]})")
        return
    result.agree += 1
    result.bound += theirs.bound
    if mine.status == theirs.status:
        result.same_status += 1
    else:
        result.other_status.append(f"{where}: kube-scheduler {theirs.status} ({theirs.message[:300]}), "
                                   f"ours {mine.status} ({mine.message[:200]})")
    if theirs.bound:
        if dict(mine.allocations) == dict(theirs.allocations):
            result.same_devices += 1
        else:
            result.other_devices.append(f"{where}: kube-scheduler {dict(theirs.allocations)}, "
                                        f"ours {dict(mine.allocations)}")
