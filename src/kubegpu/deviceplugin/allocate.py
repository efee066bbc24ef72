"""Allocate: turn the device IDs the kubelet picked into what the container runtime must inject.

Pure: the inputs are the advertised devices and the options; the output is the protobuf response (plain data).
Follows NVIDIA's response shapes (§2.4 of the reference) so that the container toolkit cannot tell us apart,
and adds per-container MPS limits, which NVIDIA leaves to the daemon's defaults.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from kubegpu.deviceplugin.resources import AnnotatedDevice
from kubegpu.errors import KubegpuError
from kubegpu.proto.deviceplugin.v1beta1 import api_pb2 as pb

DEVICE_LIST_STRATEGIES = ("envvar", "volume-mounts", "cdi-annotations", "cdi-cri")
CDI_STRATEGIES = frozenset({"cdi-annotations", "cdi-cri"})
VISIBLE_DEVICES = "NVIDIA_VISIBLE_DEVICES"
VOLUME_MOUNT_DIR = "/var/run/nvidia-container-devices"
CONTROL_DEVICES = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia-modeset")
MPS_CONTAINER_ROOT = "/mps"
MIG_CAPS_DIR = "/dev/nvidia-caps"
# The driver's MIG capability minors are a fixed table (/proc/driver/nvidia-caps/mig-minors): `config` 1, `monitor` 2,
# then per GPU minor 15 GPU instances, each with its own access node followed by one per compute instance 0-7.
_FIRST_MIG_MINOR, _MINORS_PER_GI, _GIS_PER_GPU = 3, 9, 15
# NVIDIA's vendor/class: not `nvidia.com/gpu`, the toolkit's own spec (`nvidia-ctk cdi generate`) already defines
# `nvidia.com/gpu=<uuid>`, and a runtime refuses a device name that two spec files define.
CDI_KIND = "k8s.device-plugin.nvidia.com/gpu"


class AllocationError(KubegpuError):
    """The kubelet asked for something we cannot give; the server answers INVALID_ARGUMENT with this line."""


@dataclass(frozen=True)
class AllocateOptions:
    """Everything besides the devices that shapes an Allocate response (from the merged config)."""

    device_list_strategies: tuple[str, ...] = ("envvar",)
    pass_device_specs: bool = False
    dev_root: str = "/"
    control_devices: tuple[str, ...] = CONTROL_DEVICES  # the adapter drops those absent on the host
    mps_root: str = "/run/nvidia/mps"
    cdi_annotation_prefix: str = "cdi.k8s.io/"
    cdi_kind: str = CDI_KIND
    fail_requests_greater_than_one: bool = False
    extra_envs: Mapping[str, str] = field(default_factory=dict)  # NVIDIA_GDS, NVIDIA_MOFED, NVIDIA_IMEX_CHANNELS...


def check_request(ids: Sequence[str], known: Mapping[str, AnnotatedDevice], options: AllocateOptions) -> None:
    """NVIDIA's two checks, with its messages: every ID is ours; a shared request asks for one replica."""
    for device_id in ids:
        if device_id not in known:
            raise AllocationError(f"invalid request: unknown device: {device_id}")
    if options.fail_requests_greater_than_one and len(ids) > 1 and any(known[i].shared for i in ids):
        raise AllocationError(f"invalid request: maximum request size for shared resources is 1; found {len(ids)}")


def physical_devices(ids: Sequence[str], known: Mapping[str, AnnotatedDevice]) -> list[AnnotatedDevice]:
    """Strip `::k` and de-duplicate, keeping the kubelet's order (one entry per GPU or MIG device)."""
    seen: dict[str, AnnotatedDevice] = {}
    for device_id in ids:
        device = known[device_id]
        seen.setdefault(device.physical_id, device)
    return list(seen.values())


def cdi_name(kind: str, physical_id: str) -> str:
    return f"{kind}={physical_id}"


def _annotation_key(prefix: str, physical_ids: Sequence[str]) -> str:
    """NVIDIA keys the annotation by a random response id; a digest of the IDs is as unique and reproducible."""
    digest = hashlib.sha256(",".join(physical_ids).encode()).hexdigest()[:16]
    return f"{prefix}nvidia-device-plugin_{digest}"


def mig_cap_minors(gpu_minor: int, gi_id: int, ci_id: int) -> tuple[int, int]:
    """`nvidia-cap<N>` minors that grant GPU instance `gi_id` and its compute instance `ci_id` of /dev/nvidia<minor>."""
    gi_minor = _FIRST_MIG_MINOR + (gpu_minor * _GIS_PER_GPU + gi_id) * _MINORS_PER_GI
    return gi_minor, gi_minor + 1 + ci_id


