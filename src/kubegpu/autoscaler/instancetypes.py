"""Instance types in Karpenter's kwok JSON format, plus the one field GPU awareness needs.

Each entry: `name`, `architecture`, `operatingSystems`, `resources` (any resource name, `nvidia.com/gpu`
included), `offerings` [{`Price`, `Available`, `Requirements` on zone and capacity type}]. We add an optional
`gpuModel` (a `kubegpu.gpu` catalog key such as `A100-SXM4-80GB`): Karpenter's decoder ignores it, and with it
the autoscaler knows what one GPU of that type holds under a NodePool's MIG or sharing config.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from importlib import resources as pkg_resources
from pathlib import Path
from typing import Any

from kubegpu.autoscaler import labels as L
from kubegpu.errors import ConfigError, KubegpuError
from kubegpu.files import load_json_file, parse_json_text
from kubegpu.scheduling.quantity import parse_quantities
from kubegpu.sharing.names import GPU_RESOURCE

KUBE_RESERVED = {"cpu": 0.1, "memory": 10 * 2.0**20}  # kwok's kube-reserved: 100m CPU and 10Mi
DEFAULT_PODS = 110.0
MAX_PRICE = 1e6  # per hour; the largest cloud instances cost under 1e3
_AWS_SIZE = re.compile(r"^[a-z0-9-]+\.(?P<size>[0-9]*(nano|micro|small|medium|large|xlarge|metal)[-a-z0-9]*)$")


@dataclass(frozen=True)
class Offering:
    """One way to buy an instance type: a zone and capacity type at a price."""

    zone: str
    capacity_type: str
    price: float
    available: bool = True

    def labels(self) -> dict[str, str]:
        return {L.ZONE_LABEL: self.zone, L.CAPACITY_TYPE_LABEL: self.capacity_type}


@dataclass(frozen=True)
class InstanceType:
    name: str
    architecture: str
    operating_systems: tuple[str, ...]
    capacity: Mapping[str, float]
    offerings: tuple[Offering, ...]
    gpu_model: str | None = None
    overhead: Mapping[str, float] = field(default_factory=lambda: dict(KUBE_RESERVED))

    @cached_property
    def allocatable(self) -> dict[str, float]:
        """Capacity minus kube-reserved (Karpenter: Capacity − Overhead)."""
        return {k: max(0.0, v - self.overhead.get(k, 0.0)) for k, v in self.capacity.items()}

    @property
    def gpu_count(self) -> int:
        return int(self.capacity.get(GPU_RESOURCE, 0))

    @cached_property
    def labels(self) -> dict[str, str]:
        """Labels a node of this type carries (zone and capacity type come from the offering)."""
        family, size = family_and_size(self.name, self.capacity.get("cpu", 0.0))
        out = {
            L.INSTANCE_TYPE_LABEL: self.name,
            L.ARCH_LABEL: self.architecture,
            L.INSTANCE_FAMILY_LABEL: family,
            L.INSTANCE_SIZE_LABEL: size,
            L.INSTANCE_CPU_LABEL: str(int(self.capacity.get("cpu", 0.0))),
            L.INSTANCE_MEMORY_LABEL: str(int(self.capacity.get("memory", 0.0) // 2**20)),
            L.INSTANCE_GPU_COUNT_LABEL: str(self.gpu_count),
        }
        if len(self.operating_systems) == 1:
            out[L.OS_LABEL] = self.operating_systems[0]
        if self.gpu_count:
            out[L.GPU_COUNT_LABEL] = str(self.gpu_count)
            if self.gpu_model:
                out[L.GPU_PRODUCT_LABEL] = gpu_product_label(self.gpu_model)
        return out

    def cheapest_offering(self, allowed: Any = None) -> Offering | None:
        """The cheapest available offering, optionally filtered by `allowed(offering) -> bool`."""
        best: Offering | None = None
        for offering in self.offerings:
            if not offering.available or (allowed is not None and not allowed(offering)):
                continue
            if best is None or offering.price < best.price:
                best = offering
        return best


def gpu_product_label(model_key: str) -> str:
    """GFD's `nvidia.com/gpu.product` value: the NVML product name with spaces as dashes."""
    try:
        from kubegpu.gpu.catalog import get_model

        product = get_model(model_key).product_name
    except KubegpuError:
        product = model_key
    return product.replace(" ", "-")


def family_and_size(name: str, cpu: float) -> tuple[str, str]:
    """Family from the name (split on `.` or `-`, else its first letter); size from an AWS suffix, else the CPUs."""
    match = _AWS_SIZE.match(name)
    for sep in (".", "-"):
        if sep in name:
            family = name.split(sep, 1)[0]
            break
    else:
        family = name[:1]
    size = match.group("size") if match else str(int(cpu))
    return family, size


