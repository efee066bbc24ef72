"""Which pods hold which GPU or MIG instance, from the kubelet's PodResources API.

dcgm-exporter keeps one pod per device ("last writer wins"), so on a time-sliced or MPS GPU all but one pod go
unseen, and it only looks at resources named `nvidia.com/gpu` or `nvidia.com/mig-*`. We resolve every device ID
the kubelet reports against the node's real GPUs and MIG instances instead of filtering by resource name, so
`nvidia.com/gpu.shared`, memory slices and any renamed resource are attributed too, and every sharing pod gets
its own series. Devices a pod got through DRA (each container's `dynamic_resources`: driver, pool, device name) are
resolved the same way, by the device names our DRA driver publishes (`kubegpu.sharing.names.dra_*`), and carry the
ResourceClaim's name.
"""

from __future__ import annotations

import builtins
import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import grpc

from kubegpu.gpu.backend import GpuDevice, MigDevice
from kubegpu.proto.podresources.v1 import api_pb2, api_pb2_grpc
from kubegpu.sharing.names import parse_dra_device_name, split_device_id

log = logging.getLogger(__name__)

DEFAULT_POD_RESOURCES_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"
DRA_DRIVERS = frozenset({"gpu.nvidia.com"})
"""DRA driver names whose devices are ours to resolve (the DRA driver's default `--driver-name`)."""

EntityKey = tuple[int, int | None]
"""(GPU index, GPU instance id or None for the whole GPU)."""


@dataclass(frozen=True, order=True)
class PodInfo:
    namespace: str
    pod: str
    container: str
    vgpu: str | None = None
    claim: str | None = None  # the ResourceClaim, for a device allocated through DRA


@dataclass(frozen=True)
class ContainerDevices:
    """Device IDs one container holds under one extended resource, or (with `claim`) the DRA devices one of its
    ResourceClaims allocated: then `resource_name` is the DRA driver and `device_ids` the slices' device names."""

    namespace: str
    pod: str
    container: str
    resource_name: str
    device_ids: tuple[str, ...]
    claim: str | None = None


def attribute(
    containers: Iterable[ContainerDevices], gpus: Sequence[GpuDevice], migs: Sequence[MigDevice],
    dra_drivers: frozenset[str] = DRA_DRIVERS,
) -> dict[EntityKey, list[PodInfo]]:
    """Map each GPU / MIG instance to the pods holding it; unknown device IDs are ignored (not ours).

    `migs` must be in the backend's listing order: with `deviceIDStrategy: index` the device plugin names a MIG
    device `<gpu>:<position in its GPU's listing>` (NVIDIA's `i:j`), which is not its GPU instance id."""
    by_id: dict[str, EntityKey] = {}
    for gpu in gpus:
        by_id[gpu.uuid] = (gpu.index, None)
        by_id[str(gpu.index)] = (gpu.index, None)
    positions: dict[int, int] = {}
    for mig in migs:
        position = positions[mig.gpu_index] = positions.get(mig.gpu_index, -1) + 1
        by_id[mig.uuid] = (mig.gpu_index, mig.gi_id)
        by_id[f"{mig.gpu_index}:{position}"] = (mig.gpu_index, mig.gi_id)
    by_minor = {gpu.device_minor: gpu.index for gpu in gpus}
    by_placement = {(mig.gpu_index, mig.profile_id, mig.start): mig.gi_id for mig in migs}
    holders: dict[EntityKey, set[PodInfo]] = {}
    for entry in containers:
        if entry.claim is not None:
            if entry.resource_name in dra_drivers:
                for name in entry.device_ids:
                    dra_key = _dra_entity(name, by_minor, by_placement)
                    if dra_key is not None:
                        pod = PodInfo(entry.namespace, entry.pod, entry.container, None, entry.claim)
                        holders.setdefault(dra_key, set()).add(pod)
            continue
        for device_id in entry.device_ids:
            base, replica = split_device_id(device_id)
            key = by_id.get(base)
            if key is None:
                continue
            holders.setdefault(key, set()).add(PodInfo(entry.namespace, entry.pod, entry.container, replica))
    return {key: sorted(pods) for key, pods in holders.items()}


