"""What a node's GPUs look like to DRA: NVIDIA's device names, attributes, capacities and shared counters.

Names and attributes follow NVIDIA's GPU driver (reference/dra.md §5.2–5.4) so claims written for it work
unchanged: `gpu-<minor>` for a whole GPU, `gpu-<minor>-mig-<profile>-<giProfileId>-<start>` for a MIG device,
attributes `type`, `uuid`, `productName`, `brand`, `architecture`, `cudaComputeCapability`, `driverVersion`,
`cudaDriverVersion` (versions as semver) and `resource.kubernetes.io/pciBusID`.

Dynamic MIG (partitionable devices): one counter set per GPU (`gpu-<minor>-counter-set`) holding `multiprocessors`,
`memory`, `compute-slices`, `ofa-engines` and `memory-slice-<i>` (1 each); every legal placement of every profile
is a device consuming exactly what it occupies, the whole GPU consumes everything. That set of counters is chosen
so that a set of placements fits the counters exactly when it is a legal MIG layout (memory slices keep placements
apart, compute slices bound the SM slices, the one OFA engine allows one `+me` instance) — the tests check this
equivalence against `kubegpu.gpu.geometry` on every catalog model, so the scheduler can never pick a layout the GPU
would refuse.

Fractional GPUs (`fractional`): a whole GPU not in MIG mode is published as a shared device
(`allowMultipleAllocations`, DRAConsumableCapacity) with a consumable capacity `compute` of 1000 thousandths, so a
claim asks for part of it with `capacity.requests: {compute: 300}` (the name exactly as published: kube-scheduler
1.37 does not match `gpu.nvidia.com/compute` to it) and kube-scheduler (or kubegpu's allocator) packs shares until
the thousandths run out. `compute` defaults to 1000, so a claim that names no
capacity still gets the GPU to itself; `memory` is not consumed separately (default and only valid value 0): a
share's memory is in proportion to its compute, and that is what prepare enforces (MPS active-thread percentage
and pinned device-memory limit). One number to ask for, one to pack: the scheduler cannot over-commit memory that
compute has not over-committed. Pure: GPU facts in, plain device dicts out.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from kubegpu.errors import KubegpuError
from kubegpu.gpu.backend import GpuDevice, MigDevice
from kubegpu.gpu.catalog import GpuModel, MigProfile, find_model
from kubegpu.scheduling.quantity import parse_quantity
from kubegpu.sharing.names import dra_counter_set_name, dra_gpu_device_name, dra_mig_device_name, dra_profile_label

DRIVER = "gpu.nvidia.com"
PCI_BUS_ID = "resource.kubernetes.io/pciBusID"
MIB = 1024 * 1024
COMPUTE = "compute"  # consumable capacity of a shared GPU, in thousandths of the GPU
WHOLE = 1000


@dataclass(frozen=True)
class Placement:
    """What a DRA device stands for: a whole GPU, or one MIG placement (existing or to be created)."""

    gpu_index: int
    gpu_uuid: str
    profile_id: int | None = None  # None: the whole GPU
    start: int | None = None
    mig_uuid: str | None = None  # set for a MIG device that already exists


@dataclass(frozen=True)
class NodeGpus:
    """A node's GPUs as the backend reports them, plus which MIG devices claims created (dynamic MIG)."""

    driver_version: str
    cuda_version: tuple[int, int]
    gpus: tuple[GpuDevice, ...]
    migs: Mapping[int, tuple[MigDevice, ...]]
    claimed: frozenset[tuple[int, int]] = field(default_factory=frozenset)  # (gpu index, gi id) made by prepare


def semver(text: str) -> str:
    """`580.65.06` → `580.65.6`, `12.8` → `12.8.0`: driver versions as the semver a version attribute needs."""
    parts = [str(int(p)) for p in re.findall(r"\d+", text)[:3]]
    while len(parts) < 3:
        parts.append("0")
    return ".".join(parts)


def profile_label(profile: MigProfile) -> str:
    """`1g.10gb` → `1g10gb`, `1g.10gb+me` → `1g10gb-me` (dots dropped, RFC 1123)."""
    return dra_profile_label(profile.name)


def pci_bus_id(nvml_bus_id: str) -> str:
    """NVML's `00000000:07:00.0` as the 4-digit-domain form Kubernetes' PCI attribute uses (`0000:07:00.0`)."""
    domain, sep, rest = nvml_bus_id.lower().partition(":")
    if not sep or not all(c in "0123456789abcdef" for c in domain):
        return nvml_bus_id.lower()[:64]
    return f"{int(domain, 16):04x}:{rest}"


def gpu_device_name(gpu: GpuDevice) -> str:
    return dra_gpu_device_name(gpu.device_minor)


