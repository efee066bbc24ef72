"""The `--gpu-backend` option every node-side command takes, defined once so its spelling, environment variable,
default and help text are the same everywhere (`kubegpu.gpu.backend.open_backend` parses the value)."""

from __future__ import annotations

from typing import Any

import typer

GPU_BACKEND_ENV = "KUBEGPU_GPU_BACKEND"
GPU_BACKEND_HELP = "GPU access: 'nvml' (the driver, through NVML) or 'sim:PATH' (a simulated node's state file)."


def gpu_backend_option() -> Any:
    """A fresh typer option for a command's `gpu_backend: str` parameter (typer options must not be shared)."""
    return typer.Option("nvml", "--gpu-backend", envvar=GPU_BACKEND_ENV, help=GPU_BACKEND_HELP)
