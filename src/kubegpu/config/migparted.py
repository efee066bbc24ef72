"""The nvidia-mig-parted config file, `version: v1` (reference/mig-geometry-and-partitioning.md §2.1-§2.2).

A file names MIG layouts (`mig-configs.<name>`), each a list of entries that select GPUs (`device-filter` by PCI
device id, `devices: all` or indices) and say whether MIG is on and which GPU-instance profiles to create.

mig-parted itself only finds out at apply time, GPU by GPU, that a layout cannot be built ("all orderings failed").
Here every layout is checked against the exact geometry of the GPU models it applies to (`kubegpu.gpu.geometry`),
so a bad layout is a one-line error naming the config, the entry and the profile before anything is touched.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import yaml
from pydantic import Field, PrivateAttr, ValidationError, field_validator

from kubegpu.config import (
    StrictModel,
    ValidationOptions,
    describe_value,
    format_location,
    load_yaml_file,
    register_validator,
    validation_error_line,
)
from kubegpu.errors import ConfigError, NotFoundError
from kubegpu.gpu.catalog import CATALOG, GpuModel, find_model, get_model
from kubegpu.gpu.geometry import place

if TYPE_CHECKING:
    from kubegpu.gpu.backend import GpuDevice

_PCI_ID = re.compile(r"^0x[0-9A-Fa-f]{8}$")
_PROFILE_NAME = re.compile(r"^(?:(?P<compute>\d+)c\.)?(?P<slices>\d+)g\.\d+gb(?:[+-][a-z]+(?:\.[a-z]+)*)*$")

# all-balanced per the reference table (§2.2): instances per compute-slice class, by the GPU's SM slices;
# H100 NVL takes one 1g instead of two "to avoid going over the 94GB memory limit" (mig-parted PR #101).
_BALANCED_BY_SLICES: dict[int, dict[int, int]] = {7: {1: 2, 2: 1, 3: 1}, 4: {1: 2, 2: 1}}
_BALANCED_BY_MODEL: dict[str, dict[int, int]] = {"H100-NVL-94GB": {1: 1, 2: 1, 3: 1}}


# ---------------------------------------------------------------------------------------------- models


class MigConfigEntry(StrictModel):
    """One entry of a named layout: which GPUs, MIG on or off, and profile → count."""

    device_filter: list[str] | None = Field(None, alias="device-filter")
    devices: Literal["all"] | list[int]
    mig_enabled: bool = Field(alias="mig-enabled")
    mig_devices: dict[str, int] | None = Field(None, alias="mig-devices")

    @field_validator("device_filter", mode="before")
    @classmethod
    def _filter(cls, value: Any) -> Any:
        """A PCI id `0x20B210DE` (device<<16 | vendor) or a list of them; stored upper-case after the `0x`."""
        items = [value] if isinstance(value, str) else value
        if not isinstance(items, list):
            raise ValueError(f"must be a PCI device id or a list of them, got {describe_value(value)}")
        for item in items:
            if not isinstance(item, str) or not _PCI_ID.match(item):
                raise ValueError(f"must be PCI device ids like '0x20B210DE', got {describe_value(item)}")
        return ["0x" + item[2:].upper() for item in items]

    @field_validator("devices", mode="before")
    @classmethod
    def _devices(cls, value: Any) -> Any:
        if value == "all":
            return value
        if not isinstance(value, list) or not value:
            raise ValueError(f"must be 'all' or a non-empty list of GPU indices, got {describe_value(value)}")
        for item in value:
            if isinstance(item, bool) or not isinstance(item, int) or item < 0:
                raise ValueError(f"GPU indices must be integers >= 0, got {describe_value(item)}")
        if len(set(value)) != len(value):
            raise ValueError("a GPU index is listed more than once")
        return value

    @field_validator("mig_devices")
    @classmethod
    def _profiles(cls, value: dict[str, int] | None) -> dict[str, int] | None:
        for name, count in (value or {}).items():
            if not _PROFILE_NAME.match(name):
                raise ValueError(f"{name!r} is not a MIG profile name like '1g.10gb', '1g.5gb+me' or '1c.2g.10gb'")
            if count < 0:
                raise ValueError(f"the count of {name} must be at least 0, got {count}")
        return value

    def selects(self, pci_device_id: str) -> bool:
        """The device-filter test: no filter (or an empty one) matches every GPU."""
        return not self.device_filter or "0x" + pci_device_id[2:].upper() in self.device_filter


class MigPartedConfig(StrictModel):
    """The whole file; `source` (the file name) is kept for error messages."""

    version: str
    mig_configs: dict[str, list[MigConfigEntry]] = Field(alias="mig-configs")
    _source: str = PrivateAttr(default="mig-parted config")

    @field_validator("version")
    @classmethod
    def _v1(cls, value: str) -> str:
        if value != "v1":
            raise ValueError(f"unknown version {value!r} (expected v1)")
        return value

    @field_validator("mig_configs")
    @classmethod
    def _some_configs(cls, value: dict[str, list[MigConfigEntry]]) -> dict[str, list[MigConfigEntry]]:
        if not value:
            raise ValueError("must name at least one config")
        return value

    @property
    def source(self) -> str:
        return self._source

    def to_yaml(self) -> str:
        """The file as mig-parted writes it (its key names, no nulls)."""
        data = self.model_dump(by_alias=True, exclude_none=True, mode="json")
        return yaml.safe_dump(data, sort_keys=False)


def _entry_problems(config: MigPartedConfig) -> Iterator[tuple[str, str]]:
    """mig-parted's cross-field rules, as (field path, what is wrong)."""
    for name, entries in config.mig_configs.items():
        if not name.strip():
            yield format_location(["mig-configs"]), "a config name must not be empty"
        if not entries:
            yield format_location(["mig-configs", name]), "must list at least one entry"
        for i, entry in enumerate(entries):
            where = format_location(["mig-configs", name, i])
            if not entry.mig_enabled and entry.mig_devices:
                yield f"{where}.mig-devices", "MIG devices included when 'mig-enabled' is false"
            if entry.mig_enabled and entry.mig_devices is None:
                yield f"{where}.mig-devices", "required when 'mig-enabled' is true (use {} for no devices)"


