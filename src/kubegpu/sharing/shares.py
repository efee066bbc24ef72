"""How much GPU memory a pod on a shared GPU may use: its share.

Time-slicing and shared DRA claims give no memory isolation: every pod sees the whole GPU, so the only fair reading
of "its part" is what the sharing config hands it — the GPU's (or MIG device's) memory divided by its replicas, an
MPS slice's size or an MPS client's pinned-memory limit, a shared claim's MPS limit or the device's memory divided
by the pods sharing the claim — or less where the pod says so in `kubegpu.io/gpu-memory-limit`. Whole GPUs and MIG
devices handed to one pod have no share: the hardware isolates them, so nothing here ever speaks for them.

Two sources give the same answer: the device plugin's inventory for its config (`kubegpu.sharing.devices`, exact,
including MPS), or — where the config is not at hand — the device IDs the kubelet says the node can allocate
(PodResources `GetAllocatableResources`), whose `<id>::<k>` replicas and `::mps-<N>gb-<k>` slices carry the same
facts. Both describe the config the node runs *now*; a running pod is judged by the share its device was handed
out with, which the device plugin records at Allocate (`kubegpu.sharing.allocations`, overlaid by
`with_recorded`), and today's derivation speaks only for devices with no record. The GPU-memory guard reads shares
from here; any other component that needs "the memory a shared device stands for" should too. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kubegpu.errors import ConfigError
from kubegpu.scheduling.quantity import parse_quantity
from kubegpu.sharing.allocations import RecordedShare
from kubegpu.sharing.claimconfig import Sharing
from kubegpu.sharing.names import SharingKind, mps_slice_of_id, split_device_id

if TYPE_CHECKING:
    from kubegpu.gpu.backend import GpuDevice, MigDevice
    from kubegpu.sharing.devices import AnnotatedDevice

GPU_MEMORY_LIMIT_ANNOTATION = "kubegpu.io/gpu-memory-limit"
"""A pod's own, smaller GPU-memory share (a Kubernetes quantity such as `8Gi`), per GPU it holds."""

MIB = 1024 * 1024


@dataclass(frozen=True)
class DeviceShare:
    """What one device ID the kubelet hands out stands for: where it lives and how much memory it is worth.

    `share_mib` is None where the device is not shared (a whole GPU, a MIG device for one pod)."""

    device_id: str
    gpu_index: int
    gi_id: int | None
    kind: SharingKind
    share_mib: int | None
    mps_limit_mib: int | None = None  # the pinned-memory limit an MPS client of this device must run with


