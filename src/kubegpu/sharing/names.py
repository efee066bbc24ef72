"""The one place that builds and parses the names a shared GPU is known by.

Resource names are the compatibility contract with every pod spec already written for NVIDIA's device plugin
(`nvidia.com/gpu`, `nvidia.com/gpu.shared`, `nvidia.com/mig-1g.10gb`) and with our own MPS memory slices
(`nvidia.com/gpu-10gb`); device IDs are what the kubelet checkpoints (`<uuid>::<k>` replicas,
`<uuid>::mps-<N>gb-<k>` slices). Building them in one module means the device plugin, discovery, the partitioner,
the autoscaler, the DRA driver and the simulator can never disagree on a spelling. Pure: no I/O.
"""

from __future__ import annotations

import re
from enum import StrEnum


class SharingKind(StrEnum):
    """How one physical GPU is handed to pods. A `StrEnum`, so the values stay the strings the device plugin's
    state and the simulator's results have always carried (`"none"`, `"time-slicing"`, `"mps"`)."""

    WHOLE = "none"
    TIME_SLICING = "time-slicing"
    MPS = "mps"
    MIG = "mig"


DEFAULT_DOMAIN = "nvidia.com"
GPU_RESOURCE = f"{DEFAULT_DOMAIN}/gpu"
GPU_SHARED_RESOURCE = f"{GPU_RESOURCE}.shared"
GPU_RESOURCE_PREFIX = f"{DEFAULT_DOMAIN}/"
MIG_RESOURCE_PREFIX = f"{DEFAULT_DOMAIN}/mig-"
SHARED_SUFFIX = ".shared"
REPLICA_SEPARATOR = "::"

_MPS_SLICE = re.compile(rf"^{re.escape(DEFAULT_DOMAIN)}/gpu-(?P<gb>\d+)gb$")
_MPS_SLICE_ID = re.compile(r"^mps-(?P<gb>\d+)gb-(?P<k>\d+)$")


# ---------------------------------------------------------------------------------------------- resource names


def shared_resource_name(name: str) -> str:
    """`nvidia.com/gpu` → `nvidia.com/gpu.shared`: NVIDIA's `renameByDefault` spelling of a replicated resource."""
    return f"{name}{SHARED_SUFFIX}"


def mig_resource_name(profile_name: str) -> str:
    """`1g.10gb+me` → `nvidia.com/mig-1g.10gb.me`, NVIDIA's mixed-strategy naming (`+` is not allowed in a name)."""
    return f"{MIG_RESOURCE_PREFIX}{profile_name.replace('+', '.')}"


def mig_profile_of(resource: str) -> str | None:
    """`nvidia.com/mig-1g.10gb` → `1g.10gb` (the profile's config name); None for any other resource."""
    if not resource.startswith(MIG_RESOURCE_PREFIX):
        return None
    return resource[len(MIG_RESOURCE_PREFIX):] or None


def mps_slice_resource_name(size_gb: int) -> str:
    """An MPS memory slice of `size_gb` GiB: `nvidia.com/gpu-<N>gb`."""
    return f"{DEFAULT_DOMAIN}/gpu-{size_gb}gb"


def mps_slice_size_of(resource: str) -> int | None:
    """`nvidia.com/gpu-10gb` → 10; None for any other resource."""
    match = _MPS_SLICE.match(resource)
    return int(match.group("gb")) if match else None


def is_gpu_resource(resource: str) -> bool:
    """Any extended resource in NVIDIA's domain: whole, shared, MIG or MPS-slice GPUs."""
    return resource.startswith(GPU_RESOURCE_PREFIX)


def size_label(size_gb: int) -> str:
    """How a slice size is written in layouts and annotations: `10gb`."""
    return f"{size_gb}gb"


# ---------------------------------------------------------------------------------------------- device ids


def replica_id(physical_id: str, k: int) -> str:
    """The k-th time-slicing / MPS replica of a GPU or MIG device: `<id>::<k>`."""
    return f"{physical_id}{REPLICA_SEPARATOR}{k}"


def mps_slice_id(physical_id: str, size_gb: int, k: int) -> str:
    """The k-th MPS memory slice of `size_gb` GiB on a GPU: `<uuid>::mps-<N>gb-<k>`."""
    return f"{physical_id}{REPLICA_SEPARATOR}{mps_slice_suffix(size_gb, k)}"


def mps_slice_suffix(size_gb: int, k: int) -> str:
    """The part of an MPS slice's device ID after the separator: `mps-<N>gb-<k>`."""
    return f"mps-{size_gb}gb-{k}"