# ---------------------------------------------------------------------------------------------- loading


def parse_mig_parted_config(data: object, source: str) -> MigPartedConfig:
    """Validate parsed YAML/JSON (structure only; `check_layouts` / `resolve_layout` check the geometry)."""
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: the top level must be a mapping, got {describe_value(data)}")
    try:
        config = MigPartedConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(validation_error_line(exc, source)) from None
    for path, problem in _entry_problems(config):
        raise ConfigError(f"{source}: {path}: {problem}")
    config._source = source
    return config


def load_mig_parted_config(path: Path | str) -> MigPartedConfig:
    """Read a mig-parted config file (YAML or JSON)."""
    return parse_mig_parted_config(load_yaml_file(path), str(path))


# ---------------------------------------------------------------------------------------------- geometry checks


def _profile_ids(config: MigPartedConfig, name: str, index: int, entry: MigConfigEntry, model: GpuModel) -> list[int]:
    """The GI profile ids one entry wants on one GPU model; ConfigError naming the profile when it cannot be."""
    wanted: list[int] = []
    for profile_name, count in (entry.mig_devices or {}).items():
        at = f"{config.source}: {format_location(['mig-configs', name, index, 'mig-devices', profile_name])}"
        match = _PROFILE_NAME.match(profile_name)
        if match and match["compute"] and match["compute"] != match["slices"]:
            raise ConfigError(
                f"{at}: compute-instance profiles are not supported (kubegpu creates one compute instance "
                f"spanning each GPU instance); use {profile_name.split('.', 1)[1]}"
            )
        try:
            profile = model.profile(profile_name)
        except NotFoundError:
            known = ", ".join(p.name for p in model.mig_profiles)
            raise ConfigError(f"{at}: GPU model {model.key} has no MIG profile {profile_name!r} (known: {known})") \
                from None
        if count > profile.max_count:  # before building a list of `count` ids: counts come from the user
            raise ConfigError(f"{at}: {count} x {profile.name} requested, at most {profile.max_count} fit on "
                              f"{model.key}")
        wanted.extend([profile.profile_id] * count)
        if count and place(model, wanted) is None:
            raise ConfigError(f"{at}: {_why_not(model, wanted, profile_name, count)}")
    return wanted


def _why_not(model: GpuModel, wanted: Sequence[int], profile_name: str, count: int) -> str:
    """Say why a layout does not fit, in the terms a user can act on."""
    profile = model.profile(profile_name)
    by_id = model.profile_by_id()
    same = sum(1 for pid in wanted if pid == profile.profile_id)
    if same > profile.max_count:
        return f"{same} x {profile.name} requested, at most {profile.max_count} fit on {model.key}"
    if sum(1 for pid in wanted if by_id[pid].media_extensions) > 1:
        return f"{count} x {profile.name} does not fit on {model.key}: at most one +me instance per GPU"
    slots = sum(by_id[pid].memory_slots for pid in wanted)
    slices = sum(by_id[pid].compute_slices for pid in wanted)
    totals = f"{slots} of {model.mig_memory_slots} memory slots, {slices} of {model.mig_compute_slices} SM slices"
    return f"{count} x {profile.name} does not fit on {model.key} with the profiles listed before it ({totals})"


