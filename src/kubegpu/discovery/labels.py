"""GPU feature discovery labels: the exact set NVIDIA's GFD writes, computed from GPUs, MIG devices and a config.

Pure: the caller reads the driver, the DMI machine name and the clock; this module only turns facts into
`{label: value}`. The simulator labels its virtual nodes with the same function, so a scheduling rule written
against `nvidia.com/gpu.product` behaves the same in a simulation and on a real node.

Counts and replicas come from `kubegpu.sharing.devices.devices_by_resource`, the same accounting the device
plugin advertises, so `nvidia.com/mig-1g.10gb.count` can never disagree with the `nvidia.com/mig-1g.10gb` capacity.
Rules and names: reference/kubelet-device-plugin.md §3 (sharing labels) and §4 (every GFD label).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kubegpu.errors import ConfigError
from kubegpu.gpu.catalog import MigProfile, find_model, gfd_family
from kubegpu.sharing.devices import (
    AnnotatedDevice,
    config_dict,
    devices_by_resource,
    mig_strategy,
    sharing_spec,
)
from kubegpu.sharing.names import GPU_RESOURCE, SharingKind
from kubegpu.statefiles import stamp_lines, verify_lines

if TYPE_CHECKING:
    from kubegpu.gpu.backend import GpuDevice, MigDevice

PREFIX = "nvidia.com/"
TIMESTAMP_LABEL = "nvidia.com/gfd.timestamp"
ENGINE_NAMES = ("copy", "decoder", "encoder", "jpeg", "ofa")
PCI_CLASS_COMPUTE = 0x0302
PCI_CLASS_GRAPHICS = 0x0300

# Attributes GFD writes under a resource prefix (`nvidia.com/gpu.<attr>`, `nvidia.com/mig-1g.10gb.<attr>`).
RESOURCE_ATTRIBUTES = frozenset(
    {"count", "product", "memory", "replicas", "sharing-strategy", "family", "compute.major", "compute.minor",
     "multiprocessors", "slices.gi", "slices.ci", *(f"engines.{e}" for e in ENGINE_NAMES)}
)
# Node-wide labels (without the `nvidia.com/` prefix) that GFD owns besides the resource attributes.
NODE_LABELS = frozenset({"gpu.machine", "gpu.mode", "gpu.clique", "mig.capable", "mig.strategy", "mps.capable"})
OWNED_FAMILIES = ("gfd.", "cuda.", "vgpu.")

_NOT_IN_LABEL = re.compile(r"[^A-Za-z0-9\-_. ]")
_SPACES = re.compile(r" +")
_PROFILE_G = re.compile(r"^(?:\d+c\.)?(\d+)g\.")


def sanitise(value: str) -> str:
    """GFD's label-value cleaning: drop characters outside `[A-Za-z0-9-_. ]`, then each run of spaces becomes `-`."""
    return _SPACES.sub("-", _NOT_IN_LABEL.sub("", value).strip())


def is_owned_label(key: str) -> bool:
    """Whether GFD writes this label, so discovery may remove it when it no longer applies.

    Deliberately narrower than "nvidia.com/gpu.*": `gpu.deploy.*`, `gpu.present`, `mig.config(.state)` and
    `device-plugin.config` belong to the operator, the MIG manager or the user and must never be touched.
    """
    if not key.startswith(PREFIX):
        return False
    name = key[len(PREFIX):]
    if name in NODE_LABELS or name.startswith(OWNED_FAMILIES):
        return True
    for resource in ("gpu", "mig-"):
        if name.startswith(resource):
            _, dot, attribute = name.partition(".") if resource == "gpu" else _split_mig(name)
            if dot and attribute in RESOURCE_ATTRIBUTES:
                return True
    return False


def _split_mig(name: str) -> tuple[str, str, str]:
    """`mig-1g.10gb.me.count` → (`mig-1g.10gb.me`, `.`, `count`): the attribute is one of the known suffixes."""
    for attribute in sorted(RESOURCE_ATTRIBUTES, key=len, reverse=True):
        if name.endswith("." + attribute):
            return name[: -len(attribute) - 1], ".", attribute
    return name, "", ""


# --------------------------------------------------------------------------------------------- node-wide labels


