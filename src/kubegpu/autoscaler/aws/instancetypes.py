"""Instance types from the account: DescribeInstanceTypes, offerings per zone, on-demand and spot prices, and the
unavailable-offerings (insufficient capacity) cache — Karpenter's instancetype, pricing and ICE-cache providers.

Each type becomes an `AwsInstanceType`: the autoscaler's `InstanceType` (so the scheduler, GPU-sharing capacity and
consolidation treat it like any other) carrying Karpenter's `karpenter.k8s.aws/*` labels and the catalogue GPU
model behind its `GpuInfo`, so MIG slices, time-sliced replicas and MPS slices are counted per the NodePool's
sharing config. Offerings are (zone ∩ the NodeClass's subnet zones) × (on-demand, spot) plus one reserved offering
per matched capacity reservation. TTLs are Karpenter's: types and prices 12 h, zone offerings 5 min, ICE 3 min.
"""

from __future__ import annotations

import builtins
import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from kubegpu.autoscaler import labels as L
from kubegpu.autoscaler.aws import labels as A
from kubegpu.autoscaler.aws.clients import AwsApiError, AwsClients, paginate
from kubegpu.autoscaler.aws.nodeclass import EC2NodeClass
from kubegpu.autoscaler.instancetypes import InstanceType, Offering
from kubegpu.clock import Clock

TYPES_TTL = 12 * 3600.0
PRICES_TTL = 12 * 3600.0
OFFERINGS_TTL = 5 * 60.0
UNAVAILABLE_TTL = 3 * 60.0
RESERVED_PRICE = 1e-6   # reservations are already paid for: priced near zero so they are used first
# On-demand $/h per GPU for types neither the Pricing API nor the shipped table knows (an estimate, see docs).
_GPU_HOURLY = {"t4": 0.3, "t4g": 0.3, "a10g": 0.75, "l4": 0.55, "l40s": 1.4, "a100": 3.4, "h100": 10.5,
               "h200": 12.0, "b200": 14.0, "v100": 2.5}


@dataclass(frozen=True)
class AwsOffering(Offering):
    """An offering that may be a capacity reservation (then capacity type `reserved`)."""

    reservation_id: str | None = None
    reservation_type: str | None = None

    def labels(self) -> dict[str, str]:
        out = {**super().labels(), A.CAPACITY_TYPE_LABEL: self.capacity_type}
        if self.reservation_id:
            out[A.CAPACITY_RESERVATION_ID] = self.reservation_id
            out[A.CAPACITY_RESERVATION_TYPE] = self.reservation_type or "default"
        return out


@dataclass(frozen=True)
class AwsInstanceType(InstanceType):
    """An EC2 type with Karpenter's labels next to the autoscaler's own."""

    aws_labels: Mapping[str, str] = field(default_factory=dict)

    @cached_property
    def labels(self) -> dict[str, str]:
        return {**InstanceType.labels.func(self), **self.aws_labels}  # type: ignore[attr-defined]


class UnavailableOfferings:
    """`<capacityType>:<type>:<zone>` keys that recently failed with insufficient capacity; each expires after
    `ttl` (re-marking extends it). `version` changes on every mark, so cached offering lists know to rebuild."""

    def __init__(self, clock: Clock, ttl: float = UNAVAILABLE_TTL) -> None:
        self.clock = clock
        self.ttl = ttl
        self._until: dict[str, float] = {}
        self.version = 0

    @staticmethod
    def key(capacity_type: str, instance_type: str, zone: str) -> str:
        return f"{capacity_type}:{instance_type}:{zone}"

    def mark(self, capacity_type: str, instance_type: str, zone: str) -> None:
        self._until[self.key(capacity_type, instance_type, zone)] = self.clock.now() + self.ttl
        self.version += 1

    def is_unavailable(self, capacity_type: str, instance_type: str, zone: str) -> bool:
        key = self.key(capacity_type, instance_type, zone)
        until = self._until.get(key)
        if until is None:
            return False
        if self.clock.now() >= until:
            del self._until[key]
            self.version += 1
            return False
        return True

    def expire(self) -> None:
        """Forget entries whose TTL has passed (Karpenter's 10-second cleanup, run before each read)."""
        now = self.clock.now()
        gone = [k for k, t in self._until.items() if t <= now]
        for key in gone:
            del self._until[key]
        if gone:
            self.version += 1

    def keys(self) -> list[str]:
        self.expire()
        return sorted(self._until)


def shipped_on_demand() -> dict[str, float]:
    """On-demand $/h of the catalogue shipped with the package (the fallback when the Pricing API is unreachable)."""
    from kubegpu.autoscaler.catalog import shipped_catalogue

    out: dict[str, float] = {}
    for it in shipped_catalogue():
        prices = [o.price for o in it.offerings if o.capacity_type == L.ON_DEMAND]
        if prices:
            out[it.name] = min(prices)
    return out


