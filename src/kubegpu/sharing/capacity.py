"""What a GPU node can hold under each sharing kind — before the node exists.

Karpenter only counts `nvidia.com/gpu`. We ask the device plugin's own accounting (`kubegpu.sharing.devices.
allocatable`) about a simulated node of that GPU model, with the MIG layout applied by the same placement-aware
apply the MIG manager runs (`kubegpu.sharing.migapply`), so a provisioner's idea of capacity and the node's real
allocatable are one computation: 7 x `nvidia.com/mig-1g.10gb` per A100-80GB under `all-1g.10gb`, 4 x
`nvidia.com/gpu.shared` per GPU under time-slicing with 4 replicas and `renameByDefault`.

A node's sharing config is carried in its labels and annotations (a NodePool copies them from its template):
- label `nvidia.com/mig.config: <name>` — a mig-parted config name from the default config (`all-1g.10gb`,
  `all-balanced`, `all-disabled`, ...), as the MIG manager reads it;
- annotation `kubegpu.io/device-plugin-config: <YAML or JSON>` — an NVIDIA device-plugin config (`version: v1`,
  `flags.migStrategy`, `sharing.timeSlicing` / `sharing.mps`). With a MIG config and no plugin config, the
  strategy defaults to `mixed` so each profile is its own resource.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING, Any

import yaml

from kubegpu.errors import ConfigError, KubegpuError
from kubegpu.files import parse_json_text
from kubegpu.sharing.devices import allocatable
from kubegpu.sharing.names import (
    DEVICE_PLUGIN_CONFIG_ANNOTATION,
    GPU_MEMORY_RESOURCE,
    MIG_CONFIG_LABEL,
    is_gpu_resource,
)

if TYPE_CHECKING:
    from kubegpu.gpu.backend import GpuBackend

DEFAULT_PLUGIN_CONFIG: dict[str, Any] = {"version": "v1", "flags": {"migStrategy": "none"}}
MIXED_PLUGIN_CONFIG: dict[str, Any] = {"version": "v1", "flags": {"migStrategy": "mixed"}}


@dataclass(frozen=True)
class GpuSharing:
    """A node's sharing config: mig-parted config name (or None) and the device-plugin config as canonical JSON."""

    mig_config: str | None
    plugin_config: str

    @property
    def plugin_config_dict(self) -> dict[str, Any]:
        data = parse_json_text(self.plugin_config, "device-plugin config")   # bounded, through kubegpu.files
        return data if isinstance(data, dict) else {}


def sharing_of(labels: Mapping[str, str], annotations: Mapping[str, str], where: str) -> GpuSharing:
    """The sharing config a template's labels and annotations describe; ConfigError naming `where` if invalid."""
    mig = labels.get(MIG_CONFIG_LABEL) or None
    if mig == "all-disabled":
        mig = None
    raw = annotations.get(DEVICE_PLUGIN_CONFIG_ANNOTATION)
    if raw is None:
        data: Any = MIXED_PLUGIN_CONFIG if mig else DEFAULT_PLUGIN_CONFIG
    else:
        try:
            data = yaml.safe_load(raw)
        except yaml.YAMLError as exc:
            raise ConfigError(f"{where}.annotations.{DEVICE_PLUGIN_CONFIG_ANNOTATION}: invalid YAML: "
                              f"{str(exc).splitlines()[0]}") from None
        from kubegpu.config.deviceplugin import parse_device_plugin_config

        parsed = parse_device_plugin_config(data, f"{where}.annotations.{DEVICE_PLUGIN_CONFIG_ANNOTATION}")
        data = parsed.model_dump(by_alias=True, exclude_none=True, mode="json")
    return GpuSharing(mig, json.dumps(data, sort_keys=True))


def simulated_gpu_backend(model_key: str, count: int, mig_config: str | None) -> GpuBackend:
    """An in-memory simulated node with `count` GPUs of `model_key`, the MIG config applied as the MIG manager would."""
    from kubegpu.gpu.simulated import SimulatedBackend

    backend: GpuBackend = SimulatedBackend.create(None, gpus=f"{count}x{model_key}")
    if mig_config:
        apply_mig_config(backend, model_key, mig_config)
    return backend


def apply_mig_config(backend: GpuBackend, model_key: str, mig_config: str) -> None:
    from kubegpu.config.migparted import default_mig_parted_config
    from kubegpu.gpu.catalog import get_model
    from kubegpu.sharing.migapply import execute, plan_apply, read_state

    config = default_mig_parted_config([get_model(model_key)])
    plan = plan_apply(config, mig_config, read_state(backend), force=True)
    outcome = execute(plan, backend)
    if not outcome.complete:  # Ampere: the mode change waits for a GPU reset; a new node boots with it done
        _complete_reset(backend, outcome.pending_reset)
        execute(plan_apply(config, mig_config, read_state(backend), force=True), backend)


def _complete_reset(backend: GpuBackend, indexes: list[int]) -> None:
    reset = getattr(backend, "reset_gpu", None) or getattr(backend, "reset", None)
    if reset is None:
        raise KubegpuError("simulated backend cannot complete a MIG mode change (no reset)")
    for index in indexes:
        reset(index)


def backend_allocatable(backend: GpuBackend, sharing: GpuSharing) -> dict[str, int]:
    """The device plugin's allocatable for a (simulated) node's GPUs."""
    gpus = backend.devices()
    mig = {g.index: backend.mig_devices(g.index) for g in gpus if g.mig_enabled}
    return allocatable(gpus, mig, sharing.plugin_config_dict)


@lru_cache(maxsize=1024)
def gpu_allocatable(model_key: str, count: int, sharing: GpuSharing) -> dict[str, int]:
    """Cached: the GPU resources `count` GPUs of `model_key` advertise under `sharing`."""
    return backend_allocatable(simulated_gpu_backend(model_key, count, sharing.mig_config), sharing)


def sharing_capacity(sharing: GpuSharing, gpu_model: str | None, gpu_count: int,
                     node_allocatable: Mapping[str, float]) -> dict[str, float]:
    """A node's allocatable with its GPU resources replaced by what the sharing config yields."""
    base = {k: v for k, v in node_allocatable.items() if not is_gpu_resource(k)}
    if not gpu_model or not gpu_count:
        return {**node_allocatable}
    try:
        gpu = gpu_allocatable(gpu_model, gpu_count, sharing)
    except KubegpuError as exc:
        # A MIG config this model cannot take (e.g. all-1g.10gb on a T4) leaves the GPUs whole, as MIG manager would
        # fail the node; counting them whole keeps the type usable only for whole-GPU pods.
        if sharing.mig_config:
            whole = GpuSharing(None, sharing.plugin_config)
            try:
                gpu = gpu_allocatable(gpu_model, gpu_count, whole)
            except KubegpuError:
                raise exc from None
        else:
            raise
    base.update({k: float(v) for k, v in gpu.items()})
    base[GPU_MEMORY_RESOURCE] = float(gpu_memory_of(gpu, gpu_model, sharing))
    return base


def gpu_memory_of(gpu: Mapping[str, float], gpu_model: str, sharing: GpuSharing) -> int:
    """The `kubegpu.io/gpu-memory` discovery will write for a node advertising `gpu` (`discover_gpu_memory`: the same
    charge function, table and config), so a charged pod fits a node before it exists as it will after."""
    from kubegpu.gpu.catalog import get_model
    from kubegpu.sharing.charges import ChargeTable, node_gpu_memory

    product = get_model(gpu_model).product_name.replace(" ", "-")
    return node_gpu_memory(gpu, product, ChargeTable.from_device_plugin_config(sharing.plugin_config_dict))
