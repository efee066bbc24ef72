"""The device nodes a GPU or MIG device needs in a container, and the CDI spec that names them.

Both the device plugin (`cdi-annotations` / `cdi-cri`) and the DRA driver hand devices to the container runtime
through CDI, so which /dev nodes a device needs (the GPU's minor, a MIG device's capability nodes, the control
devices) lives here once, and so does where each node comes from on the host (`host_path`): the host's /dev under
the driver's dev root on real hardware, or a simulated node's stand-in devices (`kubegpu.gpu.standins`) so a real
container runtime can inject simulated GPUs. `cdi_spec` is pure; `write_cdi_spec` is the thin adapter that writes it
atomically (after making any stand-ins it names).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from kubegpu.errors import KubegpuError
from kubegpu.files import write_durable
from kubegpu.gpu import standins
from kubegpu.sharing.devices import AnnotatedDevice

CONTROL_DEVICES = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia-modeset")
MIG_CAPS_DIR = "/dev/nvidia-caps"
# The driver's MIG capability minors are a fixed table (/proc/driver/nvidia-caps/mig-minors): `config` 1, `monitor` 2,
# then per GPU minor 15 GPU instances, each with its own access node followed by one per compute instance 0-7.
_FIRST_MIG_MINOR, _MINORS_PER_GI, _GIS_PER_GPU = 3, 9, 15
# NVIDIA's vendor/class: not `nvidia.com/gpu`, the toolkit's own spec (`nvidia-ctk cdi generate`) already defines
# `nvidia.com/gpu=<uuid>`, and a runtime refuses a device name that two spec files define.
CDI_KIND = "k8s.device-plugin.nvidia.com/gpu"
CDI_VERSION = "0.6.0"
DEFAULT_CDI_DIR = "/var/run/cdi"


def mig_cap_minors(gpu_minor: int, gi_id: int, ci_id: int) -> tuple[int, int]:
    """`nvidia-cap<N>` minors that grant GPU instance `gi_id` and its compute instance `ci_id` of /dev/nvidia<minor>."""
    gi_minor = _FIRST_MIG_MINOR + (gpu_minor * _GIS_PER_GPU + gi_id) * _MINORS_PER_GI
    return gi_minor, gi_minor + 1 + ci_id


def gpu_minor(device: AnnotatedDevice) -> int:
    """The N of the GPU's /dev/nvidia<N>: the driver's minor number when the backend reported one, else the index.
    They differ on hosts whose PCI probe order is not NVML's order, and the wrong node hands over the wrong GPU."""
    return device.minor if device.minor >= 0 else device.gpu_index


def device_nodes(device: AnnotatedDevice) -> list[str]:
    """The GPU's /dev/nvidia<minor>; a MIG device also needs its two capability nodes, or CUDA cannot open it."""
    minor = gpu_minor(device)
    nodes = [f"/dev/nvidia{minor}"]
    if device.mig is not None:
        caps = mig_cap_minors(minor, device.mig.gi_id, device.mig.ci_id)
        nodes.extend(f"{MIG_CAPS_DIR}/nvidia-cap{cap}" for cap in caps)
    return nodes


def host_path(path: str, dev_root: str = "/", stand_ins: str | None = None) -> str:
    """Where the host holds the node a container sees at ``path``: the simulated node's stand-in when it has a
    stand-in directory (`/dev/nvidia0` -> `<stand_ins>/nvidia0`), else the path under the driver's dev root."""
    if stand_ins:
        return standins.stand_in_path(stand_ins, path)
    return f"{dev_root.rstrip('/')}{path}"


def device_node(path: str, dev_root: str = "/", stand_ins: str | None = None) -> dict[str, str]:
    """One CDI `deviceNodes` entry."""
    return {"path": path, "hostPath": host_path(path, dev_root, stand_ins)}


def cdi_spec(devices: Sequence[AnnotatedDevice], kind: str = CDI_KIND, dev_root: str = "/",
             stand_ins: str | None = None) -> dict[str, Any]:
    """One CDI device per physical GPU / MIG device (replicas share it), plus the control nodes for all."""
    entries: dict[str, dict[str, Any]] = {}
    for device in devices:
        if device.physical_id in entries:
            continue
        nodes = [device_node(node, dev_root, stand_ins) for node in device_nodes(device)]
        entries[device.physical_id] = {"name": device.physical_id, "containerEdits": {"deviceNodes": nodes}}
    return {
        "cdiVersion": CDI_VERSION,
        "kind": kind,
        "devices": list(entries.values()),
        "containerEdits": {"deviceNodes": [device_node(p, dev_root, stand_ins) for p in CONTROL_DEVICES]},
    }


def spec_device_paths(spec: dict[str, Any]) -> list[str]:
    """Every container path a spec's device nodes name (spec-level edits, then each device's), once each."""
    edits = [spec.get("containerEdits") or {}, *((d.get("containerEdits") or {}) for d in spec.get("devices") or [])]
    return list(dict.fromkeys(str(node["path"]) for edit in edits for node in edit.get("deviceNodes") or []))


def ensure_stand_ins(spec: dict[str, Any], stand_ins: str | None) -> None:
    """Make the simulated node's stand-in devices a spec names before a runtime reads it (nothing for real GPUs)."""
    if stand_ins:
        standins.ensure(Path(stand_ins), spec_device_paths(spec))


def spec_file_name(kind: str) -> str:
    return "kubegpu-" + kind.replace("/", "-") + ".json"


def write_cdi_spec(directory: Path, spec: dict[str, Any], stand_ins: str | None = None) -> Path:
    """Write atomically (temp file + rename) so a runtime never reads half a spec; a simulated node's stand-in
    devices (``stand_ins``) are made first, so every `hostPath` exists once the spec does."""
    ensure_stand_ins(spec, stand_ins)
    target = directory / spec_file_name(str(spec["kind"]))
    try:
        directory.mkdir(parents=True, exist_ok=True)
        write_durable(target, json.dumps(spec, indent=2))
    except OSError as exc:
        raise KubegpuError(f"{target}: cannot write CDI spec: {exc.strerror or exc}") from exc
    return target
