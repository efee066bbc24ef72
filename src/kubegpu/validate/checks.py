"""The validator's checks (GPU Operator's nvidia-validator components) and its barrier files.

Each check is a pure function of what it reads (the GPU backend, the Node) that returns a Result; the CLI writes the
barrier file `<component>-ready` in the validations directory only on success. Operand init containers wait on those
files, so a node's stack comes up driver → toolkit → device plugin and never on a half-working GPU.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubegpu.errors import KubegpuError
from kubegpu.files import read_text, write_durable
from kubegpu.gpu.backend import GpuBackend
from kubegpu.sharing.names import GPU_RESOURCE, MIG_RESOURCE_PREFIX

DEFAULT_DIR = Path("/run/nvidia/validations")
COMPONENTS = ("driver", "toolkit", "cuda", "plugin", "mig")
DRIVER_KEYS = ("IS_HOST_DRIVER", "NVIDIA_DRIVER_ROOT", "DRIVER_ROOT_CTR_PATH", "NVIDIA_DEV_ROOT", "DEV_ROOT_CTR_PATH")
MIN_CUDA = (11, 0)


@dataclass
class Result:
    ok: bool
    message: str
    values: dict[str, str] = field(default_factory=dict)  # KEY=value lines written to the barrier file


def barrier_path(directory: Path, component: str) -> Path:
    return directory / f"{component}-ready"


def driver_root(env: dict[str, str]) -> tuple[bool, str]:
    """(host driver?, driver root): a containerized driver leaves `.driver-ctr-ready` under /run/nvidia/validations
    and lives in /run/nvidia/driver; otherwise the host's driver at /."""
    root = env.get("NVIDIA_DRIVER_ROOT")
    if root:
        return root == "/", root
    if env.get("CONTAINERIZED_DRIVER", "").lower() == "true":
        return False, "/run/nvidia/driver"
    return True, "/"


def check_driver(backend: GpuBackend, env: dict[str, str]) -> Result:
    """The driver answers (NVML: driver version and at least one GPU)."""
    try:
        version = backend.driver_version()
        count = len(backend.devices())
    except KubegpuError as exc:
        return Result(False, f"driver not ready: {exc}")
    if count == 0:
        return Result(False, f"driver {version} loaded but no GPU is visible")
    is_host, root = driver_root(env)
    values = {
        "IS_HOST_DRIVER": str(is_host).lower(),
        "NVIDIA_DRIVER_ROOT": root,
        "DRIVER_ROOT_CTR_PATH": "/host" if is_host else "/run/nvidia/driver",
        "NVIDIA_DEV_ROOT": root,
        "DEV_ROOT_CTR_PATH": "/host" if is_host else "/run/nvidia/driver",
        "DRIVER_VERSION": version,
        "GPU_COUNT": str(count),
    }
    return Result(True, f"driver {version}: {count} GPU(s)", values)


def check_toolkit(backend: GpuBackend, directory: Path) -> Result:
    """The container runtime hands GPUs to this container (the devices are visible through the runtime's
    injection), after the driver validated."""
    if not barrier_path(directory, "driver").exists():
        return Result(False, "driver not validated yet (no driver-ready)")
    try:
        devices = backend.devices()
    except KubegpuError as exc:
        return Result(False, f"no GPU visible inside the container: {exc}")
    if not devices:
        return Result(False, "no GPU visible inside the container: the toolkit did not inject any")
    return Result(True, f"{len(devices)} GPU(s) visible in a runtime-injected container")


def check_cuda(backend: GpuBackend) -> Result:
    """A CUDA workload can run: a new enough CUDA driver API, and each GPU answers a sample (the vectorAdd step)."""
    try:
        cuda = backend.cuda_driver_version()
        devices = backend.devices()
        for device in devices:
            backend.sample(device.index)
    except KubegpuError as exc:
        return Result(False, f"CUDA workload failed: {exc}")
    if cuda < MIN_CUDA:
        return Result(False, f"CUDA driver API {cuda[0]}.{cuda[1]} is older than {MIN_CUDA[0]}.{MIN_CUDA[1]}")
    return Result(True, f"CUDA {cuda[0]}.{cuda[1]} workload ran on {len(devices)} GPU(s)")


def plugin_resources(node: dict[str, Any]) -> dict[str, int]:
    """GPU resources the Node advertises: `nvidia.com/gpu` (and shared variants) or any `nvidia.com/mig-*`."""
    capacity = ((node.get("status") or {}).get("capacity") or {})
    out = {}
    for name, value in capacity.items():
        if name.startswith(GPU_RESOURCE) or name.startswith(MIG_RESOURCE_PREFIX):
            with contextlib.suppress(ValueError):
                if int(str(value)) > 0:
                    out[name] = int(str(value))
    return out


def check_plugin(node: dict[str, Any], mig_strategy: str = "single") -> Result:
    resources = plugin_resources(node)
    if not resources:
        return Result(False, "the device plugin has not advertised any GPU on this node yet")
    if mig_strategy == "mixed" and not any(name.startswith("nvidia.com/mig-") for name in resources):
        return Result(False, "MIG strategy mixed but no nvidia.com/mig-* resource is advertised")
    listed = ", ".join(f"{k}={v}" for k, v in sorted(resources.items()))
    return Result(True, f"advertised: {listed}", {"DEVICE_PLUGIN_DEVICES": str(sum(resources.values()))})


def check_mig(backend: GpuBackend) -> Result:
    """Every GPU in MIG mode has MIG devices and no mode change waits on a reset (the "no MIG devices after apply"
    and half-applied cases)."""
    try:
        devices = backend.devices()
        pending = [d.index for d in devices if d.mig_pending]
        empty = [d.index for d in devices if d.mig_enabled and not backend.mig_devices(d.index)]
    except KubegpuError as exc:
        return Result(False, f"MIG state unreadable: {exc}")
    if pending:
        return Result(False, f"GPU(s) {pending}: MIG mode change waits for a GPU reset")
    if empty:
        return Result(False, f"GPU(s) {empty}: MIG enabled but no MIG device exists")
    enabled = sum(1 for d in devices if d.mig_enabled)
    return Result(True, f"{enabled} of {len(devices)} GPU(s) in MIG mode, all with MIG devices")


def write_barrier(directory: Path, component: str, result: Result) -> Path:
    path = barrier_path(directory, component)
    directory.mkdir(parents=True, exist_ok=True)
    write_durable(path, "".join(f"{k}={v}\n" for k, v in result.values.items()))
    return path


def remove_barrier(directory: Path, component: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        barrier_path(directory, component).unlink()


def remove_all(directory: Path) -> list[str]:
    """Remove every `*-ready` file (the validator pod's stop): operands wait again until it re-validates."""
    removed = []
    for path in sorted(directory.glob("*-ready")) if directory.is_dir() else []:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
            removed.append(path.name)
    return removed


def read_barrier(directory: Path, component: str) -> dict[str, str] | None:
    """The KEY=value lines of a barrier file; None when it does not exist."""
    path = barrier_path(directory, component)
    if not path.exists():
        return None
    values = {}
    for line in read_text(path).splitlines():
        key, sep, value = line.partition("=")
        if sep:
            values[key.strip()] = value.strip()
    return values


def run_with_retries(check: Callable[[], Result], attempts: int, sleep: Callable[[float], None],
                     interval: float) -> Result:
    """Retry a check (the GPU Operator retries every 5 s) until it passes or the attempts run out."""
    result = check()
    for _ in range(max(0, attempts - 1)):
        if result.ok:
            break
        sleep(interval)
        result = check()
    return result


def environment() -> dict[str, str]:
    return dict(os.environ)
