"""A fake kubelet that speaks the real device-plugin protocol (v1beta1) over real unix sockets.

It serves `Registration` on `<dir>/kubelet.sock`; on each `Register` it dials `<dir>/<endpoint>`, asks for the
plugin options and consumes `ListAndWatch`, keeping the latest device list per resource. Tests then call
`allocate` / `preferred` through the same channel, and `restart()` does what a kubelet restart does: delete every
socket in the directory and create a fresh `kubelet.sock`.
"""

from __future__ import annotations

import asyncio
import contextlib
import stat
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from kubegpu.proto.deviceplugin.v1beta1 import api_pb2 as pb
from kubegpu.proto.deviceplugin.v1beta1 import api_pb2_grpc as pb_grpc


@dataclass
class Registration:
    resource: str
    endpoint: str
    version: str
    options: pb.DevicePluginOptions
    at: float  # time.monotonic() when Register arrived


@dataclass
class PluginEndpoint:
    """The kubelet's view of one registered plugin."""

    registration: Registration
    channel: grpc.aio.Channel
    stub: pb_grpc.DevicePluginStub
    options: pb.DevicePluginOptions | None = None
    devices: dict[str, str] = field(default_factory=dict)  # id → health
    numa: dict[str, list[int]] = field(default_factory=dict)
    updates: int = 0
    disconnected: bool = False
    task: asyncio.Task[None] | None = None


class _RegistrationService(pb_grpc.RegistrationServicer):
    def __init__(self, kubelet: FakeKubelet) -> None:
        self.kubelet = kubelet

    async def Register(self, request: pb.RegisterRequest, context: grpc.aio.ServicerContext) -> pb.Empty:
        if request.version != "v1beta1":
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"unsupported version {request.version}")
        if self.kubelet.register_delay:
            await asyncio.sleep(self.kubelet.register_delay)
        if request.resource_name in self.kubelet.refuse:
            self.kubelet.refused.append(request.resource_name)
            await context.abort(grpc.StatusCode.ALREADY_EXISTS, f"{request.resource_name} is already registered")
        await self.kubelet._on_register(request)
        return pb.Empty()


class FakeKubelet:
    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self.socket = directory / "kubelet.sock"
        self.registrations: list[Registration] = []
        self.plugins: dict[str, PluginEndpoint] = {}
        self.refuse: set[str] = set()  # resource names whose Register is refused (as if another plugin held them)
        self.refused: list[str] = []
        self.register_delay = 0.0  # seconds each Register takes (a busy kubelet)
        self._server: grpc.aio.Server | None = None
        self._changed = asyncio.Condition()

    async def start(self) -> None:
        server = grpc.aio.server()
        pb_grpc.add_RegistrationServicer_to_server(_RegistrationService(self), server)
        server.add_insecure_port(f"unix://{self.socket}")
        await server.start()
        self._server = server

    async def stop(self) -> None:
        for plugin in self.plugins.values():
            await self._drop(plugin)
        self.plugins.clear()
        if self._server is not None:
            await self._server.stop(0)
            self._server = None
        with contextlib.suppress(FileNotFoundError):
            self.socket.unlink()

    async def restart(self) -> float:
        """Like a kubelet restart: all sockets in the directory go, a new kubelet.sock appears. Returns its time."""
        await self.stop()
        for path in self.dir.iterdir():
            if stat.S_ISSOCK(path.lstat().st_mode):
                path.unlink()
        await self.start()
        return time.monotonic()

    async def _drop(self, plugin: PluginEndpoint) -> None:
        if plugin.task is not None:
            plugin.task.cancel()
            with contextlib.suppress(asyncio.CancelledError, grpc.aio.AioRpcError):
                await plugin.task
        await plugin.channel.close()

    async def _on_register(self, request: pb.RegisterRequest) -> None:
        registration = Registration(
            request.resource_name, request.endpoint, request.version, request.options, time.monotonic()
        )
        self.registrations.append(registration)
        old = self.plugins.pop(request.resource_name, None)
        if old is not None:
            await self._drop(old)
        channel = grpc.aio.insecure_channel(f"unix://{self.dir / request.endpoint}")
        plugin = PluginEndpoint(registration, channel, pb_grpc.DevicePluginStub(channel))
        self.plugins[request.resource_name] = plugin
        plugin.task = asyncio.create_task(self._watch(plugin))
        async with self._changed:
            self._changed.notify_all()

    async def _watch(self, plugin: PluginEndpoint) -> None:
        plugin.options = await plugin.stub.GetDevicePluginOptions(pb.Empty(), wait_for_ready=True)
        with contextlib.suppress(grpc.aio.AioRpcError):
            async for response in plugin.stub.ListAndWatch(pb.Empty()):
                plugin.devices = {d.ID: d.health for d in response.devices}
                plugin.numa = {d.ID: [n.ID for n in d.topology.nodes] for d in response.devices}
                plugin.updates += 1
                async with self._changed:
                    self._changed.notify_all()
        # The plugin went away. Like kubelet's endpointStopGracePeriod: it stays known, with allocatable 0.
        plugin.devices = dict.fromkeys(plugin.devices, "Unhealthy")
        plugin.disconnected = True
        async with self._changed:
            self._changed.notify_all()

    # ------------------------------------------------------------------------------------------- test helpers

    def capacity(self, resource: str) -> int:
        plugin = self.plugins.get(resource)
        return len(plugin.devices) if plugin else 0

    def allocatable(self, resource: str) -> int:
        plugin = self.plugins.get(resource)
        return sum(1 for h in plugin.devices.values() if h == "Healthy") if plugin else 0

    async def wait_for(self, condition: Callable[[], bool], timeout: float = 5.0) -> None:
        """Wait until `condition()` holds after a registration or a ListAndWatch update."""

        async def waiting() -> None:
            async with self._changed:
                await self._changed.wait_for(condition)

        try:
            await asyncio.wait_for(waiting(), timeout)
        except TimeoutError:
            summary = self.summary()
            raise AssertionError(f"fake kubelet: condition not met within {timeout}s; plugins={summary}") from None

    def summary(self) -> dict[str, tuple[int, int]]:
        return {r: (self.capacity(r), self.allocatable(r)) for r in self.plugins}

    async def wait_for_devices(self, resource: str, count: int, healthy: int | None = None,
                               timeout: float = 5.0) -> dict[str, str]:
        await self.wait_for(
            lambda: self.capacity(resource) == count and (healthy is None or self.allocatable(resource) == healthy),
            timeout,
        )
        return dict(self.plugins[resource].devices)

    async def allocate(self, resource: str, *containers: Sequence[str]) -> pb.AllocateResponse:
        requests = [pb.ContainerAllocateRequest(devices_ids=list(c)) for c in containers]
        request = pb.AllocateRequest(container_requests=requests)
        return await self.plugins[resource].stub.Allocate(request, timeout=5)

    async def preferred(self, resource: str, available: Sequence[str], must_include: Sequence[str],
                        size: int) -> list[str]:
        request = pb.PreferredAllocationRequest(container_requests=[pb.ContainerPreferredAllocationRequest(
            available_deviceIDs=list(available), must_include_deviceIDs=list(must_include), allocation_size=size)])
        response = await self.plugins[resource].stub.GetPreferredAllocation(request, timeout=5)
        return list(response.container_responses[0].deviceIDs)
