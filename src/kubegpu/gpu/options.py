"""The `--gpu-backend` option every node-side command takes, defined once so its spelling, environment variable,
default and help text are the same everywhere (`kubegpu.gpu.backend.open_backend` parses the value)."""

from __future__ import annotations

from typing import Any

from kubegpu.cliopts import checked_option

GPU_BACKEND_ENV = "KUBEGPU_GPU_BACKEND"
GPU_BACKEND_HELP = "GPU access: 'nvml' (the driver, through NVML) or 'sim:PATH' (a simulated node's state file)."


def gpu_backend_option() -> Any:
    """A fresh typer option for a command's `gpu_backend: str` parameter (typer options must not be shared)."""
    return checked_option("nvml", "--gpu-backend", check=check_gpu_backend, envvar=GPU_BACKEND_ENV,
                          metavar="nvml|sim:PATH", help=GPU_BACKEND_HELP)


def check_gpu_backend(value: str) -> str:
    """The spellings `open_backend` accepts, checked when the flag is parsed (exit 2 naming the flag)."""
    if value != "nvml" and not (value.startswith("sim:") and len(value) > len("sim:")):
        raise ValueError(f"expected 'nvml' or 'sim:PATH', got {value!r}")
    return value
