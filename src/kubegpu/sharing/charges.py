"""What a pod's GPU resources are charged in one unit, `kubegpu.io/gpu-memory` (bytes), whatever the sharing kind.

Kubernetes' ResourceQuota counts every resource name apart, so a quota on `nvidia.com/gpu` is bypassed by asking
for `nvidia.com/mig-1g.10gb` and a per-profile quota breaks when the partitioner re-cuts a GPU. Charging every GPU
resource in GPU memory makes one stock quota mean the same on every cut. The rules (one place; the admission
policy's CEL, `kubegpu quota explain`, the nodes' advertised capacity and the simulator all read this module or the
table it renders):

* a MIG profile or an MPS slice charges the memory in its name, read as GiB (`mig-1g.10gb` = 10Gi, `gpu-20gb` =
  20Gi), on every GPU model — names are cluster-wide, as the quota is;
* a whole GPU (`nvidia.com/gpu`, or a name a config's `resources.gpus[]` gives it) charges the memory of the GPU
  model the pod selects with GFD's `nvidia.com/gpu.product` (node selector, or the largest of the products its
  required node affinity allows), else the table's cluster default model; a model's memory is what its full-GPU MIG
  profile's name says (`7g.80gb`: 80Gi, for an A100-80GB and an H100-80GB alike), else its whole GiB;
* a time-slicing or MPS replica (`nvidia.com/gpu.shared`, or any name the device-plugin config replicates) charges
  what the replicated device is charged, divided by the configured replicas (rounded down to a byte, so the
  replicas of one device never add up to more than the device).

Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kubegpu.errors import ConfigError
from kubegpu.gpu.catalog import CATALOG, GpuModel, find_model
from kubegpu.scheduling.pods import pod_key
from kubegpu.scheduling.requests import container_requests
from kubegpu.sharing.devices import advertised_name, config_dict, qualify_resource_name, sharing_spec
from kubegpu.sharing.names import (
    GPU_PRODUCT_LABEL,
    GPU_RESOURCE,
    GPU_SHARED_RESOURCE,
    is_gpu_resource,
    mig_resource_name,
    named_memory_gib,
)

GIB = 1 << 30
DEFAULT_MODEL = "A100-SXM4-80GB"
DEFAULT_REPLICAS: Mapping[str, int] = {GPU_SHARED_RESOURCE: 4}
"""The shipped table's replicas: `nvidia.com/gpu.shared` as a 4-replica time-sliced GPU (a ClusterPolicy's
device-plugin config replaces it; `kubegpu quota explain --config` likewise)."""
SHARED_PRODUCT_SUFFIX = "-SHARED"  # GFD appends it to `gpu.product` on a node whose GPUs are replicated in place


def model_memory_bytes(model: GpuModel) -> int:
    """What one whole GPU of `model` is charged: the GiB its full-GPU MIG profile's name says (`7g.80gb`: 80Gi, so a
    whole GPU and its one full MIG slice charge the same), else its memory in whole GiB."""
    full = max(model.mig_profiles, key=lambda p: p.memory_slots, default=None)
    named = named_memory_gib(mig_resource_name(full.name)) if full is not None else None
    return (named if named is not None else model.memory_mib // 1024) * GIB


def product_label(model: GpuModel) -> str:
    """GFD's `nvidia.com/gpu.product` value of a model (NVML's product name, spaces as dashes)."""
    return model.product_name.replace(" ", "-")


def model_of_product(product: str) -> GpuModel | None:
    """The catalog model whose GFD label `nvidia.com/gpu.product` is exactly `product` (GFD's `-SHARED` suffix
    ignored); None otherwise. Exact, as a node selector matches and as the policy's table is keyed."""
    if product.endswith(SHARED_PRODUCT_SUFFIX):
        product = product[: -len(SHARED_PRODUCT_SUFFIX)]
    return next((model for model in CATALOG.values() if product_label(model) == product), None)


