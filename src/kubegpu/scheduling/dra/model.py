"""resource.k8s.io/v1 objects as the allocator needs them: ResourceSlice, DeviceClass, ResourceClaim.

Parsing is strict where a wrong value would silently change an allocation (unknown allocation mode, a request with
both or neither of `exactly`/`firstAvailable`, a bad quantity) and every problem is one `ConfigError` line naming
the object (`ResourceClaim default/train`) and the field path (`spec.devices.requests[1].exactly.count`). CEL
selectors are compiled here, once, so a selector that does not compile is reported against its object and field.
Pure: dicts in, frozen dataclasses out.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from kubegpu.errors import ConfigError, KubegpuError
from kubegpu.scheduling.dra.capacity import RequestPolicy, result_key
from kubegpu.scheduling.dra.celenv import compile_selector, is_semver, quantity_value, semver_value
from kubegpu.scheduling.quantity import format_quantity, parse_quantity

API_VERSIONS = ("resource.k8s.io/v1", "resource.k8s.io/v1beta2", "resource.k8s.io/v1beta1")
BLOCKING_EFFECTS = ("NoSchedule", "NoExecute")

AttrValue = tuple[str, Any]  # ("int", 3) | ("bool", True) | ("string", "x") | ("version", "1.2.3")


class DeviceId(NamedTuple):
    """A device by driver, pool and name: a tuple, so the allocator's sets of devices in use hash it natively."""

    driver: str
    pool: str
    device: str


@dataclass(frozen=True)
class Taint:
    key: str
    value: str
    effect: str


@dataclass(frozen=True)
class Toleration:
    key: str
    operator: str  # Exists | Equal
    value: str
    effect: str  # "" = every effect

    def tolerates(self, taint: Taint) -> bool:
        if self.effect and self.effect != taint.effect:
            return False
        if self.operator == "Exists":
            return not self.key or self.key == taint.key
        return self.key == taint.key and self.value == taint.value


@dataclass(frozen=True)
class Device:
    id: DeviceId
    attributes: Mapping[str, AttrValue]  # fully qualified names ("gpu.nvidia.com/type")
    capacity: Mapping[str, float]  # fully qualified names, base units
    consumes: tuple[tuple[str, tuple[tuple[str, float], ...]], ...]  # (counter set, ((counter, amount), ...))
    taints: tuple[Taint, ...]
    view: Mapping[str, Any] = field(compare=False, hash=False)  # the CEL `device` variable
    # selector results per expression, and the device's CEL context: a device is evaluated against the same few
    # selectors by every claim, so each answer is computed once per parsed device
    memo: dict[str, Any] = field(default_factory=dict, compare=False, hash=False, repr=False)
    multiple: bool = False  # allowMultipleAllocations: shared by claims through consumable capacity
    policies: Mapping[str, RequestPolicy] = field(default_factory=dict, compare=False, hash=False)
    written: Mapping[str, str] = field(default_factory=dict, compare=False, hash=False)  # capacity key as published

    def attribute(self, name: str) -> AttrValue | None:
        """matchAttribute lookup: the fully qualified name, or the bare id when its domain is the driver's."""
        return self.attributes.get(name)


@dataclass(frozen=True)
class ResourceSlice:
    name: str
    driver: str
    pool: str
    generation: int
    slice_count: int
    node_name: str | None
    all_nodes: bool
    devices: tuple[Device, ...]
    shared_counters: Mapping[str, Mapping[str, float]]


@dataclass(frozen=True)
class DeviceClass:
    name: str
    selectors: tuple[str, ...]
    extended_resource_name: str | None = None


@dataclass(frozen=True)
class SubRequest:
    """One way to satisfy a request: `exactly` (name = the request's) or one `firstAvailable` entry (`req/sub`)."""

    name: str
    request: str
    class_name: str
    selectors: tuple[str, ...]
    mode: str  # ExactCount | All
    count: int
    tolerations: tuple[Toleration, ...]
    admin_access: bool
    capacity: tuple[tuple[str, float], ...] = ()  # capacity.requests (names as written, qualified per device)