def mig_device_name(gpu: GpuDevice, profile: MigProfile, start: int) -> str:
    return dra_mig_device_name(gpu.device_minor, profile.name, profile.profile_id, start)


def counter_set_name(gpu: GpuDevice) -> str:
    return dra_counter_set_name(gpu.device_minor)


def _architecture(model: GpuModel | None) -> str:
    family = model.architecture if model else "unknown"
    return " ".join(part.capitalize() for part in family.split("-"))


def _common_attributes(node: NodeGpus, gpu: GpuDevice, model: GpuModel | None) -> dict[str, dict[str, Any]]:
    major, minor = gpu.compute_capability
    cuda_major, cuda_minor = node.cuda_version
    return {
        "productName": {"string": gpu.product_name[:64]},
        "brand": {"string": "Nvidia"},
        "architecture": {"string": _architecture(model)},
        "cudaComputeCapability": {"version": f"{major}.{minor}.0"},
        "driverVersion": {"version": semver(node.driver_version)},
        "cudaDriverVersion": {"version": f"{cuda_major}.{cuda_minor}.0"},
        PCI_BUS_ID: {"string": pci_bus_id(gpu.pci_bus_id)},
    }


def _mig_capacity(profile: MigProfile) -> dict[str, dict[str, str]]:
    engines = profile.engines
    return {
        "multiprocessors": {"value": str(profile.multiprocessors)},
        "copyEngines": {"value": str(engines.copy)},
        "decoders": {"value": str(engines.decoder)},
        "encoders": {"value": str(engines.encoder)},
        "jpegEngines": {"value": str(engines.jpeg)},
        "ofaEngines": {"value": str(engines.ofa)},
        "memory": {"value": f"{profile.memory_mib}Mi"},
    }


def full_gpu_device(node: NodeGpus, gpu: GpuDevice, dynamic: bool, shared: bool = False) -> dict[str, Any]:
    """A whole GPU; `shared`: as a device claims share by thousandths of `compute` (module doc)."""
    model = find_model(gpu.model_key or gpu.product_name)
    capacity: dict[str, Any] = {"memory": {"value": f"{gpu.memory_mib}Mi"}}
    device: dict[str, Any] = {
        "name": gpu_device_name(gpu),
        "attributes": {"type": {"string": "gpu"}, "uuid": {"string": gpu.uuid}, **_common_attributes(node, gpu, model)},
        "capacity": capacity,
    }
    if shared:
        device["allowMultipleAllocations"] = True
        capacity[COMPUTE] = {"value": str(WHOLE), "requestPolicy": {
            "default": str(WHOLE), "validRange": {"min": "1", "max": str(WHOLE), "step": "1"}}}
        capacity["memory"]["requestPolicy"] = {"default": "0", "validValues": ["0"]}
    if dynamic and model is not None:
        capacity["multiprocessors"] = {"value": str(gpu.multiprocessors)}
        device["consumesCounters"] = [{"counterSet": counter_set_name(gpu),
                                       "counters": gpu_counters(gpu, model)}]
    return device


def gpu_counters(gpu: GpuDevice, model: GpuModel) -> dict[str, dict[str, str]]:
    """The counter set of one GPU (also what the whole GPU consumes)."""
    counters = {
        "multiprocessors": {"value": str(model.multiprocessors)},
        "memory": {"value": f"{max(gpu.memory_mib, model.memory_mib)}Mi"},
        "compute-slices": {"value": str(model.mig_compute_slices)},
        "ofa-engines": {"value": "1"},
    }
    for slot in range(model.mig_memory_slots):
        counters[f"memory-slice-{slot}"] = {"value": "1"}
    return counters


def placement_counters(profile: MigProfile, start: int) -> dict[str, dict[str, str]]:
    counters = {
        "multiprocessors": {"value": str(profile.multiprocessors)},
        "memory": {"value": f"{profile.memory_mib}Mi"},
        "compute-slices": {"value": str(profile.compute_slices)},
    }
    if profile.media_extensions:
        counters["ofa-engines"] = {"value": "1"}
    for slot in range(start, start + profile.memory_slots):
        counters[f"memory-slice-{slot}"] = {"value": "1"}
    return counters


def mig_device(node: NodeGpus, gpu: GpuDevice, model: GpuModel, profile: MigProfile, start: int,
               mig_uuid: str | None, dynamic: bool) -> dict[str, Any]:
    attributes: dict[str, dict[str, Any]] = {"type": {"string": "mig"}}
    if mig_uuid:
        attributes["uuid"] = {"string": mig_uuid}
    attributes.update({"parentUUID": {"string": gpu.uuid}, "profile": {"string": profile.name},
                       **_common_attributes(node, gpu, model)})
    device: dict[str, Any] = {"name": mig_device_name(gpu, profile, start), "attributes": attributes,
                              "capacity": _mig_capacity(profile)}
    if dynamic:
        device["consumesCounters"] = [{"counterSet": counter_set_name(gpu),
                                       "counters": placement_counters(profile, start)}]
    else:
        for slot in range(start, start + profile.memory_slots):
            device["capacity"][f"memorySlice{slot}"] = {"value": "1"}
    return device


