"""Allocate: turn the device IDs the kubelet picked into what the container runtime must inject.

Pure: the inputs are the advertised devices and the options; the output is the protobuf response (plain data).
Follows NVIDIA's response shapes (§2.4 of the reference) so that the container toolkit cannot tell us apart,
and adds per-container MPS limits, which NVIDIA leaves to the daemon's defaults.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from kubegpu.errors import KubegpuError
from kubegpu.proto.deviceplugin.v1beta1 import api_pb2 as pb
from kubegpu.sharing.cdi import CDI_KIND, CONTROL_DEVICES, device_nodes, host_path
from kubegpu.sharing.devices import AnnotatedDevice
from kubegpu.sharing.names import SharingKind

__all__ = ["CDI_KIND", "CONTROL_DEVICES", "AllocateOptions", "AllocationError", "allocate", "allocate_container",
           "device_nodes"]

DEVICE_LIST_STRATEGIES = ("envvar", "volume-mounts", "cdi-annotations", "cdi-cri")
CDI_STRATEGIES = frozenset({"cdi-annotations", "cdi-cri"})
VISIBLE_DEVICES = "NVIDIA_VISIBLE_DEVICES"
VOLUME_MOUNT_DIR = "/var/run/nvidia-container-devices"
MPS_CONTAINER_ROOT = "/mps"


class AllocationError(KubegpuError):
    """The kubelet asked for something we cannot give; the server answers INVALID_ARGUMENT with this line."""


@dataclass(frozen=True)
class AllocateOptions:
    """Everything besides the devices that shapes an Allocate response (from the merged config)."""

    device_list_strategies: tuple[str, ...] = ("envvar",)
    pass_device_specs: bool = False
    dev_root: str = "/"
    control_devices: tuple[str, ...] = CONTROL_DEVICES  # the adapter drops those absent on the host
    stand_ins: str | None = None  # a simulated node's stand-in devices (kubegpu.gpu.standins): the host paths
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


def _device_specs(devices: Sequence[AnnotatedDevice], options: AllocateOptions) -> list[pb.DeviceSpec]:
    paths = list(options.control_devices)
    paths.extend(dict.fromkeys(node for d in devices for node in device_nodes(d)))
    return [pb.DeviceSpec(container_path=p, host_path=host_path(p, options.dev_root, options.stand_ins),
                          permissions="rw") for p in paths]


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
    if any(d.sharing == SharingKind.MPS for d in devices):
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
