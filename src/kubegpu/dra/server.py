"""The DRA driver's two gRPC endpoints on unix sockets: the DRA service (`v1` and `v1beta1`, identical messages)
on `<plugin dir>/dra.sock`, and the plugin-registration service on `<registry dir>/<driver>-reg.sock`, through which
the kubelet (watching that directory) finds the plugin, learns its versions and picks the first it supports.

The DRA service is a synchronous gRPC server: each call runs straight in one of its worker threads, and the
driver serializes them. Prepare sits on the kubelet's pod-start path, and an asyncio server would add two thread
hops per call (event loop, then `to_thread` for the blocking driver), about 0.4 ms of a ~2 ms prepare. Registration
stays on asyncio, next to `watch`: a removed registration socket (a kubelet restart wipes the directory) is served
again so the kubelet re-registers.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import ModuleType
from typing import Any

import grpc

from kubegpu.dra.driver import ClaimRef, DraDriver
from kubegpu.files import owner_only_files
from kubegpu.proto.dra.pluginregistration import api_pb2 as reg_pb
from kubegpu.proto.dra.pluginregistration import api_pb2_grpc as reg_grpc
from kubegpu.proto.dra.v1 import api_pb2 as v1_pb
from kubegpu.proto.dra.v1 import api_pb2_grpc as v1_grpc
from kubegpu.proto.dra.v1beta1 import api_pb2 as v1beta1_pb
from kubegpu.proto.dra.v1beta1 import api_pb2_grpc as v1beta1_grpc

log = logging.getLogger("kubegpu.dra")

PLUGIN_TYPE = "DRAPlugin"
SUPPORTED_VERSIONS = ("v1.DRAPlugin", "v1beta1.DRAPlugin")
DEFAULT_REGISTRY_DIR = "/var/lib/kubelet/plugins_registry"
DEFAULT_PLUGINS_DIR = "/var/lib/kubelet/plugins"


def _servicer(pb: ModuleType, base: type, driver: DraDriver) -> Any:
    class Servicer(base):  # type: ignore[misc,valid-type]
        def NodePrepareResources(self, request: Any, context: Any) -> Any:
            refs = [ClaimRef(c.namespace, c.uid, c.name) for c in request.claims]
            results = driver.prepare(refs)
            response = pb.NodePrepareResourcesResponse()
            for uid, result in results.items():
                entry = response.claims[uid]
                if result.error:
                    entry.error = result.error
                    continue
                for device in result.devices:
                    entry.devices.add(request_names=device.request_names, pool_name=device.pool,
                                      device_name=device.device, cdi_device_ids=device.cdi_device_ids,
                                      share_id=device.share_id)
            return response

        def NodeUnprepareResources(self, request: Any, context: Any) -> Any:
            refs = [ClaimRef(c.namespace, c.uid, c.name) for c in request.claims]
            errors = driver.unprepare(refs)
            response = pb.NodeUnprepareResourcesResponse()
            for uid, error in errors.items():
                response.claims[uid].error = error
            return response

    return Servicer()


class _Registration(reg_grpc.RegistrationServicer):  # type: ignore[misc]
    def __init__(self, server: DraPluginServer) -> None:
        self.server = server

    async def GetInfo(self, request: Any, context: Any) -> Any:
        return reg_pb.PluginInfo(type=PLUGIN_TYPE, name=self.server.driver.driver_name,
                                 endpoint=str(self.server.dra_socket), supported_versions=list(self.server.versions))

    async def NotifyRegistrationStatus(self, request: Any, context: Any) -> Any:
        self.server.registered = bool(request.plugin_registered)
        self.server.registration_error = request.error
        if request.plugin_registered:
            log.info("registered with the kubelet")
        else:
            log.error("kubelet refused the registration: %s", request.error)
        self.server.status_changed.set()
        return reg_pb.RegistrationStatusResponse()


class DraPluginServer:
    def __init__(self, driver: DraDriver, plugin_dir: Path, registry_dir: Path,
                 versions: tuple[str, ...] = SUPPORTED_VERSIONS) -> None:
        self.driver = driver
        self.plugin_dir = plugin_dir
        self.registry_dir = registry_dir
        self.versions = versions
        self.dra_socket = plugin_dir / "dra.sock"
        self.registration_socket = registry_dir / f"{driver.driver_name}-reg.sock"
        self.registered = False
        self.registration_error = ""
        self.status_changed = asyncio.Event()
        self._dra: grpc.Server | None = None
        self._registration: grpc.aio.Server | None = None

    async def start(self) -> None:
        self.plugin_dir.mkdir(parents=True, exist_ok=True)
        # a few workers: calls queue on the driver's lock anyway, but a slow prepare (a MIG mode switch) must not
        # keep the server from accepting the kubelet's next calls
        self._dra = grpc.server(ThreadPoolExecutor(max_workers=4, thread_name_prefix="dra-grpc"))
        v1_grpc.add_DRAPluginServicer_to_server(_servicer(v1_pb, v1_grpc.DRAPluginServicer, self.driver), self._dra)
        v1beta1_grpc.add_DRAPluginServicer_to_server(
            _servicer(v1beta1_pb, v1beta1_grpc.DRAPluginServicer, self.driver), self._dra)
        with owner_only_files():  # the sockets are born 0600: only root (the kubelet) may connect
            self._dra.add_insecure_port(f"unix://{self.dra_socket.absolute()}")
        self._dra.start()
        await self._serve_registration()

    async def _serve_registration(self) -> None:
        if self._registration is not None:
            await self._registration.stop(None)
        self.registry_dir.mkdir(parents=True, exist_ok=True)
        self._registration = grpc.aio.server()
        reg_grpc.add_RegistrationServicer_to_server(_Registration(self), self._registration)
        with owner_only_files():
            self._registration.add_insecure_port(f"unix://{self.registration_socket.absolute()}")
        await self._registration.start()

    async def watch(self, interval: float = 1.0) -> None:
        """Serve the registration socket again whenever it disappears (kubelet restart), until cancelled."""
        while True:
            await asyncio.sleep(interval)
            if not self.registration_socket.exists():
                log.info("registration socket %s is gone; serving it again", self.registration_socket)
                self.registered = False
                await self._serve_registration()

    async def stop(self) -> None:
        if self._registration is not None:
            await self._registration.stop(None)
        if self._dra is not None:
            await asyncio.to_thread(self._dra.stop(None).wait)
        for path in (self.registration_socket, self.dra_socket):
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