def _dra_entity(name: str, by_minor: dict[int, int], by_placement: dict[tuple[int, int, int], int]) -> EntityKey | None:
    """A DRA device name → (GPU index, GI id or None); None when it names no GPU or live MIG instance here."""
    parsed = parse_dra_device_name(name)
    if parsed is None or parsed[0] not in by_minor:
        return None
    minor, profile_id, start = parsed
    index = by_minor[minor]
    if profile_id is None or start is None:
        return (index, None)
    gi_id = by_placement.get((index, profile_id, start))
    return (index, gi_id) if gi_id is not None else None


def flatten(response: api_pb2.ListPodResourcesResponse) -> list[ContainerDevices]:
    """Every container's device-plugin devices, then the DRA devices of each of its claims (one entry per driver)."""
    out: list[ContainerDevices] = []
    for pod in response.pod_resources:
        for container in pod.containers:
            out.extend(ContainerDevices(pod.namespace, pod.name, container.name, devices.resource_name,
                                        tuple(devices.device_ids)) for devices in container.devices)
            for dynamic in container.dynamic_resources:
                by_driver: dict[str, list[str]] = {}
                for claimed in dynamic.claim_resources:
                    by_driver.setdefault(claimed.driver_name, []).append(claimed.device_name)
                out.extend(ContainerDevices(pod.namespace, pod.name, container.name, driver, tuple(names),
                                            dynamic.claim_name) for driver, names in sorted(by_driver.items()))
    return out


class PodResourcesClient:
    """Calls `List` on the kubelet's PodResources socket; any failure means "no attribution this time"."""

    def __init__(self, socket_path: str | Path = DEFAULT_POD_RESOURCES_SOCKET, timeout: float = 2.0) -> None:
        self.socket_path = Path(socket_path)
        self.timeout = timeout
        self._warned = False

    def list(self) -> list[ContainerDevices] | None:
        if not self.socket_path.exists():
            self._warn_once(f"pod-resources socket {self.socket_path} not found; metrics are not attributed to pods")
            return None
        try:
            with grpc.insecure_channel(f"unix://{self.socket_path.absolute()}") as channel:
                stub = api_pb2_grpc.PodResourcesListerStub(channel)
                response = stub.List(api_pb2.ListPodResourcesRequest(), timeout=self.timeout)
        except grpc.RpcError as exc:
            code = exc.code().name if isinstance(exc, grpc.Call) else type(exc).__name__
            self._warn_once(f"pod-resources List on {self.socket_path} failed: {code}")
            return None
        self._warned = False
        return flatten(response)

    def allocatable(self) -> builtins.list[tuple[str, builtins.list[str]]] | None:
        """`GetAllocatableResources`: every device ID the node can hand out, as (resource name, IDs); None on any
        failure. The replicas and slices among them tell what each shared device is worth (`kubegpu.sharing.shares`)."""
        if not self.socket_path.exists():
            return None
        try:
            with grpc.insecure_channel(f"unix://{self.socket_path.absolute()}") as channel:
                stub = api_pb2_grpc.PodResourcesListerStub(channel)
                response = stub.GetAllocatableResources(api_pb2.AllocatableResourcesRequest(), timeout=self.timeout)
        except grpc.RpcError as exc:
            code = exc.code().name if isinstance(exc, grpc.Call) else type(exc).__name__
            self._warn_once(f"pod-resources GetAllocatableResources on {self.socket_path} failed: {code}")
            return None
        return [(devices.resource_name, list(devices.device_ids)) for devices in response.devices]

    def _warn_once(self, message: str) -> None:
        if not self._warned:
            log.warning(message)
            self._warned = True