def strip_replica(device_id: str) -> str:
    """`GPU-x::3` → `GPU-x`; `GPU-x::mps-10gb-0` → `GPU-x`; anything else unchanged."""
    return device_id.split(REPLICA_SEPARATOR, 1)[0]


def replica_suffix(device_id: str) -> str | None:
    """`GPU-x::3` → `3`; `GPU-x::mps-10gb-0` → `mps-10gb-0`; None when the ID names a physical device."""
    return split_device_id(device_id)[1]


def split_device_id(device_id: str) -> tuple[str, str | None]:
    """`GPU-x::3` → (`GPU-x`, `3`); a physical ID → (ID, None)."""
    base, sep, rest = device_id.partition(REPLICA_SEPARATOR)
    return base, (rest if sep else None)


def mps_slice_of_id(device_id: str) -> tuple[int, int] | None:
    """(size GiB, k) of an MPS slice device ID, or None for any other ID."""
    suffix = replica_suffix(device_id)
    match = _MPS_SLICE_ID.match(suffix or "")
    return (int(match.group("gb")), int(match.group("k"))) if match else None


# ---------------------------------------------------------------------------------------------- node metadata

MIG_CONFIG_LABEL = "nvidia.com/mig.config"
"""The mig-parted config a node should have (the GPU Operator's label, read by the MIG manager)."""
DEVICE_PLUGIN_CONFIG_ANNOTATION = "kubegpu.io/device-plugin-config"
"""An inline NVIDIA device-plugin config (YAML or JSON) a NodePool template carries for the nodes it creates."""
GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"
"""GFD's label naming a node's GPU model (`NVIDIA-A100-SXM4-80GB`); pods select a model with it."""
GPU_MEMORY_RESOURCE = "kubegpu.io/gpu-memory"
"""The one unit GPU quotas are written in: the GPU memory a pod's GPU resources are charged, in bytes."""

_NAMED_GIB = re.compile(r"(?P<gb>\d+)gb")


def named_memory_gib(resource: str) -> int | None:
    """The GiB a MIG profile or MPS slice resource carries in its name (`mig-1g.10gb` → 10, `gpu-20gb` → 20, also
    their `.shared` replicas); None for names that carry no size (`nvidia.com/gpu`, `nvidia.com/gpu.shared`)."""
    base = resource[: -len(SHARED_SUFFIX)] if resource.endswith(SHARED_SUFFIX) else resource
    if mps_slice_size_of(base) is not None:
        return mps_slice_size_of(base)
    profile = mig_profile_of(base)
    if profile is None:
        return None
    match = _NAMED_GIB.search(profile)
    return int(match.group("gb")) if match else None


# ---------------------------------------------------------------------------------------------- DRA device names

_DRA_DEVICE = re.compile(r"^gpu-(?P<minor>\d+)(?:-mig-[a-z0-9-]*?-(?P<profile>\d+)-(?P<start>\d+))?$")


def dra_profile_label(profile_name: str) -> str:
    """`1g.10gb` → `1g10gb`, `1g.10gb+me` → `1g10gb-me` (dots dropped, RFC 1123), as NVIDIA's DRA driver writes it."""
    return re.sub(r"[^a-z0-9-]", "-", profile_name.lower().replace(".", "")).strip("-")


def dra_gpu_device_name(minor: int) -> str:
    """A whole GPU in a ResourceSlice: `gpu-<minor>` (NVIDIA's DRA driver names devices by /dev/nvidia<minor>)."""
    return f"gpu-{minor}"


def dra_mig_device_name(minor: int, profile_name: str, profile_id: int, start: int) -> str:
    """One MIG placement in a ResourceSlice: `gpu-<minor>-mig-<profile label>-<GI profile id>-<start>`."""
    return f"gpu-{minor}-mig-{dra_profile_label(profile_name)}-{profile_id}-{start}"


def dra_counter_set_name(minor: int) -> str:
    """A GPU's shared-counter set (partitionable devices): `gpu-<minor>-counter-set`."""
    return f"gpu-{minor}-counter-set"


def parse_dra_device_name(name: str) -> tuple[int, int | None, int | None] | None:
    """(GPU minor, GI profile id, start) of a device name the functions above build; (minor, None, None) for a whole
    GPU; None for anything else."""
    match = _DRA_DEVICE.match(name)
    if match is None:
        return None
    profile, start = match.group("profile"), match.group("start")
    return int(match.group("minor")), (int(profile) if profile else None), (int(start) if start else None)
