"""NVIDIA's opaque per-claim configuration (`resource.nvidia.com/v1beta1` `GpuConfig` / `MigDeviceConfig`).

Decoded strictly like NVIDIA's driver (unknown fields are an error) so a typo fails the claim with a message instead
of silently giving an unshared GPU. A bad config fails only the claim carrying it (NodePrepareResources reports it in
that claim's `error`). Pure: dicts in, `Sharing` out.

It lives in the sharing core, not in the DRA driver, because more than the driver reads it: the GPU-memory guard
derives a shared claim's memory share from the same config the driver prepared the claim with.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kubegpu.errors import ConfigError, KubegpuError
from kubegpu.scheduling.quantity import parse_quantity

API_VERSION = "resource.nvidia.com/v1beta1"
KINDS = ("GpuConfig", "MigDeviceConfig")
INTERVALS = ("Default", "Short", "Medium", "Long")


@dataclass(frozen=True)
class Sharing:
    """How the devices of some requests are shared: none, TimeSlicing (interval) or MPS (limits)."""

    strategy: str = ""  # "" | TimeSlicing | MPS
    interval: str = "Default"
    thread_percentage: int | None = None
    pinned_memory_mib: int | None = None
    per_device_pinned_mib: Mapping[str, int] = field(default_factory=dict)  # device index or UUID -> MiB


def _fields(obj: Mapping[str, Any], allowed: set[str], path: str) -> None:
    unknown = sorted(set(obj) - allowed)
    if unknown:
        raise ConfigError(f"{path}: unknown field(s) {', '.join(unknown)}")


def _mib(value: object, path: str) -> int:
    try:
        return int(parse_quantity(value) // (1024 * 1024))  # type: ignore[arg-type]
    except KubegpuError as exc:
        raise ConfigError(f"{path}: {exc}") from None


def parse_opaque(parameters: object, path: str = "parameters") -> Sharing:
    """One `opaque.parameters` object; ConfigError naming the field otherwise."""
    if not isinstance(parameters, Mapping):
        raise ConfigError(f"{path}: expected an object")
    if parameters.get("apiVersion") != API_VERSION:
        raise ConfigError(f"{path}.apiVersion: expected {API_VERSION}, got {parameters.get('apiVersion')!r}")
    kind = parameters.get("kind")
    if kind not in KINDS:
        raise ConfigError(f"{path}.kind: expected one of {', '.join(KINDS)}, got {kind!r}")
    _fields(parameters, {"apiVersion", "kind", "sharing"}, path)
    sharing = parameters.get("sharing")
    if sharing is None:
        return Sharing()
    if not isinstance(sharing, Mapping):
        raise ConfigError(f"{path}.sharing: expected an object")
    allowed = {"strategy", "mpsConfig"} | ({"timeSlicingConfig"} if kind == "GpuConfig" else set())
    _fields(sharing, allowed, f"{path}.sharing")
    strategy = sharing.get("strategy")
    valid = ("TimeSlicing", "MPS")  # MigDeviceConfig: the same strategies, without timeSlicingConfig
    if strategy not in valid:
        raise ConfigError(f"{path}.sharing.strategy: expected one of {', '.join(valid)}, got {strategy!r}")
    if strategy == "TimeSlicing":
        config = sharing.get("timeSlicingConfig") or {}
        if not isinstance(config, Mapping):
            raise ConfigError(f"{path}.sharing.timeSlicingConfig: expected an object")
        _fields(config, {"interval"}, f"{path}.sharing.timeSlicingConfig")
        interval = config.get("interval", "Default")
        if interval not in INTERVALS:
            raise ConfigError(f"{path}.sharing.timeSlicingConfig.interval: expected one of {', '.join(INTERVALS)}, "
                              f"got {interval!r}")
        return Sharing(strategy="TimeSlicing", interval=interval)
    config = sharing.get("mpsConfig") or {}
    where = f"{path}.sharing.mpsConfig"
    if not isinstance(config, Mapping):
        raise ConfigError(f"{where}: expected an object")
    _fields(config, {"defaultActiveThreadPercentage", "defaultPinnedDeviceMemoryLimit",
                     "defaultPerDevicePinnedMemoryLimit"}, where)
    percentage = config.get("defaultActiveThreadPercentage")
    if percentage is not None and (isinstance(percentage, bool) or not isinstance(percentage, int)
                                   or not 1 <= percentage <= 100):
        raise ConfigError(f"{where}.defaultActiveThreadPercentage: expected an integer 1..100, got {percentage!r}")
    pinned = config.get("defaultPinnedDeviceMemoryLimit")
    per_device = config.get("defaultPerDevicePinnedMemoryLimit") or {}
    if not isinstance(per_device, Mapping):
        raise ConfigError(f"{where}.defaultPerDevicePinnedMemoryLimit: expected a map")
    return Sharing(strategy="MPS", thread_percentage=percentage,
                   pinned_memory_mib=_mib(pinned, f"{where}.defaultPinnedDeviceMemoryLimit") if pinned else None,
                   per_device_pinned_mib={str(k): _mib(v, f"{where}.defaultPerDevicePinnedMemoryLimit.{k}")
                                          for k, v in per_device.items()})


def sharing_by_request(configs: Sequence[Mapping[str, Any]], driver: str,
                       requests: Sequence[str]) -> dict[str, Sharing]:
    """The sharing each allocated request gets from `status.allocation.devices.config` (class configs first, then
    the claim's, so the claim's win); configs for other drivers are not ours to read."""
    ordered = sorted(enumerate(configs), key=lambda ic: (ic[1].get("source") != "FromClass", ic[0]))
    out: dict[str, Sharing] = {}
    for index, config in ordered:
        opaque = config.get("opaque") if isinstance(config, Mapping) else None
        if not isinstance(opaque, Mapping) or opaque.get("driver") != driver:
            continue
        sharing = parse_opaque(opaque.get("parameters"), f"config[{index}].opaque.parameters")
        listed = config.get("requests") or []
        for request in requests:
            base = request.split("/")[0]
            if not listed or request in listed or base in listed:
                out[request] = sharing
    return out
