"""From cluster objects to the placement core's state and back: the pure half of `kubegpu place`.

- `inventory`: per node, its shared GPUs in GPU order, from the `--fractional` DRA driver's ResourceSlices (newest
  generation of each pool; devices of type `gpu` that allow multiple allocations; `gpu-<minor>` sorted by minor).
- `build_state`: a `ClusterState` with every node's allocatable CPU and memory less what its bound pods request, and
  every GPU's thousandths less what allocated ResourceClaims consumed of it (`consumedCapacity.compute`, or all of
  it for a device allocated whole) — whoever allocated them: kube-scheduler, or us.
- `pod_request`: what a pod asks, as a placement `Request` (its CPU and memory requests, and its one claim's one
  request: `count` GPUs, `capacity.requests.compute` thousandths of one; no selectors); `cpu_request` for a pod
  with no claim.
- `allocation_status`: the claim status kube-scheduler would write for that placement: results with a `shareID` and
  the `consumedCapacity` of every capacity (`compute`, and `memory` at its default 0, as `kubegpu.dra.devices`
  publishes them), the class and claim configs, a node selector for the node, and `reservedFor` the pod.

Pure: dicts in, dataclasses and dicts out; the controller does the reading and writing.
"""

from __future__ import annotations

import contextlib
import math
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kubegpu.errors import ConfigError, KubegpuError
from kubegpu.scheduling.dra.capacity import share_id
from kubegpu.scheduling.fit import NodeInfo, fits, pod_requirements
from kubegpu.scheduling.placement import MILLI, ClusterState, Placement, Request
from kubegpu.scheduling.pods import is_finished, pod_key
from kubegpu.scheduling.quantity import format_quantity, parse_quantity
from kubegpu.scheduling.requests import pod_requests

DRIVER = "gpu.nvidia.com"
COMPUTE = "compute"
CLASSES = ("fraction.gpu.kubegpu.io", "gpu.nvidia.com")  # the classes whose claims `kubegpu place` places
MIB = 1024 * 1024
_MINOR = re.compile(r"^gpu-(\d+)$")


@dataclass(frozen=True)
class NodeGpus:
    """One node's shared GPUs in GPU order (device names) and their model (productName)."""

    devices: tuple[str, ...]
    model: str


@dataclass(frozen=True)
class PodAsk:
    """A pending pod's request and the one claim (name, request name) it is placed through."""

    request: Request
    claim: str
    request_name: str


def inventory(slices: Iterable[Mapping[str, Any]], driver: str = DRIVER) -> dict[str, NodeGpus]:
    """Shared GPUs per node (see the module doc); a node whose pool is mid-publication is left out."""
    pools: dict[str, list[Mapping[str, Any]]] = {}
    for item in slices:
        spec = item.get("spec") or {}
        if spec.get("driver") == driver and spec.get("nodeName"):
            pools.setdefault(str(spec["nodeName"]), []).append(spec)
    out = {}
    for node, specs in sorted(pools.items()):
        generation = max(int((s.get("pool") or {}).get("generation") or 0) for s in specs)
        current = [s for s in specs if int((s.get("pool") or {}).get("generation") or 0) == generation]
        if len(current) < max(int((s.get("pool") or {}).get("resourceSliceCount") or 1) for s in current):
            continue
        found: list[tuple[int, str, str]] = []
        for spec in current:
            for device in spec.get("devices") or ():
                attributes = device.get("attributes") or {}
                minor = _MINOR.match(str(device.get("name", "")))
                if (minor and device.get("allowMultipleAllocations") is True
                        and (attributes.get("type") or {}).get("string") == "gpu"):
                    model = str((attributes.get("productName") or {}).get("string") or "gpu")
                    found.append((int(minor.group(1)), str(device["name"]), model))
        if found:
            found.sort()
            out[node] = NodeGpus(tuple(name for _, name, _ in found), found[0][2])
    return out


def _resources(pod: Mapping[str, Any]) -> tuple[int, int]:
    """The pod's CPU (millicores) and memory (MiB) requests, rounded up."""
    asked = pod_requests(pod)
    return math.ceil(asked.get("cpu", 0.0) * 1000 - 1e-9), math.ceil(asked.get("memory", 0.0) / MIB - 1e-9)


