"""Small builders for resource.k8s.io/v1 objects in the DRA tests (plain dicts, as users write them)."""

from __future__ import annotations

from typing import Any

DRIVER = "gpu.nvidia.com"
GPU_SEL = "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'gpu'"
MIG_SEL = "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'mig'"


def device(name: str, type_: str = "gpu", product: str = "NVIDIA H100 80GB HBM3", memory: str = "80Gi",
           consumes: dict[str, dict[str, str]] | None = None, taints: list[dict[str, str]] | None = None,
           **attrs: Any) -> dict[str, Any]:
    attributes: dict[str, Any] = {"type": {"string": type_}, "productName": {"string": product}}
    for key, value in attrs.items():
        kind = "bool" if isinstance(value, bool) else "int" if isinstance(value, int) else "string"
        attributes[key] = {kind: value}
    out: dict[str, Any] = {"name": name, "attributes": attributes, "capacity": {"memory": {"value": memory}}}
    if consumes:
        out["consumesCounters"] = [{"counterSet": s, "counters": {k: {"value": v} for k, v in c.items()}}
                                   for s, c in consumes.items()]
    if taints:
        out["taints"] = taints
    return out


def slice_(name: str, node: str, devices: list[dict[str, Any]], pool: str | None = None, generation: int = 1,
           count: int = 1, counters: dict[str, dict[str, str]] | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"driver": DRIVER, "pool": {"name": pool or node, "generation": generation,
                                                       "resourceSliceCount": count},
                            "nodeName": node, "devices": devices}
    if counters:
        spec["sharedCounters"] = [{"name": s, "counters": {k: {"value": v} for k, v in c.items()}}
                                  for s, c in counters.items()]
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": name}, "spec": spec}


def device_class(name: str, *selectors: str) -> dict[str, Any]:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": name},
            "spec": {"selectors": [{"cel": {"expression": s}} for s in selectors]}}


def classes() -> list[dict[str, Any]]:
    return [device_class("gpu.nvidia.com", GPU_SEL), device_class("mig.nvidia.com", MIG_SEL)]


def request(name: str, cls: str = "gpu.nvidia.com", count: int | None = None, mode: str | None = None,
            selectors: tuple[str, ...] = (), tolerations: list[dict[str, str]] | None = None) -> dict[str, Any]:
    exactly: dict[str, Any] = {"deviceClassName": cls}
    if count is not None:
        exactly["count"] = count
    if mode is not None:
        exactly["allocationMode"] = mode
    if selectors:
        exactly["selectors"] = [{"cel": {"expression": s}} for s in selectors]
    if tolerations:
        exactly["tolerations"] = tolerations
    return {"name": name, "exactly": exactly}


def first_available(name: str, *subs: dict[str, Any]) -> dict[str, Any]:
    return {"name": name, "firstAvailable": [{"name": s["name"], **s["exactly"]} for s in subs]}


def claim(name: str, *requests: dict[str, Any], constraints: list[dict[str, Any]] | None = None,
          namespace: str = "default", allocation: list[dict[str, str]] | None = None) -> dict[str, Any]:
    devices: dict[str, Any] = {"requests": list(requests)}
    if constraints:
        devices["constraints"] = constraints
    out: dict[str, Any] = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                           "metadata": {"name": name, "namespace": namespace}, "spec": {"devices": devices}}
    if allocation is not None:
        out["status"] = {"allocation": {"devices": {"results": allocation}}}
    return out
