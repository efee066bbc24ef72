"""The device nodes a GPU or MIG device needs in a container, and the CDI spec that names them.

Both the device plugin (`cdi-annotations` / `cdi-cri`) and the DRA driver hand devices to the container runtime
through CDI, so which /dev nodes a device needs (the GPU's minor, a MIG device's capability nodes, the control
devices) lives here once. `cdi_spec` is pure; `write_cdi_spec` is the thin adapter that writes it atomically.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from kubegpu.errors import KubegpuError
from kubegpu.files import write_durable
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


def cdi_spec(devices: Sequence[AnnotatedDevice], kind: str = CDI_KIND, dev_root: str = "/") -> dict[str, Any]:
    """One CDI device per physical GPU / MIG device (replicas share it), plus the control nodes for all."""
    root = dev_root.rstrip("/")
    entries: dict[str, dict[str, Any]] = {}
    for device in devices:
        if device.physical_id in entries:
            continue
        nodes = [{"path": node, "hostPath": f"{root}{node}"} for node in device_nodes(device)]
        entries[device.physical_id] = {"name": device.physical_id, "containerEdits": {"deviceNodes": nodes}}
    return {
        "cdiVersion": CDI_VERSION,
        "kind": kind,
        "devices": list(entries.values()),
        "containerEdits": {"deviceNodes": [{"path": p, "hostPath": f"{root}{p}"} for p in CONTROL_DEVICES]},
    }


def spec_file_name(kind: str) -> str:
    return "kubegpu-" + kind.replace("/", "-") + ".json"


def write_cdi_spec(directory: Path, spec: dict[str, Any]) -> Path:
    """Write atomically (temp file + rename) so a runtime never reads half a spec."""
    target = directory / spec_file_name(str(spec["kind"]))
    try:
        directory.mkdir(parents=True, exist_ok=True)
        write_durable(target, json.dumps(spec, indent=2))
    except OSError as exc:
        raise KubegpuError(f"{target}: cannot write CDI spec: {exc.strerror or exc}") from exc
    return target