def device_share(device: AnnotatedDevice) -> DeviceShare:
    """The share one inventory device stands for: an MPS client's pinned limit (or slice size), a time-slicing
    replica's 1/N of its GPU or MIG device; None for an unshared device."""
    gi_id = device.mig.gi_id if device.mig is not None else None
    if not device.shared:
        return DeviceShare(device.id, device.gpu_index, gi_id, SharingKind.MIG if gi_id is not None else
                           SharingKind.WHOLE, None)
    if device.sharing == SharingKind.MPS:
        limit = device.mps_memory_mib or device.memory_mib // max(1, device.replicas)
        return DeviceShare(device.id, device.gpu_index, gi_id, SharingKind.MPS, limit, limit)
    return DeviceShare(device.id, device.gpu_index, gi_id, SharingKind.TIME_SLICING,
                       device.memory_mib // max(1, device.replicas))


def shares_from_inventory(inventory: Mapping[str, Sequence[AnnotatedDevice]]) -> dict[str, DeviceShare]:
    """Device ID → share, from `devices_by_resource` for the device plugin's own config (the exact source)."""
    return {device.id: device_share(device) for devices in inventory.values() for device in devices}


def shares_from_allocatable(allocatable: Iterable[tuple[str, Sequence[str]]], gpus: Sequence[GpuDevice],
                            migs: Sequence[MigDevice]) -> dict[str, DeviceShare]:
    """Device ID → share from the IDs the kubelet can allocate, `(resource, ids)` pairs, without the config: the
    replicas of a device are its `<id>::<k>` IDs under one resource; an MPS slice's size is in its ID. IDs naming
    no GPU or MIG device here are left out (not ours). A replicated device here is taken for time-slicing: only the
    config tells MPS replicas apart, and their share is the same 1/N."""
    where = _locations(gpus, migs)
    by_resource: dict[str, list[str]] = {}
    for resource, ids in allocatable:  # the kubelet lists one entry per device, not per resource
        by_resource.setdefault(resource, []).extend(ids)
    out: dict[str, DeviceShare] = {}
    for ids in by_resource.values():
        replicas: dict[str, int] = {}
        for device_id in ids:
            base, suffix = split_device_id(device_id)
            if suffix is not None and mps_slice_of_id(device_id) is None:
                replicas[base] = replicas.get(base, 0) + 1
        for device_id in ids:
            base, suffix = split_device_id(device_id)
            if base not in where:
                continue
            index, gi_id, memory = where[base]
            mps_slice = mps_slice_of_id(device_id)
            if mps_slice is not None:
                limit = mps_slice[0] * 1024
                out[device_id] = DeviceShare(device_id, index, gi_id, SharingKind.MPS, limit, limit)
            elif suffix is not None:
                out[device_id] = DeviceShare(device_id, index, gi_id, SharingKind.TIME_SLICING,
                                             memory // replicas[base])
            else:
                out[device_id] = DeviceShare(device_id, index, gi_id,
                                             SharingKind.MIG if gi_id is not None else SharingKind.WHOLE, None)
    return out


def _locations(gpus: Sequence[GpuDevice], migs: Sequence[MigDevice]) -> dict[str, tuple[int, int | None, int]]:
    """A physical device ID (UUID or index form: `3`, `3:1` for a GPU's second MIG device) → (GPU index, GPU
    instance id or None, memory MiB)."""
    where: dict[str, tuple[int, int | None, int]] = {}
    for gpu in gpus:
        where[gpu.uuid] = where[str(gpu.index)] = (gpu.index, None, gpu.memory_mib)
    positions: dict[int, int] = {}
    for mig in migs:
        position = positions[mig.gpu_index] = positions.get(mig.gpu_index, -1) + 1
        where[mig.uuid] = where[f"{mig.gpu_index}:{position}"] = (mig.gpu_index, mig.gi_id, mig.memory_mib)
    return where


def with_recorded(current: Mapping[str, DeviceShare], recorded: Mapping[str, RecordedShare],
                  gpus: Sequence[GpuDevice], migs: Sequence[MigDevice]) -> dict[str, DeviceShare]:
    """Device ID → share, each ID judged by the share it was allocated with (`kubegpu.sharing.allocations`).

    A pod keeps the share it was admitted under: a config switch from 2 to 4 replicas halves the shares derived
    now, not the ones its devices were handed out with. Only IDs with no record (allocated before the device plugin
    recorded shares, or on a node whose device plugin does not) fall back to `current`, today's derivation from the
    config or the kubelet's allocatable IDs. A recorded ID the config no longer lists (a replica a shrinking config
    dropped while a pod still holds it) keeps its record too, located by its physical ID; one naming no device here
    any more is left out."""
    out = dict(current)
    where = _locations(gpus, migs)
    for device_id, record in recorded.items():
        now = current.get(device_id)
        if now is not None:
            place: tuple[int, int | None] | None = (now.gpu_index, now.gi_id)
        else:
            found = where.get(split_device_id(device_id)[0])
            place = (found[0], found[1]) if found is not None else None
        if place is not None:
            out[device_id] = DeviceShare(device_id, place[0], place[1], record.kind, record.share_mib,
                                         record.mps_limit_mib)
    return out


def recorded_share(share: DeviceShare) -> RecordedShare:
    """What the device plugin records for one device it hands out: the share it stands for now."""
    return RecordedShare(share.kind, share.share_mib, share.mps_limit_mib)


def claim_share(sharing: Sharing | None, device_memory_mib: int, consumers: int, device_key: str = "",
                mig: bool = False) -> tuple[SharingKind, int | None, int | None]:
    """(kind, share MiB, MPS limit MiB) of one device of a DRA claim `consumers` pods reserve.

    MPS: the claim's pinned-memory limit for this device (per-device entry, keyed by index or UUID, else the
    default), else 1/consumers of the device; TimeSlicing, or a claim several pods share with no config: 1/consumers;
    a claim held by one pod with no sharing, or a MIG device for one pod, is unshared (None)."""
    strategy = sharing.strategy if sharing is not None else ""
    even = device_memory_mib // max(1, consumers)
    if strategy == "MPS":
        assert sharing is not None
        limit = sharing.per_device_pinned_mib.get(device_key) or sharing.pinned_memory_mib or even
        return SharingKind.MPS, limit, limit
    if strategy == "TimeSlicing" or consumers > 1:
        return SharingKind.TIME_SLICING, even, None
    return (SharingKind.MIG if mig else SharingKind.WHOLE), None, None


def claim_consumers(claim: Mapping[str, Any]) -> int:
    """How many pods a ResourceClaim is reserved for (`status.reservedFor`): the pods sharing its devices."""
    reserved = (claim.get("status") or {}).get("reservedFor") or []
    return max(1, sum(1 for entry in reserved if isinstance(entry, Mapping) and entry.get("resource") == "pods"))


def annotated_limit_mib(pod: Mapping[str, Any]) -> int | None:
    """The pod's `kubegpu.io/gpu-memory-limit` in MiB, None when it has none; ConfigError naming the pod and the
    annotation for a value that is not a positive quantity."""
    metadata = pod.get("metadata") or {}
    value = (metadata.get("annotations") or {}).get(GPU_MEMORY_LIMIT_ANNOTATION)
    if value is None:
        return None
    pod_name = f"{metadata.get('namespace', 'default')}/{metadata.get('name')}"
    where = f"pod {pod_name}: annotation {GPU_MEMORY_LIMIT_ANNOTATION}"
    try:
        amount = parse_quantity(str(value).strip())
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc}") from None
    if amount <= 0:
        raise ConfigError(f"{where}: must be a positive quantity such as 8Gi, got {value!r}")
    return max(1, int(amount // MIB))


def effective_share(config_share_mib: int, annotated_mib: int | None) -> int:
    """The pod's share: the config's, or less where the pod asks for less (never more: the annotation cannot take
    memory from a neighbour)."""
    return config_share_mib if annotated_mib is None else min(config_share_mib, annotated_mib)
