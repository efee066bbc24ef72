"""Which pods hold which GPU or MIG instance, from the kubelet's PodResources API.

dcgm-exporter keeps one pod per device ("last writer wins"), so on a time-sliced or MPS GPU all but one pod go
unseen, and it only looks at resources named `nvidia.com/gpu` or `nvidia.com/mig-*`. We resolve every device ID
the kubelet reports against the node's real GPUs and MIG instances instead of filtering by resource name, so
`nvidia.com/gpu.shared`, memory slices and any renamed resource are attributed too, and every sharing pod gets
its own series.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import grpc

from kubegpu.gpu.backend import GpuDevice, MigDevice
from kubegpu.proto.podresources.v1 import api_pb2, api_pb2_grpc

log = logging.getLogger(__name__)

DEFAULT_POD_RESOURCES_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"

EntityKey = tuple[int, int | None]
"""(GPU index, GPU instance id or None for the whole GPU)."""


@dataclass(frozen=True, order=True)
class PodInfo:
    namespace: str
    pod: str
    container: str
    vgpu: str | None = None


@dataclass(frozen=True)
class ContainerDevices:
    namespace: str
    pod: str
    container: str
    resource_name: str
    device_ids: tuple[str, ...]


def _split_replica(device_id: str) -> tuple[str, str | None]:
    """`<id>::<k>` is a shared replica (time-slicing, MPS, memory slice); the part before `::` is the device."""
    base, sep, replica = device_id.partition("::")
    return base, (replica if sep else None)


def attribute(
    containers: Iterable[ContainerDevices], gpus: Sequence[GpuDevice], migs: Sequence[MigDevice]
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
    holders: dict[EntityKey, set[PodInfo]] = {}
    for entry in containers:
        for device_id in entry.device_ids:
            base, replica = _split_replica(device_id)
            key = by_id.get(base)
            if key is None:
                continue
            holders.setdefault(key, set()).add(PodInfo(entry.namespace, entry.pod, entry.container, replica))
    return {key: sorted(pods) for key, pods in holders.items()}


def flatten(response: api_pb2.ListPodResourcesResponse) -> list[ContainerDevices]:
    return [
        ContainerDevices(pod.namespace, pod.name, container.name, devices.resource_name, tuple(devices.device_ids))
        for pod in response.pod_resources
        for container in pod.containers
        for devices in container.devices
    ]


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

    def _warn_once(self, message: str) -> None:
        if not self._warned:
            log.warning(message)
            self._warned = True
