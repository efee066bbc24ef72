"""A fake kubelet for DRA plugins over real unix sockets: it finds `*-reg.sock` in the registry directory, asks
`GetInfo`, picks the first of the plugin's versions it supports (in the plugin's order, as the kubelet does),
reports the outcome with `NotifyRegistrationStatus`, then calls NodePrepare/UnprepareResources on the endpoint."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import grpc

from kubegpu.proto.dra.pluginregistration import api_pb2 as reg_pb
from kubegpu.proto.dra.pluginregistration import api_pb2_grpc as reg_grpc
from kubegpu.proto.dra.v1 import api_pb2 as v1_pb
from kubegpu.proto.dra.v1 import api_pb2_grpc as v1_grpc
from kubegpu.proto.dra.v1beta1 import api_pb2 as v1beta1_pb
from kubegpu.proto.dra.v1beta1 import api_pb2_grpc as v1beta1_grpc

SERVICES = {"v1.DRAPlugin": (v1_pb, v1_grpc), "v1beta1.DRAPlugin": (v1beta1_pb, v1beta1_grpc)}


class FakeDraKubelet:
    def __init__(self, registry_dir: Path, supported: tuple[str, ...] = ("v1.DRAPlugin", "v1beta1.DRAPlugin")) -> None:
        self.registry_dir = registry_dir
        self.supported = supported
        self.info: Any = None
        self.version = ""
        self.error = ""
        self._channel: grpc.aio.Channel | None = None
        self._stub: Any = None
        self._pb: Any = None

    async def register(self, timeout: float = 5.0) -> bool:
        """Find the plugin's registration socket and register it; True when a version matched."""
        deadline = asyncio.get_running_loop().time() + timeout
        while True:
            sockets = sorted(p for p in self.registry_dir.glob("*-reg.sock") if not p.name.startswith("."))
            if sockets:
                break
            if asyncio.get_running_loop().time() > deadline:
                raise TimeoutError("no registration socket appeared")
            await asyncio.sleep(0.05)
        async with grpc.aio.insecure_channel(f"unix://{sockets[0]}") as channel:
            stub = reg_grpc.RegistrationStub(channel)
            self.info = await stub.GetInfo(reg_pb.InfoRequest(), timeout=5)
            chosen = next((v for v in self.info.supported_versions if v in self.supported), "")
            if self.info.type != "DRAPlugin":
                self.error = f"unexpected plugin type {self.info.type}"
            elif not chosen:
                self.error = (f"none of services supported by the plugin {list(self.info.supported_versions)} are "
                              f"supported by the kubelet {list(self.supported)}")
            await stub.NotifyRegistrationStatus(reg_pb.RegistrationStatus(plugin_registered=not self.error,
                                                                          error=self.error), timeout=5)
        if self.error:
            return False
        self.version = chosen
        await self.close()
        self._pb, module = SERVICES[chosen]
        self._channel = grpc.aio.insecure_channel(f"unix://{self.info.endpoint}")
        self._stub = module.DRAPluginStub(self._channel)
        return True

    def _claims(self, claims: list[tuple[str, str, str]]) -> list[Any]:
        return [self._pb.Claim(namespace=ns, uid=uid, name=name) for ns, uid, name in claims]

    async def prepare(self, *claims: tuple[str, str, str]) -> Any:
        request = self._pb.NodePrepareResourcesRequest(claims=self._claims(list(claims)))
        return await self._stub.NodePrepareResources(request, timeout=10)

    async def unprepare(self, *claims: tuple[str, str, str]) -> Any:
        request = self._pb.NodeUnprepareResourcesRequest(claims=self._claims(list(claims)))
        return await self._stub.NodeUnprepareResources(request, timeout=10)

    async def close(self) -> None:
        if self._channel is not None:
            await self._channel.close()
            self._channel = None
