"""The simulated node's state file: its format, a fresh node, and the checks that make a bad file one line.

Pure (no I/O): `kubegpu.gpu.simulated` reads and writes the file through `kubegpu.files` and runs every operation
on the checked state. Every number is bounded (MAX_NUMBER) so hand-edited files with `1e308` energy or `inf` load
cannot overflow the arithmetic later.

State file (JSON, `"kind": "kubegpu-sim-node"`, `"version": 1`)::

    {"sha256", "kind", "version", "node_name", "driver_version", "cuda_driver_version": [12, 4], "generation",
     "boots" (reboots so far; optional, 0 when absent),
     "gpus": [{"index", "model", "uuid", "pci_bus_id", "numa_node", "minor_number", "mig_enabled",
               "mig_pending_enabled", "mig_serial",
               "mig_devices": [{"gi_id", "ci_id", "profile_id", "start", "uuid", "load"}],
               "processes": [{"pid", "gi_id", "used_memory_mib", "name"}],
               "load": {"gpu_util", "mem_copy_util", "memory_used_mib", "temperature_c", "power_w",
                        "energy_mj", "energy_at", "xid_last", "pcie_replay"}}],
     "xid_events": [{"gpu_index", "xid", "timestamp", "gi_id"}]}

`sha256` (written by kubegpu, checked by every reader; `kubegpu.statefiles`) is the checksum of the rest: a torn or
tampered file is one error line naming it. A file without it is taken as hand-written, so after editing a file
kubegpu wrote, delete the field. `minor_number` (the N of /dev/nvidia<N>) is the index on a new node; edit it to
model a host whose driver numbers device files in another order. Files written before it existed have none and read
as minor = index.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Sequence
from typing import Any

from kubegpu.errors import ConfigError, NotFoundError
from kubegpu.gpu.backend import GpuBackendError, GpuDevice, MigDevice
from kubegpu.gpu.catalog import GpuModel, get_model

STATE_KIND = "kubegpu-sim-node"
STATE_VERSION = 1
DEFAULT_DRIVER_VERSION = "550.54.15"
DEFAULT_CUDA_VERSION = (12, 4)
MAX_XID_EVENTS = 1000  # the log is a ring: a node that keeps failing must not grow its file without bound
LOCK_TIMEOUT_S = 30.0
_UUID_NAMESPACE = uuid.UUID("6f1d3c1e-5a53-4b7e-9d3e-6b7567707573")
_DGX_BUSES = ("07", "0F", "47", "4E", "87", "90", "B7", "BD")
_IDLE_SM_CLOCK_MHZ = 210
MAX_GPUS_PER_NODE = 64  # real nodes hold 8 (16 on HGX-2); the bound keeps `100000000xA100` from exhausting memory
NODE_FILE_LIMIT = 8 * 1024 * 1024  # a node file is a few KiB; the cap holds even with MAX_XID_EVENTS events
MAX_NUMBER = 1e15  # |any number| in a node file: far above any MiB, mJ or timestamp, far below float overflow

State = dict[str, Any]


# --- pure state core ------------------------------------------------------------------------------------------------


def parse_gpu_spec(spec: str) -> list[GpuModel]:
    """`8xA100-SXM4-80GB` or `4xH100-SXM5-80GB,4xL4` (a bare key means one GPU) → one model per GPU."""
    models: list[GpuModel] = []
    for part in filter(None, (p.strip() for p in spec.split(","))):
        match = re.fullmatch(r"(\d+)[xX](.+)", part)
        count, key = (int(match.group(1)), match.group(2)) if match else (1, part)
        if count < 1:
            raise ConfigError(f"GPU spec {part!r}: the count must be at least 1")
        if len(models) + count > MAX_GPUS_PER_NODE:
            raise ConfigError(f"GPU spec {spec[:60]!r}: at most {MAX_GPUS_PER_NODE} GPUs per node")
        models.extend([get_model(key)] * count)
    if not models:
        raise ConfigError(f"GPU spec {spec!r} names no GPUs; write e.g. 8xA100-SXM4-80GB or 4xH100-SXM5-80GB,4xL4")
    return models


def new_node_state(models: Sequence[GpuModel], node_name: str = "sim-node",
                   driver_version: str = DEFAULT_DRIVER_VERSION,
                   cuda_driver_version: tuple[int, int] = DEFAULT_CUDA_VERSION) -> State:
    """A fresh node: MIG disabled everywhere, idle, no events. UUIDs derive from the node name, so runs repeat."""
    count = len(models)
    gpus = []
    for index, model in enumerate(models):
        bus = _DGX_BUSES[index] if count <= len(_DGX_BUSES) else f"{(index * 8 + 7) % 256:02X}"
        gpus.append({
            "index": index,
            "model": model.key,
            "uuid": "GPU-" + str(uuid.uuid5(_UUID_NAMESPACE, f"{node_name}/gpu/{index}")),
            "pci_bus_id": f"00000000:{bus}:00.0",
            "numa_node": 0 if index < max(count // 2, 1) else 1,
            "minor_number": index,
            "mig_enabled": False,
            "mig_pending_enabled": None,
            "mig_serial": 0,
            "mig_devices": [],
            "processes": [],
            "load": _idle_load(0.0),
        })
    return {"kind": STATE_KIND, "version": STATE_VERSION, "node_name": node_name, "driver_version": driver_version,
            "cuda_driver_version": list(cuda_driver_version), "generation": 0, "gpus": gpus, "xid_events": []}


def _idle_load(now: float) -> dict[str, Any]:
    return {"gpu_util": 0.0, "mem_copy_util": 0.0, "memory_used_mib": 0, "temperature_c": None, "power_w": None,
            "energy_mj": 0, "energy_at": now, "xid_last": 0, "pcie_replay": 0}


FieldTypes = dict[str, type | tuple[type, ...]]
_NUMBER = (int, float)
_MAYBE_NUMBER = (int, float, type(None))
_MAYBE_INT = (int, type(None))
# The shape of the state file (see the module docstring): every field the operations read, with its JSON type, so a
# hand-edited or truncated file is one line naming the field rather than a KeyError deep inside a command.
_TOP_FIELDS: FieldTypes = {"node_name": str, "driver_version": str, "cuda_driver_version": list, "generation": int,
                           "xid_events": list}
_OPTIONAL_TOP_FIELDS: FieldTypes = {"boots": int}  # absent in files written before it existed
_GPU_FIELDS: FieldTypes = {"model": str, "uuid": str, "pci_bus_id": str, "numa_node": int, "mig_enabled": bool,
                           "mig_pending_enabled": (bool, type(None)), "mig_serial": int, "mig_devices": list,
                           "processes": list, "load": dict}
_OPTIONAL_GPU_FIELDS: FieldTypes = {"minor_number": int}  # absent in files written before it existed
_LOAD_FIELDS: FieldTypes = {"gpu_util": _NUMBER, "mem_copy_util": _NUMBER, "memory_used_mib": int, "xid_last": int,
                            "pcie_replay": int}
_OPTIONAL_LOAD_FIELDS: FieldTypes = {"temperature_c": _MAYBE_NUMBER, "power_w": _MAYBE_NUMBER,
                                     "energy_mj": _NUMBER, "energy_at": _NUMBER}
_MIG_FIELDS: FieldTypes = {"gi_id": int, "ci_id": int, "profile_id": int, "start": int, "uuid": str, "load": dict}
_MIG_LOAD_FIELDS: FieldTypes = {"gpu_util": _NUMBER, "memory_used_mib": int}
_PROCESS_FIELDS: FieldTypes = {"pid": int, "gi_id": _MAYBE_INT, "used_memory_mib": int, "name": str}
_XID_FIELDS: FieldTypes = {"gpu_index": int, "xid": int, "timestamp": _NUMBER, "gi_id": _MAYBE_INT}
_JSON_TYPE_NAMES = {int: "an integer", float: "a number", str: "a string", bool: "true or false", list: "a list",
                    dict: "an object", type(None): "null"}


def _check_fields(record: object, source: str, where: str, required: FieldTypes,
                  optional: FieldTypes | None = None) -> dict[str, Any]:
    """`record` as an object holding `required` (and, when present, `optional`) fields of the given JSON types."""
    if not isinstance(record, dict):
        raise ConfigError(f"{source}: {where}: must be an object")
    for fields, needed in ((required, True), (optional or {}, False)):
        for name, kind in fields.items():
            if name not in record:
                if needed:
                    raise ConfigError(f"{source}: {where}.{name}: required field is missing")
                continue
            value = record[name]
            if not _has_type(value, kind):
                raise ConfigError(f"{source}: {where}.{name}: must be {_type_name(kind)}, got {json.dumps(value)}")
            _check_bounded(value, source, f"{where}.{name}")
    return record


def _check_bounded(value: object, source: str, where: str) -> None:
    if isinstance(value, int | float) and not isinstance(value, bool) and not abs(value) <= MAX_NUMBER:  # NaN too
        raise ConfigError(f"{source}: {where}: must be a finite number of magnitude at most {MAX_NUMBER:.0e}")


def _has_type(value: object, kind: type | tuple[type, ...]) -> bool:
    """`isinstance`, except that JSON true/false is no number (Python's bool is an int)."""
    kinds = kind if isinstance(kind, tuple) else (kind,)
    return bool in kinds if isinstance(value, bool) else isinstance(value, kinds)


def _type_name(kind: type | tuple[type, ...]) -> str:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    return " or ".join(_JSON_TYPE_NAMES[k] for k in kinds if not (k is int and float in kinds))


def check_state(state: object, source: str) -> State:
    """Reject anything that is not a node state, in one line naming `source` and the field at fault."""
    if not isinstance(state, dict) or state.get("kind") != STATE_KIND:
        raise ConfigError(f"{source}: not a kubegpu simulated node file (kind must be {STATE_KIND!r})")
    if state.get("version") != STATE_VERSION:
        raise ConfigError(f"{source}: version: unsupported {state.get('version')!r} (expected {STATE_VERSION})")
    gpus = state.get("gpus")
    if not isinstance(gpus, list):
        raise ConfigError(f"{source}: gpus: must be a list")
    if len(gpus) > MAX_GPUS_PER_NODE:
        raise ConfigError(f"{source}: gpus: at most {MAX_GPUS_PER_NODE} GPUs per node, got {len(gpus)}")
    for name, kind in (*_TOP_FIELDS.items(), *((n, k) for n, k in _OPTIONAL_TOP_FIELDS.items() if n in state)):
        if not _has_type(state.get(name), kind):
            raise ConfigError(f"{source}: {name}: must be {_type_name(kind)}, got {json.dumps(state.get(name))}")
        _check_bounded(state.get(name), source, name)
    cuda = state["cuda_driver_version"]
    if len(cuda) != 2 or not all(_has_type(part, int) and 0 <= part < 1000 for part in cuda):
        raise ConfigError(f"{source}: cuda_driver_version: must be [major, minor], got {json.dumps(cuda)}")
    for position, gpu in enumerate(gpus):
        if not isinstance(gpu, dict) or gpu.get("index") != position:
            raise ConfigError(f"{source}: gpus[{position}]: must be an object with index {position}")
        try:
            get_model(str(gpu.get("model")))
        except NotFoundError as exc:
            raise ConfigError(f"{source}: gpus[{position}].model: {exc}") from exc
        _check_gpu(gpu, source, f"gpus[{position}]")
    _check_minor_numbers(gpus, source)
    for position, event in enumerate(state["xid_events"]):
        _check_fields(event, source, f"xid_events[{position}]", _XID_FIELDS)
    return state


def _check_gpu(gpu: dict[str, Any], source: str, where: str) -> None:
    _check_fields(gpu, source, where, _GPU_FIELDS, _OPTIONAL_GPU_FIELDS)
    _check_fields(gpu["load"], source, f"{where}.load", _LOAD_FIELDS, _OPTIONAL_LOAD_FIELDS)
    for position, record in enumerate(gpu["mig_devices"]):
        _check_fields(record, source, f"{where}.mig_devices[{position}]", _MIG_FIELDS)
        _check_fields(record["load"], source, f"{where}.mig_devices[{position}].load", _MIG_LOAD_FIELDS)
    for position, process in enumerate(gpu["processes"]):
        _check_fields(process, source, f"{where}.processes[{position}]", _PROCESS_FIELDS)


def _minor_number(gpu: dict[str, Any]) -> int:
    return int(gpu.get("minor_number", gpu["index"]))


def _check_minor_numbers(gpus: list[dict[str, Any]], source: str) -> None:
    """Two GPUs behind one /dev/nvidia<N> would hand a container the wrong GPU: refuse such a node file."""
    owner: dict[int, int] = {}
    for gpu in gpus:
        minor = _minor_number(gpu)
        where = f"{source}: gpus[{gpu['index']}].minor_number"
        if minor < 0:
            raise ConfigError(f"{where}: must not be negative, got {minor}")
        if minor in owner:
            raise ConfigError(f"{where}: {minor} is already GPU {owner[minor]}'s minor number")
        owner[minor] = gpu["index"]


def _gpu(state: State, index: int) -> dict[str, Any]:
    gpus = state["gpus"]
    if not 0 <= index < len(gpus):
        raise GpuBackendError(f"node {state['node_name']} has no GPU {index} ({len(gpus)} GPUs)")
    gpu: dict[str, Any] = gpus[index]
    return gpu


def _model(gpu: dict[str, Any]) -> GpuModel:
    return get_model(gpu["model"])


def _describe(gpu: dict[str, Any]) -> str:
    return f"GPU {gpu['index']} ({_model(gpu).product_name})"


def _mig_record(gpu: dict[str, Any], gi_id: int) -> dict[str, Any]:
    for record in gpu["mig_devices"]:
        if record["gi_id"] == gi_id:
            found: dict[str, Any] = record
            return found
    raise GpuBackendError(f"{_describe(gpu)} has no GPU instance {gi_id}")


def _to_device(gpu: dict[str, Any]) -> GpuDevice:
    model = _model(gpu)
    pending = gpu.get("mig_pending_enabled")
    return GpuDevice(
        index=gpu["index"], uuid=gpu["uuid"], product_name=model.product_name, model_key=model.key,
        memory_mib=model.memory_mib, pci_bus_id=gpu["pci_bus_id"], pci_device_id=model.pci_device_id,
        numa_node=gpu["numa_node"], compute_capability=model.compute_capability,
        multiprocessors=model.multiprocessors, mig_capable=model.mig_capable, mig_enabled=gpu["mig_enabled"],
        mig_pending=pending is not None and pending != gpu["mig_enabled"], minor_number=_minor_number(gpu),
    )


def _to_mig_device(gpu: dict[str, Any], record: dict[str, Any]) -> MigDevice:
    profile = _model(gpu).profile(record["profile_id"])
    return MigDevice(
        gpu_index=gpu["index"], gpu_uuid=gpu["uuid"], uuid=record["uuid"], gi_id=record["gi_id"],
        ci_id=record["ci_id"], profile_id=profile.profile_id, profile_name=profile.name, start=record["start"],
        size=profile.memory_slots, memory_mib=profile.memory_mib, multiprocessors=profile.multiprocessors,
    )