@dataclass(frozen=True)
class Request:
    name: str
    alternatives: tuple[SubRequest, ...]


@dataclass(frozen=True)
class Constraint:
    requests: tuple[str, ...]  # empty: every request
    attribute: str
    distinct: bool  # distinctAttribute instead of matchAttribute

    def applies(self, sub: SubRequest) -> bool:
        return not self.requests or sub.request in self.requests or sub.name in self.requests


@dataclass(frozen=True)
class Result:
    request: str
    driver: str
    pool: str
    device: str
    share_id: str | None = None  # set for a share of a device that allows multiple allocations
    consumed: tuple[tuple[str, float], ...] = ()  # consumedCapacity, fully qualified names, base units

    @property
    def id(self) -> DeviceId:
        return DeviceId(self.driver, self.pool, self.device)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"request": self.request, "driver": self.driver, "pool": self.pool,
                               "device": self.device}
        if self.share_id is not None:
            out["shareID"] = self.share_id
        if self.consumed:
            out["consumedCapacity"] = {result_key(name, self.driver): format_quantity(amount)
                                       for name, amount in self.consumed}
        return out


@dataclass(frozen=True)
class Claim:
    namespace: str
    name: str
    requests: tuple[Request, ...]
    constraints: tuple[Constraint, ...]
    allocation: tuple[Result, ...] | None = None  # status.allocation: an allocated claim keeps it
    uid: str = ""  # metadata.uid where known (share IDs derive from it)

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


# --- parsing helpers ------------------------------------------------------------------------------------------------


class _Ctx:
    """The object being parsed, so every error names it."""

    def __init__(self, what: str) -> None:
        self.what = what

    def error(self, path: str, message: str) -> ConfigError:
        return ConfigError(f"{self.what}: {path}: {message}")

    def mapping(self, value: object, path: str, required: bool = False) -> Mapping[str, Any]:
        if value is None and not required:
            return {}
        if not isinstance(value, Mapping):
            raise self.error(path, f"expected a mapping, got {type(value).__name__}")
        return value

    def seq(self, value: object, path: str) -> Sequence[Any]:
        if value is None:
            return ()
        if not isinstance(value, list):
            raise self.error(path, f"expected a list, got {type(value).__name__}")
        return value

    def text(self, value: object, path: str, required: bool = True) -> str:
        if value is None and not required:
            return ""
        if not isinstance(value, str) or (required and not value):
            raise self.error(path, "expected a non-empty string" if required else "expected a string")
        return value

    def integer(self, value: object, path: str, default: int, minimum: int = 0) -> int:
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise self.error(path, f"expected an integer >= {minimum}")
        return value

    def quantity(self, value: object, path: str) -> float:
        try:
            return parse_quantity(value)  # type: ignore[arg-type]
        except KubegpuError as exc:
            raise self.error(path, str(exc)) from None

    def selectors(self, value: object, path: str) -> tuple[str, ...]:
        out = []
        for i, item in enumerate(self.seq(value, path)):
            where = f"{path}[{i}].cel.expression"
            expression = self.text(self.mapping(self.mapping(item, f"{path}[{i}]").get("cel"), f"{path}[{i}].cel",
                                           required=True).get("expression"), where)
            try:
                compile_selector(expression)
            except KubegpuError as exc:
                raise self.error(where, str(exc)) from None
            out.append(expression)
        return tuple(out)


