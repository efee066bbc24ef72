"""What a pod's GPU resources are charged in one unit, `kubegpu.io/gpu-memory` (bytes), whatever the sharing kind.

Kubernetes' ResourceQuota counts every resource name apart, so a quota on `nvidia.com/gpu` is bypassed by asking
for `nvidia.com/mig-1g.10gb` and a per-profile quota breaks when the partitioner re-cuts a GPU. Charging every GPU
resource in GPU memory makes one stock quota mean the same on every cut. The rules (one place; the admission
policy's CEL, `kubegpu quota explain`, the nodes' advertised capacity and the simulator all read this module or the
table it renders):

* a MIG profile or an MPS slice charges the memory in its name, read as GiB (`mig-1g.10gb` = 10Gi, `gpu-20gb` =
  20Gi), on every GPU model — names are cluster-wide, as the quota is;
* a whole GPU (`nvidia.com/gpu`, or a name a config's `resources.gpus[]` gives it) charges the memory of the
  largest GPU the pod could land on: the table's shapes (kinds of node: catalog models, GPU instance types, the
  cluster's nodes and what its NodePools may launch, each with the labels that name its GPU) matched against the
  pod's node selector and required node affinity with `kubegpu.kube.selectors`; a pod that pins nothing, or allows
  a GPU the table does not know, pays the largest; a model's memory is what its full-GPU MIG profile's name says
  (`7g.80gb`: 80Gi, for an A100-80GB and an H100-80GB alike), else its whole GiB;
* a time-slicing or MPS replica (`nvidia.com/gpu.shared`, or any name the device-plugin config replicates) charges
  what the replicated device is charged, divided by the configured replicas (rounded down to a byte, so the
  replicas of one device never add up to more than the device).

A node advertises room for the most its GPU resources can be charged (`node_gpu_memory`), so a charged pod fits
wherever its GPU resources do.

Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache, cached_property
from typing import Any

from kubegpu.errors import ConfigError
from kubegpu.gpu.catalog import CATALOG, GpuModel, find_model, get_model
from kubegpu.gpu.instances import (
    GPU_COUNT_LABEL,
    GPU_INSTANCE_TYPES,
    GPU_MEMORY_LABEL,
    gfd_model_labels,
    instance_type_labels,
)
from kubegpu.kube.selectors import IN, NodeSelectorTerm, node_selector_terms
from kubegpu.scheduling.pods import pod_key
from kubegpu.scheduling.requests import container_requests
from kubegpu.sharing.devices import advertised_name, config_dict, qualify_resource_name, sharing_spec
from kubegpu.sharing.names import (
    GPU_PRODUCT_LABEL,
    GPU_RESOURCE,
    GPU_RESOURCE_PREFIX,
    GPU_SHARED_RESOURCE,
    is_gpu_resource,
    mig_resource_name,
    named_memory_gib,
)

GIB = 1 << 30
DEFAULT_REPLICAS: Mapping[str, int] = {GPU_SHARED_RESOURCE: 4}
"""The shipped table's replicas: `nvidia.com/gpu.shared` as a 4-replica time-sliced GPU (a ClusterPolicy's
device-plugin config replaces it; `kubegpu quota explain --config` likewise)."""
REPLICAS_LABEL_SUFFIX = ".replicas"  # GFD's `nvidia.com/<resource>.replicas`
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
class GpuShape:
    """One kind of node a pod may land on, as far as a charge cares: the labels that name its GPU (GFD's product and
    memory, the instance type, Karpenter's GPU labels, ...) and what one of its whole GPUs is charged."""

    labels: Mapping[str, str]
    whole_gpu_bytes: int


def model_shapes(model: GpuModel) -> tuple[GpuShape, ...]:
    """A model on a node of any kind: GFD's labels only, its product plain and with GFD's `-SHARED` suffix."""
    labels = gfd_model_labels(model)
    shared = {**labels, GPU_PRODUCT_LABEL: labels[GPU_PRODUCT_LABEL] + SHARED_PRODUCT_SUFFIX}
    return GpuShape(labels, model_memory_bytes(model)), GpuShape(shared, model_memory_bytes(model))


def catalogue_shapes(models: Sequence[str] | None = None) -> tuple[GpuShape, ...]:
    """The shapes of every catalog model (or of `models`, catalog keys) and of every GPU instance type holding one."""
    keys = list(CATALOG) if models is None else [get_model(m).key for m in models]
    shapes = [shape for key in keys for shape in model_shapes(CATALOG[key])]
    shapes += [GpuShape(instance_type_labels(name), model_memory_bytes(CATALOG[key]))
               for name, (key, _) in sorted(GPU_INSTANCE_TYPES.items()) if key in keys]
    return tuple(shapes)


def _whole_of_labels(labels: Mapping[str, str]) -> int | None:
    """One GPU of a node by its GFD labels: its product's model charge, else its `nvidia.com/gpu.memory` in whole GiB
    (a GPU the catalog does not know, or a MIG device under the `single` strategy); None without either."""
    model = model_of_product(labels.get(GPU_PRODUCT_LABEL) or "")
    if model is not None:
        return model_memory_bytes(model)
    memory = labels.get(GPU_MEMORY_LABEL, "")
    return int(memory) // 1024 * GIB if memory.isdigit() and int(memory) >= 1024 else None


def node_gpus_bytes(labels: Mapping[str, str]) -> int:
    """What a node's GPUs hold, by GFD's labels (`nvidia.com/gpu.count` of its model): the room the elastic quota
    counts. Not the `kubegpu.io/gpu-memory` it advertises, which leaves room for the largest charge per GPU so the
    scheduler's fit never refuses one: pods pinned to smaller GPUs would never seem to need a reclaim."""
    count = labels.get(GPU_COUNT_LABEL, "")
    whole = _whole_of_labels(labels)
    return int(count) * whole if count.isdigit() and whole is not None else 0


def node_shape(labels: Mapping[str, str], keys: frozenset[str] | None = None) -> GpuShape | None:
    """A GPU node as a shape (None for a node GFD has not labelled with a product): its labels that pin a model (those
    the catalog's shapes carry), charged its model's memory, else its `nvidia.com/gpu.memory` label's whole GiB (a
    GPU the catalog does not know). Nodes of the cluster join the table, so a pin through a label the catalog does
    not list (another cloud's instance type) still narrows the charge, and the cluster's largest GPU is known."""
    whole = _whole_of_labels(labels) if labels.get(GPU_PRODUCT_LABEL) else None
    if whole is None:
        return None
    keys = keys or shipped_table().pinning_keys
    return GpuShape({k: v for k, v in sorted(labels.items()) if k in keys}, whole)


def replicas_of_node(labels: Mapping[str, str]) -> dict[str, int]:
    """The replicas a node's device-plugin config gives each resource, as GFD labels them: `nvidia.com/<r>.replicas`
    above 1 replicates `nvidia.com/<r>` in place when its product carries GFD's `-SHARED` suffix, else the renamed
    `nvidia.com/<r>.shared` (renameByDefault; a custom `rename:` is not in the labels: list it in the ClusterPolicy);
    1 is a whole `nvidia.com/<r>`."""
    found: dict[str, int] = {}
    for key, value in labels.items():
        if not (key.startswith(GPU_RESOURCE_PREFIX) and key.endswith(REPLICAS_LABEL_SUFFIX)) or not value.isdigit():
            continue
        base = key[: -len(REPLICAS_LABEL_SUFFIX)]
        if int(value) == 1:
            found[base] = 1  # whole here: a name replicated in place elsewhere must not charge a replica here
        elif int(value) > 1:
            in_place = labels.get(base + ".product", "").endswith(SHARED_PRODUCT_SUFFIX)
            found[base if in_place else base + ".shared"] = int(value)
    return found


def nodepool_shapes(pool: Mapping[str, Any]) -> tuple[GpuShape, ...]:
    """The GPUs a NodePool (kubegpu's `kubegpu.io/v1` or Karpenter's `karpenter.sh/v1`) may launch: each GPU instance
    type its requirements allow (requirements on labels an instance type does not name, a zone or a capacity type,
    leave it possible), labelled as its nodes will be: the type's labels, the template's labels and the pool's name.
    ConfigError naming the pool and the field for a requirement the API server would refuse."""
    meta = pool.get("metadata") or {}
    name = str(meta.get("name") or "")
    template = ((pool.get("spec") or {}).get("template") or {})
    where = f"NodePool {name}: spec.template.spec.requirements"
    requirements = (template.get("spec") or {}).get("requirements") or []
    term = node_selector_terms([{"matchExpressions": requirements}], where)[0] if requirements else None
    name_label = ("karpenter.sh/nodepool" if str(pool.get("apiVersion", "")).startswith("karpenter.sh/")
                  else "kubegpu.io/nodepool")
    extra = {str(k): str(v) for k, v in ((template.get("metadata") or {}).get("labels") or {}).items()}
    shapes = []
    for instance_type, (key, _) in sorted(GPU_INSTANCE_TYPES.items()):
        labels = instance_type_labels(instance_type)
        if term is None or all(r.key not in labels or r.matches_value(labels[r.key]) for r in term.expressions):
            shapes.append(GpuShape({**labels, **extra, name_label: name}, model_memory_bytes(CATALOG[key])))
    return tuple(shapes)


@dataclass(frozen=True)
class ChargeTable:
    """The cluster-wide table: the shapes of node a GPU pod may land on (a whole GPU is charged the largest one the
    pod's node selector and required affinity leave possible) and each replicated name's replicas. The operator
    keeps it (as the admission policy's parameter ConfigMap) in step with the cluster; the shipped one lists the
    whole catalog."""

    shapes: tuple[GpuShape, ...] = field(default_factory=catalogue_shapes)
    replicas: Mapping[str, int] = field(default_factory=lambda: dict(DEFAULT_REPLICAS))

    def __post_init__(self) -> None:
        if not self.shapes:
            raise ConfigError("charge table: no GPU shapes (a pod that pins no model must be charged the largest)")
        for name, count in self.replicas.items():
            if not isinstance(count, int) or count < 1:
                raise ConfigError(f"replicas of {name}: expected a whole number >= 1, got {count!r}")

    @classmethod
    def for_models(cls, models: Sequence[str], replicas: Mapping[str, int] | None = None) -> ChargeTable:
        """A cluster of these catalog models (keys or product names); ConfigError naming an unknown one."""
        for model in models:
            if find_model(model) is None:
                raise ConfigError(f"GPU model {model!r} is not in the catalog; known: {', '.join(CATALOG)}")
        return cls(catalogue_shapes(models) if models else catalogue_shapes(),
                   dict(DEFAULT_REPLICAS) if replicas is None else dict(replicas))

    @classmethod
    def for_cluster(cls, models: Sequence[str], nodes: Sequence[Mapping[str, str]],
                    replicas: Mapping[str, int] | None = None,
                    pools: Sequence[Mapping[str, Any]] = ()) -> ChargeTable:
        """The cluster's table: the GPUs its NodePools may launch (`nodepool_shapes`), a shape for each distinct GPU
        node (`node_shape`, from its labels) and the catalog shapes of `models` (GPUs nodes may still bring some
        other way); with none of these, the whole catalog."""
        listed = cls.for_models(models).shapes if models else ()
        launchable = tuple(shape for pool in pools for shape in nodepool_shapes(pool))
        keys = shipped_table().pinning_keys | {key for shape in launchable for key in shape.labels}
        found: dict[tuple[tuple[str, str], ...], GpuShape] = {}
        for labels in nodes:
            shape = node_shape(labels, keys)
            if shape is not None:
                found.setdefault(tuple(sorted(shape.labels.items())), shape)
        known = (*listed, *launchable)
        shapes = (*known, *(found[k] for k in sorted(found) if found[k] not in known))
        # the nodes' own replicas win over the listed ones; where nodes differ, the fewest (the larger charge)
        reported: dict[str, int] = {}
        for labels in nodes:
            for name, count in replicas_of_node(labels).items():
                reported[name] = min(count, reported.get(name, count))
        listed_replicas = dict(DEFAULT_REPLICAS) if replicas is None else dict(replicas)
        merged = {**listed_replicas, **reported}
        return cls(shapes or catalogue_shapes(), {name: count for name, count in merged.items() if count > 1})

    @cached_property
    def largest_bytes(self) -> int:
        """What a whole GPU is charged when nothing the pod states narrows it: the largest shape's."""
        return max(shape.whole_gpu_bytes for shape in self.shapes)

    @cached_property
    def pinning_keys(self) -> frozenset[str]:
        """The labels the shapes know; a requirement on any other label says nothing about the GPU model."""
        return frozenset(key for shape in self.shapes for key in shape.labels)

    @cached_property
    def known_values(self) -> dict[str, frozenset[str]]:
        """Each pinning label's values over the shapes."""
        values: dict[str, set[str]] = {}
        for shape in self.shapes:
            for key, value in shape.labels.items():
                values.setdefault(key, set()).add(value)
        return {key: frozenset(found) for key, found in values.items()}

    def _pins(self, pod: Mapping[str, Any]) -> tuple[dict[str, str], tuple[NodeSelectorTerm, ...] | None]:
        """The pod's node selector on pinning labels, and its required node affinity's terms (None: it has none)."""
        spec = pod.get("spec") or {}
        selector = spec.get("nodeSelector") or {}
        if not isinstance(selector, Mapping):
            raise ConfigError(f"{pod_key(pod)}: spec.nodeSelector: must be a mapping of label to value")
        pins = {str(k): str(v) for k, v in selector.items() if k in self.pinning_keys}
        required = (((spec.get("affinity") or {}).get("nodeAffinity") or {})
                    .get("requiredDuringSchedulingIgnoredDuringExecution"))
        terms = None if required is None else node_selector_terms(
            (required or {}).get("nodeSelectorTerms") or [],
            f"{pod_key(pod)}: spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution"
            ".nodeSelectorTerms")
        return pins, terms

    def landing_shapes(self, pod: Mapping[str, Any]) -> list[GpuShape]:
        """The shapes the pod's node selector and required node affinity (on pinning labels) leave possible."""
        pins, terms = self._pins(pod)
        return [shape for shape in self.shapes
                if all(shape.labels.get(k) == v for k, v in pins.items())
                and (terms is None or any(self._term_allows(term, shape) for term in terms))]

    def names_unknown_gpu(self, pod: Mapping[str, Any]) -> bool:
        """Whether the pod allows a value of a pinning label no shape carries (`instance-type In [a3-ultragpu-8g,
        g6.xlarge]`): a node the table does not know yet may be that, and hold any GPU."""
        pins, terms = self._pins(pod)
        known = self.known_values
        if any(value not in known[key] for key, value in pins.items()):
            return True
        return any(r.operator == IN and r.key in known and not r.values <= known[r.key]
                   for term in terms or () for r in term.expressions)

    def _term_allows(self, term: NodeSelectorTerm, shape: GpuShape) -> bool:
        """A nodeSelectorTerm on a shape: requirements on labels the shapes do not know (and `matchFields`) may hold
        on some node, so only pinning labels are checked; a term with nothing in it matches nothing."""
        if not term.expressions and not term.fields:
            return False
        return all(r.key not in self.pinning_keys or r.matches_value(shape.labels.get(r.key))
                   for r in term.expressions)

    def whole_gpu_bytes(self, pod: Mapping[str, Any] | None = None) -> int:
        """A whole GPU's charge for `pod`: the largest shape it may land on; the largest of all when it pins none,
        names a GPU the table does not know, or pins only what no shape is (no node the table knows can take it)."""
        if pod is None or self.names_unknown_gpu(pod):
            return self.largest_bytes
        return max((shape.whole_gpu_bytes for shape in self.landing_shapes(pod)), default=self.largest_bytes)

    def bytes_each(self, resource: str, whole_gpu_bytes: int) -> int:
        """What one unit of `resource` is charged; 0 for a resource that is not a GPU."""
        if not is_gpu_resource(resource):
            return 0
        named = named_memory_gib(resource)
        base = named * GIB if named is not None else whole_gpu_bytes
        return base // self.replicas.get(resource, 1)

    @classmethod
    def from_device_plugin_config(cls, config: object, shapes: tuple[GpuShape, ...] | None = None) -> ChargeTable:
        """The replicas an NVIDIA device-plugin config (`version: v1`) gives each name it advertises."""
        return cls(shapes=shapes or catalogue_shapes(), replicas=replicas_of_config(config))


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


def _count(amount: float, where: str) -> int:
    if amount < 0 or amount != int(amount):
        raise ConfigError(f"{where}: a GPU resource must be a whole number, got {amount:g}")
    return int(amount)


def pod_charge(pod: Mapping[str, Any], table: ChargeTable | None = None) -> PodCharge:
    """The `kubegpu.io/gpu-memory` a pod's GPU resources are charged, per container and resource (requests, with
    limits standing in for missing ones, as the API server defaults them). Init containers are listed too: each
    container that asks for GPUs carries its own charge."""
    table = table or shipped_table()
    if not isinstance(pod, Mapping):
        raise ConfigError(f"pod: expected a mapping, got {type(pod).__name__}")
    whole = table.whole_gpu_bytes(pod)
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
    """A node's `kubegpu.io/gpu-memory` capacity: room for the largest charge each of its allocatable GPU units can
    carry, so the scheduler's fit on the charge never disagrees with its fit on the GPU resources themselves.

    A whole GPU of any node may go to a pod that pins no model, charged the table's largest: so each whole GPU (and
    each replica of one) counts at the largest, or at its own model where that is larger still (a table that has not
    caught up with a new node). MIG profiles and MPS slices carry their size in their name, on every node."""
    table = table or shipped_table()
    own = model_of_product(product) if product else None
    whole = max(table.largest_bytes, model_memory_bytes(own) if own is not None else 0)
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
TABLE_KEYS_KEY = "keys"
TABLE_SHAPES_KEY = "shapes"
TABLE_SHAPE_PREFIX = "shape."
TABLE_VALUES_PREFIX = "values."
TABLE_BYTES_SUFFIX = "bytes"
TABLE_REPLICAS_PREFIX = "replicas."


def table_key(prefix: str, name: str) -> str:
    """A ConfigMap key for a resource or label name (keys cannot hold `/`): `replicas.nvidia.com_gpu.shared`."""
    return prefix + name.replace("/", "_")


def table_data(table: ChargeTable | None = None) -> dict[str, str]:
    """The admission policy's parameter (a ConfigMap's `data`), so the CEL decides exactly as `pod_charge`:

    * `default`: the largest whole-GPU charge (a pod that pins nothing the table knows);
    * `keys`: the pinning labels, comma-separated (label names and values hold no comma); `values.<label>` the
      values the shapes give each (a pod allowing another may land on a GPU the table does not know);
    * `shapes`: the shape ids, comma-separated; `shape.<id>.bytes` its whole-GPU charge and `shape.<id>.<label>` each
      of its labels (`/` written `_`): a requirement is looked up, not searched for;
    * `replicas.<name>`: each replicated name's replicas.

    MIG and MPS names carry their size, so the policy reads it from the name with the same rule as
    `named_memory_gib`."""
    table = table or shipped_table()
    data = {TABLE_DEFAULT_KEY: str(table.largest_bytes), TABLE_KEYS_KEY: ",".join(sorted(table.pinning_keys)),
            TABLE_SHAPES_KEY: ",".join(str(i) for i in range(len(table.shapes)))}
    for key, values in sorted(table.known_values.items()):
        data[table_key(TABLE_VALUES_PREFIX, key)] = ",".join(sorted(values))
    for index, shape in enumerate(table.shapes):
        prefix = f"{TABLE_SHAPE_PREFIX}{index}."
        data[prefix + TABLE_BYTES_SUFFIX] = str(shape.whole_gpu_bytes)
        for key, value in sorted(shape.labels.items()):
            data[table_key(prefix, key)] = value
    for resource, count in sorted(table.replicas.items()):
        data[table_key(TABLE_REPLICAS_PREFIX, resource)] = str(count)
    return data


def table_from_data(data: Mapping[str, str], source: str = "table") -> ChargeTable:
    """The table back from its ConfigMap `data` (`table_data`), for a component that charges what the admission
    policy charges (the quota controller, for ResourceClaims). ConfigError naming the key at fault."""
    try:
        keys = [k for k in str(data[TABLE_KEYS_KEY]).split(",") if k]
        shapes = []
        for shape_id in (i for i in str(data[TABLE_SHAPES_KEY]).split(",") if i):
            prefix = f"{TABLE_SHAPE_PREFIX}{shape_id}."
            labels = {k: str(data[table_key(prefix, k)]) for k in keys if table_key(prefix, k) in data}
            shapes.append(GpuShape(labels, int(data[prefix + TABLE_BYTES_SUFFIX])))
        # a resource name's domain holds no `_`: the first one stands for the `/`
        replicas = {key[len(TABLE_REPLICAS_PREFIX):].replace("_", "/", 1): int(value) for key, value in data.items()
                    if key.startswith(TABLE_REPLICAS_PREFIX)}
    except KeyError as exc:
        raise ConfigError(f"{source}: data: missing key {exc.args[0]}") from None
    except ValueError as exc:
        raise ConfigError(f"{source}: data: {exc}") from None
    return ChargeTable(tuple(shapes), replicas)


@cache
def shipped_table() -> ChargeTable:
    """The table shipped in deploy/kubernetes/quota and used offline: the whole catalog, the default replicas."""
    return ChargeTable()


__all__ = ["GIB", "GPU_RESOURCE", "ChargeLine", "ChargeTable", "GpuShape", "PodCharge", "catalogue_shapes",
           "model_memory_bytes", "node_gpu_memory", "pod_charge", "product_label", "quantity_of_bytes",
           "replicas_of_config", "shipped_table", "table_data", "table_from_data"]
