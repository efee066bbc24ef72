"""What a pod's ResourceClaims are charged in `kubegpu.io/gpu-memory`: the same unit as device-plugin GPUs.

A claim's devices are not in the pod spec, so the admission policy cannot charge them; the quota controller does
(`kubegpu.quota.holders`), with this function, and `kubegpu quota explain` shows the same number. A claim is charged
the most its requests could get, so no selector, class or node is a way around it:

* a request is tried against the devices one GPU of every model the charge table's shapes allow would publish
  through kubegpu's DRA driver (`kubegpu.dra.devices`: the whole GPU, every MIG placement, the GPU shared by
  thousandths), with its DeviceClass's and its own CEL selectors; a selector that fails on a synthetic device (an
  attribute only real nodes carry) counts as a match;
* a whole GPU is charged as `nvidia.com/gpu` is (the shape's whole-GPU charge), a MIG device the memory its profile
  names (`3g.40gb`: 40Gi, as `nvidia.com/mig-3g.40gb`), a share of a GPU (`capacity.requests`) its thousandths of
  the whole GPU (rounded down to a byte, so the shares of one GPU never add up to more than it), or the memory it
  requests where that is more;
* `count` devices are charged `count` times; `allocationMode: All` the whole GPUs the largest node of the model
  holds (no node's MIG devices or shares hold more than its GPUs); `firstAvailable` the largest alternative;
* the shapes are those the pod's node selector and required affinity leave possible (`ChargeTable.landing_shapes`,
  as for a whole GPU) for a claim from a template (one claim per pod); a named ResourceClaim may be shared by pods
  pinned differently, so it is charged against every shape; a shape whose GPU the catalogue does not know is
  charged its whole GPU for any request some GPU satisfies. The claim pays the largest over the shapes.

Pure: objects in, bytes out (the synthetic devices are built in memory, once per model).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from kubegpu.dra.devices import COMPUTE, DRIVER, WHOLE, gpu_offers, read_node
from kubegpu.dra.slices import build_slices
from kubegpu.errors import ConfigError, KubegpuError
from kubegpu.gpu.catalog import CATALOG, GpuModel
from kubegpu.gpu.instances import GPU_COUNT_LABEL, GPU_INSTANCE_TYPES, KARPENTER_GPU_COUNT, KUBEGPU_GPU_COUNT
from kubegpu.scheduling.dra import Claim, Device, DeviceClass, SubRequest, parse_claim, parse_class, parse_slice
from kubegpu.scheduling.dra.celenv import compile_selector
from kubegpu.scheduling.pods import pod_key
from kubegpu.sharing.capacity import simulated_gpu_backend
from kubegpu.sharing.charges import (
    GIB,
    ChargeTable,
    GpuShape,
    model_of_product,
    quantity_of_bytes,
    shipped_table,
)
from kubegpu.sharing.names import GPU_PRODUCT_LABEL, mig_resource_name, named_memory_gib

CLAIM_GATE = "kubegpu.io/gpu-memory"
"""The scheduling gate a pod with ResourceClaims waits behind until its claims are charged (`quota.holders`)."""
HOLDER_LABEL = "kubegpu.io/gpu-memory-charge"
"""Marks a charge holder: a pod that only carries a claim's charge (value: the claim pod's or claim's name)."""
HOLDER_PREFIX = "kubegpu-charge-"
"""Every holder's name starts so: an eviction names only the pod, so the guard against evicting holders goes by it."""
TYPE_ATTRIBUTE = f"{DRIVER}/type"
PROFILE_ATTRIBUTE = f"{DRIVER}/profile"
MEMORY_CAPACITY = f"{DRIVER}/memory"
COUNT_LABELS = (GPU_COUNT_LABEL, KARPENTER_GPU_COUNT, KUBEGPU_GPU_COUNT)


class ClaimSourceMissing(KubegpuError):
    """A pod names a ResourceClaimTemplate or ResourceClaim that does not exist (yet): it cannot be charged."""


@dataclass(frozen=True)
class ClaimCharge:
    """One of the pod's claims: its entry in `spec.resourceClaims`, where its devices come from and what it is
    charged. `shared`: a named ResourceClaim (charged once, however many pods use it), else a claim the pod's own
    template gives it."""

    entry: str
    kind: str  # ResourceClaimTemplate | ResourceClaim
    source: str
    shared: bool
    bytes: int
    owner_uid: str = ""  # the named claim's uid (the holder's owner); "" for a template claim

    def as_json(self) -> dict[str, Any]:
        return {"claim": self.entry, "kind": self.kind, "name": self.source, "gpuMemoryBytes": self.bytes,
                "gpuMemory": quantity_of_bytes(self.bytes) or "0"}


