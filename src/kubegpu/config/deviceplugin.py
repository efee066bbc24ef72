"""The NVIDIA device-plugin / GFD config file, `version: v1` (reference/kubelet-device-plugin.md §2, §3).

Field names, defaults and validation rules are NVIDIA's, so an existing config file works unchanged. Two deliberate
differences, both improvements the reference asks for:
- `resources`, `rename` and `devices` are honoured (NVIDIA's plugin resets them with a warning); here they are only
  modelled and validated, the device plugin uses them.
- Nothing is accepted silently: unknown keys, duplicate YAML keys and values NVIDIA would coerce oddly (a number for
  a duration, a string for a boolean) are errors naming the field path.

The nos fork's per-replica `memoryGB` is accepted on replicated resources (reference/mig-geometry-and-partitioning.md
§3.6), since kubegpu's MPS sharing uses it for per-container memory limits.

Precedence when a component starts is NVIDIA's: command-line flag > environment variable > config file
(`effective_device_plugin_config`).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal, TypeVar

from pydantic import AfterValidator, Field, ValidationError, field_validator

from kubegpu.config import (
    StrictModel,
    ValidationOptions,
    describe_value,
    format_location,
    load_yaml_file,
    register_validator,
    validation_error_line,
)
from kubegpu.errors import ConfigError

if TYPE_CHECKING:
    from kubegpu.gpu.backend import GpuDevice

DEFAULT_RESOURCE_DOMAIN = "nvidia.com"
MAX_RESOURCE_NAME_LENGTH = 63
MPS_MAX_CLIENTS = 48  # compute capability >= 7.5; older GPUs allow 16 (see mps_max_replicas)
DEVICE_LIST_STRATEGIES = ("envvar", "volume-mounts", "cdi-annotations", "cdi-cri")

_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_GO_DURATION = re.compile(r"^[-+]?((\d+(\.\d*)?|\.\d+)(ns|us|µs|μs|ms|s|m|h))+$")
_DURATION_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|μs|ms|s|m|h)")
_DURATION_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "μs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_MIG_INDEX = re.compile(r"^\d+:\d+$")
_UUID_PREFIXES = ("GPU-", "MIG-")


# ---------------------------------------------------------------------------------------------- value rules


def qualify_resource_name(name: str) -> str:
    """NVIDIA's rule: prepend `nvidia.com/` when there is no domain; the whole name ≤ 63 chars, DNS-shaped parts."""
    full = name if "/" in name else f"{DEFAULT_RESOURCE_DOMAIN}/{name}"
    domain, _, tail = full.partition("/")
    if not name:
        raise ValueError("must not be empty")
    if len(full) > MAX_RESOURCE_NAME_LENGTH:
        raise ValueError(f"resource name {full!r} is longer than {MAX_RESOURCE_NAME_LENGTH} characters")
    if not _DNS_SUBDOMAIN.match(domain) or not _DNS_SUBDOMAIN.match(tail):
        raise ValueError(
            f"invalid resource name {full!r}: domain and name must be lowercase letters, digits, '-' and '.'"
        )
    if domain == "kubernetes.io" or domain.endswith(".kubernetes.io") or domain == "k8s.io":
        raise ValueError(f"resource name {full!r} must not use the reserved kubernetes.io domain")
    return full


ResourceName = Annotated[str, AfterValidator(qualify_resource_name)]


def _non_empty(value: str) -> str:
    if not value.strip():
        raise ValueError("must not be empty")
    return value


NonEmptyStr = Annotated[str, AfterValidator(_non_empty)]


def parse_go_duration(text: str) -> float:
    """Seconds in a Go duration string (`60s`, `1m30s`, `500ms`); ValueError when it is not one."""
    if text == "0":
        return 0.0
    if not _GO_DURATION.match(text):
        raise ValueError(f"must be a duration such as '60s' or '1m30s' (or 'infinite'), got {text!r}")
    seconds = sum(float(n) * _DURATION_UNITS[unit] for n, unit in _DURATION_PART.findall(text))
    return -seconds if text.startswith("-") else seconds


