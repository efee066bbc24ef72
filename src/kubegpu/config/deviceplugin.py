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

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from kubegpu.clock import MAX_DURATION_S, parse_go_duration
from kubegpu.config import (
    ValidationOptions,
    format_location,
    load_yaml_file,
    register_validator,
    validation_error_line,
)
from kubegpu.config.deviceplugin_models import (
    DEFAULT_RESOURCE_DOMAIN,
    DEVICE_LIST_STRATEGIES,
    MAX_DEVICE_COUNT,
    MAX_MEMORY_GB,
    MAX_REPLICAS,
    MAX_RESOURCE_NAME_LENGTH,
    MPS_MAX_CLIENTS,
    DeviceListStrategy,
    DevicePluginConfig,
    Flags,
    GfdFlags,
    Imex,
    NonEmptyStr,
    PluginFlags,
    ReplicatedResource,
    ReplicatedResources,
    ResourceName,
    ResourcePattern,
    Resources,
    Sharing,
    _cross_field_problems,
    load_device_plugin_config,
    mps_max_replicas,
    parse_device_plugin_config,
    qualify_resource_name,
)
from kubegpu.errors import ConfigError

if TYPE_CHECKING:
    from kubegpu.gpu.backend import GpuDevice

__all__ = [
    "DEFAULT_RESOURCE_DOMAIN",
    "DEVICE_LIST_STRATEGIES",
    "MAX_DEVICE_COUNT",
    "MAX_DURATION_S",
    "MAX_MEMORY_GB",
    "MAX_REPLICAS",
    "MAX_RESOURCE_NAME_LENGTH",
    "MPS_MAX_CLIENTS",
    "SETTINGS",
    "DeviceListStrategy",
    "DevicePluginConfig",
    "Flags",
    "GfdFlags",
    "Imex",
    "NonEmptyStr",
    "PluginFlags",
    "ReplicatedResource",
    "ReplicatedResources",
    "ResourceName",
    "ResourcePattern",
    "Resources",
    "Sharing",
    "check_mps_against_gpus",
    "effective_device_plugin_config",
    "load_device_plugin_config",
    "looks_like_device_plugin_config",
    "mps_max_replicas",
    "parse_device_plugin_config",
    "parse_go_duration",
    "qualify_resource_name",
    "register_kind",
]


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
