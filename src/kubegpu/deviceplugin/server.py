"""One gRPC DevicePlugin server per resource, on its own unix socket (grpc.aio).

The servicer is a thin adapter: it holds the current device list and health, and delegates Allocate and
GetPreferredAllocation to the pure cores. ListAndWatch sends the full list at once and again after every
change (health, relist, config reload), as the kubelet expects.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from kubegpu.deviceplugin.allocate import AllocateOptions, AllocationError, allocate
from kubegpu.deviceplugin.preferred import PairScore, PreferenceError, numa_pair_score, preferred_allocation
from kubegpu.errors import KubegpuError
from kubegpu.files import owner_only_files, restrict_socket
from kubegpu.proto.deviceplugin.v1beta1 import api_pb2 as pb
from kubegpu.proto.deviceplugin.v1beta1 import api_pb2_grpc as pb_grpc
from kubegpu.sharing.devices import AnnotatedDevice

log = logging.getLogger(__name__)

API_VERSION = "v1beta1"
HEALTHY, UNHEALTHY = "Healthy", "Unhealthy"


def socket_name(resource: str) -> str:
    """NVIDIA's names: `nvidia.com/gpu` → `nvidia-gpu.sock`; other domains keep theirs (`example.com-foo.sock`)."""
    domain, _, tail = resource.partition("/")
    prefix = "nvidia" if domain == "nvidia.com" else domain
    return f"{prefix}-{tail}.sock"


def device_message(device: AnnotatedDevice, healthy: bool) -> pb.Device:
    topology = pb.TopologyInfo(nodes=[pb.NUMANode(ID=device.numa_node)]) if device.numa_node is not None else None
    return pb.Device(ID=device.id, health=HEALTHY if healthy else UNHEALTHY, topology=topology)


@dataclass
class ServingState:
    """What one resource serves right now; `version` goes up on every change so streams know to re-send."""

    devices: list[AnnotatedDevice]
    unhealthy: frozenset[str] = frozenset()
    options: AllocateOptions = field(default_factory=AllocateOptions)
    policy: str = "distributed"
    pair_score: PairScore = numa_pair_score
    version: int = 0
    record: Callable[[list[AnnotatedDevice]], None] | None = None  # the devices one Allocate hands out, durably

    def listing(self) -> pb.ListAndWatchResponse:
        return pb.ListAndWatchResponse(devices=[device_message(d, d.id not in self.unhealthy) for d in self.devices])


