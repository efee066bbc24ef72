"""The one interface every node-side component uses to see and change GPUs.

Two implementations satisfy it: `NvmlBackend` (real GPUs through nvidia-ml-py) and `SimulatedBackend` (a node whose
state lives in a JSON file, or in memory for the simulator). Components take a backend spec on the command line —
`--gpu-backend nvml` (default) or `--gpu-backend sim:PATH` — and call `open_backend(spec)`, so the same code runs on a
DGX and in a test with no GPU.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, runtime_checkable

from kubegpu.errors import KubegpuError


@dataclass
class GpuDevice:
    """A physical GPU as the driver reports it."""

    index: int
    uuid: str
    product_name: str
    model_key: str | None  # catalog key, None for a GPU the catalog does not know
    memory_mib: int
    pci_bus_id: str
    pci_device_id: str  # "0x20B210DE": device << 16 | vendor, as mig-parted's device-filter writes it
    numa_node: int | None
    compute_capability: tuple[int, int]
    multiprocessors: int
    mig_capable: bool
    mig_enabled: bool  # the current mode
    mig_pending: bool  # a mode change waits for a GPU reset (Ampere)
    # /dev/nvidia<minor>: the driver numbers device files in its own (PCI probe) order, not NVML's index order, so
    # whoever builds device paths must use this; None when the backend cannot tell (then the index is the best guess)
    minor_number: int | None = None

    @property
    def device_minor(self) -> int:
        """The minor of this GPU's /dev/nvidia<N> node: the driver's when known, else the index."""
        return self.index if self.minor_number is None else self.minor_number


@dataclass
class MigDevice:
    """A MIG device: one GPU instance with one compute instance spanning it."""

    gpu_index: int
    gpu_uuid: str
    uuid: str
    gi_id: int
    ci_id: int
    profile_id: int
    profile_name: str
    start: int
    size: int
    memory_mib: int
    multiprocessors: int


@dataclass
class XidEvent:
    gpu_index: int
    xid: int
    timestamp: float
    gi_id: int | None = None  # set when the driver attributes the error to one GPU instance


@dataclass
class GpuProcess:
    pid: int
    gpu_index: int
    gi_id: int | None
    used_memory_mib: int
    name: str


@dataclass
class GpuSample:
    """One reading of a GPU's (or a MIG device's) counters, in the units DCGM exports."""

    gpu_util: float  # percent, 0..100
    mem_copy_util: float  # percent, 0..100
    memory_used_mib: int
    memory_free_mib: int
    temperature_c: float
    power_w: float
    sm_clock_mhz: int
    mem_clock_mhz: int
    energy_mj: int  # monotonically increasing since driver load
    xid_last: int  # the last XID seen on this GPU, 0 if none
    pcie_replay: int
    graphics_engine_active: float  # GR engine activity 0..1 (also defined for MIG)


class GpuBackendError(KubegpuError):
    """A GPU operation failed or was refused (illegal placement, device in use, unknown index)."""


class BackendUnavailable(GpuBackendError):
    """The backend cannot start at all: no NVML library or driver, or no simulated node file."""


@runtime_checkable
class GpuBackend(Protocol):
    def driver_version(self) -> str: ...

    def cuda_driver_version(self) -> tuple[int, int]: ...

    def devices(self) -> list[GpuDevice]: ...

    def set_mig_mode(self, index: int, enabled: bool) -> bool:
        """Request a MIG mode; True when the change still waits for `reset_gpu` (Ampere)."""
        ...

    def reset_gpu(self, index: int) -> None:
        """Reset one GPU so a pending MIG mode takes effect (refused while processes run on it)."""
        ...

    def mig_devices(self, index: int) -> list[MigDevice]: ...

    def create_mig_device(self, index: int, profile_id: int, start: int) -> MigDevice:
        """Create a GPU instance at exactly this placement plus one compute instance spanning it."""
        ...

    def destroy_mig_device(self, index: int, gi_id: int) -> None: ...

    def processes(self, index: int) -> list[GpuProcess]: ...

    def sample(self, index: int, gi_id: int | None = None) -> GpuSample: ...

    def xid_events(self, since: float) -> list[XidEvent]:
        """XID events with timestamp > since."""
        ...

    def boot_id(self) -> str:
        """Names the node's current boot; a new one after a reboot, which no MIG instance, GPU process or tmpfs
        file survives. "" when unknown."""
        ...

    def close(self) -> None: ...


BACKEND_SPEC_HELP = (
    "GPU backend: 'nvml' (real GPUs) or 'sim:PATH' (a simulated node file made by `kubegpu sim-node create`)"
)


def responds(backend: GpuBackend, index: int) -> bool:
    """Whether GPU `index` answers a query: the probe XID recovery runs after a quiet period (a GPU that fell off the
    bus, or whose driver lost it, raises instead of sampling), shared by every agent that tracks GPU health."""
    try:
        backend.sample(index)
    except KubegpuError:
        return False
    return True


def open_backend(spec: str) -> GpuBackend:
    """Open the backend a `--gpu-backend` value names; a bad spec or missing library is one KubegpuError line."""
    kind, sep, rest = spec.strip().partition(":")
    if kind == "nvml" and not sep:
        from kubegpu.gpu.nvml import NvmlBackend

        return NvmlBackend()
    if kind == "sim" and sep and rest:
        from kubegpu.gpu.simulated import SimulatedBackend

        return SimulatedBackend(Path(rest))
    raise KubegpuError(f"unknown GPU backend {spec!r}; use 'nvml' or 'sim:PATH'")