def _meta(obj: Mapping[str, Any], kind: str, index: int, namespaced: bool) -> tuple[str, str, _Ctx]:
    if not isinstance(obj, Mapping):
        raise ConfigError(f"{kind} #{index + 1}: expected a mapping, got {type(obj).__name__}")
    metadata = obj.get("metadata")
    name = metadata.get("name") if isinstance(metadata, Mapping) else None
    if not isinstance(name, str) or not name:
        raise ConfigError(f"{kind} #{index + 1}: metadata.name: expected a non-empty string")
    namespace = ""
    if namespaced:
        namespace = metadata.get("namespace") or "default"  # type: ignore[union-attr]
        if not isinstance(namespace, str):
            raise ConfigError(f"{kind} {name}: metadata.namespace: expected a string")
    ctx = _Ctx(f"{kind} {namespace + '/' if namespace else ''}{name}")
    if obj.get("kind") not in (None, kind):
        raise ctx.error("kind", f"expected {kind}, got {obj.get('kind')!r}")
    if obj.get("apiVersion") is not None and obj.get("apiVersion") not in API_VERSIONS:
        raise ctx.error("apiVersion", f"expected one of {', '.join(API_VERSIONS)}, got {obj.get('apiVersion')!r}")
    return namespace, name, ctx


def qualify(name: str, driver: str) -> str:
    return name if "/" in name else f"{driver}/{name}"


# --- ResourceSlice --------------------------------------------------------------------------------------------------


def parse_slice(obj: Mapping[str, Any], index: int = 0) -> ResourceSlice:
    _, name, ctx = _meta(obj, "ResourceSlice", index, namespaced=False)
    spec = ctx.mapping(obj.get("spec"), "spec", required=True)
    driver = ctx.text(spec.get("driver"), "spec.driver")
    pool_spec = ctx.mapping(spec.get("pool"), "spec.pool", required=True)
    pool = ctx.text(pool_spec.get("name"), "spec.pool.name")
    generation = ctx.integer(pool_spec.get("generation"), "spec.pool.generation", 0)
    count = ctx.integer(pool_spec.get("resourceSliceCount"), "spec.pool.resourceSliceCount", 1, minimum=1)
    node_name = spec.get("nodeName")
    if node_name is not None:
        node_name = ctx.text(node_name, "spec.nodeName")
    all_nodes = bool(spec.get("allNodes")) or spec.get("nodeSelector") is not None
    if node_name is None and not all_nodes and not spec.get("perDeviceNodeSelection"):
        raise ctx.error("spec", "exactly one of nodeName, nodeSelector, allNodes, perDeviceNodeSelection is required")
    counters: dict[str, dict[str, float]] = {}
    for i, counter_set in enumerate(ctx.seq(spec.get("sharedCounters"), "spec.sharedCounters")):
        path = f"spec.sharedCounters[{i}]"
        set_name = ctx.text(ctx.mapping(counter_set, path).get("name"), f"{path}.name")
        values = ctx.mapping(counter_set.get("counters"), f"{path}.counters")
        counters[set_name] = {
            key: ctx.quantity(ctx.mapping(v, f"{path}.counters.{key}").get("value"), f"{path}.counters.{key}.value")
            for key, v in values.items()
        }
    devices = []
    seen: set[str] = set()
    for i, item in enumerate(ctx.seq(spec.get("devices"), "spec.devices")):
        device = _parse_device(ctx, ctx.mapping(item, f"spec.devices[{i}]"), f"spec.devices[{i}]", driver, pool)
        if device.id.device in seen:
            raise ctx.error(f"spec.devices[{i}].name", f"duplicate device name {device.id.device!r}")
        seen.add(device.id.device)
        devices.append(device)
    return ResourceSlice(name=name, driver=driver, pool=pool, generation=generation, slice_count=count,
                         node_name=node_name, all_nodes=all_nodes, devices=tuple(devices), shared_counters=counters)