def check_entry(config: MigPartedConfig, name: str, index: int, model: GpuModel) -> list[int] | None:
    """Check one entry against one GPU model: the GI profile ids it creates there, or None for MIG disabled."""
    entry = config.mig_configs[name][index]
    if not entry.mig_enabled:
        return None
    if not model.mig_capable:
        where = format_location(["mig-configs", name, index, "mig-enabled"])
        raise ConfigError(f"{config.source}: {where}: GPU model {model.key} is not MIG-capable")
    return _profile_ids(config, name, index, entry, model)


def _model_of(gpu: GpuDevice) -> GpuModel | None:
    return find_model(gpu.model_key) if gpu.model_key else find_model(gpu.pci_device_id)


def _selected_gpus(config: MigPartedConfig, name: str, index: int, gpus: Sequence[GpuDevice]) -> list[GpuDevice]:
    """mig-parted's selection: the device-filter, then `all` (MIG-capable GPUs only) or explicit indices."""
    entry = config.mig_configs[name][index]
    matching = [g for g in gpus if entry.selects(g.pci_device_id)]
    if entry.devices == "all":
        return [g for g in matching if g.mig_capable]
    by_index = {g.index: g for g in matching}
    known = {g.index for g in gpus}
    selected = []
    for gpu_index in entry.devices:
        if gpu_index not in known:
            where = format_location(["mig-configs", name, index, "devices"])
            raise ConfigError(f"{config.source}: {where}: GPU {gpu_index} does not exist (this node has "
                              f"{len(gpus)} GPU(s))")
        gpu = by_index.get(gpu_index)
        if gpu is None:
            continue  # the device-filter excludes it
        if entry.mig_enabled and not gpu.mig_capable:
            where = format_location(["mig-configs", name, index, "devices"])
            raise ConfigError(f"{config.source}: {where}: GPU {gpu_index} ({gpu.product_name}) is not MIG-capable")
        selected.append(gpu)
    return selected


def resolve_layout(config: MigPartedConfig, name: str, gpus: Sequence[GpuDevice]) -> dict[int, list[int] | None]:
    """GPU index → the GI profile ids to create (None: MIG disabled) for the named layout on these GPUs.

    GPUs no entry selects are left out (mig-parted leaves them alone). A GPU selected by two entries, an unknown
    profile for that GPU's model or a layout that does not fit its geometry is a ConfigError naming config, entry
    and profile.
    """
    if name not in config.mig_configs:
        known = ", ".join(config.mig_configs)
        raise NotFoundError(f"{config.source}: mig-configs: no config named {name!r} (known: {known})")
    result: dict[int, list[int] | None] = {}
    owner: dict[int, int] = {}
    for index in range(len(config.mig_configs[name])):
        for gpu in _selected_gpus(config, name, index, gpus):
            if gpu.index in owner:
                where = format_location(["mig-configs", name, index])
                raise ConfigError(f"{config.source}: {where}: GPU {gpu.index} is already selected by entry "
                                  f"{owner[gpu.index]}")
            owner[gpu.index] = index
            model = _model_of(gpu)
            if model is None and config.mig_configs[name][index].mig_enabled:
                where = format_location(["mig-configs", name, index])
                raise ConfigError(f"{config.source}: {where}: GPU {gpu.index} ({gpu.product_name}, "
                                  f"{gpu.pci_device_id}) is not in the GPU catalog, so its MIG geometry is unknown")
            result[gpu.index] = None if model is None else check_entry(config, name, index, model)
    return result


def check_layouts(config: MigPartedConfig, models: Sequence[GpuModel] | None = None) -> str:
    """Check every layout against GPU models without a node; returns a one-line summary of what was checked.

    With `models` (the user named them) each entry is checked strictly against each named model its device-filter
    selects. Without, the catalog's MIG models are used: an entry with a device-filter is checked against every
    model the filter selects; an entry without one must fit at least one model that knows all its profile names
    (a filter-less entry is usually written for one GPU type, and the catalog holds several).
    """
    checked: set[str] = set()
    unchecked = 0
    for name, entries in config.mig_configs.items():
        for index, entry in enumerate(entries):
            if not entry.mig_devices:
                continue  # MIG off, or on with no instances: nothing a geometry could reject
            if models is not None:
                targets = [m for m in models if entry.selects(m.pci_device_id)]
                for model in targets:
                    if entry.devices == "all" and not model.mig_capable:
                        continue
                    check_entry(config, name, index, model)
                    checked.add(model.key)
                continue
            targets = [m for m in CATALOG.values() if m.mig_capable and entry.selects(m.pci_device_id)]
            if not targets:
                unchecked += 1
            elif entry.device_filter:
                for model in targets:
                    check_entry(config, name, index, model)
                    checked.add(model.key)
            else:
                checked.add(_fits_some_model(config, name, index, targets).key)
    summary = f"layouts checked against {', '.join(sorted(checked))}" if checked else "no layout checked"
    if unchecked:
        summary += f"; {unchecked} entr{'y' if unchecked == 1 else 'ies'} select no GPU model in the catalog"
    return summary