def estimated_price(info: Mapping[str, Any]) -> float:
    """A resource-based on-demand estimate ($0.045/vCPU, $0.006/GiB, a per-GPU rate) for unknown types."""
    cpu = float((info.get("VCpuInfo") or {}).get("DefaultVCpus") or 0)
    gib = float((info.get("MemoryInfo") or {}).get("SizeInMiB") or 0) / 1024
    price = 0.045 * cpu + 0.006 * gib
    for gpu in (info.get("GpuInfo") or {}).get("Gpus") or []:
        name = A.label_value(str(gpu.get("Name", "")))
        price += _GPU_HOURLY.get(name, 1.5) * float(gpu.get("Count") or 0)
    return round(price, 4)


def parse_price_list(items: Iterable[str]) -> dict[str, float]:
    """Pricing API GetProducts `PriceList` entries (JSON strings) → instance type → on-demand $/h."""
    out: dict[str, float] = {}
    for raw in items:
        product = json.loads(raw) if isinstance(raw, str) else raw
        name = ((product.get("product") or {}).get("attributes") or {}).get("instanceType")
        for term in ((product.get("terms") or {}).get("OnDemand") or {}).values():
            for dim in (term.get("priceDimensions") or {}).values():
                usd = (dim.get("pricePerUnit") or {}).get("USD")
                if name and usd is not None and float(usd) > 0:
                    out[str(name)] = min(float(usd), out.get(str(name), float("inf")))
    return out


@dataclass
class _Cached:
    value: Any
    at: float