def gpu_minor(device: AnnotatedDevice) -> int:
    """The N of the GPU's /dev/nvidia<N>: the driver's minor number when the backend reported one, else the index.
    They differ on hosts whose PCI probe order is not NVML's order, and the wrong node hands over the wrong GPU."""
    return device.minor if device.minor >= 0 else device.gpu_index


def device_nodes(device: AnnotatedDevice) -> list[str]:
    """The GPU's /dev/nvidia<minor>; a MIG device also needs its two capability nodes, or CUDA cannot open it."""
    minor = gpu_minor(device)
    nodes = [f"/dev/nvidia{minor}"]
    if device.mig is not None:
        caps = mig_cap_minors(minor, device.mig.gi_id, device.mig.ci_id)
        nodes.extend(f"{MIG_CAPS_DIR}/nvidia-cap{cap}" for cap in caps)
    return nodes


def _device_specs(devices: Sequence[AnnotatedDevice], options: AllocateOptions) -> list[pb.DeviceSpec]:
    root = options.dev_root.rstrip("/")
    paths = list(options.control_devices)
    paths.extend(dict.fromkeys(node for d in devices for node in device_nodes(d)))
    return [pb.DeviceSpec(container_path=p, host_path=f"{root}{p}", permissions="rw") for p in paths]


def _mps_parts(resource: str, devices: Sequence[AnnotatedDevice], options: AllocateOptions) -> tuple[
    dict[str, str], list[pb.Mount]
]:
    """Pipe and log directories of the resource's MPS daemon, plus this container's own limits."""
    container_dir = f"{MPS_CONTAINER_ROOT}/{resource}"
    host_dir = f"{options.mps_root.rstrip('/')}/{resource}"
    envs = {
        "CUDA_MPS_PIPE_DIRECTORY": f"{container_dir}/pipe",
        "CUDA_MPS_LOG_DIRECTORY": f"{container_dir}/log",
    }
    limits = [f"{n}={d.mps_memory_mib}M" for n, d in enumerate(devices) if d.mps_memory_mib]
    if limits:
        envs["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = ",".join(limits)
    threads = [d.mps_thread_percentage for d in devices if d.mps_thread_percentage]
    if threads:
        envs["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(min(threads))
    mounts = [
        pb.Mount(container_path=f"{container_dir}/pipe", host_path=f"{host_dir}/pipe"),
        pb.Mount(container_path=f"{container_dir}/log", host_path=f"{host_dir}/log", read_only=True),
        pb.Mount(container_path="/dev/shm", host_path=f"{options.mps_root.rstrip('/')}/shm"),
    ]
    return envs, mounts


def allocate_container(
    resource: str, ids: Sequence[str], known: Mapping[str, AnnotatedDevice], options: AllocateOptions
) -> pb.ContainerAllocateResponse:
    """One container's response; raises `AllocationError` naming the first bad ID."""
    check_request(ids, known, options)
    devices = physical_devices(ids, known)
    physical_ids = [d.physical_id for d in devices]
    strategies = set(options.device_list_strategies)
    response = pb.ContainerAllocateResponse()
    response.envs.update(options.extra_envs)
    if "envvar" in strategies:
        response.envs[VISIBLE_DEVICES] = ",".join(physical_ids)
    if "volume-mounts" in strategies:
        response.envs[VISIBLE_DEVICES] = VOLUME_MOUNT_DIR
        response.mounts.extend(
            pb.Mount(container_path=f"{VOLUME_MOUNT_DIR}/{pid}", host_path="/dev/null") for pid in physical_ids
        )
    if "cdi-annotations" in strategies:
        names = ",".join(cdi_name(options.cdi_kind, pid) for pid in physical_ids)
        response.annotations[_annotation_key(options.cdi_annotation_prefix, physical_ids)] = names
    if "cdi-cri" in strategies:
        response.cdi_devices.extend(pb.CDIDevice(name=cdi_name(options.cdi_kind, pid)) for pid in physical_ids)
    if options.pass_device_specs:
        response.devices.extend(_device_specs(devices, options))
    if any(d.sharing == "mps" for d in devices):
        envs, mounts = _mps_parts(resource, devices, options)
        response.envs.update(envs)
        response.mounts.extend(mounts)
    return response


def allocate(
    resource: str, request: pb.AllocateRequest, known: Mapping[str, AnnotatedDevice], options: AllocateOptions
) -> pb.AllocateResponse:
    return pb.AllocateResponse(
        container_responses=[
            allocate_container(resource, list(c.devices_ids), known, options) for c in request.container_requests
        ]
    )