def _attr_value(ctx: _Ctx, value: object, path: str) -> AttrValue:
    item = ctx.mapping(value, path, required=True)
    kinds = [k for k in ("int", "bool", "string", "version") if k in item]
    if len(kinds) != 1:
        raise ctx.error(path, "exactly one of int, bool, string, version is required")
    kind = kinds[0]
    raw = item[kind]
    ok = {"int": isinstance(raw, int) and not isinstance(raw, bool), "bool": isinstance(raw, bool),
          "string": isinstance(raw, str), "version": isinstance(raw, str) and is_semver(raw)}[kind]
    if not ok:
        raise ctx.error(f"{path}.{kind}", f"invalid {kind} value {raw!r}")
    return kind, raw


def _parse_device(ctx: _Ctx, item: Mapping[str, Any], path: str, driver: str, pool: str) -> Device:
    name = ctx.text(item.get("name"), f"{path}.name")
    attributes = {qualify(k, driver): _attr_value(ctx, v, f"{path}.attributes.{k}")
                  for k, v in ctx.mapping(item.get("attributes"), f"{path}.attributes").items()}
    capacity, policies, written = {}, {}, {}
    for k, v in ctx.mapping(item.get("capacity"), f"{path}.capacity").items():
        entry = ctx.mapping(v, f"{path}.capacity.{k}")
        capacity[qualify(k, driver)] = ctx.quantity(entry.get("value"), f"{path}.capacity.{k}.value")
        written[k] = qualify(k, driver)
        if entry.get("requestPolicy") is not None:
            policies[qualify(k, driver)] = _policy(ctx, entry["requestPolicy"], f"{path}.capacity.{k}.requestPolicy")
    consumes = []
    for i, entry in enumerate(ctx.seq(item.get("consumesCounters"), f"{path}.consumesCounters")):
        where = f"{path}.consumesCounters[{i}]"
        set_name = ctx.text(ctx.mapping(entry, where).get("counterSet"), f"{where}.counterSet")
        values = ctx.mapping(entry.get("counters"), f"{where}.counters")
        consumes.append((set_name, tuple(sorted(
            (key, ctx.quantity(ctx.mapping(v, f"{where}.counters.{key}").get("value"), f"{where}.counters.{key}.value"))
            for key, v in values.items()))))
    taints = []
    for i, taint in enumerate(ctx.seq(item.get("taints"), f"{path}.taints")):
        where = f"{path}.taints[{i}]"
        taint = ctx.mapping(taint, where)
        taints.append(Taint(key=ctx.text(taint.get("key"), f"{where}.key"),
                            value=ctx.text(taint.get("value"), f"{where}.value", required=False),
                            effect=ctx.text(taint.get("effect"), f"{where}.effect")))
    multiple = item.get("allowMultipleAllocations") is True
    view = _cel_view(driver, attributes, capacity, multiple)
    return Device(id=DeviceId(driver, pool, name), attributes=attributes, capacity=capacity,
                  consumes=tuple(consumes), taints=tuple(taints), view=view, multiple=multiple, policies=policies,
                  written=written)


def _policy(ctx: _Ctx, value: object, path: str) -> RequestPolicy:
    policy = ctx.mapping(value, path)
    default = policy.get("default")
    values = tuple(ctx.quantity(v, f"{path}.validValues[{i}]")
                   for i, v in enumerate(ctx.seq(policy.get("validValues"), f"{path}.validValues")))
    if list(values) != sorted(values):
        raise ctx.error(f"{path}.validValues", "must be in ascending order")
    valid_range = ctx.mapping(policy.get("validRange"), f"{path}.validRange")
    if values and valid_range:
        raise ctx.error(path, "at most one of validValues, validRange is allowed")

    def bound(key: str) -> float | None:
        raw = valid_range.get(key)
        return None if raw is None else ctx.quantity(raw, f"{path}.validRange.{key}")

    minimum = bound("min")
    if valid_range and minimum is None:
        raise ctx.error(f"{path}.validRange.min", "is required")
    step = bound("step")
    if step is not None and step <= 0:
        raise ctx.error(f"{path}.validRange.step", "must be positive")
    return RequestPolicy(default=None if default is None else ctx.quantity(default, f"{path}.default"),
                         valid_values=values, minimum=minimum, maximum=bound("max"), step=step)


