"""GPUs as kubegpu sees them: the model catalog, exact MIG geometry, and the backends that read and change GPUs.

- `catalog`: models (NVML product names, PCI ids, memory, SMs, compute capability) and their MIG profiles.
- `geometry`: legal layouts, placement around in-use instances, enumeration of feasible/maximal layouts (pure).
- `backend`: the `GpuBackend` protocol and its dataclasses; `open_backend("nvml" | "sim:PATH")`.
- `simulated`: a node in a locked JSON file (or in memory); `nvml`: real GPUs through nvidia-ml-py.
- `cli`: `kubegpu sim-node create | inject-xid | set-load | add-process | remove-process | show`.
"""

from __future__ import annotations

from kubegpu.gpu.backend import (
    BackendUnavailable,
    GpuBackend,
    GpuBackendError,
    GpuDevice,
    GpuProcess,
    GpuSample,
    MigDevice,
    XidEvent,
    open_backend,
)
from kubegpu.gpu.catalog import CATALOG, GpuModel, MigEngines, MigProfile, find_model, get_model
from kubegpu.gpu.geometry import PlacedInstance, is_legal, layout_errors, place

__all__ = [
    "CATALOG",
    "BackendUnavailable",
    "GpuBackend",
    "GpuBackendError",
    "GpuDevice",
    "GpuModel",
    "GpuProcess",
    "GpuSample",
    "MigDevice",
    "MigEngines",
    "MigProfile",
    "PlacedInstance",
    "XidEvent",
    "find_model",
    "get_model",
    "is_legal",
    "layout_errors",
    "open_backend",
    "place",
]