def mps_max_replicas(compute_capability: tuple[int, int]) -> int:
    """The MPS client limit a GPU allows: 48 from compute capability 7.5 (Volta MPS), else 16 (reference §2.3)."""
    return MPS_MAX_CLIENTS if compute_capability >= (7, 5) else 16


# ---------------------------------------------------------------------------------------------- models

DeviceListStrategy = Literal["envvar", "volume-mounts", "cdi-annotations", "cdi-cri"]
_M = TypeVar("_M", bound=StrictModel)


def _defaults(model: type[_M]) -> Callable[[], _M]:
    """A default factory building a sub-block from no keys, i.e. with NVIDIA's defaults."""
    return lambda: model.model_validate({})


def _envvar() -> list[DeviceListStrategy]:
    return ["envvar"]


class PluginFlags(StrictModel):
    """`flags.plugin`: settings only the device plugin reads (GFD ignores them)."""

    pass_device_specs: bool = Field(False, alias="passDeviceSpecs")
    device_list_strategy: list[DeviceListStrategy] = Field(default_factory=_envvar, alias="deviceListStrategy")
    device_id_strategy: Literal["uuid", "index"] = Field("uuid", alias="deviceIDStrategy")
    cdi_annotation_prefix: str = Field("cdi.k8s.io/", alias="cdiAnnotationPrefix")
    nvidia_ctk_path: str = Field("/usr/bin/nvidia-ctk", alias="nvidiaCTKPath")
    container_driver_root: str = Field("/driver-root", alias="containerDriverRoot")
    shared_devices_allocation_policy: Literal["distributed", "packed"] = Field(
        "distributed", alias="sharedDevicesAllocationPolicy"
    )

    @field_validator("device_list_strategy", mode="before")
    @classmethod
    def _string_or_list(cls, value: Any) -> Any:
        """NVIDIA accepts one strategy as a string or several as a list."""
        if isinstance(value, str):
            return [value]
        if isinstance(value, list) and not value:
            raise ValueError(f"must name at least one of {', '.join(DEVICE_LIST_STRATEGIES)}")
        return value


class GfdFlags(StrictModel):
    """`flags.gfd`: settings only GPU feature discovery reads."""

    oneshot: bool = False
    no_timestamp: bool = Field(False, alias="noTimestamp")
    sleep_interval: str = Field("60s", alias="sleepInterval")
    output_file: str = Field("/etc/kubernetes/node-feature-discovery/features.d/gfd", alias="outputFile")
    machine_type_file: str = Field("/sys/class/dmi/id/product_name", alias="machineTypeFile")

    @field_validator("sleep_interval")
    @classmethod
    def _duration(cls, value: str) -> str:
        if value == "infinite":
            return value
        if parse_go_duration(value) <= 0:
            raise ValueError(f"must be a positive duration, got {value!r}")
        return value

    @property
    def sleep_interval_seconds(self) -> float | None:
        """The labelling period in seconds; None for `infinite` (label once, then sleep forever)."""
        return None if self.sleep_interval == "infinite" else parse_go_duration(self.sleep_interval)


class Flags(StrictModel):
    """`flags`: the settings that also exist as command-line flags and environment variables."""

    mig_strategy: Literal["none", "single", "mixed"] = Field("none", alias="migStrategy")
    fail_on_init_error: bool = Field(True, alias="failOnInitError")
    nvidia_driver_root: str = Field("/", alias="nvidiaDriverRoot")
    nvidia_dev_root: str | None = Field(None, alias="nvidiaDevRoot")
    mps_root: str | None = Field(None, alias="mpsRoot")
    gds_enabled: bool = Field(False, alias="gdsEnabled")
    mofed_enabled: bool = Field(False, alias="mofedEnabled")
    gdrcopy_enabled: bool = Field(False, alias="gdrcopyEnabled")
    use_node_feature_api: bool = Field(True, alias="useNodeFeatureAPI")
    device_discovery_strategy: Literal["auto", "nvml", "tegra", "vfio"] = Field(
        "auto", alias="deviceDiscoveryStrategy"
    )
    plugin: PluginFlags = Field(default_factory=_defaults(PluginFlags))
    gfd: GfdFlags = Field(default_factory=_defaults(GfdFlags))

    @property
    def dev_root(self) -> str:
        """`nvidiaDevRoot` defaults to the driver root."""
        return self.nvidia_dev_root if self.nvidia_dev_root is not None else self.nvidia_driver_root


