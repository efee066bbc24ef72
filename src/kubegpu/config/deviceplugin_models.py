"""The NVIDIA device-plugin / GFD config file's models, single-field bounds and cross-field rules.

Split from `kubegpu.config.deviceplugin` (which re-exports every name here and adds the flag/env precedence and
the `validate-config` kind) so each module stays small. Every number is bounded, with the bound named in the error.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal, TypeVar

from pydantic import AfterValidator, Field, ValidationError, field_validator

from kubegpu.clock import parse_go_duration
from kubegpu.config import (
    StrictModel,
    describe_value,
    load_yaml_file,
    validation_error_line,
)
from kubegpu.errors import ConfigError

if TYPE_CHECKING:
    pass

DEFAULT_RESOURCE_DOMAIN = "nvidia.com"
MAX_RESOURCE_NAME_LENGTH = 63
MPS_MAX_CLIENTS = 48  # compute capability >= 7.5; older GPUs allow 16 (see mps_max_replicas)
MAX_REPLICAS = 1024
"""Most time-slicing replicas per GPU. NVIDIA sets no limit, but each replica is a device the kubelet tracks and
checkpoints; real configs use 2-48. A 10^8 count would build 10^8 devices and OOM-kill every node agent."""
MAX_DEVICE_COUNT = 64  # `devices: N` selects the first N GPUs of a node; no node holds more
MAX_MEMORY_GB = 4096  # per-replica `memoryGB`; the largest GPU today holds under 300 GB
DEVICE_LIST_STRATEGIES = ("envvar", "volume-mounts", "cdi-annotations", "cdi-cri")

_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
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
    memory_gb: int | None = Field(None, alias="memoryGB", ge=1, le=MAX_MEMORY_GB)

    @field_validator("replicas")
    @classmethod
    def _bounded_replicas(cls, value: int) -> int:
        if value > MAX_REPLICAS:
            raise ValueError(f"must be at most {MAX_REPLICAS} (MAX_REPLICAS, replicas per GPU), got {value}")
        return value

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
            if value > MAX_DEVICE_COUNT:
                raise ValueError(f"a device count must be at most {MAX_DEVICE_COUNT}, got {value}")
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
