"""The MPS control-daemon side: one `nvidia-cuda-mps-control` per MPS-shared resource, with default limits.

`kubegpu.sharing.mps.mps_plans` (pure) works out which daemons to run and the control commands NVIDIA's daemon
sends (`set_default_active_thread_percentage`, `set_default_device_pinned_mem_limit`). `MpsControl` (adapter) runs
them when the binary exists, and always records the limits in a JSON file, which is all the sim backend can do.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path

from kubegpu.errors import KubegpuError
from kubegpu.files import write_durable
from kubegpu.sharing.mps import MpsPlan, limits_document, plans_for

log = logging.getLogger("kubegpu.mps")

MPS_CONTROL = "nvidia-cuda-mps-control"
LIMITS_FILE = "kubegpu-mps-limits.json"


def find_mps_control() -> str | None:
    return shutil.which(MPS_CONTROL)


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
            write_durable(path, json.dumps(limits_document(plans), indent=2))  # unique temp: writers never race
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


__all__ = ["MpsControl", "MpsPlan", "find_mps_control", "plans_for"]