class DevicePluginServicer(pb_grpc.DevicePluginServicer):
    """The kubelet-facing API for one resource. Bad requests become INVALID_ARGUMENT; nothing crashes the server."""

    def __init__(self, resource: str, state: ServingState) -> None:
        self.resource = resource
        self.state = state
        self._known = {d.id: d for d in state.devices}
        self._changed = asyncio.Condition()
        self._closed = False

    async def update(self, state: ServingState) -> bool:
        """Replace what we serve; wake every ListAndWatch stream only if the kubelet would see a difference."""
        visible = state.listing() != self.state.listing()
        state.version = self.state.version + (1 if visible else 0)
        self.state = state
        self._known = {d.id: d for d in state.devices}
        if visible:
            async with self._changed:
                self._changed.notify_all()
        return visible

    async def close(self) -> None:
        self._closed = True
        async with self._changed:
            self._changed.notify_all()

    async def GetDevicePluginOptions(
        self, request: pb.Empty, context: grpc.aio.ServicerContext
    ) -> pb.DevicePluginOptions:
        return pb.DevicePluginOptions(pre_start_required=False, get_preferred_allocation_available=True)

    async def ListAndWatch(self, request: pb.Empty, context: grpc.aio.ServicerContext) -> AsyncIterator[
        pb.ListAndWatchResponse
    ]:
        sent = -1
        while not self._closed:
            if self.state.version != sent:
                sent = self.state.version
                yield self.state.listing()
            async with self._changed:
                if self.state.version == sent and not self._closed:
                    await self._changed.wait()

    async def GetPreferredAllocation(
        self, request: pb.PreferredAllocationRequest, context: grpc.aio.ServicerContext
    ) -> pb.PreferredAllocationResponse:
        state = self.state
        responses = []
        for container in request.container_requests:
            try:
                ids = preferred_allocation(
                    state.devices,
                    list(container.available_deviceIDs),
                    list(container.must_include_deviceIDs),
                    container.allocation_size,
                    state.policy,
                    state.pair_score,
                )
            except PreferenceError as exc:
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"{self.resource}: {exc}")
            responses.append(pb.ContainerPreferredAllocationResponse(deviceIDs=ids))
        return pb.PreferredAllocationResponse(container_responses=responses)

    async def Allocate(self, request: pb.AllocateRequest, context: grpc.aio.ServicerContext) -> pb.AllocateResponse:
        try:
            response = allocate(self.resource, request, self._known, self.state.options)
        except AllocationError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"{self.resource}: {exc}")
            raise  # pragma: no cover - abort raises
        if self.state.record is not None:  # record before the container gets the devices (the guard's shares)
            try:
                self.state.record([self._known[i] for c in request.container_requests for i in c.devices_ids])
            except KubegpuError as exc:
                await context.abort(grpc.StatusCode.INTERNAL, f"{self.resource}: {exc}")
        return response

    async def PreStartContainer(
        self, request: pb.PreStartContainerRequest, context: grpc.aio.ServicerContext
    ) -> pb.PreStartContainerResponse:
        return pb.PreStartContainerResponse()


class ResourceServer:
    """A servicer on its socket: start (removing a stale socket), stop (removing ours)."""

    def __init__(self, resource: str, socket_path: Path, state: ServingState) -> None:
        self.resource = resource
        self.socket_path = socket_path
        self.servicer = DevicePluginServicer(resource, state)
        self._server: grpc.aio.Server | None = None

    async def start(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.socket_path.unlink()
        server = grpc.aio.server()
        pb_grpc.add_DevicePluginServicer_to_server(self.servicer, server)
        try:
            with owner_only_files():  # the socket is born 0600: only root (the kubelet) may connect
                server.add_insecure_port(f"unix://{self.socket_path}")
        except RuntimeError as exc:
            raise KubegpuError(f"{self.socket_path}: cannot listen: {exc}") from None
        await server.start()
        restrict_socket(self.socket_path)
        self._server = server

    async def stop(self, grace: float = 0.2) -> None:
        await self.servicer.close()
        if self._server is not None:
            await self._server.stop(grace)
            self._server = None
        with contextlib.suppress(FileNotFoundError):
            self.socket_path.unlink()


async def register(kubelet_socket: Path, endpoint: str, resource: str, timeout: float = 5.0) -> None:
    """Registration.Register with version v1beta1, our socket's basename and GetPreferredAllocation advertised."""
    request = pb.RegisterRequest(
        version=API_VERSION,
        endpoint=endpoint,
        resource_name=resource,
        options=pb.DevicePluginOptions(get_preferred_allocation_available=True),
    )
    async with grpc.aio.insecure_channel(f"unix://{kubelet_socket}") as channel:
        try:
            await pb_grpc.RegistrationStub(channel).Register(request, timeout=timeout, wait_for_ready=True)
        except grpc.aio.AioRpcError as exc:
            raise KubegpuError(
                f"{kubelet_socket}: registering {resource} failed: {exc.code().name}: {exc.details()}"
            ) from None


def unhealthy_ids(devices: Sequence[AnnotatedDevice], unhealthy_gpus: frozenset[int]) -> frozenset[str]:
    """Every ID (replica, MIG device, slice) on a failing physical GPU is unhealthy."""
    return frozenset(d.id for d in devices if d.gpu_index in unhealthy_gpus)