class ResourcePattern(StrictModel):
    """One `resources.gpus[]` / `resources.mig[]` rule: a `*` glob (anchored) over the product or profile name."""

    pattern: NonEmptyStr
    name: ResourceName


class Resources(StrictModel):
    gpus: list[ResourcePattern] = Field(default_factory=list)
    mig: list[ResourcePattern] = Field(default_factory=list)


def _device_ref(item: Any) -> str:
    """One `devices` list item: a GPU index, a MIG index `gpu:mig`, or a GPU-/MIG- UUID, as a string."""
    if isinstance(item, bool) or not isinstance(item, int | str):
        raise ValueError(f"a device must be a GPU index, 'gpu:mig' index or UUID, got {describe_value(item)}")
    if isinstance(item, int):
        if item < 0:
            raise ValueError(f"a GPU index must be at least 0, got {item}")
        return str(item)
    if item.isdigit() or _MIG_INDEX.match(item) or (item.startswith(_UUID_PREFIXES) and len(item) > 4):
        return item
    raise ValueError(f"a device must be a GPU index, 'gpu:mig' index or GPU-/MIG- UUID, got {item!r}")


class ReplicatedResource(StrictModel):
    """One shared resource: `replicas` copies of each selected device of `name`, optionally advertised as `rename`."""

    name: ResourceName
    rename: ResourceName | None = None
    devices: Literal["all"] | int | list[str] = "all"
    replicas: int = Field(ge=2)
    memory_gb: int | None = Field(None, alias="memoryGB", ge=1)

    @field_validator("devices", mode="before")
    @classmethod
    def _devices(cls, value: Any) -> Any:
        """`all`, a positive count, or a list of indices / UUIDs (normalised to strings)."""
        if isinstance(value, str):
            if value != "all":
                raise ValueError(f"the only valid string is 'all', got {value!r}")
            return value
        if isinstance(value, bool):
            raise ValueError(f"must be 'all', a positive count or a list of devices, got {describe_value(value)}")
        if isinstance(value, int):
            if value <= 0:
                raise ValueError(f"a device count must be at least 1, got {value}")
            return value
        if isinstance(value, list):
            if not value:
                raise ValueError("must list at least one device (or be 'all')")
            refs = [_device_ref(item) for item in value]
            duplicates = sorted({r for r in refs if refs.count(r) > 1})
            if duplicates:
                raise ValueError(f"device {duplicates[0]} is listed more than once")
            return refs
        raise ValueError(f"must be 'all', a positive count or a list of devices, got {describe_value(value)}")


class ReplicatedResources(StrictModel):
    """`sharing.timeSlicing` / `sharing.mps` (NVIDIA's one `ReplicatedResources` type)."""

    rename_by_default: bool = Field(False, alias="renameByDefault")
    fail_requests_greater_than_one: bool | None = Field(None, alias="failRequestsGreaterThanOne")
    resources: list[ReplicatedResource]

    @field_validator("resources")
    @classmethod
    def _some_resources(cls, value: list[ReplicatedResource]) -> list[ReplicatedResource]:
        if not value:
            raise ValueError("no resources specified")
        return value

    def advertised_name(self, resource: ReplicatedResource) -> str:
        """The name replicas are advertised under: `rename`, else `<name>.shared` with renameByDefault, else name."""
        if resource.rename:
            return resource.rename
        return f"{resource.name}.shared" if self.rename_by_default else resource.name


class Sharing(StrictModel):
    time_slicing: ReplicatedResources | None = Field(None, alias="timeSlicing")
    mps: ReplicatedResources | None = None


