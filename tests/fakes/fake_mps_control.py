"""A fake `nvidia-cuda-mps-control` for tests: an executable script that logs every invocation (arguments, stdin,
the pipe and log directories from its environment) as one JSON line, and behaves like the real control program as
far as the adapters can tell: `-d` starts a daemon for its pipe directory (refused while one runs there), commands
on stdin need a running daemon, `quit` stops it. "Running" is a `control` file in the pipe directory, as the real
daemon keeps its control pipe there. `FAKE_MPS_FAIL=<text>` makes any invocation whose arguments or stdin contain
that text fail; `FAKE_MPS_LINGER=1` leaves a child behind at `-d` that holds on to its stdout and stderr."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

SCRIPT = '''#!{python}
import json, os, sys
args = sys.argv[1:]
stdin = "" if args else sys.stdin.read()
pipe, log = os.environ.get("CUDA_MPS_PIPE_DIRECTORY", ""), os.environ.get("CUDA_MPS_LOG_DIRECTORY", "")
with open({log_path!r}, "a") as out:
    out.write(json.dumps({{"args": args, "stdin": stdin.strip(), "pipe": pipe, "log": log}}) + "\\n")
control = os.path.join(pipe, "control")
fail = os.environ.get("FAKE_MPS_FAIL")
if fail and (fail in " ".join(args) or fail in stdin):
    sys.exit("injected failure")
if args == ["-d"]:
    if os.path.exists(control):
        sys.exit("An instance of this daemon is already running")
    open(control, "w").close()
    if os.environ.get("FAKE_MPS_LINGER"):  # like a daemon that keeps the output it was started with
        import subprocess
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3)"])
elif not os.path.exists(control):
    sys.exit("Cannot find MPS control daemon process")
elif stdin.strip() == "quit":
    os.unlink(control)
'''


def install(directory: Path) -> tuple[Path, Path]:
    """Write the fake as `<directory>/nvidia-cuda-mps-control`; returns (binary, invocation log)."""
    directory.mkdir(parents=True, exist_ok=True)
    binary = directory / "nvidia-cuda-mps-control"
    log_path = directory / "mps-invocations.jsonl"
    binary.write_text(SCRIPT.format(python=sys.executable, log_path=str(log_path)))
    binary.chmod(0o755)
    return binary, log_path


def invocations(log_path: Path) -> list[dict[str, Any]]:
    if not log_path.exists():
        return []
    return [json.loads(line) for line in log_path.read_text().splitlines()]


def running(pipe_dir: str | Path) -> bool:
    return (Path(pipe_dir) / "control").exists()