def version_labels(driver_version: str, cuda_version: tuple[int, int]) -> dict[str, str]:
    """`cuda.driver-version.*` / `cuda.runtime-version.*`, plus the deprecated duplicates GFD still writes."""
    parts = driver_version.strip().split(".")
    if not 2 <= len(parts) <= 3 or not all(p.isdigit() for p in parts):
        raise ConfigError(f"driver version {driver_version!r} does not match the format X.Y[.Z]")
    major, minor = parts[0], parts[1]
    revision = parts[2] if len(parts) == 3 else ""
    cuda_major, cuda_minor = (str(v) for v in cuda_version)
    return {
        "nvidia.com/cuda.driver.major": major,
        "nvidia.com/cuda.driver.minor": minor,
        "nvidia.com/cuda.driver.rev": revision,
        "nvidia.com/cuda.runtime.major": cuda_major,
        "nvidia.com/cuda.runtime.minor": cuda_minor,
        "nvidia.com/cuda.driver-version.major": major,
        "nvidia.com/cuda.driver-version.minor": minor,
        "nvidia.com/cuda.driver-version.revision": revision,
        "nvidia.com/cuda.driver-version.full": driver_version.strip(),
        "nvidia.com/cuda.runtime-version.major": cuda_major,
        "nvidia.com/cuda.runtime-version.minor": cuda_minor,
        "nvidia.com/cuda.runtime-version.full": f"{cuda_major}.{cuda_minor}",
    }


def gpu_mode(gpu: GpuDevice) -> str:
    """`compute` for a 3D controller, `graphics` for a VGA controller.

    Backends that do not report the PCI class get `compute`: every data-centre model in the catalog is a
    3D controller (class 0x0302).
    """
    pci_class = getattr(gpu, "pci_class", PCI_CLASS_COMPUTE)
    return {PCI_CLASS_COMPUTE: "compute", PCI_CLASS_GRAPHICS: "graphics"}.get(pci_class, "unknown")


def architecture_labels(prefix: str, compute_capability: tuple[int, int]) -> dict[str, str]:
    """Family and compute capability; GFD leaves them out when NVML reports compute major 0."""
    major, minor = compute_capability
    if major == 0:
        return {}
    return {
        f"{prefix}.family": gfd_family(compute_capability),
        f"{prefix}.compute.major": str(major),
        f"{prefix}.compute.minor": str(minor),
    }


# --------------------------------------------------------------------------------------------- resource labels


@dataclass(frozen=True)
class Sharing:
    """What GFD reports about one resource's sharing: replicas per device, strategy, and whether it was renamed."""

    replicas: int
    strategy: SharingKind
    renamed: bool

    @property
    def shared(self) -> bool:
        return self.replicas > 1

    @property
    def label_strategy(self) -> str:
        """The label value as a plain string (labels are dumped as YAML too, which knows no enums)."""
        return (self.strategy if self.shared else SharingKind.WHOLE).value


NO_SHARING = Sharing(replicas=1, strategy=SharingKind.WHOLE, renamed=False)
SHARING_DISABLED = Sharing(replicas=0, strategy=SharingKind.WHOLE, renamed=False)  # GFD's quirk for MIG-enabled GPUs


def base_labels(prefix: str, count: int, sharing: Sharing, product_parts: Sequence[str]) -> dict[str, str]:
    """count / replicas / sharing-strategy / product, with `-SHARED` when shared and not renamed (§3)."""
    parts = [sanitise(p) for p in product_parts if p]
    if sharing.shared and not sharing.renamed:
        parts.append("SHARED")
    return {
        f"{prefix}.count": str(count),
        f"{prefix}.replicas": str(sharing.replicas),
        f"{prefix}.sharing-strategy": sharing.label_strategy,
        f"{prefix}.product": "-".join(parts),
    }


def mig_attribute_labels(prefix: str, mig: MigDevice, profile: MigProfile | None) -> dict[str, str]:
    """memory / multiprocessors / slices / engines of one MIG device type (its CI spans the whole GI)."""
    slices = profile.compute_slices if profile else _slices_from_name(mig.profile_name)
    labels = {
        f"{prefix}.memory": str(mig.memory_mib),
        f"{prefix}.multiprocessors": str(mig.multiprocessors),
        f"{prefix}.slices.gi": str(slices),
        f"{prefix}.slices.ci": str(slices),
    }
    if profile is not None:  # engine counts are known only for catalog models
        for engine in ENGINE_NAMES:
            labels[f"{prefix}.engines.{engine}"] = str(getattr(profile.engines, engine))
    return labels


def _slices_from_name(profile_name: str) -> int:
    match = _PROFILE_G.match(profile_name)
    return int(match.group(1)) if match else 0