class Imex(StrictModel):
    channel_ids: list[int] = Field(default_factory=list, alias="channelIDs")
    required: bool = False

    @field_validator("channel_ids")
    @classmethod
    def _only_channel_zero(cls, value: list[int]) -> list[int]:
        if value not in ([], [0]):
            raise ValueError(f"only [] or [0] are supported, got {value}")
        return value


class DevicePluginConfig(StrictModel):
    """The whole file. Defaults are NVIDIA's; `resources` None means "NVIDIA's default names"."""

    version: str = "v1"
    flags: Flags = Field(default_factory=_defaults(Flags))
    resources: Resources | None = None
    sharing: Sharing = Field(default_factory=_defaults(Sharing))
    imex: Imex = Field(default_factory=Imex)

    @field_validator("version")
    @classmethod
    def _v1(cls, value: str) -> str:
        if value in ("", "v1"):
            return "v1"
        raise ValueError(f"unknown version {value!r} (expected v1)")

    @property
    def replicated(self) -> ReplicatedResources | None:
        """The sharing block in force: `mps` whenever it is present, else `timeSlicing` (NVIDIA's choice)."""
        return self.sharing.mps if self.sharing.mps is not None else self.sharing.time_slicing

    @property
    def sharing_strategy(self) -> str:
        """`mps`, `time-slicing` or `none`, as NVIDIA's `SharingStrategy()` and the GFD label report it."""
        for block, name in ((self.sharing.mps, "mps"), (self.sharing.time_slicing, "time-slicing")):
            if block is not None and any(r.replicas > 1 for r in block.resources):
                return name
        return "none"

    @property
    def fail_requests_greater_than_one(self) -> bool:
        """False for time-slicing and true for MPS unless the file says otherwise (NVIDIA's defaults, PR #1762)."""
        block = self.replicated
        if block is None:
            return False
        if block.fail_requests_greater_than_one is not None:
            return block.fail_requests_greater_than_one
        return block is self.sharing.mps


# ---------------------------------------------------------------------------------------------- cross-field rules


def _cross_field_problems(config: DevicePluginConfig) -> Iterator[tuple[str, str]]:
    """Rules that span several fields, as (field path, what is wrong); pydantic checks the single-field ones."""
    sharing = config.sharing
    if sharing.time_slicing is not None and sharing.mps is not None:
        yield "sharing", "timeSlicing and mps are mutually exclusive; configure only one of them"
    for key, block in (("timeSlicing", sharing.time_slicing), ("mps", sharing.mps)):
        if block is not None:
            yield from _overlapping_resources(f"sharing.{key}", block)
    if sharing.mps is None:
        return
    if config.flags.mig_strategy == "mixed":
        yield "sharing.mps", "MPS sharing is not supported with flags.migStrategy mixed (NVIDIA rejects it too)"
    for i, resource in enumerate(sharing.mps.resources):
        where = f"sharing.mps.resources[{i}]"
        if resource.name.split("/", 1)[1].startswith("mig-"):
            yield f"{where}.name", f"sharing using MPS is not supported for MIG devices ({resource.name})"
        if isinstance(resource.devices, list):
            for j, ref in enumerate(resource.devices):
                if _MIG_INDEX.match(ref) or ref.startswith("MIG-"):
                    yield f"{where}.devices[{j}]", f"sharing using MPS is not supported for MIG devices ({ref})"
        if resource.replicas > MPS_MAX_CLIENTS:
            limit = f"must be at most {MPS_MAX_CLIENTS} (the MPS client limit)"
            yield f"{where}.replicas", f"{limit}, got {resource.replicas}"


def _overlapping_resources(path: str, block: ReplicatedResources) -> Iterator[tuple[str, str]]:
    """The same resource may be listed twice only for disjoint explicit device lists (per-GPU replica counts)."""
    seen: dict[str, tuple[int, ReplicatedResource]] = {}
    for i, resource in enumerate(block.resources):
        if resource.name in seen:
            first_index, first = seen[resource.name]
            if not (isinstance(first.devices, list) and isinstance(resource.devices, list)):
                yield f"{path}.resources[{i}].name", (
                    f"{resource.name} is already shared by resources[{first_index}]; list it twice only with "
                    "disjoint explicit device lists"
                )
            else:
                common = sorted(set(first.devices) & set(resource.devices))
                if common:
                    yield f"{path}.resources[{i}].devices", (
                        f"device {common[0]} of {resource.name} is already shared by resources[{first_index}]"
                    )
        else:
            seen[resource.name] = (i, resource)