def _offering(raw: Any, where: str) -> Offering:
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: must be an object with Price, Available and Requirements")
    price = raw.get("Price", raw.get("price"))
    if isinstance(price, bool) or not isinstance(price, int | float) or not 0 <= price <= MAX_PRICE:
        raise ConfigError(f"{where}.Price: must be a number from 0 to {MAX_PRICE:.0e}, got {str(price)[:40]}")
    zone, capacity_type = None, None
    reqs = raw.get("Requirements", raw.get("requirements"))
    if not isinstance(reqs, list):
        raise ConfigError(f"{where}.Requirements: must be a list of zone / capacity-type requirements")
    for i, req in enumerate(reqs):
        if not isinstance(req, dict) or req.get("operator") != "In":
            raise ConfigError(f"{where}.Requirements[{i}]: must be {{key, operator: In, values: [one value]}}")
        values = req.get("values")
        if not isinstance(values, list) or not values or not isinstance(values[0], str):
            raise ConfigError(f"{where}.Requirements[{i}].values: must be a non-empty list of strings, got {values!r}")
        if req.get("key") == L.ZONE_LABEL:
            zone = str(req["values"][0])
        elif req.get("key") in (L.CAPACITY_TYPE_LABEL, "karpenter.sh/capacity-type"):
            capacity_type = str(req["values"][0])
    if zone is None or capacity_type is None:
        raise ConfigError(f"{where}.Requirements: needs both {L.ZONE_LABEL} and capacity-type")
    if capacity_type not in L.CAPACITY_TYPES:
        raise ConfigError(f"{where}.Requirements: capacity type {capacity_type!r} is not one of {L.CAPACITY_TYPES}")
    # Like kwok, every offering is treated as available; "Available": false is kept for tests of the filter.
    available = raw.get("Available", raw.get("available", True))
    if not isinstance(available, bool):
        raise ConfigError(f"{where}.Available: must be true or false, got {available!r}")
    return Offering(zone=zone, capacity_type=capacity_type, price=float(price), available=bool(available))


def parse_instance_type(raw: Any, where: str) -> InstanceType:
    """One kwok-format entry; ConfigError naming `where.field` when it is malformed."""
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: must be an object")
    name = raw.get("name")
    if not isinstance(name, str) or not name:
        raise ConfigError(f"{where}.name: must be a non-empty string")
    resources = raw.get("resources")
    if not isinstance(resources, dict) or "cpu" not in resources or "memory" not in resources:
        raise ConfigError(f"{where}.resources: must be an object with at least cpu and memory")
    capacity = parse_quantities(resources, f"{where}.resources")
    capacity.setdefault("pods", DEFAULT_PODS)
    offerings = raw.get("offerings")
    if not isinstance(offerings, list) or not offerings:
        raise ConfigError(f"{where}.offerings: must be a non-empty list")
    parsed = tuple(_offering(o, f"{where}.offerings[{i}]") for i, o in enumerate(offerings))
    systems = raw.get("operatingSystems") or ["linux"]
    if not isinstance(systems, list) or not all(isinstance(s, str) for s in systems):
        raise ConfigError(f"{where}.operatingSystems: must be a list of strings, got {systems!r}")
    gpu_model = raw.get("gpuModel")
    if gpu_model is not None:
        from kubegpu.gpu.catalog import get_model

        try:
            gpu_model = get_model(str(gpu_model)).key
        except KubegpuError as exc:
            raise ConfigError(f"{where}.gpuModel: {exc}") from None
    return InstanceType(
        name=name,
        architecture=str(raw.get("architecture") or "amd64"),
        operating_systems=tuple(str(s) for s in systems),
        capacity=capacity,
        offerings=parsed,
        gpu_model=gpu_model,
    )


def parse_instance_types(data: Any, source: str) -> list[InstanceType]:
    if not isinstance(data, list):
        raise ConfigError(f"{source}: must be a JSON list of instance types")
    types = [parse_instance_type(raw, f"{source}: [{i}]") for i, raw in enumerate(data)]
    seen: set[str] = set()
    for i, it in enumerate(types):
        if it.name in seen:
            raise ConfigError(f"{source}: [{i}].name: duplicate instance type {it.name!r}")
        seen.add(it.name)
    return types


def load_instance_types(path: Path | str) -> list[InstanceType]:
    """Instance types from a kwok-format JSON file; one-line ConfigError for a missing or malformed file."""
    return parse_instance_types(load_json_file(path), str(path))  # bounded, UTF-8, strict JSON


def default_instance_types() -> list[InstanceType]:
    """The GPU and CPU catalogue shipped with the package (p4d/p5/g5/g6/g6e/g4dn-like and c/m/r types)."""
    text = pkg_resources.files("kubegpu.autoscaler").joinpath("data/instance_types.json").read_text()
    return parse_instance_types(parse_json_text(text, "instance_types.json"), "instance_types.json")


def to_kwok(types: Sequence[InstanceType]) -> list[dict[str, Any]]:
    """Back to the kwok JSON shape (for generated catalogues and benchmarks)."""
    out = []
    for it in types:
        entry: dict[str, Any] = {
            "name": it.name,
            "architecture": it.architecture,
            "operatingSystems": list(it.operating_systems),
            "resources": {k: _quantity_text(k, v) for k, v in it.capacity.items()},
            "offerings": [
                {"Price": round(o.price, 6), "Available": o.available, "Requirements": [
                    {"key": L.CAPACITY_TYPE_LABEL, "operator": "In", "values": [o.capacity_type]},
                    {"key": L.ZONE_LABEL, "operator": "In", "values": [o.zone]},
                ]}
                for o in it.offerings
            ],
        }
        if it.gpu_model:
            entry["gpuModel"] = it.gpu_model
        out.append(entry)
    return out


def _quantity_text(name: str, value: float) -> str:
    if name == "memory" and value % 2**30 == 0:
        return f"{int(value // 2**30)}Gi"
    return str(int(value)) if float(value).is_integer() else str(value)
