"""A fake kubelet PodResources server on a real unix socket, speaking the real v1 protocol."""

from __future__ import annotations

from concurrent import futures
from pathlib import Path

import grpc

from kubegpu.proto.podresources.v1 import api_pb2, api_pb2_grpc

Assignment = tuple[str, str, str, str, list[str]]
"""(namespace, pod, container, resource name, device ids)."""
ClaimAssignment = tuple[str, str, str, str, str, list[str]]
"""(namespace, pod, container, claim name, DRA driver, device names in the driver's pool) — a DRA allocation."""


class FakePodResources(api_pb2_grpc.PodResourcesListerServicer):
    def __init__(self, socket_path: Path, assignments: list[Assignment], error: grpc.StatusCode | None = None,
                 claims: list[ClaimAssignment] | None = None,
                 allocatable: list[tuple[str, list[str]]] | None = None) -> None:
        self.socket_path = socket_path
        self.assignments = assignments
        self.claims = claims or []
        self.allocatable = allocatable or []  # (resource name, device ids) GetAllocatableResources answers
        self.error = error  # answer every List with this status instead, as a failing kubelet would
        self.calls = 0
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        api_pb2_grpc.add_PodResourcesListerServicer_to_server(self, self.server)
        self.server.add_insecure_port(f"unix://{socket_path}")

    def __enter__(self) -> FakePodResources:
        self.server.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.stop(None)

    def GetAllocatableResources(
        self, request: api_pb2.AllocatableResourcesRequest, context: grpc.ServicerContext
    ) -> api_pb2.AllocatableResourcesResponse:
        if self.error is not None:
            context.abort(self.error, "injected failure")
        return api_pb2.AllocatableResourcesResponse(
            devices=[api_pb2.ContainerDevices(resource_name=name, device_ids=ids) for name, ids in self.allocatable])

    def List(
        self, request: api_pb2.ListPodResourcesRequest, context: grpc.ServicerContext
    ) -> api_pb2.ListPodResourcesResponse:
        self.calls += 1
        if self.error is not None:
            context.abort(self.error, "injected failure")
        pods: dict[tuple[str, str], api_pb2.PodResources] = {}
        for namespace, pod, container, resource, ids in self.assignments:
            entry = pods.setdefault((namespace, pod), api_pb2.PodResources(name=pod, namespace=namespace))
            entry.containers.append(
                api_pb2.ContainerResources(
                    name=container, devices=[api_pb2.ContainerDevices(resource_name=resource, device_ids=ids)]
                )
            )
        for namespace, pod, container, claim, driver, names in self.claims:
            entry = pods.setdefault((namespace, pod), api_pb2.PodResources(name=pod, namespace=namespace))
            resources = [api_pb2.ClaimResource(driver_name=driver, pool_name="node", device_name=name)
                         for name in names]
            dynamic = api_pb2.DynamicResource(claim_name=claim, claim_namespace=namespace, claim_resources=resources)
            entry.containers.append(api_pb2.ContainerResources(name=container, dynamic_resources=[dynamic]))
        return api_pb2.ListPodResourcesResponse(pod_resources=list(pods.values()))