# ---------------------------------------------------------------------------------------------- loading


def parse_device_plugin_config(data: object, source: str) -> DevicePluginConfig:
    """Validate parsed YAML/JSON; every problem is one ConfigError line `<source>: <field.path>: <what>`."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: the top level must be a mapping, got {describe_value(data)}")
    try:
        config = DevicePluginConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(validation_error_line(exc, source)) from None
    for path, problem in _cross_field_problems(config):
        raise ConfigError(f"{source}: {path}: {problem}")
    return config


def load_device_plugin_config(path: Path | str) -> DevicePluginConfig:
    """Read a device-plugin config file (YAML or JSON)."""
    return parse_device_plugin_config(load_yaml_file(path), str(path))


# ---------------------------------------------------------------------------------------------- flags and env


@dataclass(frozen=True)
class _Setting:
    """One config field that can also be set by a command-line flag or an environment variable (§2.1)."""

    path: tuple[str, ...]
    flags: tuple[str, ...]
    env: tuple[str, ...]
    kind: str = "str"  # "str" | "bool" | "list" | "int-list"


SETTINGS: tuple[_Setting, ...] = (
    _Setting(("flags", "migStrategy"), ("mig-strategy",), ("MIG_STRATEGY", "GFD_MIG_STRATEGY")),
    _Setting(("flags", "failOnInitError"), ("fail-on-init-error",), ("FAIL_ON_INIT_ERROR",), "bool"),
    _Setting(("flags", "nvidiaDriverRoot"), ("nvidia-driver-root", "driver-root"), ("NVIDIA_DRIVER_ROOT",)),
    _Setting(("flags", "nvidiaDevRoot"), ("nvidia-dev-root", "dev-root"), ("NVIDIA_DEV_ROOT",)),
    _Setting(("flags", "mpsRoot"), ("mps-root",), ("MPS_ROOT",)),
    _Setting(("flags", "gdsEnabled"), ("gds-enabled",), ("GDS_ENABLED",), "bool"),
    _Setting(("flags", "mofedEnabled"), ("mofed-enabled",), ("MOFED_ENABLED",), "bool"),
    _Setting(("flags", "gdrcopyEnabled"), ("gdrcopy-enabled",), ("GDRCOPY_ENABLED",), "bool"),
    _Setting(("flags", "useNodeFeatureAPI"), ("use-node-feature-api",),
             ("GFD_USE_NODE_FEATURE_API", "USE_NODE_FEATURE_API"), "bool"),
    _Setting(("flags", "deviceDiscoveryStrategy"), ("device-discovery-strategy",), ("DEVICE_DISCOVERY_STRATEGY",)),
    _Setting(("flags", "plugin", "passDeviceSpecs"), ("pass-device-specs",), ("PASS_DEVICE_SPECS",), "bool"),
    _Setting(("flags", "plugin", "deviceListStrategy"), ("device-list-strategy",), ("DEVICE_LIST_STRATEGY",), "list"),
    _Setting(("flags", "plugin", "deviceIDStrategy"), ("device-id-strategy",), ("DEVICE_ID_STRATEGY",)),
    _Setting(("flags", "plugin", "cdiAnnotationPrefix"), ("cdi-annotation-prefix",), ("CDI_ANNOTATION_PREFIX",)),
    _Setting(("flags", "plugin", "nvidiaCTKPath"), ("nvidia-cdi-hook-path", "nvidia-ctk-path"),
             ("NVIDIA_CDI_HOOK_PATH", "NVIDIA_CTK_PATH")),
    _Setting(("flags", "plugin", "containerDriverRoot"), ("driver-root-ctr-path", "container-driver-root"),
             ("DRIVER_ROOT_CTR_PATH", "CONTAINER_DRIVER_ROOT")),
    _Setting(("flags", "plugin", "sharedDevicesAllocationPolicy"), ("shared-devices-allocation-policy",),
             ("SHARED_DEVICES_ALLOCATION_POLICY",)),
    _Setting(("flags", "gfd", "oneshot"), ("oneshot",), ("GFD_ONESHOT",), "bool"),
    _Setting(("flags", "gfd", "noTimestamp"), ("no-timestamp",), ("GFD_NO_TIMESTAMP",), "bool"),
    _Setting(("flags", "gfd", "sleepInterval"), ("sleep-interval",), ("GFD_SLEEP_INTERVAL",)),
    _Setting(("flags", "gfd", "outputFile"), ("output-file", "o"), ("GFD_OUTPUT_FILE",)),
    _Setting(("flags", "gfd", "machineTypeFile"), ("machine-type-file",), ("GFD_MACHINE_TYPE_FILE",)),
    _Setting(("imex", "channelIDs"), ("imex-channel-ids",), ("IMEX_CHANNEL_IDS",), "int-list"),
    _Setting(("imex", "required"), ("imex-required",), ("IMEX_REQUIRED",), "bool"),
)

_GO_TRUE = {"1", "t", "T", "TRUE", "true", "True"}
_GO_FALSE = {"0", "f", "F", "FALSE", "false", "False"}


def _from_text(text: str, kind: str) -> object:
    """Convert an env var (or a string flag value) the way NVIDIA's urfave/cli does (strconv.ParseBool, commas)."""
    if kind == "bool":
        if text in _GO_TRUE:
            return True
        if text in _GO_FALSE:
            return False
        raise ValueError(f"must be true or false, got {text!r}")
    if kind == "list":
        return [part.strip() for part in text.split(",") if part.strip()]
    if kind == "int-list":
        parts = [part.strip() for part in text.split(",") if part.strip()]
        if not all(p.isdigit() for p in parts):
            raise ValueError(f"must be a comma-separated list of integers, got {text!r}")
        return [int(p) for p in parts]
    return text


