"""The MPS control-daemon adapter both node agents use: `nvidia-cuda-mps-control -d` per daemon plan.

`kubegpu.sharing.mps` (pure) works out the daemons (the device plugin: one per MPS-shared resource; the DRA driver:
one per MPS-shared claim) and the control commands NVIDIA's daemon takes (`set_default_active_thread_percentage`,
`set_default_device_pinned_mem_limit`). `MpsControl` runs them: it starts a daemon with the plan's own
`CUDA_MPS_PIPE_DIRECTORY` / `CUDA_MPS_LOG_DIRECTORY`, sends the limit commands through the control binary's stdin,
and stops it with `quit`. Without the binary (a simulated node, or no `nvidia-cuda-mps-control` on PATH) it
starts nothing; the limits are still recorded in JSON, which is all a simulated node can show.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path

from kubegpu.errors import KubegpuError
from kubegpu.files import write_durable
from kubegpu.sharing.mps import MpsPlan, dumps_limits

log = logging.getLogger("kubegpu.mps")

MPS_CONTROL = "nvidia-cuda-mps-control"
LIMITS_FILE = "kubegpu-mps-limits.json"
STARTED_MARKER = ".started"


def find_mps_control() -> str | None:
    return shutil.which(MPS_CONTROL)


def record_limits(path: Path, plans: Sequence[MpsPlan]) -> Path:
    """The plans' directories, limits and control commands as JSON at `path` (atomically: readers never race)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_durable(path, dumps_limits(plans))  # checksummed: `parse_limits` tells a torn record
    except OSError as exc:
        raise KubegpuError(f"{path}: cannot record MPS limits: {exc.strerror or exc}") from None
    return path


class MpsControl:
    """Starts, configures and stops control daemons (when the binary exists) and records what was set."""

    def __init__(self, mps_root: Path, binary: str | None) -> None:
        """`binary` None: record only (sim backend, or no `nvidia-cuda-mps-control` on PATH)."""
        self.mps_root = mps_root
        self.binary = binary

    def record(self, plans: Sequence[MpsPlan]) -> Path:
        return record_limits(self.mps_root / LIMITS_FILE, plans)

    def _env(self, plan: MpsPlan) -> dict[str, str]:
        return {**os.environ, "CUDA_MPS_PIPE_DIRECTORY": plan.pipe_dir, "CUDA_MPS_LOG_DIRECTORY": plan.log_dir}

    def _control(self, plan: MpsPlan, *args: str, stdin: str | None = None) -> None:
        """Run the control program once. `-d` leaves a daemon behind that may keep whatever output it was given:
        its output goes to a file in the log directory, never a pipe this call would wait on until the timeout."""
        assert self.binary is not None
        try:
            if args == ("-d",):
                out = Path(plan.log_dir) / "control-start.out"
                with open(out, "w") as handle:
                    code = subprocess.run([self.binary, *args], stdin=subprocess.DEVNULL, stdout=handle,
                                          stderr=subprocess.STDOUT, env=self._env(plan), timeout=30).returncode
                if code:
                    raise subprocess.CalledProcessError(code, self.binary, out.read_text(errors="replace"))
            else:
                subprocess.run([self.binary, *args], input=stdin, text=True, env=self._env(plan), check=True,
                               capture_output=True, timeout=30)
        except subprocess.CalledProcessError as exc:
            detail = (exc.stderr or exc.stdout or exc.output or "").strip().splitlines()
            reason = detail[-1] if detail else f"exit status {exc.returncode}"
            raise KubegpuError(f"{self.binary} {' '.join(args) or repr(stdin)} for {plan.resource} failed: "
                               f"{reason}") from None
        except (OSError, subprocess.SubprocessError) as exc:
            raise KubegpuError(f"{self.binary} {' '.join(args) or repr(stdin)} for {plan.resource} failed: {exc}") \
                from None

    def start_daemon(self, plan: MpsPlan) -> bool:
        """Start one daemon in its own directories and set its limits; False when there is no binary. A daemon
        that started but refused a limit is stopped again before the error is raised: none runs unconfigured."""
        if self.binary is None:
            return False
        Path(plan.pipe_dir).mkdir(parents=True, exist_ok=True)
        Path(plan.log_dir).mkdir(parents=True, exist_ok=True)
        self._control(plan, "-d")
        try:
            for command in plan.commands:
                self._control(plan, stdin=command + "\n")
        except KubegpuError:
            self.stop_daemon(plan)
            raise
        (Path(plan.pipe_dir).parent / STARTED_MARKER).touch()
        return True

    def stop_daemon(self, plan: MpsPlan) -> None:
        """Ask the daemon to quit. One that is not running (already stopped, never started, or died) is fine:
        the failure is logged, never raised, so stopping is idempotent."""
        if self.binary is None:
            return
        try:
            self._control(plan, stdin="quit\n")
        except KubegpuError as exc:
            log.warning("%s (taken as already stopped)", exc)
        (Path(plan.pipe_dir).parent / STARTED_MARKER).unlink(missing_ok=True)

    def start(self, plans: Sequence[MpsPlan]) -> bool:
        """Run and configure each daemon; False (nothing started) when the binary is not on PATH."""
        if self.binary is None:
            log.info("%s not found on PATH; recording the limits only", MPS_CONTROL)
            return False
        for plan in plans:
            self.start_daemon(plan)
        (self.mps_root / ".ready").touch()
        return True

    def stop(self, plans: Sequence[MpsPlan]) -> None:
        if self.binary is None:
            return
        for plan in plans:
            self.stop_daemon(plan)
        (self.mps_root / ".ready").unlink(missing_ok=True)


__all__ = ["LIMITS_FILE", "MPS_CONTROL", "MpsControl", "find_mps_control", "record_limits"]