# ---------------------------------------------------------------------------------------------- synthetic devices


@lru_cache(maxsize=128)
def model_devices(model_key: str) -> tuple[Device, ...]:
    """The devices one GPU of the model publishes through kubegpu's DRA driver, in every mode: the whole GPU with
    every MIG placement (dynamic MIG) and the GPU shared by thousandths (fractional). Parsed once per model, so each
    device's memo keeps its selector answers across pods."""
    backend = simulated_gpu_backend(model_key, 1, None)
    try:
        node = read_node(backend)
    finally:
        backend.close()
    devices: list[Device] = []
    for offers in (gpu_offers(node, dynamic_mig=True), gpu_offers(node, dynamic_mig=False, fractional=True)):
        for index, obj in enumerate(build_slices("charge", offers)):
            devices.extend(parse_slice(obj, index).devices)
    return tuple(devices)


def _attribute(device: Device, name: str) -> str | None:
    found = device.attribute(name)
    return str(found[1]) if found is not None else None


def _selected(device: Device, selectors: Sequence[str]) -> bool:
    """Every selector accepts the device; one that fails to evaluate on it (an attribute a real node has and the
    synthetic device lacks) may accept it on a real node, so it counts as accepting."""
    for expression in selectors:
        try:
            if not compile_selector(expression).matches(device.view, device.memo):
                return False
        except KubegpuError:
            continue
    return True