def _allocatable(node: Mapping[str, Any]) -> tuple[int, int]:
    status = node.get("status") or {}
    amounts = status.get("allocatable") or status.get("capacity") or {}
    try:
        cpu = parse_quantity(amounts.get("cpu", 0))
        memory = parse_quantity(amounts.get("memory", 0))
    except KubegpuError:
        return 0, 0
    return int(cpu * 1000), int(memory // MIB)


def build_state(nodes: Sequence[Mapping[str, Any]], gpus: Mapping[str, NodeGpus], pods: Iterable[Mapping[str, Any]],
                claims: Iterable[Mapping[str, Any]], driver: str = DRIVER) -> ClusterState:
    """The placement state of the nodes that have shared GPUs (module doc), in node-name order."""
    named = sorted(((str((n.get("metadata") or {}).get("name")), n) for n in nodes
                    if not (n.get("spec") or {}).get("unschedulable")), key=lambda pair: pair[0])
    named = [(name, node) for name, node in named if name in gpus]
    names = [name for name, _ in named]
    cpus, memories = zip(*(_allocatable(node) for _, node in named), strict=True) if named else ((), ())
    state = ClusterState(names, [gpus[n].model for n in names], list(cpus), list(memories),
                         [len(gpus[n].devices) for n in names])
    index = {name: i for i, name in enumerate(names)}
    for pod in pods:
        node = (pod.get("spec") or {}).get("nodeName")
        if node in index and not is_finished(pod):
            try:
                cpu, memory = _resources(pod)
            except KubegpuError:
                continue
            state.cpu_free[index[node]] -= cpu
            state.memory_free[index[node]] -= memory
    slots = {(name, device): (index[name], g) for name in names for g, device in enumerate(gpus[name].devices)}
    for claim in claims:
        allocation = (claim.get("status") or {}).get("allocation") or {}
        for result in (allocation.get("devices") or {}).get("results") or ():
            slot = slots.get((result.get("pool"), result.get("device")))
            if result.get("driver") == driver and slot is not None:
                state.gpu_free[slot] -= consumed_milli(result)
    state.version += 1
    return state


def allowed_nodes(pod: Mapping[str, Any], nodes: Mapping[str, Mapping[str, Any]], state: ClusterState) -> set[int]:
    """The state's nodes the pod may go to by kube-scheduler's filters other than resources (cordon, nodeName,
    taints and tolerations, nodeSelector and required node affinity); resources are the placement core's."""
    need = pod_requirements(pod, {})
    return {i for i, name in enumerate(state.names)
            if name in nodes and fits(need, NodeInfo(dict(nodes[name]), {}))}


@contextlib.contextmanager
def only_nodes(state: ClusterState, allowed: set[int]) -> Iterator[None]:
    """While inside, the other nodes of the state fit nothing (their free CPU reads -1, so `feasible` rules them
    out for every policy); their versions move on entry and exit, so a policy's per-node caches are redone."""
    hidden = [n for n in range(len(state)) if n not in allowed]
    saved = state.cpu_free[hidden].copy()
    state.cpu_free[hidden] = -1
    state.version[hidden] += 1
    try:
        yield
    finally:
        state.cpu_free[hidden] = saved
        state.version[hidden] += 1


def consumed_milli(result: Mapping[str, Any]) -> int:
    """The thousandths of a GPU an allocation result holds: its consumed `compute`, or all of a device held whole."""
    consumed = result.get("consumedCapacity") or {}
    amount = consumed.get(COMPUTE, consumed.get(f"{DRIVER}/{COMPUTE}"))
    if amount is None:
        return MILLI
    try:
        return min(MILLI, math.ceil(parse_quantity(amount) - 1e-9))
    except KubegpuError:
        return MILLI


def pod_claim_names(pod: Mapping[str, Any]) -> list[str | None]:
    """The ResourceClaim behind each of the pod's `resourceClaims` entries (None: generated, not created yet)."""
    generated = {s.get("name"): s.get("resourceClaimName")
                 for s in (pod.get("status") or {}).get("resourceClaimStatuses") or ()}
    return [entry.get("resourceClaimName") or generated.get(entry.get("name"))
            for entry in (pod.get("spec") or {}).get("resourceClaims") or ()]


def cpu_request(pod: Mapping[str, Any]) -> PodAsk:
    """A pod without claims: CPU and memory only (placed on the GPU nodes, where it strands the fewest GPUs)."""
    cpu, memory = _resources(pod)
    return PodAsk(Request(cpu_milli=cpu, memory_mib=memory), claim="", request_name="")


def pod_request(pod: Mapping[str, Any], claim: Mapping[str, Any]) -> PodAsk:
    """The pod's placement request through its one claim; ConfigError (one line, naming pod and field) for a shape
    `kubegpu place` does not place: more than one request, `firstAvailable`, selectors, another class, `All`."""
    where = f"pod {pod_key(pod)}: ResourceClaim {(claim.get('metadata') or {}).get('name')}"
    requests = ((claim.get("spec") or {}).get("devices") or {}).get("requests") or []
    if len(requests) != 1 or not isinstance(requests[0], Mapping):
        raise ConfigError(f"{where}: spec.devices.requests: kubegpu place needs exactly one request")
    exactly = requests[0].get("exactly")
    if not isinstance(exactly, Mapping):
        raise ConfigError(f"{where}: spec.devices.requests[0].exactly: required (firstAvailable is not placed)")
    path = "spec.devices.requests[0].exactly"
    if exactly.get("deviceClassName") not in CLASSES:
        raise ConfigError(f"{where}: {path}.deviceClassName: expected one of {', '.join(CLASSES)}")
    if exactly.get("selectors") or (exactly.get("allocationMode") or "ExactCount") != "ExactCount":
        raise ConfigError(f"{where}: {path}: selectors and allocationMode All are not placed")
    count = exactly.get("count", 1)
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise ConfigError(f"{where}: {path}.count: expected an integer >= 1")
    asked = ((exactly.get("capacity") or {}).get("requests") or {})
    unknown = sorted(k for k in asked if k not in (COMPUTE,))
    if unknown:
        raise ConfigError(f"{where}: {path}.capacity.requests: only {COMPUTE} is placed, not {unknown[0]}")
    milli = MILLI
    if asked:
        try:
            milli = math.ceil(parse_quantity(next(iter(asked.values()))) - 1e-9)
        except KubegpuError as exc:
            raise ConfigError(f"{where}: {path}.capacity.requests: {exc}") from None
    if not 1 <= milli <= MILLI or (count > 1 and milli != MILLI):
        raise ConfigError(f"{where}: {path}.capacity.requests.{COMPUTE}: 1..{MILLI} thousandths of one GPU, or "
                          "whole GPUs when count > 1")
    cpu, memory = _resources(pod)
    return PodAsk(Request(cpu_milli=cpu, memory_mib=memory, gpu_count=count, gpu_milli=milli),
                  claim=str((claim.get("metadata") or {}).get("name")), request_name=str(requests[0].get("name")))


def allocation_status(ask: PodAsk, claim: Mapping[str, Any], pod: Mapping[str, Any], node: str,
                      devices: Sequence[str], class_config: Sequence[Mapping[str, Any]] = (),
                      driver: str = DRIVER) -> dict[str, Any]:
    """`status` of the claim allocated on `node` to `devices` and reserved for the pod (module doc)."""
    uid = str((claim.get("metadata") or {}).get("uid") or ask.claim)
    results = [{"request": ask.request_name, "driver": driver, "pool": node, "device": device,
                "shareID": share_id(uid, ask.request_name, slot, device),
                "consumedCapacity": {COMPUTE: format_quantity(ask.request.gpu_milli), "memory": "0"}}
               for slot, device in enumerate(devices)]
    config = [{"source": "FromClass", "requests": [ask.request_name], "opaque": dict(c["opaque"])}
              for c in class_config if isinstance(c, Mapping) and isinstance(c.get("opaque"), Mapping)]
    for item in ((claim.get("spec") or {}).get("devices") or {}).get("config") or ():
        if isinstance(item, Mapping) and isinstance(item.get("opaque"), Mapping):
            config.append({"source": "FromClaim", "requests": list(item.get("requests") or [ask.request_name]),
                           "opaque": dict(item["opaque"])})
    devices_status: dict[str, Any] = {"results": results}
    if config:
        devices_status["config"] = config
    meta = pod.get("metadata") or {}
    return {
        "allocation": {"devices": devices_status, "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
            {"key": "metadata.name", "operator": "In", "values": [node]}]}]}},
        "reservedFor": [{"resource": "pods", "name": meta.get("name"), "uid": meta.get("uid")}],
    }


def placed_devices(gpus: NodeGpus, placement: Placement) -> list[str]:
    return [gpus.devices[g] for g in placement.gpus]
