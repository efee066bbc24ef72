"""Run the real `kubegpu` command as a user would: `python -m kubegpu ...` in a subprocess.

Shared by the end-to-end tests. `invoke()` runs short commands through the same app in-process, where a cold start
per call would only cost time (Python start-up plus imports is ~1 s here). Long-running commands are started with
`start()` and always stopped with `stop()` (SIGTERM, then SIGKILL), so a failing test never leaves a device plugin
or an exporter behind.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"

# Wide, colourless output: help text and tables must not wrap flag names or carry escape codes.
ENV = {**os.environ, "COLUMNS": "250", "NO_COLOR": "1", "TERM": "dumb", "PYTHONUNBUFFERED": "1"}
for _name in ("KUBEGPU_GPU_BACKEND", "CONFIG_FILE", "MIG_STRATEGY", "NODE_NAME", "KUBELET_SOCKET"):
    ENV.pop(_name, None)  # a developer's shell must not change what the commands do here


def kubegpu(*args: str | Path, cwd: Path = REPO, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """Run one `kubegpu` command to completion; stdout and stderr are captured as text."""
    return subprocess.run(
        [sys.executable, "-m", "kubegpu", *map(str, args)],
        cwd=cwd, env=ENV, capture_output=True, text=True, timeout=timeout, check=False,
    )


def ok(*args: str | Path, cwd: Path = REPO, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """Like `kubegpu`, but the command must succeed; the failure message carries its output."""
    result = kubegpu(*args, cwd=cwd, timeout=timeout)
    assert result.returncode == 0, f"kubegpu {' '.join(map(str, args))} -> {result.returncode}\n{result.stderr}"
    return result


def start(*args: str | Path, cwd: Path, log: Path) -> subprocess.Popen[bytes]:
    """Start a long-running `kubegpu` command; its output goes to `log` (a pipe nobody reads could block it)."""
    with log.open("wb") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "kubegpu", *map(str, args)],
            cwd=cwd, env=ENV, stdout=out, stderr=subprocess.STDOUT,
        )


def stop(process: subprocess.Popen[bytes]) -> int:
    """SIGTERM, then SIGKILL after 5 s; returns the exit status."""
    if process.poll() is None:
        process.terminate()
        try:
            return process.wait(5)
        except subprocess.TimeoutExpired:
            process.kill()
    return process.wait(5)


def free_port() -> int:
    """A loopback port nobody listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def invoke(*args: str | Path, expect: int = 0) -> InProcessResult:
    """Run a short `kubegpu` command in this process (the same app, no cold start); check its exit status."""
    from typer.testing import CliRunner

    from kubegpu.cli import app

    result = CliRunner().invoke(app, [str(a) for a in args], env={"COLUMNS": "250", "NO_COLOR": "1"})
    assert result.exit_code == expect, (
        f"kubegpu {' '.join(map(str, args))} -> {result.exit_code}, wanted {expect}\n{result.output}")
    return InProcessResult(result.stdout, result.stderr)


@dataclass(frozen=True)
class InProcessResult:
    stdout: str
    stderr: str
