"""The device inventory a node offers for a sharing config: which device IDs the kubelet sees, under which names.

This is the one place that turns "these GPUs and MIG devices, this NVIDIA-format config" into
`nvidia.com/gpu: 32`. The device plugin serves exactly these lists, discovery labels them, and the simulator and
the autoscaler compute node allocatable from the same function, so the numbers can never drift apart. Names come
from `kubegpu.sharing.names`. Pure: no I/O.

Rules (NVIDIA's, plus the parts NVIDIA switches off):
* whole GPUs are named by `resources.gpus[].pattern` (glob on the NVML product name; default `nvidia.com/gpu`);
* MIG strategy `none` lists MIG-enabled GPUs as whole GPUs; `single` lists their MIG devices as `nvidia.com/gpu`;
  `mixed` as `nvidia.com/mig-<profile>` with `+` → `.` (or `resources.mig[].pattern` names);
* time-slicing / MPS replicate the selected devices into IDs `<id>::<k>`; `renameByDefault` → `<name>.shared`;
  per-resource `rename` and `devices` are honoured, so some GPUs can stay exclusive while others are shared
  with different replica counts;
* MPS memory slices (`{gpu index: [GiB, ...]}`) become `nvidia.com/gpu-<N>gb` devices `<uuid>::mps-<N>gb-<k>`.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any

from kubegpu.config import deviceplugin as config_rules
from kubegpu.errors import ConfigError
from kubegpu.sharing.names import (
    DEFAULT_DOMAIN,
    GPU_RESOURCE,
    REPLICA_SEPARATOR,
    SharingKind,
    mig_resource_name,
    mps_slice_id,
    mps_slice_resource_name,
    replica_id,
    shared_resource_name,
    strip_replica,
)

if TYPE_CHECKING:
    from kubegpu.gpu.backend import GpuDevice, MigDevice

__all__ = ["DEFAULT_DOMAIN", "GPU_RESOURCE", "REPLICA_SEPARATOR", "AnnotatedDevice", "SharingSpec", "allocatable",
           "config_dict", "device_id_strategy", "devices_by_resource", "mig_resource_name", "mig_strategy",
           "qualify_resource_name", "sharing_spec", "strip_replica"]

MIG_STRATEGIES = ("none", "single", "mixed")
ID_STRATEGIES = ("uuid", "index")


@dataclass(frozen=True)
class AnnotatedDevice:
    """One ID the kubelet sees, with what is needed to allocate it and to attribute health to it."""

    id: str
    resource: str
    gpu_index: int
    gpu_uuid: str
    mig: MigDevice | None
    replica: int | None
    replicas: int
    numa_node: int | None
    physical_id: str = ""  # the ID without `::k` (uuid or index form): what NVIDIA_VISIBLE_DEVICES carries
    sharing: SharingKind = SharingKind.WHOLE  # WHOLE, TIME_SLICING or MPS (MIG devices are WHOLE or replicated)
    mps_memory_mib: int | None = None  # per-container pinned memory limit (MPS only)
    mps_thread_percentage: int | None = None  # per-container active thread percentage (MPS only)
    memory_mib: int = 0  # memory of the underlying GPU or MIG device
    minor: int = field(default=-1)  # /dev/nvidia<minor>; the GPU index unless a backend says otherwise

    @property
    def shared(self) -> bool:
        return self.replica is not None


@dataclass(frozen=True)
class _Unit:
    """A physical thing that can be handed out: a whole GPU or one MIG device (before replication)."""

    gpu: Any
    mig: Any | None
    mig_position: int
    resource: str
    physical_id: str

    @property
    def memory_mib(self) -> int:
        return int(self.mig.memory_mib if self.mig is not None else self.gpu.memory_mib)

    @cached_property
    def plain(self) -> AnnotatedDevice:
        """The unit advertised as itself (unshared); kept with the unit, which is reused while its GPU is the same."""
        return _device(self, self.resource, self.physical_id)


# ---------------------------------------------------------------------------------------------- config access


def config_dict(config: object) -> dict[str, Any]:
    """The config in NVIDIA's JSON shape (camelCase keys), whether given as a pydantic model or a plain dict.

    Reading the NVIDIA shape rather than Python attribute names keeps this module bound to the file format,
    which is the compatibility contract, and not to how `kubegpu.config` spells its fields.
    """
    if config is None:
        return {}
    if isinstance(config, Mapping):
        return dict(config)
    dump = getattr(config, "model_dump", None)
    if dump is None:
        raise ConfigError(f"device plugin config: expected a mapping or a model, got {type(config).__name__}")
    data = dump(by_alias=True, exclude_none=True, mode="json")
    return dict(data)


def _get(data: Mapping[str, Any], *path: str, default: Any = None) -> Any:
    node: Any = data
    for key in path:
        if not isinstance(node, Mapping):
            return default
        node = node.get(key)
        if node is None:
            return default
    return node


def mig_strategy(config: Mapping[str, Any]) -> str:
    value = str(_get(config, "flags", "migStrategy", default="none") or "none")
    if value not in MIG_STRATEGIES:
        raise ConfigError(f"flags.migStrategy: unknown MIG strategy {value!r} (expected none, single or mixed)")
    return value


def device_id_strategy(config: Mapping[str, Any]) -> str:
    value = str(_get(config, "flags", "plugin", "deviceIDStrategy", default="uuid") or "uuid")
    if value not in ID_STRATEGIES:
        raise ConfigError(f"flags.plugin.deviceIDStrategy: unknown strategy {value!r} (expected uuid or index)")
    return value


@dataclass(frozen=True)
class SharingSpec:
    """The active sharing block: which strategy, where in the file it came from, and its settings."""

    strategy: SharingKind  # WHOLE, TIME_SLICING or MPS
    path: str  # "sharing.timeSlicing" | "sharing.mps"
    rename_by_default: bool
    fail_requests_greater_than_one: bool
    resources: tuple[Mapping[str, Any], ...]


def sharing_spec(config: Mapping[str, Any]) -> SharingSpec:
    """NVIDIA's selection: MPS if its block has a resource, else time-slicing if it has one, else none.

    `failRequestsGreaterThanOne` defaults to false for time-slicing and true for MPS, as NVIDIA's do.
    """
    blocks = (("mps", SharingKind.MPS, True), ("timeSlicing", SharingKind.TIME_SLICING, False))
    for key, strategy, default_fail in blocks:
        block = _get(config, "sharing", key)
        if isinstance(block, Mapping) and block.get("resources"):
            fail = block.get("failRequestsGreaterThanOne")
            return SharingSpec(
                strategy=strategy,
                path=f"sharing.{key}",
                rename_by_default=bool(block.get("renameByDefault", False)),
                fail_requests_greater_than_one=default_fail if fail is None else bool(fail),
                resources=tuple(block["resources"]),
            )
    return SharingSpec(SharingKind.WHOLE, "", False, False, ())


# ---------------------------------------------------------------------------------------------- naming


def advertised_name(name: str, rename: str | None, rename_by_default: bool) -> str:
    """The name a replicated resource is advertised under: `rename`, else `<name>.shared` with renameByDefault, else
    `name` (NVIDIA's rule, for one `sharing.*.resources[]` entry)."""
    if rename:
        return rename
    return shared_resource_name(name) if rename_by_default else name


def qualify_resource_name(name: str, where: str) -> str:
    """The config's rule (prepend `nvidia.com/`, 63 chars, DNS-shaped), with the field path in the error."""
    try:
        return config_rules.qualify_resource_name(name)
    except ValueError as exc:
        raise ConfigError(f"{where}: {exc}") from None


def _glob(pattern: str) -> re.Pattern[str]:
    return re.compile("^" + ".*".join(re.escape(part) for part in pattern.split("*")) + "$")


def _name_rules(config: Mapping[str, Any], kind: str) -> list[tuple[re.Pattern[str], str]]:
    rules = []
    for i, entry in enumerate(_get(config, "resources", kind, default=[]) or []):
        where = f"resources.{kind}[{i}]"
        pattern, name = (entry or {}).get("pattern"), (entry or {}).get("name")
        if not pattern or not name:
            raise ConfigError(f"{where}: both 'pattern' and 'name' are required")
        rules.append((_glob(str(pattern)), qualify_resource_name(str(name), f"{where}.name")))
    return rules


def _first_match(rules: Sequence[tuple[re.Pattern[str], str]], text: str) -> str | None:
    return next((name for pattern, name in rules if pattern.match(text)), None)


# ---------------------------------------------------------------------------------------------- physical units


def _gpu_units(gpus: Sequence[Any], mig: Mapping[int, Sequence[Any]], config: Mapping[str, Any]) -> list[_Unit]:
    strategy = mig_strategy(config)
    by_index = device_id_strategy(config) == "index"
    gpu_rules, mig_rules = _name_rules(config, "gpus"), _name_rules(config, "mig")
    units: list[_Unit] = []
    if strategy == "single":
        _check_single(gpus, mig)
    rules = (strategy, by_index, tuple((p.pattern, n) for p, n in gpu_rules),
             tuple((p.pattern, n) for p, n in mig_rules))
    for gpu in sorted(gpus, key=lambda g: g.index):
        devices = mig.get(gpu.index, ()) if gpu.mig_enabled and strategy != "none" else None
        key = _units_key(rules, gpu, devices)
        cached = _UNITS.get(key) if key is not None else None
        if cached is None:
            cached = _units_of(gpu, devices, strategy, by_index, gpu_rules, mig_rules)
            if key is not None:
                if len(_UNITS) >= _UNITS_MAX:
                    _UNITS.clear()
                _UNITS[key] = cached
        units.extend(cached)
    return units


def _units_of(gpu: Any, devices: Sequence[Any] | None, strategy: str, by_index: bool,
              gpu_rules: Sequence[tuple[re.Pattern[str], str]],
              mig_rules: Sequence[tuple[re.Pattern[str], str]]) -> tuple[_Unit, ...]:
    """One GPU's units: its MIG devices (`devices`, when they are listed), else the whole GPU."""
    if devices is not None:
        units = []
        for position, device in enumerate(devices):
            default = GPU_RESOURCE if strategy == "single" else mig_resource_name(device.profile_name)
            name = _first_match(mig_rules, device.profile_name) or default
            physical = f"{gpu.index}:{position}" if by_index else device.uuid
            units.append(_Unit(gpu, device, position, name, physical))
        return tuple(units)
    name = _first_match(gpu_rules, gpu.product_name) or GPU_RESOURCE
    return (_Unit(gpu, None, -1, name, str(gpu.index) if by_index else gpu.uuid),)


# A GPU's units (and their unshared devices, `_Unit.plain`) by what they are made of — the very GPU and MIG device
# objects (units hand them on, so the same objects must come back) and the value of every field: a node's inventory
# is recomputed whenever one of its GPUs changes (a simulated MIG re-cut, a device plugin's health or config
# change), and the other GPUs' units are then the same. A cached unit holds its objects, so their ids stay theirs.
# Units and devices are immutable; bounded by clearing.
_UNITS: dict[Hashable, tuple[_Unit, ...]] = {}
_UNITS_MAX = 8192


def _units_key(rules: Hashable, gpu: Any, devices: Sequence[Any] | None) -> Hashable | None:
    """The GPU and its listed MIG devices, each by identity and every field, or None where one is not a plain object
    with hashable fields (then nothing is cached)."""
    try:
        listed = None if devices is None else tuple([(id(d), tuple(d.__dict__.values())) for d in devices])
        key = (rules, id(gpu), tuple(gpu.__dict__.values()), listed)
        hash(key)
    except (TypeError, AttributeError):
        return None
    return key


def _check_single(gpus: Sequence[Any], mig: Mapping[int, Sequence[Any]]) -> None:
    """NVIDIA's `single` rules: one MIG state across GPUs, one MIG device type, no empty MIG-enabled GPU."""
    if len({bool(g.mig_enabled) for g in gpus}) > 1:
        raise ConfigError("flags.migStrategy=single: all GPUs must have the same MIG mode (some are enabled, some not)")
    profiles = {d.profile_name for g in gpus if g.mig_enabled for d in mig.get(g.index, ())}
    if len(profiles) > 1:
        found = ", ".join(sorted(profiles))
        raise ConfigError(f"flags.migStrategy=single: more than one MIG device type present on node: {found}")
    empty = [g.index for g in gpus if g.mig_enabled and not mig.get(g.index)]
    if empty:
        raise ConfigError(f"flags.migStrategy=single: MIG-enabled GPU(s) {empty} have no MIG devices")


# ---------------------------------------------------------------------------------------------- sharing


def _selects(item: Any, unit: _Unit) -> bool:
    """Does one `devices` list item (GPU index, `i:j` MIG index, GPU-/MIG- UUID) name this unit?"""
    text = str(item)
    if isinstance(item, int) or text.isdigit():
        return int(text) == unit.gpu.index
    if ":" in text and not text.startswith(("GPU-", "MIG-")):
        gpu_part, _, mig_part = text.partition(":")
        return unit.mig is not None and f"{unit.gpu.index}:{unit.mig_position}" == f"{gpu_part}:{mig_part}"
    if text.startswith("GPU-"):
        return text == unit.gpu.uuid
    if text.startswith("MIG-"):
        return unit.mig is not None and text == unit.mig.uuid
    return False


def _selected_units(spec_devices: Any, candidates: list[_Unit], where: str, every: Sequence[_Unit] = ()) -> list[_Unit]:
    """The candidates a `devices` value picks; a listed device that is not on this node at all is an error."""
    if spec_devices is None or spec_devices == "all":
        return candidates
    if isinstance(spec_devices, bool):
        raise ConfigError(f"{where}: expected 'all', a positive count or a list of devices")
    if isinstance(spec_devices, int):
        if spec_devices <= 0:
            raise ConfigError(f"{where}: device count must be positive, got {spec_devices}")
        if spec_devices > len(candidates):
            available = len(candidates)
            raise ConfigError(
                f"{where}: requested {spec_devices} devices to be replicated, but only {available} devices available"
            )
        return candidates[:spec_devices]
    if isinstance(spec_devices, str):
        raise ConfigError(f"{where}: {spec_devices!r} is not valid; the only valid string input is 'all'")
    if not isinstance(spec_devices, Sequence):
        raise ConfigError(f"{where}: expected 'all', a positive count or a list of devices")
    chosen: list[_Unit] = []
    for j, item in enumerate(spec_devices):
        if not isinstance(item, int | str) or (isinstance(item, str) and not item):
            raise ConfigError(f"{where}[{j}]: unsupported device reference {item!r}")
        if every and not any(_selects(item, u) for u in every):
            raise ConfigError(f"{where}[{j}]: no device {item!r} on this node")
        chosen.extend(u for u in candidates if _selects(item, u) and u not in chosen)
    return chosen


def _replicate(
    units: list[_Unit], sharing: SharingSpec
) -> tuple[list[tuple[_Unit, str, int, int]], set[int]]:
    """Assign each shared unit its (resource, replicas, entry number); returns them and the shared unit ids."""
    plan: list[tuple[_Unit, str, int, int]] = []
    taken: dict[int, int] = {}
    for i, entry in enumerate(sharing.resources):
        where = f"{sharing.path}.resources[{i}]"
        if not isinstance(entry, Mapping) or not entry.get("name"):
            raise ConfigError(f"{where}.name: no resource name specified")
        name = qualify_resource_name(str(entry["name"]), f"{where}.name")
        replicas = entry.get("replicas")
        if not isinstance(replicas, int) or isinstance(replicas, bool) or replicas < 1:
            raise ConfigError(f"{where}.replicas: expected a positive number of replicas, got {replicas!r}")
        rename = entry.get("rename")
        target = advertised_name(name, qualify_resource_name(str(rename), f"{where}.rename") if rename else None,
                                 sharing.rename_by_default)
        qualify_resource_name(target, f"{where}.name")
        candidates = [u for u in units if u.resource == name and id(u) not in taken]
        for unit in _selected_units(entry.get("devices"), candidates, f"{where}.devices", units):
            if sharing.strategy == SharingKind.MPS and unit.mig is not None:
                raise ConfigError(f"{where}: sharing using MPS is not supported for MIG devices ({unit.physical_id})")
            taken[id(unit)] = i
            plan.append((unit, target, replicas, i))
    return plan, set(taken)


# ---------------------------------------------------------------------------------------------- public API


def _device(unit: _Unit, resource: str, id_: str, **extra: Any) -> AnnotatedDevice:
    return AnnotatedDevice(
        id=id_,
        resource=resource,
        gpu_index=unit.gpu.index,
        gpu_uuid=unit.gpu.uuid,
        mig=unit.mig,
        replica=extra.pop("replica", None),
        replicas=extra.pop("replicas", 1),
        numa_node=unit.gpu.numa_node,
        physical_id=unit.physical_id,
        memory_mib=unit.memory_mib,
        minor=int(getattr(unit.gpu, "device_minor", unit.gpu.index)),
        **extra,
    )


def _slice_devices(gpu: Any, sizes_gib: Sequence[int], by_index: bool, where: str) -> list[AnnotatedDevice]:
    unit = _Unit(gpu, None, -1, GPU_RESOURCE, str(gpu.index) if by_index else gpu.uuid)
    if sum(sizes_gib) * 1024 > gpu.memory_mib:
        raise ConfigError(f"{where}: slices {list(sizes_gib)} GiB exceed GPU {gpu.index}'s {gpu.memory_mib} MiB")
    counters: dict[int, int] = {}
    out: list[AnnotatedDevice] = []
    for size in sizes_gib:
        if not isinstance(size, int) or isinstance(size, bool) or size <= 0:
            raise ConfigError(f"{where}: slice size must be a positive number of GiB, got {size!r}")
        k = counters.get(size, 0)
        counters[size] = k + 1
        memory = size * 1024
        out.append(
            _device(
                unit,
                mps_slice_resource_name(size),
                mps_slice_id(unit.physical_id, size, k),
                replica=len(out),
                replicas=len(sizes_gib),
                sharing=SharingKind.MPS,
                mps_memory_mib=memory,
                mps_thread_percentage=max(1, min(100, round(100 * memory / gpu.memory_mib))),
            )
        )
    return out


def devices_by_resource(
    gpus: Sequence[GpuDevice],
    mig: Mapping[int, Sequence[MigDevice]],
    config: object,
    mps_slices: Mapping[int, Sequence[int]] | None = None,
) -> dict[str, list[AnnotatedDevice]]:
    """Every device ID the plugin advertises, grouped by resource name, in a stable order.

    `config` is a `DevicePluginConfig` (or the same data as a dict in NVIDIA's shape). GPUs listed in
    `mps_slices` are handed out only as memory slices. Raises `ConfigError` naming the field at fault.
    """
    data = config_dict(config)
    sharing = sharing_spec(data)
    by_index = device_id_strategy(data) == "index"
    slices = {int(k): list(v) for k, v in (mps_slices or {}).items() if v}
    units = [u for u in _gpu_units(gpus, mig, data) if not (u.mig is None and u.gpu.index in slices)]
    plan, shared = _replicate(units, sharing)
    replicated = {
        id(unit): (target, replicas, sharing.resources[entry].get("memoryGB")) for unit, target, replicas, entry in plan
    }
    out: dict[str, list[AnnotatedDevice]] = {}
    for unit in units:
        if id(unit) not in shared:
            out.setdefault(unit.resource, []).append(unit.plain)
            continue
        target, replicas, memory_gb = replicated[id(unit)]
        mps = sharing.strategy == SharingKind.MPS
        mps_memory = int(memory_gb) * 1024 if memory_gb else unit.memory_mib // replicas
        for k in range(replicas):
            out.setdefault(target, []).append(
                _device(
                    unit,
                    target,
                    replica_id(unit.physical_id, k),
                    replica=k,
                    replicas=replicas,
                    sharing=sharing.strategy,
                    mps_memory_mib=mps_memory if mps else None,
                    mps_thread_percentage=100 // replicas if mps else None,
                )
            )
    known = {g.index: g for g in gpus}
    for index in sorted(slices):
        if index not in known:
            raise ConfigError(f"mps slices: GPU index {index} does not exist on this node")
        for device in _slice_devices(known[index], slices[index], by_index, f"mps slices[{index}]"):
            out.setdefault(device.resource, []).append(device)
    return out


def allocatable(
    gpus: Sequence[GpuDevice],
    mig: Mapping[int, Sequence[MigDevice]],
    config: object,
    mps_slices: Mapping[int, Sequence[int]] | None = None,
    unhealthy: Collection[str] = (),
) -> dict[str, int]:
    """What the node's `status.allocatable` shows for GPU resources: healthy device IDs per resource."""
    bad = set(unhealthy)
    return {
        name: sum(1 for d in devices if d.id not in bad)
        for name, devices in devices_by_resource(gpus, mig, config, mps_slices).items()
    }