def _normalise_flag_name(name: str) -> str:
    return name.lstrip("-").replace("_", "-")


def _set_path(data: dict[str, Any], path: tuple[str, ...], value: object) -> None:
    node = data
    for key in path[:-1]:
        child = node.get(key)
        if not isinstance(child, dict):
            child = {}
            node[key] = child
        node = child
    node[path[-1]] = value


def _config_file_from(env: Mapping[str, str], flags: Mapping[str, object]) -> Path | None:
    """`--config-file` or `CONFIG_FILE`, the way NVIDIA's binaries find their file."""
    for name, value in flags.items():
        if _normalise_flag_name(name) == "config-file" and value not in (None, ""):
            return Path(str(value))
    return Path(env["CONFIG_FILE"]) if env.get("CONFIG_FILE") else None


def _override(
    data: dict[str, Any], env: Mapping[str, str], flags: Mapping[str, object]
) -> dict[str, str]:
    """Apply env vars, then flags, over the file's data; returns {field path: source label} for error messages."""
    given_flags = {_normalise_flag_name(k): v for k, v in flags.items() if v is not None}
    sources: dict[str, str] = {}
    for setting in SETTINGS:
        path_text = format_location(setting.path)
        flag = next((f for f in setting.flags if f in given_flags), None)
        env_name = next((e for e in setting.env if env.get(e)), None)  # empty means unset (Helm renders "")
        if flag is not None:
            label, raw = f"--{flag}", given_flags[flag]
        elif env_name is not None:
            label, raw = f"${env_name}", env[env_name]
        else:
            continue
        try:
            value = _from_text(raw, setting.kind) if isinstance(raw, str) else raw
        except ValueError as exc:
            raise ConfigError(f"{label}: {path_text}: {exc}") from None
        if isinstance(value, tuple):
            value = list(value)
        _set_path(data, setting.path, value)
        sources[path_text] = label
    return sources


