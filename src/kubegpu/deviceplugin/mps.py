"""The MPS control-daemon side: one `nvidia-cuda-mps-control` per MPS-shared resource, with default limits.

`mps_plans` (pure) works out, from the same resource accounting the plugin serves, which daemons to run and the
control commands NVIDIA's daemon sends (`set_default_active_thread_percentage`, `set_default_device_pinned_mem_limit`).
`MpsControl` (adapter) runs them when the binary exists, and always records the limits in a JSON file, which is
all the sim backend can do.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from kubegpu.deviceplugin.resources import AnnotatedDevice, config_dict, devices_by_resource
from kubegpu.errors import KubegpuError

log = logging.getLogger("kubegpu.mps")

MPS_CONTROL = "nvidia-cuda-mps-control"
LIMITS_FILE = "kubegpu-mps-limits.json"


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
            if d.sharing != "mps" or d.gpu_index in per_gpu:
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
    mps_root = str((data.get("flags") or {}).get("mpsRoot") or "/run/nvidia/mps")
    return mps_plans(devices_by_resource(gpus, mig, data), mps_root)


def find_mps_control() -> str | None:
    return shutil.which(MPS_CONTROL)


def limits_document(plans: Sequence[MpsPlan]) -> dict[str, Any]:
    return {
        "daemons": [
            {"resource": p.resource, "pipeDirectory": p.pipe_dir, "logDirectory": p.log_dir, "commands": p.commands,
             "gpus": [asdict(g) for g in p.gpus]}
            for p in plans
        ]
    }


class MpsControl:
    """Starts and configures the daemons (when the binary exists) and records what was set."""

    def __init__(self, mps_root: Path, binary: str | None) -> None:
        """`binary` None: record only (sim backend, or no `nvidia-cuda-mps-control` on PATH)."""
        self.mps_root = mps_root
        self.binary = binary

    def record(self, plans: Sequence[MpsPlan]) -> Path:
        path = self.mps_root / LIMITS_FILE
        try:
            self.mps_root.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(".tmp")
            tmp.write_text(json.dumps(limits_document(plans), indent=2))
            os.replace(tmp, path)
        except OSError as exc:
            raise KubegpuError(f"{path}: cannot record MPS limits: {exc.strerror or exc}") from None
        return path

    def _env(self, plan: MpsPlan) -> dict[str, str]:
        return {**os.environ, "CUDA_MPS_PIPE_DIRECTORY": plan.pipe_dir, "CUDA_MPS_LOG_DIRECTORY": plan.log_dir}

    def _control(self, plan: MpsPlan, *args: str, stdin: str | None = None) -> None:
        assert self.binary is not None
        try:
            subprocess.run([self.binary, *args], input=stdin, text=True, env=self._env(plan), check=True,
                           capture_output=True, timeout=30)
        except (OSError, subprocess.SubprocessError) as exc:
            raise KubegpuError(f"{self.binary} {' '.join(args) or stdin!r} for {plan.resource} failed: {exc}") from None

    def start(self, plans: Sequence[MpsPlan]) -> bool:
        """Run and configure each daemon; False (nothing started) when the binary is not on PATH."""
        if self.binary is None:
            log.info("%s not found on PATH; recording the limits only", MPS_CONTROL)
            return False
        for plan in plans:
            Path(plan.pipe_dir).mkdir(parents=True, exist_ok=True)
            Path(plan.log_dir).mkdir(parents=True, exist_ok=True)
            self._control(plan, "-d")
            for command in plan.commands:
                self._control(plan, stdin=command + "\n")
            (Path(plan.pipe_dir).parent / ".started").touch()
        (self.mps_root / ".ready").touch()
        return True

    def stop(self, plans: Sequence[MpsPlan]) -> None:
        if self.binary is None:
            return
        for plan in plans:
            try:
                self._control(plan, stdin="quit\n")
            except KubegpuError as exc:
                log.error("%s", exc)
        (self.mps_root / ".ready").unlink(missing_ok=True)