def device_charge(device: Device, sub: SubRequest, whole: int) -> int:
    """What one device of the request is charged: see the module doc. `whole`: the shape's whole-GPU charge."""
    if _attribute(device, TYPE_ATTRIBUTE) == "mig":
        gib = named_memory_gib(mig_resource_name(_attribute(device, PROFILE_ATTRIBUTE) or ""))
        return gib * GIB if gib is not None else whole
    if not device.multiple:
        return whole
    requested = dict(sub.capacity)
    share = requested.get(COMPUTE, requested.get(f"{DRIVER}/{COMPUTE}", float(WHOLE)))
    share = min(max(share, 0.0), float(WHOLE))
    memory = requested.get("memory", requested.get(MEMORY_CAPACITY, 0.0))
    return min(whole, max(int(whole * share) // WHOLE, int(memory)))


def _model_of(shape: GpuShape) -> GpuModel | None:
    return model_of_product(shape.labels.get(GPU_PRODUCT_LABEL) or "")


def _gpus_per_node(shape: GpuShape, model: GpuModel | None) -> int:
    """The most GPUs a node of the shape holds: its count label, else the largest instance type of its model, else
    the largest of any."""
    for label in COUNT_LABELS:
        value = shape.labels.get(label, "")
        if value.isdigit() and int(value) > 0:
            return int(value)
    counts = [count for key, count in GPU_INSTANCE_TYPES.values() if model is None or key == model.key]
    return max(counts or [count for _, count in GPU_INSTANCE_TYPES.values()])


def _any_gpu_selected(selectors: Sequence[str]) -> bool:
    return any(_selected(device, selectors) for key in sorted(CATALOG) for device in model_devices(key))


def sub_request_charge(sub: SubRequest, classes: Mapping[str, DeviceClass], shape: GpuShape) -> int:
    """A request (or one `firstAvailable` alternative) on a node of `shape`; 0 when no GPU device there matches.
    A DeviceClass the cluster lacks selects every GPU (the claim cannot be allocated without it anyway)."""
    device_class = classes.get(sub.class_name)
    selectors = (*(device_class.selectors if device_class is not None else ()), *sub.selectors)
    model = _model_of(shape)
    if model is None:  # a GPU the catalogue does not know: its whole GPU, for whatever some GPU satisfies
        each = shape.whole_gpu_bytes if _any_gpu_selected(selectors) else 0
    else:
        each = max((device_charge(d, sub, shape.whole_gpu_bytes) for d in model_devices(model.key)
                    if _selected(d, selectors)), default=0)
    if not each:
        return 0
    if sub.mode == "All":
        return _gpus_per_node(shape, model) * shape.whole_gpu_bytes
    return sub.count * each


def claim_charge(claim: Claim, classes: Mapping[str, DeviceClass], shapes: Sequence[GpuShape]) -> int:
    """The most the claim's requests could take together on a node of any of `shapes`."""
    return max((sum(max(sub_request_charge(sub, classes, shape) for sub in request.alternatives)
                    for request in claim.requests) for shape in shapes), default=0)


def claim_shapes(pod: Mapping[str, Any] | None, table: ChargeTable) -> tuple[GpuShape, ...]:
    """The shapes a claim of `pod` may be allocated on (None: a named claim, any pod's): as for a whole GPU, every
    shape when the pod pins none, names a GPU the table does not know, or pins what no shape is."""
    if pod is None or table.names_unknown_gpu(pod):
        return table.shapes
    return tuple(table.landing_shapes(pod)) or table.shapes


def parse_classes(objects: Sequence[Mapping[str, Any]]) -> dict[str, DeviceClass]:
    """DeviceClass objects by name (one that does not parse is left out: as if missing, it selects every GPU)."""
    classes: dict[str, DeviceClass] = {}
    for index, obj in enumerate(objects):
        try:
            parsed = parse_class(obj, index)
        except ConfigError:
            continue
        classes[parsed.name] = parsed
    return classes


def _template_claim(template: Mapping[str, Any], namespace: str, name: str) -> Mapping[str, Any]:
    """The ResourceClaim a template gives a pod (its `spec.spec`), as `parse_claim` reads one."""
    spec = (template.get("spec") or {}).get("spec")
    if not isinstance(spec, Mapping):
        raise ConfigError(f"ResourceClaimTemplate {namespace}/{name}: spec.spec: expected the claim's spec")
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": namespace}, "spec": spec}


def pod_claim_charges(pod: Mapping[str, Any], templates: Mapping[str, Mapping[str, Any]],
                      claims: Mapping[str, Mapping[str, Any]], classes: Mapping[str, DeviceClass],
                      table: ChargeTable | None = None) -> list[ClaimCharge]:
    """Each of the pod's `spec.resourceClaims`, charged. `templates` / `claims`: the pod namespace's
    ResourceClaimTemplates / ResourceClaims by name. ClaimSourceMissing for one the pod names that is not there;
    ConfigError (naming the object and field) for one that does not parse."""
    table = table or shipped_table()
    spec = pod.get("spec") or {}
    namespace = str((pod.get("metadata") or {}).get("namespace") or "default")
    charges = []
    for index, entry in enumerate(spec.get("resourceClaims") or ()):
        if not isinstance(entry, Mapping):
            raise ConfigError(f"{pod_key(pod)}: spec.resourceClaims[{index}]: expected a mapping")
        name = str(entry.get("name") or f"resourceClaims[{index}]")
        template_name, claim_name = entry.get("resourceClaimTemplateName"), entry.get("resourceClaimName")
        if template_name:
            template = templates.get(str(template_name))
            if template is None:
                raise ClaimSourceMissing(f"{pod_key(pod)}: claim {name}: ResourceClaimTemplate "
                                         f"{namespace}/{template_name} not found")
            claim = parse_claim(_template_claim(template, namespace, str(template_name)))
            charges.append(ClaimCharge(name, "ResourceClaimTemplate", str(template_name), False,
                                       claim_charge(claim, classes, claim_shapes(pod, table))))
        elif claim_name:
            obj = claims.get(str(claim_name))
            if obj is None:
                raise ClaimSourceMissing(f"{pod_key(pod)}: claim {name}: ResourceClaim {namespace}/{claim_name} "
                                         "not found")
            uid = str((obj.get("metadata") or {}).get("uid") or "")
            charges.append(ClaimCharge(name, "ResourceClaim", str(claim_name), True,
                                       claim_charge(parse_claim(obj), classes, claim_shapes(None, table)), uid))
        else:
            raise ConfigError(f"{pod_key(pod)}: spec.resourceClaims[{index}]: names neither "
                              "resourceClaimTemplateName nor resourceClaimName")
    return charges


def holder_name(pod: Mapping[str, Any], charge: ClaimCharge) -> str:
    """The charge holder's name: fixed by what it charges (the pod's uid and claim entry, or the named claim's uid),
    so a controller that crashed after creating it finds it again instead of charging twice."""
    meta = pod.get("metadata") or {}
    if charge.shared:
        base, key = charge.source, f"claim/{charge.owner_uid or charge.source}"
    else:
        base, key = str(meta.get("name") or ""), f"pod/{meta.get('uid') or meta.get('name')}/{charge.entry}"
    digest = hashlib.sha256(key.encode()).hexdigest()[:10]
    return f"{HOLDER_PREFIX}{base[:40].rstrip('-.')}-{digest}"


__all__ = ["CLAIM_GATE", "HOLDER_LABEL", "HOLDER_PREFIX", "ClaimCharge", "ClaimSourceMissing", "claim_charge",
           "claim_shapes", "holder_name", "model_devices", "parse_classes", "pod_claim_charges"]