def _profile_of(gpu: GpuDevice, mig: MigDevice) -> MigProfile | None:
    """The catalog profile (for engine counts); None for a GPU the catalog does not know."""
    model = find_model(gpu.model_key or gpu.product_name)
    return model.profile_by_id().get(mig.profile_id) if model is not None else None


def _sharing_of(devices: Sequence[AnnotatedDevice], base_resource: Mapping[str, str]) -> Sharing:
    """Replicas and strategy of a group of advertised devices; renamed when a shared ID left its base name."""
    shared = [d for d in devices if d.replica is not None]
    if not shared:
        return NO_SHARING
    renamed = any(d.resource != base_resource.get(d.physical_id, d.resource) for d in shared)
    return Sharing(replicas=max(d.replicas for d in shared), strategy=shared[0].sharing, renamed=renamed)


@dataclass(frozen=True)
class _Advertised:
    """devices_by_resource's answer, grouped by the resource each physical device has without sharing."""

    groups: dict[str, list[AnnotatedDevice]]
    base_resource: dict[str, str]


def _advertised(gpus: Sequence[GpuDevice], mig: Mapping[int, Sequence[MigDevice]], data: dict[str, Any]) -> _Advertised:
    unshared = devices_by_resource(gpus, mig, {**data, "sharing": {}})
    # without an active sharing block the advertised devices are the unshared ones: one computation, not two
    shared = unshared if sharing_spec(data).strategy == SharingKind.WHOLE else devices_by_resource(gpus, mig, data)
    base = {d.physical_id: resource for resource, devices in unshared.items() for d in devices}
    groups: dict[str, list[AnnotatedDevice]] = {}
    for devices in shared.values():
        for device in devices:
            groups.setdefault(base.get(device.physical_id, device.resource), []).append(device)
    return _Advertised(groups, base)


def _label_prefix(resource: str) -> str:
    """GFD labels every resource under `nvidia.com/`, whatever domain a custom resource name carries."""
    return PREFIX + resource.rpartition("/")[2]


def full_gpu_labels(gpus: Sequence[GpuDevice], advertised: _Advertised, without_sharing: bool) -> dict[str, str]:
    """`nvidia.com/gpu.*` for whole GPUs: physical count, first GPU's product/memory/architecture, sharing.

    `without_sharing`: GFD's quirk for MIG-enabled GPUs under `mixed` — replicas 0, strategy none, no suffix.
    """
    first = min(gpus, key=lambda g: g.index)
    sharing = SHARING_DISABLED
    if not without_sharing:
        whole = [d for devices in advertised.groups.values() for d in devices if d.mig is None]
        sharing = _sharing_of(whole, advertised.base_resource)
    labels = base_labels(GPU_RESOURCE, len(gpus), sharing, [first.product_name])
    labels["nvidia.com/gpu.memory"] = str(first.memory_mib)
    labels.update(architecture_labels(GPU_RESOURCE, first.compute_capability))
    return labels


def mixed_mig_labels(gpus: Sequence[GpuDevice], advertised: _Advertised) -> dict[str, str]:
    """One `nvidia.com/mig-<profile>.*` block per MIG resource the device plugin advertises."""
    by_index = {g.index: g for g in gpus}
    labels: dict[str, str] = {}
    for resource, devices in sorted(advertised.groups.items()):
        migs = [d for d in devices if d.mig is not None]
        if not migs:
            continue
        first = migs[0]
        assert first.mig is not None
        gpu = by_index[first.gpu_index]
        prefix = _label_prefix(resource)
        physical = {d.physical_id for d in migs}
        sharing = _sharing_of(migs, advertised.base_resource)
        labels.update(base_labels(prefix, len(physical), sharing, [gpu.product_name, "MIG", first.mig.profile_name]))
        labels.update(mig_attribute_labels(prefix, first.mig, _profile_of(gpu, first.mig)))
    return labels


def single_mig_labels(
    gpus: Sequence[GpuDevice], mig: Mapping[int, Sequence[MigDevice]], data: dict[str, Any]
) -> dict[str, str]:
    """`single`: the MIG devices are `nvidia.com/gpu`; an invalid mix is reported as `<model>-MIG-INVALID`."""
    first = min(gpus, key=lambda g: g.index)
    devices = [d for g in sorted(gpus, key=lambda g: g.index) for d in mig.get(g.index, ())]
    profiles = {d.profile_name for d in devices}
    all_enabled = all(g.mig_enabled for g in gpus)
    if not all_enabled or len(profiles) != 1 or any(not mig.get(g.index) for g in gpus):
        return {
            "nvidia.com/gpu.count": "0",
            "nvidia.com/gpu.replicas": "0",
            "nvidia.com/gpu.memory": "0",
            "nvidia.com/gpu.product": "-".join([sanitise(first.product_name), "MIG", "INVALID"]),
        }
    advertised = _advertised(gpus, mig, data)
    migs = [d for group in advertised.groups.values() for d in group if d.mig is not None]
    sharing = _sharing_of(migs, advertised.base_resource)
    labels = base_labels(GPU_RESOURCE, len(devices), sharing, [first.product_name, "MIG", devices[0].profile_name])
    labels.update(mig_attribute_labels(GPU_RESOURCE, devices[0], _profile_of(first, devices[0])))
    return labels