def effective_device_plugin_config(
    file: Path | None, env: Mapping[str, str], flags: Mapping[str, object]
) -> DevicePluginConfig:
    """The config a component runs with: command-line flag > environment variable (NVIDIA's names) > file.

    `flags` maps flag names (`mig-strategy`, `--mig-strategy` or `mig_strategy`) to values the user actually gave;
    None means "not given" (pass only explicit flags, or None for unset typer options). Unknown names are ignored,
    so a component may pass its CLI-only flags too. Without `file`, `--config-file` / `CONFIG_FILE` is used if set.
    A bad value is reported against the flag or env var that supplied it (`$MIG_STRATEGY: flags.migStrategy: ...`).
    Runtime rules that need the merged view are checked here: MPS needs `mpsRoot`.
    """
    file = file if file is not None else _config_file_from(env, flags)
    if file is not None:
        raw = load_yaml_file(file)
        parse_device_plugin_config(raw, str(file))  # the file alone must be valid, errors named by the file
        data: dict[str, Any] = dict(raw) if isinstance(raw, dict) else {}
    else:
        data = {}
    data = _deep_copy(data)
    sources = _override(data, env, flags)
    source = str(file) if file is not None else "device plugin settings"
    try:
        config = DevicePluginConfig.model_validate(data)
    except ValidationError as exc:
        path = format_location([p for p in exc.errors()[0]["loc"] if isinstance(p, int | str)])
        label = _source_of(path, sources, source)
        raise ConfigError(validation_error_line(exc, label)) from None
    for path, problem in _cross_field_problems(config):
        raise ConfigError(f"{_source_of(path, sources, source)}: {path}: {problem}")
    if config.sharing.mps is not None and not config.flags.mps_root:
        raise ConfigError(
            f"{source}: flags.mpsRoot: using MPS requires an MPS root (flags.mpsRoot, --mps-root or $MPS_ROOT)"
        )
    return config


def check_mps_against_gpus(config: DevicePluginConfig, gpus: Sequence[GpuDevice], source: str) -> None:
    """Rules NVIDIA checks only once it sees the devices: no MPS on a node with MIG enabled (GFD and the plugin
    both refuse it, whatever the MIG strategy), and no more MPS clients than the GPU allows (16 before CC 7.5).
    """
    mps = config.sharing.mps
    if mps is None:
        return
    for gpu in gpus:
        if gpu.mig_enabled:
            raise ConfigError(f"{source}: sharing.mps: MPS sharing is not supported for MIG devices, and GPU "
                              f"{gpu.index} has MIG enabled")
        limit = mps_max_replicas(gpu.compute_capability)
        for i, resource in enumerate(mps.resources):
            if resource.replicas > limit:
                raise ConfigError(f"{source}: sharing.mps.resources[{i}].replicas: GPU {gpu.index} "
                                  f"({gpu.product_name}) allows at most {limit} MPS clients, got {resource.replicas}")


def _source_of(path: str, sources: Mapping[str, str], default: str) -> str:
    return next((label for prefix, label in sources.items() if path.startswith(prefix)), default)


def _deep_copy(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _deep_copy(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_deep_copy(v) for v in value]
    return value


# ---------------------------------------------------------------------------------------------- validate-config


_TOP_LEVEL_KEYS = {"version", "flags", "resources", "sharing", "imex"}


def looks_like_device_plugin_config(data: object) -> bool:
    """A mapping with NVIDIA device-plugin keys and none of mig-parted's or a Kubernetes object's."""
    if not isinstance(data, dict) or "mig-configs" in data or "apiVersion" in data or "kind" in data:
        return False
    keys = set(data)
    return bool(keys & (_TOP_LEVEL_KEYS - {"version"})) or keys == {"version"}


def _validate_for_cli(data: object, source: str, options: ValidationOptions) -> str:
    config = parse_device_plugin_config(data, source)
    return f"sharing: {config.sharing_strategy}, migStrategy: {config.flags.mig_strategy}"


def register_kind() -> None:
    register_validator("device-plugin config", looks_like_device_plugin_config, _validate_for_cli)
