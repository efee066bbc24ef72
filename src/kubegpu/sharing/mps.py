"""MPS state in one place: the memory slices a GPU is cut into, and the limits each MPS control daemon enforces.

Two processes share this state on a node: the partition agent writes the slices file when it re-cuts a GPU, and the
device plugin reads it to advertise `nvidia.com/gpu-<N>gb` devices; the device plugin and the DRA driver both turn
a sharing config into per-GPU daemon limits. Keeping the file format and the limit arithmetic here means writer and
readers cannot drift. The plans are pure; the slices file is written atomically (temp file + rename) so a reader
never sees half a file, and carries a checksum so a torn or foreign one is never taken for slices; so does the
limits record the MPS daemon side writes.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from kubegpu.errors import ConfigError
from kubegpu.files import (
    CorruptStateError,
    dumps_checked,
    loads_checked,
    parse_json_text,
    read_text,
    write_durable,
)
from kubegpu.sharing.devices import AnnotatedDevice, config_dict, devices_by_resource
from kubegpu.sharing.names import SharingKind
from kubegpu.statefiles import stamp_checksum, verify_checksum

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

SLICES_KIND = "kubegpu-mps-slices"
SLICES_VERSION = 1
SLICES_FILE_LIMIT = 1024 * 1024
MAX_SLICE_GB = 4096  # far above any GPU's memory; keeps a foreign number from becoming a device count later
MAX_GPU_INDEX = 1023


def read_slices(path: Path) -> dict[int, list[int]]:
    """The partition agent's slices file; a missing file means no slices.

    Written as a checksummed envelope (`kubegpu.files.dumps_checked`) around `{"<gpu index>": [<GiB>, ...]}`; the
    bare object older agents wrote is still read. A torn, foreign or tampered file is a CorruptStateError: the
    partition agent rebuilds the file from the plan on its Node, the device plugin keeps the slices it had.
    Other read failures (permissions, a directory) stay plain ConfigErrors.
    """
    if not path.exists():
        return {}
    return parse_slices(read_text(path, limit=SLICES_FILE_LIMIT), str(path))


def parse_slices(text: str, source: str) -> dict[int, list[int]]:
    try:
        data = parse_json_text(text, source)
    except ConfigError as exc:
        detail = str(exc).removeprefix(source).lstrip(":0123456789 ")
        raise CorruptStateError(f"{source}: cannot read MPS slices: {detail} (torn or not a slices file)") from None
    if isinstance(data, dict) and "kind" in data:
        data = loads_checked(text, source, SLICES_KIND, SLICES_VERSION)
    shape = f"{source}: not an MPS slices file: expected {{gpu index: [GiB, ...]}}"
    if not isinstance(data, dict):
        raise CorruptStateError(shape)
    slices: dict[int, list[int]] = {}
    for key, sizes in data.items():
        index_ok = isinstance(key, str) and re.fullmatch(r"[0-9]{1,4}", key) and int(key) <= MAX_GPU_INDEX
        if not index_ok or not isinstance(sizes, list):
            raise CorruptStateError(shape)
        if not all(type(gb) is int and 0 < gb <= MAX_SLICE_GB for gb in sizes):
            raise CorruptStateError(f"{source}: GPU {key}: slice sizes must be whole GiB from 1 to {MAX_SLICE_GB}")
        slices[int(key)] = list(sizes)
    return slices


def dumps_slices(slices: Mapping[int, Sequence[int]]) -> str:
    return dumps_checked(SLICES_KIND, SLICES_VERSION, {str(k): list(v) for k, v in sorted(slices.items())})


def write_slices(path: Path, slices: Mapping[int, Sequence[int]]) -> None:
    """Atomically and checksummed, so the device plugin never reads half a file or takes a foreign one for slices."""
    path.parent.mkdir(parents=True, exist_ok=True)
    write_durable(path, dumps_slices(slices))


# ---------------------------------------------------------------------------------------------- limits record

LIMITS_KIND = "kubegpu-mps-limits"
LIMITS_VERSION = 1


def dumps_limits(plans: Sequence[MpsPlan]) -> str:
    """The limits record (`limits_document` plus kind, version and a `sha256` field), as the MPS daemon side
    writes it: readers of `daemons` see the same document as before; `parse_limits` can tell a torn one."""
    document = {"kind": LIMITS_KIND, "version": LIMITS_VERSION, **limits_document(plans)}
    return json.dumps(stamp_checksum(document), indent=2)


def parse_limits(text: str, source: str) -> dict[str, Any]:
    """The record's document (without its checksum); CorruptStateError when torn, tampered or foreign.

    A record without `sha256` (written before it existed, or by hand) is accepted when its shape is right.
    """
    try:
        data = parse_json_text(text, source)
    except ConfigError as exc:
        detail = str(exc).removeprefix(source).lstrip(":0123456789 ")
        raise CorruptStateError(f"{source}: cannot read the MPS limits record: {detail} (torn?)") from None
    verify_checksum(data, source, "MPS limits record")
    if not isinstance(data, dict) or data.get("kind", LIMITS_KIND) != LIMITS_KIND \
            or not isinstance(data.get("daemons"), list) or not all(isinstance(d, dict) for d in data["daemons"]):
        raise CorruptStateError(f"{source}: not an MPS limits record (expected {{\"daemons\": [...]}})")
    if data.get("version", LIMITS_VERSION) != LIMITS_VERSION:
        raise CorruptStateError(f"{source}: MPS limits record version {data.get('version')!r}, "
                                f"expected {LIMITS_VERSION}")
    return data