def _cel_view(driver: str, attributes: Mapping[str, AttrValue], capacity: Mapping[str, float],
              multiple: bool) -> dict[str, Any]:
    attrs: dict[str, dict[str, Any]] = {}
    for key, (kind, value) in attributes.items():
        domain, _, ident = key.rpartition("/")
        attrs.setdefault(domain, {})[ident] = semver_value(value) if kind == "version" else value
    caps: dict[str, dict[str, Any]] = {}
    for key, amount in capacity.items():
        domain, _, ident = key.rpartition("/")
        caps.setdefault(domain, {})[ident] = quantity_value(amount)
    return {"driver": driver, "attributes": attrs, "capacity": caps, "allowMultipleAllocations": multiple}


# --- DeviceClass ----------------------------------------------------------------------------------------------------


def parse_class(obj: Mapping[str, Any], index: int = 0) -> DeviceClass:
    _, name, ctx = _meta(obj, "DeviceClass", index, namespaced=False)
    spec = ctx.mapping(obj.get("spec"), "spec")
    extended = spec.get("extendedResourceName")
    return DeviceClass(name=name, selectors=ctx.selectors(spec.get("selectors"), "spec.selectors"),
                       extended_resource_name=ctx.text(extended, "spec.extendedResourceName") if extended else None)


# --- ResourceClaim --------------------------------------------------------------------------------------------------


def parse_claim(obj: Mapping[str, Any], index: int = 0) -> Claim:
    namespace, name, ctx = _meta(obj, "ResourceClaim", index, namespaced=True)
    spec = ctx.mapping(obj.get("spec"), "spec", required=True)
    devices = ctx.mapping(spec.get("devices"), "spec.devices")
    requests = []
    names: set[str] = set()
    for i, item in enumerate(ctx.seq(devices.get("requests"), "spec.devices.requests")):
        request = _parse_request(ctx, ctx.mapping(item, f"spec.devices.requests[{i}]"), f"spec.devices.requests[{i}]")
        if request.name in names:
            raise ctx.error(f"spec.devices.requests[{i}].name", f"duplicate request name {request.name!r}")
        names.add(request.name)
        requests.append(request)
    known = names | {alt.name for r in requests for alt in r.alternatives}
    constraints = []
    for i, item in enumerate(ctx.seq(devices.get("constraints"), "spec.devices.constraints")):
        path = f"spec.devices.constraints[{i}]"
        item = ctx.mapping(item, path)
        listed = tuple(ctx.text(r, f"{path}.requests[{j}]") for j, r in enumerate(ctx.seq(item.get("requests"),
                                                                                           f"{path}.requests")))
        for j, ref in enumerate(listed):
            if ref not in known:
                raise ctx.error(f"{path}.requests[{j}]", f"unknown request {ref!r}")
        match, distinct = item.get("matchAttribute"), item.get("distinctAttribute")
        if (match is None) == (distinct is None):
            raise ctx.error(path, "exactly one of matchAttribute, distinctAttribute is required")
        attribute = ctx.text(match if match is not None else distinct,
                            f"{path}.{'matchAttribute' if match is not None else 'distinctAttribute'}")
        if "/" not in attribute:
            raise ctx.error(f"{path}.matchAttribute", f"{attribute!r} must be fully qualified (<domain>/<name>)")
        constraints.append(Constraint(requests=listed, attribute=attribute, distinct=distinct is not None))
    uid = (obj.get("metadata") or {}).get("uid")
    return Claim(namespace=namespace, name=name, requests=tuple(requests), constraints=tuple(constraints),
                 allocation=_parse_allocation(ctx, obj.get("status")), uid=uid if isinstance(uid, str) else "")