# --------------------------------------------------------------------------------------------- the whole set


def compute_labels(
    gpus: Sequence[GpuDevice],
    mig_devices: Mapping[int, Sequence[MigDevice]],
    config: object,
    driver_version: str,
    cuda_version: tuple[int, int],
    machine: str | None,
    now: float | None,
) -> dict[str, str]:
    """Every label GFD writes for this node.

    `config` is a `DevicePluginConfig` or the same data as a dict; `machine` the raw DMI product name (None when
    unreadable: `unknown`); `now` unix seconds for `gfd.timestamp` (None, or `flags.gfd.noTimestamp`, leaves it out).
    Raises `ConfigError` for a config or driver version that cannot be labelled, naming the field.
    """
    data = config_dict(config)
    strategy = mig_strategy(data)
    labels: dict[str, str] = {}
    no_timestamp = bool(((data.get("flags") or {}).get("gfd") or {}).get("noTimestamp"))
    if now is not None and not no_timestamp:
        labels[TIMESTAMP_LABEL] = str(int(now))
    labels.update(version_labels(driver_version, cuda_version))
    labels["nvidia.com/gpu.machine"] = sanitise(machine or "") or "unknown"
    if not gpus:
        return labels
    any_mig_enabled = any(g.mig_enabled for g in gpus)
    if strategy == "single" and any_mig_enabled:
        labels.update(single_mig_labels(gpus, mig_devices, data))
    else:
        advertised = _advertised(gpus, mig_devices, data)
        labels.update(full_gpu_labels(gpus, advertised, strategy == "mixed" and any_mig_enabled))
        if strategy == "mixed":
            labels.update(mixed_mig_labels(gpus, advertised))
    labels["nvidia.com/gpu.mode"] = gpu_mode(min(gpus, key=lambda g: g.index))
    labels["nvidia.com/mig.capable"] = _bool(any(g.mig_capable for g in gpus))
    if strategy in ("single", "mixed"):
        labels["nvidia.com/mig.strategy"] = strategy
    labels["nvidia.com/mps.capable"] = _bool(sharing_spec(data).strategy == SharingKind.MPS and not any_mig_enabled)
    labels["nvidia.com/vgpu.present"] = "false"
    return labels


def _bool(value: bool) -> str:
    return "true" if value else "false"


def format_features_file(labels: Mapping[str, str]) -> str:
    """NFD `features.d` format: one `key=value` per line, sorted so that rewrites of the same set are identical."""
    return "".join(f"{key}={value}\n" for key, value in sorted(labels.items()))


def checked_features_file(labels: Mapping[str, str]) -> str:
    """The features file as the file sink writes it: behind a `# kubegpu-sha256=...` line, which NFD skips as a
    comment, so `parse_features_file` tells a torn or tampered file from a whole one."""
    return stamp_lines(format_features_file(labels))


def parse_features_file(text: str, source: str) -> dict[str, str]:
    """The labels of a features file as NFD reads them: trimmed lines, `#` lines skipped, `key=value` (a bare key
    is "true"); CorruptStateError when the checksum line does not match. A file without one is taken as is."""
    body, _ = verify_lines(text, source, "NFD feature file")
    labels: dict[str, str] = {}
    for raw in body.split("\n"):
        line = raw.strip()
        if line and not line.startswith("#"):
            key, sep, value = line.partition("=")
            labels[key] = value if sep else "true"
    return labels


def node_label_patch(current: Mapping[str, str], desired: Mapping[str, str]) -> dict[str, str | None]:
    """The merge-patch `metadata.labels` that makes a Node carry `desired`, dropping owned labels that no longer apply.

    Labels GFD does not own are never in the patch, whatever their value. Empty when nothing changes.
    """
    patch: dict[str, str | None] = {k: v for k, v in desired.items() if current.get(k) != v}
    patch.update({k: None for k in current if is_owned_label(k) and k not in desired})
    return patch