@dataclass(frozen=True)
class GpuOffer:
    """Everything one physical GPU contributes: devices (in first-fit order), its counter set, what each stands for."""

    gpu: GpuDevice
    devices: tuple[dict[str, Any], ...]
    counter_set: dict[str, Any] | None
    placements: Mapping[str, Placement]


def gpu_offers(node: NodeGpus, dynamic_mig: bool, fractional: bool = False) -> list[GpuOffer]:
    """Per GPU (by minor): whole GPU (`fractional`: shared by thousandths); or its existing MIG devices (static
    MIG); or, dynamic, every placement."""
    offers = []
    for gpu in sorted(node.gpus, key=lambda g: g.device_minor):
        model = find_model(gpu.model_key or gpu.product_name)
        existing = node.migs.get(gpu.index, ())
        unclaimed = [m for m in existing if (gpu.index, m.gi_id) not in node.claimed]
        dynamic = dynamic_mig and model is not None and model.mig_capable and not unclaimed
        if dynamic and model is not None:
            offers.append(_dynamic_offer(node, gpu, model))
        elif gpu.mig_enabled and model is not None:
            devices, placements = [], {}
            for mig in sorted(existing, key=lambda m: (m.start, m.profile_id)):
                profile = model.profile_by_id().get(mig.profile_id)
                if profile is None:
                    continue
                device = mig_device(node, gpu, model, profile, mig.start, mig.uuid, dynamic=False)
                devices.append(device)
                placements[device["name"]] = Placement(gpu.index, gpu.uuid, mig.profile_id, mig.start, mig.uuid)
            offers.append(GpuOffer(gpu, tuple(devices), None, placements))
        else:
            device = full_gpu_device(node, gpu, dynamic=False, shared=fractional)
            offers.append(GpuOffer(gpu, (device,), None, {device["name"]: Placement(gpu.index, gpu.uuid)}))
    return offers


def _dynamic_offer(node: NodeGpus, gpu: GpuDevice, model: GpuModel) -> GpuOffer:
    """Whole GPU first, then placements from the top memory slot down, so the scheduler's first fit packs small
    instances at the top and keeps the low, aligned slots free for large ones (what our own placement does)."""
    whole = full_gpu_device(node, gpu, dynamic=True)
    placements = {whole["name"]: Placement(gpu.index, gpu.uuid)}
    live = {(m.profile_id, m.start): m.uuid for m in node.migs.get(gpu.index, ())}
    entries = sorted(((p, s) for p in model.mig_profiles for s in p.starts),
                     key=lambda ps: (-ps[1], -ps[0].memory_slots, ps[0].profile_id))
    devices = [whole]
    for profile, start in entries:
        device = mig_device(node, gpu, model, profile, start, live.get((profile.profile_id, start)), dynamic=True)
        devices.append(device)
        placements[device["name"]] = Placement(gpu.index, gpu.uuid, profile.profile_id, start,
                                               live.get((profile.profile_id, start)))
    counter_set = {"name": counter_set_name(gpu), "counters": gpu_counters(gpu, model)}
    return GpuOffer(gpu, tuple(devices), counter_set, placements)


def share_of(result: Mapping[str, Any]) -> int | None:
    """The thousandths of a GPU an allocation result consumed (`consumedCapacity.compute`); None for a device
    allocated whole (no share, or the share is the whole GPU)."""
    consumed = result.get("consumedCapacity")
    if result.get("shareID") is None or not isinstance(consumed, Mapping):
        return None
    amount = consumed.get(COMPUTE, consumed.get(f"{DRIVER}/{COMPUTE}"))
    if amount is None:
        return None
    try:
        value = math.ceil(parse_quantity(amount))
    except KubegpuError:
        return None
    return value if 0 < value < WHOLE else None


def placements_by_name(offers: Iterable[GpuOffer]) -> dict[str, Placement]:
    return {name: placement for offer in offers for name, placement in offer.placements.items()}


def read_node(backend: Any, claimed: Iterable[tuple[int, int]] = ()) -> NodeGpus:
    """The node's GPUs through a `GpuBackend` (the one I/O step here)."""
    gpus = tuple(backend.devices())
    migs = {gpu.index: tuple(backend.mig_devices(gpu.index)) for gpu in gpus if gpu.mig_enabled}
    return NodeGpus(driver_version=backend.driver_version(), cuda_version=backend.cuda_driver_version(), gpus=gpus,
                    migs=migs, claimed=frozenset(claimed))
