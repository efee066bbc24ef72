"""Processes on a simulated node: start, grow (a leak) and end them, with the driver's rules.

Split from `kubegpu.gpu.simulated` (which re-exports them) so the node's process table has one small home; pure
functions over the node state (`kubegpu.gpu.simstate`).
"""

from __future__ import annotations

from typing import Any

from kubegpu.gpu.backend import GpuBackendError
from kubegpu.gpu.simstate import State, _describe, _gpu, _mig_record, _model


def add_process(state: State, index: int, pid: int, used_memory_mib: int, gi_id: int | None = None,
                name: str = "python") -> None:
    """A compute process on a GPU (or in one of its GPU instances), as the driver would list it; the same pid again
    replaces its entry. Refused where no real process could be: a MIG GPU outside any instance, more memory than
    the GPU or instance has left."""
    gpu = _gpu(state, index)
    if pid <= 0:
        raise GpuBackendError(f"pid {pid}: must be a positive process id")
    if used_memory_mib < 0:
        raise GpuBackendError(f"pid {pid}: used memory {used_memory_mib} MiB must not be negative")
    if gi_id is None and gpu["mig_enabled"]:
        ids = ", ".join(str(record["gi_id"]) for record in gpu["mig_devices"])
        choice = f"name one of GPU instances {ids}" if ids else "it has no GPU instances yet"
        raise GpuBackendError(f"{_describe(gpu)} has MIG enabled, so a process runs in a GPU instance; {choice}")
    others = [p for p in gpu["processes"] if p["pid"] != pid]
    capacity = _memory_mib(gpu, gi_id)
    in_use = sum(int(p["used_memory_mib"]) for p in others if p["gi_id"] == gi_id)
    if in_use + used_memory_mib > capacity:
        where = _describe(gpu) if gi_id is None else f"GPU instance {gi_id} on {_describe(gpu)}"
        raise GpuBackendError(f"pid {pid}: {used_memory_mib} MiB does not fit on {where}: {capacity - in_use} of "
                              f"{capacity} MiB free")
    gpu["processes"] = [*others, {"pid": pid, "gi_id": gi_id, "used_memory_mib": used_memory_mib, "name": name}]


def set_process_memory(state: State, pid: int, used_memory_mib: int) -> int:
    """A running process's memory grows or shrinks (a leak played on a simulated node); returns its GPU index. As
    the driver would, an allocation past what the GPU (or its instance) has free is refused, and the process keeps
    what it had. An unknown pid is an error."""
    for gpu in state["gpus"]:
        for process in gpu["processes"]:
            if process["pid"] == pid:
                add_process(state, gpu["index"], pid, used_memory_mib, process["gi_id"], process["name"])
                return int(gpu["index"])
    running = ", ".join(str(p["pid"]) for gpu in state["gpus"] for p in gpu["processes"]) or "none"
    raise GpuBackendError(f"no process {pid} on node {state['node_name']} (running: {running})")


def _memory_mib(gpu: dict[str, Any], gi_id: int | None) -> int:
    """Memory of the whole GPU, or of one of its GPU instances (an unknown instance is an error)."""
    model = _model(gpu)
    if gi_id is None:
        return model.memory_mib
    return model.profile(_mig_record(gpu, gi_id)["profile_id"]).memory_mib


def remove_process(state: State, index: int, pid: int) -> None:
    """The process exits. An unknown pid is an error: a typo must not look like a freed GPU."""
    gpu = _gpu(state, index)
    remaining = [p for p in gpu["processes"] if p["pid"] != pid]
    if len(remaining) == len(gpu["processes"]):
        running = ", ".join(str(p["pid"]) for p in gpu["processes"]) or "none"
        raise GpuBackendError(f"no process {pid} on {_describe(gpu)} (running: {running})")
    gpu["processes"] = remaining