@dataclass(frozen=True)
class ChargeTable:
    """The cluster-wide table: which model a pod that names none is charged for, and each replicated name's
    replicas. The operator keeps it (as the admission policy's parameter ConfigMap) in step with the cluster's
    device-plugin config."""

    default_model: str = DEFAULT_MODEL
    replicas: Mapping[str, int] = field(default_factory=lambda: dict(DEFAULT_REPLICAS))

    def __post_init__(self) -> None:
        if find_model(self.default_model) is None:
            raise ConfigError(f"default GPU model {self.default_model!r} is not in the catalog; known: "
                              f"{', '.join(CATALOG)}")
        for name, count in self.replicas.items():
            if not isinstance(count, int) or count < 1:
                raise ConfigError(f"replicas of {name}: expected a whole number >= 1, got {count!r}")

    def whole_gpu_bytes(self, products: Sequence[str] = ()) -> int:
        """A whole GPU's charge for a pod that may land on any of `products` (the largest; the default if none or
        for a product the catalog does not know)."""
        default = find_model(self.default_model)
        assert default is not None  # checked in __post_init__
        charges = [model_memory_bytes(model_of_product(p) or default) for p in products]
        return max(charges, default=model_memory_bytes(default))

    def bytes_each(self, resource: str, whole_gpu_bytes: int) -> int:
        """What one unit of `resource` is charged; 0 for a resource that is not a GPU."""
        if not is_gpu_resource(resource):
            return 0
        named = named_memory_gib(resource)
        base = named * GIB if named is not None else whole_gpu_bytes
        return base // self.replicas.get(resource, 1)

    @classmethod
    def from_device_plugin_config(cls, config: object, default_model: str = DEFAULT_MODEL) -> ChargeTable:
        """The replicas an NVIDIA device-plugin config (`version: v1`) gives each name it advertises."""
        return cls(default_model=default_model, replicas=replicas_of_config(config))


def replicas_of_config(config: object) -> dict[str, int]:
    """Advertised resource name → replicas, from a device-plugin config's `sharing.timeSlicing` / `sharing.mps`."""
    data = config_dict(config)
    spec = sharing_spec(data)
    replicas: dict[str, int] = {}
    for index, entry in enumerate(spec.resources):
        where = f"{spec.path}.resources[{index}]"
        name = qualify_resource_name(str(entry.get("name") or ""), f"{where}.name")
        rename = entry.get("rename")
        advertised = advertised_name(name, qualify_resource_name(str(rename), f"{where}.rename") if rename else None,
                                     spec.rename_by_default)
        count = entry.get("replicas")
        if not isinstance(count, int) or isinstance(count, bool) or count < 1:
            raise ConfigError(f"{where}.replicas: expected a whole number >= 1, got {count!r}")
        replicas[advertised] = count
    return replicas


# ---------------------------------------------------------------------------------------------- pods


@dataclass(frozen=True)
class ChargeLine:
    """One GPU resource of one container: `count` units at `bytes_each`."""

    container: str
    resource: str
    count: int
    bytes_each: int

    @property
    def total(self) -> int:
        return self.count * self.bytes_each


@dataclass(frozen=True)
class PodCharge:
    """A pod's charge, line by line, and each container's sum (what goes into its requests and limits)."""

    pod: str
    lines: tuple[ChargeLine, ...]

    @property
    def containers(self) -> dict[str, int]:
        totals: dict[str, int] = {}
        for line in self.lines:
            totals[line.container] = totals.get(line.container, 0) + line.total
        return totals

    @property
    def gpu_memory_bytes(self) -> int:
        """What the pod as a whole is charged (the sum over its app and init containers' lines)."""
        return sum(line.total for line in self.lines)

    def as_json(self) -> dict[str, Any]:
        """`kubegpu quota explain -o json`'s shape."""
        return {"pod": self.pod, "gpuMemoryBytes": self.gpu_memory_bytes,
                "lines": [{"container": line.container, "resource": line.resource, "count": line.count,
                           "bytesEach": line.bytes_each} for line in self.lines]}


def pod_products(pod: Mapping[str, Any]) -> list[str]:
    """The GPU products a pod may land on: its node selector's `nvidia.com/gpu.product`, else every value its required
    node affinity allows for that label with `In` (the policy charges the largest); [] when it names none."""
    spec = pod.get("spec") or {}
    selector = spec.get("nodeSelector") or {}
    if isinstance(selector, Mapping) and GPU_PRODUCT_LABEL in selector:
        return [str(selector[GPU_PRODUCT_LABEL])]
    required = (((spec.get("affinity") or {}).get("nodeAffinity") or {})
                .get("requiredDuringSchedulingIgnoredDuringExecution") or {})
    products: list[str] = []
    for term in required.get("nodeSelectorTerms") or ():
        for expression in (term or {}).get("matchExpressions") or ():
            if expression.get("key") == GPU_PRODUCT_LABEL and expression.get("operator") == "In":
                products.extend(str(v) for v in expression.get("values") or ())
    return products