def _fits_some_model(config: MigPartedConfig, name: str, index: int, models: Sequence[GpuModel]) -> GpuModel:
    """The first model the entry is valid for. If none, the error from the first model that knows every profile
    name (a geometry problem is more useful than "unknown profile"), else the first model's error.
    """
    entry = config.mig_configs[name][index]
    errors: list[tuple[bool, ConfigError]] = []
    for model in models:
        try:
            check_entry(config, name, index, model)
        except ConfigError as exc:
            errors.append((all(_knows(model, p) for p in entry.mig_devices or {}), exc))
        else:
            return model
    best = next((exc for knows, exc in errors if knows), errors[0][1])
    raise ConfigError(f"{best.message}; no other MIG model in the catalog fits this entry either "
                      "(use --gpu-model or a device-filter to name the GPU it is for)")


def _knows(model: GpuModel, profile_name: str) -> bool:
    try:
        model.profile(profile_name)
    except NotFoundError:
        return False
    return True


# ---------------------------------------------------------------------------------------------- defaults


def _balanced(model: GpuModel) -> dict[str, int]:
    """all-balanced for one model: per compute-slice class, the base profile with the highest max count."""
    counts = _BALANCED_BY_MODEL.get(model.key, _BALANCED_BY_SLICES.get(model.mig_compute_slices, {}))
    layout: dict[str, int] = {}
    for slices, count in counts.items():
        candidates = [p for p in model.mig_profiles if p.compute_slices == slices and not p.media_extensions]
        if candidates:
            best = max(candidates, key=lambda p: p.max_count)
            layout[best.name] = count
    return layout


def _entry(model: GpuModel | None, filtered: bool, mig_devices: dict[str, int] | None) -> dict[str, object]:
    entry: dict[str, object] = {}
    if filtered and model is not None:
        entry["device-filter"] = [model.pci_device_id]
    entry["devices"] = "all"
    entry["mig-enabled"] = mig_devices is not None
    if mig_devices is not None:
        entry["mig-devices"] = mig_devices
    return entry


def default_mig_parted_config(models: Iterable[GpuModel]) -> MigPartedConfig:
    """mig-parted's default config names for these GPU models (§2.2): all-disabled, all-enabled, all-<profile> at
    its max count (`+me` written `.me`), all-balanced. Entries carry a device-filter when several MIG models are
    given, as mig-parted's generator does; non-MIG models contribute nothing but are left alone by `devices: all`.
    """
    mig_models = list({m.key: m for m in models if m.mig_capable}.values())
    filtered = len(mig_models) > 1
    configs: dict[str, list[dict[str, object]]] = {
        "all-disabled": [_entry(None, False, None)],
        "all-enabled": [_entry(None, False, {})],
    }
    for model in mig_models:
        for profile in model.mig_profiles:
            configs.setdefault(f"all-{profile.config_name}", []).append(
                _entry(model, filtered, {profile.name: profile.max_count})
            )
    balanced = [_entry(m, filtered, _balanced(m)) for m in mig_models if _balanced(m)]
    if balanced:
        configs["all-balanced"] = balanced
    return parse_mig_parted_config({"version": "v1", "mig-configs": configs}, "default mig-parted config")


def models_for(keys: Sequence[str]) -> list[GpuModel]:
    """Catalog models by key, product name or PCI id; NotFoundError naming the unknown one."""
    return [get_model(key) for key in keys]


# ---------------------------------------------------------------------------------------------- validate-config


def looks_like_mig_parted_config(data: object) -> bool:
    return isinstance(data, dict) and "mig-configs" in data


def _validate_for_cli(data: object, source: str, options: ValidationOptions) -> str:
    config = parse_mig_parted_config(data, source)
    models = models_for(options.gpu_models) if options.gpu_models else None
    return f"{len(config.mig_configs)} config(s); {check_layouts(config, models)}"


def register_kind() -> None:
    register_validator("mig-parted config", looks_like_mig_parted_config, _validate_for_cli)
