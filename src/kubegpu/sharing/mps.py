"""MPS state in one place: the memory slices a GPU is cut into, and the limits each MPS control daemon enforces.

Two processes share this state on a node: the partition agent writes the slices file when it re-cuts a GPU, and the
device plugin reads it to advertise `nvidia.com/gpu-<N>gb` devices; the device plugin and the DRA driver both turn
a sharing config into per-GPU daemon limits. Keeping the file format and the limit arithmetic here means writer and
readers cannot drift. The plans are pure; the slices file is written atomically (temp file + rename) so a reader
never sees half a file.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from kubegpu.errors import ConfigError
from kubegpu.files import load_json_file, write_durable
from kubegpu.sharing.devices import AnnotatedDevice, config_dict, devices_by_resource
from kubegpu.sharing.names import SharingKind

DEFAULT_MPS_ROOT = "/run/nvidia/mps"


@dataclass(frozen=True)
class GpuLimits:
    gpu_index: int
    gpu_uuid: str
    replicas: int
    pinned_memory_mib: int
    active_thread_percentage: int


@dataclass(frozen=True)
class MpsPlan:
    """One control daemon: its directories and the commands that set its defaults."""

    resource: str
    pipe_dir: str
    log_dir: str
    gpus: tuple[GpuLimits, ...] = field(default_factory=tuple)

    @property
    def commands(self) -> list[str]:
        threads = min((g.active_thread_percentage for g in self.gpus), default=100)
        out = [f"set_default_active_thread_percentage {threads}"]
        out.extend(f"set_default_device_pinned_mem_limit {g.gpu_index} {g.pinned_memory_mib}M" for g in self.gpus)
        return out


def mps_plans(listing: Mapping[str, Sequence[AnnotatedDevice]], mps_root: str) -> list[MpsPlan]:
    """A daemon for every resource whose devices are MPS replicas or slices; limits per physical GPU."""
    plans = []
    for resource, devices in sorted(listing.items()):
        per_gpu: dict[int, GpuLimits] = {}
        for d in devices:
            if d.sharing != SharingKind.MPS or d.gpu_index in per_gpu:
                continue
            per_gpu[d.gpu_index] = GpuLimits(
                d.gpu_index, d.gpu_uuid, d.replicas, int(d.mps_memory_mib or 0), int(d.mps_thread_percentage or 100)
            )
        if per_gpu:
            base = f"{mps_root.rstrip('/')}/{resource}"
            plans.append(MpsPlan(resource, f"{base}/pipe", f"{base}/log", tuple(per_gpu[i] for i in sorted(per_gpu))))
    return plans


def plans_for(gpus: Sequence[Any], mig: Mapping[int, Sequence[Any]], config: object) -> list[MpsPlan]:
    data = config_dict(config)
    mps_root = str((data.get("flags") or {}).get("mpsRoot") or DEFAULT_MPS_ROOT)
    return mps_plans(devices_by_resource(gpus, mig, data), mps_root)


def limits_document(plans: Sequence[MpsPlan]) -> dict[str, Any]:
    return {
        "daemons": [
            {"resource": p.resource, "pipeDirectory": p.pipe_dir, "logDirectory": p.log_dir, "commands": p.commands,
             "gpus": [asdict(g) for g in p.gpus]}
            for p in plans
        ]
    }


# ---------------------------------------------------------------------------------------------- slices file


def read_slices(path: Path) -> dict[int, list[int]]:
    """The partition agent's `{"<gpu index>": [<GiB>, ...]}` file; a missing file means no slices."""
    if not path.exists():
        return {}
    try:
        data = load_json_file(path, limit=1024 * 1024)  # bounded, UTF-8, strict JSON
    except ConfigError as exc:
        detail = str(exc).removeprefix(str(path)).lstrip(":0123456789 ")
        raise ConfigError(f"{path}: cannot read MPS slices: {detail}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected an object {{gpu index: [GiB, ...]}}")
    try:
        return {int(k): [int(x) for x in v] for k, v in data.items()}
    except (TypeError, ValueError):
        raise ConfigError(f"{path}: expected an object {{gpu index: [GiB, ...]}}") from None


def write_slices(path: Path, slices: Mapping[int, Sequence[int]]) -> None:
    """Atomically, so the device plugin never reads half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    write_durable(path, json.dumps({str(k): list(v) for k, v in sorted(slices.items())}))