def _count(amount: float, where: str) -> int:
    if amount < 0 or amount != int(amount):
        raise ConfigError(f"{where}: a GPU resource must be a whole number, got {amount:g}")
    return int(amount)


def pod_charge(pod: Mapping[str, Any], table: ChargeTable | None = None) -> PodCharge:
    """The `kubegpu.io/gpu-memory` a pod's GPU resources are charged, per container and resource (requests, with
    limits standing in for missing ones, as the API server defaults them). Init containers are listed too: each
    container that asks for GPUs carries its own charge."""
    table = table or ChargeTable()
    if not isinstance(pod, Mapping):
        raise ConfigError(f"pod: expected a mapping, got {type(pod).__name__}")
    whole = table.whole_gpu_bytes(pod_products(pod))
    spec = pod.get("spec") or {}
    lines: list[ChargeLine] = []
    for field_name in ("initContainers", "containers"):
        for index, container in enumerate(spec.get(field_name) or ()):
            where = f"{pod_key(pod)}: spec.{field_name}[{index}]"
            name = str(container.get("name") or f"{field_name}[{index}]")
            for resource, amount in sorted(container_requests(container, where).items()):
                each = table.bytes_each(resource, whole)
                count = _count(amount, f"{where}.resources.{resource}") if is_gpu_resource(resource) else 0
                if count and each:
                    lines.append(ChargeLine(name, resource, count, each))
    return PodCharge(pod_key(pod), tuple(lines))


# ---------------------------------------------------------------------------------------------- nodes


def node_gpu_memory(allocatable: Mapping[str, float], product: str | None, table: ChargeTable | None = None) -> int:
    """A node's `kubegpu.io/gpu-memory` capacity: what its allocatable GPU resources are charged in total, so the
    scheduler's fit on the charge never disagrees with its fit on the GPU resources themselves."""
    table = table or ChargeTable()
    whole = table.whole_gpu_bytes([product] if product else [])
    return sum(int(count) * table.bytes_each(resource, whole) for resource, count in allocatable.items()
               if is_gpu_resource(resource))


def quantity_of_bytes(value: int) -> str:
    """Bytes as a Kubernetes quantity, in Gi or Mi where exact (`10Gi`), else plain bytes — as the policy writes it."""
    for suffix, unit in (("Gi", GIB), ("Mi", 1 << 20)):
        if value and value % unit == 0:
            return f"{value // unit}{suffix}"
    return str(value)


# ---------------------------------------------------------------------------------------------- the policy's table


TABLE_DEFAULT_KEY = "default"
TABLE_PRODUCT_PREFIX = "product."
TABLE_REPLICAS_PREFIX = "replicas."


def table_key(prefix: str, resource: str) -> str:
    """A ConfigMap key for a resource name (keys cannot hold `/`): `replicas.nvidia.com_gpu.shared`."""
    return prefix + resource.replace("/", "_")


def table_data(table: ChargeTable | None = None) -> dict[str, str]:
    """The admission policy's parameter (a ConfigMap's `data`): the default whole-GPU charge, each catalog product's
    whole-GPU charge (GFD's plain and `-SHARED` labels), and each replicated name's replicas. MIG and MPS names carry
    their size, so the policy reads it from the name with the same rule as `named_memory_gib`."""
    table = table or ChargeTable()
    data = {TABLE_DEFAULT_KEY: str(table.whole_gpu_bytes())}
    for model in CATALOG.values():
        for label in (product_label(model), product_label(model) + SHARED_PRODUCT_SUFFIX):
            data[TABLE_PRODUCT_PREFIX + label] = str(model_memory_bytes(model))
    for resource, count in sorted(table.replicas.items()):
        data[table_key(TABLE_REPLICAS_PREFIX, resource)] = str(count)
    return data


__all__ = ["DEFAULT_MODEL", "GIB", "GPU_RESOURCE", "ChargeLine", "ChargeTable", "PodCharge", "model_memory_bytes",
           "node_gpu_memory", "pod_charge", "pod_products", "product_label", "quantity_of_bytes",
           "replicas_of_config", "table_data"]