class InstanceTypeProvider:
    """The account's instance types for a NodeClass, with offerings and prices, cached with Karpenter's TTLs."""

    def __init__(self, clients: AwsClients, clock: Clock, unavailable: UnavailableOfferings,
                 type_patterns: Sequence[str] = (), use_pricing_api: bool = True) -> None:
        self.clients = clients
        self.clock = clock
        self.unavailable = unavailable
        self.type_patterns = list(type_patterns)
        self.use_pricing_api = use_pricing_api
        self.pricing_source = ""
        self._cache: dict[str, _Cached] = {}
        self._built: dict[str, tuple[int, float, builtins.list[AwsInstanceType]]] = {}

    @property
    def _wildcards(self) -> bool:
        """Whether the type patterns need the server to expand wildcards (not every endpoint does for offerings)."""
        return any(ch in p for p in self.type_patterns for ch in "*?")

    def _cached(self, key: str, ttl: float, load: Any) -> Any:
        hit = self._cache.get(key)
        if hit is None or self.clock.now() - hit.at >= ttl:
            hit = self._cache[key] = _Cached(load(), self.clock.now())
        return hit.value

    def refresh(self) -> None:
        """Drop every cached answer (the 12-hour controllers' job, on demand)."""
        self._cache.clear()
        self._built.clear()

    # -- raw answers ----------------------------------------------------------------------------------------------
    def describe_types(self) -> dict[str, dict[str, Any]]:
        def load() -> dict[str, dict[str, Any]]:
            filters = [{"Name": "supported-virtualization-type", "Values": ["hvm"]},
                       {"Name": "processor-info.supported-architecture", "Values": ["x86_64", "arm64"]}]
            if self.type_patterns:
                filters.append({"Name": "instance-type", "Values": list(self.type_patterns)})
            items = paginate(self.clients.ec2, "describe_instance_types", "InstanceTypes", Filters=filters,
                             PaginationConfig={"PageSize": 100})
            return {str(i["InstanceType"]): i for i in items}
        result: dict[str, dict[str, Any]] = self._cached("types", TYPES_TTL, load)
        return result

    def zone_offerings(self) -> dict[str, set[str]]:
        def load() -> dict[str, set[str]]:
            kwargs: dict[str, Any] = {"LocationType": "availability-zone"}
            if self.type_patterns and not self._wildcards:
                kwargs["Filters"] = [{"Name": "instance-type", "Values": list(self.type_patterns)}]
            known = self.describe_types()
            out: dict[str, set[str]] = {}
            for row in paginate(self.clients.ec2, "describe_instance_type_offerings", "InstanceTypeOfferings",
                                **kwargs):
                if row["InstanceType"] in known:
                    out.setdefault(str(row["InstanceType"]), set()).add(str(row["Location"]))
            return out
        result: dict[str, set[str]] = self._cached("offerings", OFFERINGS_TTL, load)
        return result

    def on_demand_prices(self) -> dict[str, float]:
        def load() -> dict[str, float]:
            if self.use_pricing_api:
                try:
                    prices = self._pricing_api()
                except AwsApiError:
                    prices = {}
                if prices:
                    self.pricing_source = "pricing-api"
                    return prices
            self.pricing_source = "shipped-table"
            return shipped_on_demand()
        result: dict[str, float] = self._cached("od-prices", PRICES_TTL, load)
        return result

    def _pricing_api(self) -> dict[str, float]:
        filters = [{"Type": "TERM_MATCH", "Field": k, "Value": v} for k, v in (
            ("regionCode", self.clients.region), ("serviceCode", "AmazonEC2"), ("preInstalledSw", "NA"),
            ("operatingSystem", "Linux"), ("capacitystatus", "Used"), ("marketoption", "OnDemand"),
            ("tenancy", "Shared"))]
        return parse_price_list(paginate(self.clients.pricing, "get_products", "PriceList", ServiceCode="AmazonEC2",
                                         Filters=filters))

    def spot_prices(self) -> dict[tuple[str, str], float]:
        def load() -> dict[tuple[str, str], float]:
            kwargs: dict[str, Any] = {"ProductDescriptions": ["Linux/UNIX", "Linux/UNIX (Amazon VPC)"],
                                      "StartTime": self.clock.now()}
            if self.type_patterns:
                kwargs["InstanceTypes"] = sorted(self.describe_types())
            latest: dict[tuple[str, str], tuple[Any, float]] = {}
            for row in paginate(self.clients.ec2, "describe_spot_price_history", "SpotPriceHistory", **kwargs):
                key = (str(row["InstanceType"]), str(row["AvailabilityZone"]))
                stamp = row.get("Timestamp")
                if key not in latest or (stamp is not None and stamp > latest[key][0]):
                    latest[key] = (stamp, float(row["SpotPrice"]))
            return {k: v[1] for k, v in latest.items()}
        result: dict[tuple[str, str], float] = self._cached("spot-prices", PRICES_TTL, load)
        return result

    # -- instance types ---------------------------------------------------------------------------------------------
    def list(self, nodeclass: EC2NodeClass) -> list[AwsInstanceType]:
        """The types a NodeClass can launch, with offerings in its zones (ICE'd ones marked unavailable)."""
        self.unavailable.expire()
        key = hashlib.sha256(nodeclass.model_dump_json().encode()).hexdigest()
        built = self._built.get(key)
        if built is not None and built[0] == self.unavailable.version and \
                self.clock.now() - built[1] < OFFERINGS_TTL:
            return built[2]
        result = self._build(nodeclass)
        self._built[key] = (self.unavailable.version, self.clock.now(), result)
        return result

    def _build(self, nodeclass: EC2NodeClass) -> builtins.list[AwsInstanceType]:
        zones = {s.zone for s in nodeclass.status.subnets}
        types, offered = self.describe_types(), self.zone_offerings()
        od, spot = self.on_demand_prices(), self.spot_prices()
        max_pods = nodeclass.spec.kubelet.maxPods if nodeclass.spec.kubelet else None
        reservations: dict[str, builtins.list[Any]] = {}
        for res in nodeclass.status.capacityReservations:
            if res.availableInstanceCount > 0 and res.availabilityZone in zones:
                reservations.setdefault(res.instanceType, []).append(res)
        out: builtins.list[AwsInstanceType] = []
        for name, info in sorted(types.items()):
            arch = A.architecture(info)
            type_zones = sorted(offered.get(name, set()) & zones)
            if arch is None or not type_zones:
                continue
            usage = set(info.get("SupportedUsageClasses") or ["on-demand", "spot"])
            offerings: builtins.list[AwsOffering] = []
            for res in reservations.get(name, []):
                free = not self.unavailable.is_unavailable("reserved", name, res.availabilityZone)
                offerings.append(AwsOffering(res.availabilityZone, "reserved", RESERVED_PRICE, free,
                                             res.id, res.reservationType))
            od_price = od.get(name) or estimated_price(info)
            for zone in type_zones:
                if "on-demand" in usage:
                    offerings.append(AwsOffering(zone, L.ON_DEMAND, od_price,
                                                 not self.unavailable.is_unavailable(L.ON_DEMAND, name, zone)))
                if "spot" in usage and (name, zone) in spot:
                    offerings.append(AwsOffering(zone, L.SPOT, spot[(name, zone)],
                                                 not self.unavailable.is_unavailable(L.SPOT, name, zone)))
            if not offerings:
                continue
            capacity = A.type_capacity(info, max_pods)
            overhead = A.kube_reserved(capacity["cpu"], capacity["pods"])
            out.append(AwsInstanceType(name=name, architecture=arch, operating_systems=("linux",), capacity=capacity,
                                       offerings=tuple(offerings), gpu_model=A.gpu_model_key(info),
                                       overhead=overhead, aws_labels=A.type_labels(info)))
        return out