def _parse_request(ctx: _Ctx, item: Mapping[str, Any], path: str) -> Request:
    name = ctx.text(item.get("name"), f"{path}.name")
    exactly, first = item.get("exactly"), item.get("firstAvailable")
    if exactly is None and first is None and item.get("deviceClassName") is not None:
        exactly = item  # v1beta1 shape: the request itself carries deviceClassName
    if (exactly is None) == (first is None):
        raise ctx.error(path, "exactly one of exactly, firstAvailable is required")
    if exactly is not None:
        return Request(name, (_parse_sub(ctx, ctx.mapping(exactly, f"{path}.exactly"), f"{path}.exactly", name, name),))
    subs = []
    for i, sub in enumerate(ctx.seq(first, f"{path}.firstAvailable")):
        where = f"{path}.firstAvailable[{i}]"
        sub_name = ctx.text(ctx.mapping(sub, where).get("name"), f"{where}.name")
        subs.append(_parse_sub(ctx, sub, where, name, f"{name}/{sub_name}"))
    if not subs:
        raise ctx.error(f"{path}.firstAvailable", "needs at least one subrequest")
    return Request(name, tuple(subs))


def _parse_sub(ctx: _Ctx, item: Mapping[str, Any], path: str, request: str, name: str) -> SubRequest:
    mode = item.get("allocationMode") or "ExactCount"
    if mode not in ("ExactCount", "All"):
        raise ctx.error(f"{path}.allocationMode", f"expected ExactCount or All, got {mode!r}")
    count = ctx.integer(item.get("count"), f"{path}.count", 1, minimum=1)
    tolerations = []
    for i, tol in enumerate(ctx.seq(item.get("tolerations"), f"{path}.tolerations")):
        where = f"{path}.tolerations[{i}]"
        tol = ctx.mapping(tol, where)
        operator = tol.get("operator") or "Equal"
        if operator not in ("Exists", "Equal"):
            raise ctx.error(f"{where}.operator", f"expected Exists or Equal, got {operator!r}")
        tolerations.append(Toleration(key=ctx.text(tol.get("key"), f"{where}.key", required=False), operator=operator,
                                      value=ctx.text(tol.get("value"), f"{where}.value", required=False),
                                      effect=ctx.text(tol.get("effect"), f"{where}.effect", required=False)))
    requested = ctx.mapping(ctx.mapping(item.get("capacity"), f"{path}.capacity").get("requests"),
                            f"{path}.capacity.requests")
    capacity = tuple(sorted((key, ctx.quantity(v, f"{path}.capacity.requests.{key}")) for key, v in requested.items()))
    return SubRequest(name=name, request=request,
                      class_name=ctx.text(item.get("deviceClassName"), f"{path}.deviceClassName"),
                      selectors=ctx.selectors(item.get("selectors"), f"{path}.selectors"), mode=mode, count=count,
                      tolerations=tuple(tolerations), admin_access=bool(item.get("adminAccess")), capacity=capacity)


def _parse_allocation(ctx: _Ctx, status: object) -> tuple[Result, ...] | None:
    allocation = ctx.mapping(ctx.mapping(status, "status").get("allocation"), "status.allocation")
    if not allocation:
        return None
    results = []
    path = "status.allocation.devices.results"
    for i, item in enumerate(ctx.seq(ctx.mapping(allocation.get("devices"), "status.allocation.devices").get("results"),
                                      path)):
        item = ctx.mapping(item, f"{path}[{i}]")
        fields = {key: ctx.text(item.get(key), f"{path}[{i}].{key}") for key in ("request", "driver", "pool", "device")}
        share = item.get("shareID")
        consumed = ctx.mapping(item.get("consumedCapacity"), f"{path}[{i}].consumedCapacity")
        results.append(Result(**fields, share_id=None if share is None else ctx.text(share, f"{path}[{i}].shareID"),
                              consumed=tuple(sorted(
                                  (qualify(k, fields["driver"]), ctx.quantity(v, f"{path}[{i}].consumedCapacity.{k}"))
                                  for k, v in consumed.items()))))
    return tuple(results)
