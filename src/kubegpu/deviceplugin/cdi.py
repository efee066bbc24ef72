"""CDI spec for the devices we serve, so `cdi-annotations` / `cdi-cri` names resolve in the container runtime.

`cdi_spec` is pure; `write_cdi_spec` is the thin adapter that puts it in the CDI directory atomically.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from kubegpu.deviceplugin.allocate import CDI_KIND, CONTROL_DEVICES, device_nodes
from kubegpu.deviceplugin.resources import AnnotatedDevice
from kubegpu.errors import KubegpuError

CDI_VERSION = "0.6.0"
DEFAULT_CDI_DIR = "/var/run/cdi"


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
        fd, tmp = tempfile.mkstemp(dir=directory, prefix=".kubegpu-cdi-", suffix=".tmp")
        with os.fdopen(fd, "w") as handle:
            json.dump(spec, handle, indent=2)
        os.replace(tmp, target)
    except OSError as exc:
        raise KubegpuError(f"{target}: cannot write CDI spec: {exc.strerror or exc}") from exc
    return target
