"""The processes a control plane (and its real node) recorded in DIR/pids: read them back, tell ours from a
recycled pid, and stop them (SIGTERM to the process group, SIGKILL after a timeout), leaving no zombie."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

from kubegpu.errors import KubegpuError

log = logging.getLogger("kubegpu.testing.controlplane")

PIDS = "pids"
STOP_TIMEOUT_S = 15.0
EXEC_GRACE_S = 0.1  # how long an empty command line is taken for an exec still under way (`is_ours`)


def read_pids(directory: Path) -> list[tuple[int, str, str]]:
    """`PID NAME BINARY` per line of DIR/pids; none when the file does not exist."""
    try:
        lines = (directory / PIDS).read_text().splitlines()
    except FileNotFoundError:
        return []
    entries = []
    for number, line in enumerate(lines, 1):
        parts = line.split(maxsplit=2)
        if len(parts) != 3 or not parts[0].isdigit():
            raise KubegpuError(f"{directory / PIDS}:{number}: expected `PID NAME BINARY`, got {line!r}")
        entries.append((int(parts[0]), parts[1], parts[2]))
    return entries


def is_ours(pid: int, binary: str) -> bool:
    """The pid is alive and still runs the binary we started (not a recycled pid, not a zombie).

    A process caught in the middle of its exec has no command line yet: the kernel closes the close-on-exec pipe
    that lets `Popen` return before it maps the new program's arguments. So an empty one is read again for a
    moment rather than taken for a stranger, which would leave a process just started running after `down`."""
    deadline = time.monotonic() + EXEC_GRACE_S
    while True:
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            return False
        if argv != [b""] or state == "Z" or time.monotonic() >= deadline:
            break
        time.sleep(0.001)
    # argv[0] for a binary; argv[1] when the kernel ran it through a `#!` interpreter
    return binary.encode() in argv[:2] and state != "Z"


def live_pids(directory: Path) -> list[tuple[int, str]]:
    return [(pid, name) for pid, name, binary in read_pids(directory) if is_ours(pid, binary)]


def stop(pid: int, binary: str, name: str, timeout: float = STOP_TIMEOUT_S) -> None:
    """SIGTERM one recorded process (its process group), SIGKILL after `timeout`; returns once it is gone."""
    stop_all([(pid, name, binary)], timeout)


def signal_group(pid: int, signum: int) -> None:
    """Signal the process and whatever it started: each component leads its own process group (`up` started it
    with a new session), so the group holds only processes of ours."""
    try:
        if os.getpgid(pid) == pid:
            os.killpg(pid, signum)
        else:
            os.kill(pid, signum)
    except (ProcessLookupError, PermissionError):
        pass


def reap(pid: int) -> None:
    """Collect an exit status when the process is our own child (the fixture's case), so it leaves no zombie."""
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)


def stop_all(entries: Sequence[tuple[int, str, str]], timeout: float = STOP_TIMEOUT_S) -> None:
    """Stop several recorded processes together: SIGTERM all, then wait for each (SIGKILL after `timeout`, then wait
    again), so a stage of clients takes one timeout at most, not one per process."""
    for pid, _, binary in entries:
        if is_ours(pid, binary):
            signal_group(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    for pid, name, binary in entries:
        _wait_gone(pid, binary, deadline)
        if is_ours(pid, binary):
            log.warning("%s (pid %d) ignored SIGTERM for %.0fs; killing it", name, pid, timeout)
            signal_group(pid, signal.SIGKILL)
            _wait_gone(pid, binary, time.monotonic() + timeout)
        reap(pid)


def _wait_gone(pid: int, binary: str, deadline: float) -> None:
    while is_ours(pid, binary) and time.monotonic() < deadline:
        reap(pid)
        time.sleep(0.05)


def unix_socket_owners(directory: Path) -> list[tuple[Path, int, str]]:
    """(socket path, pid, command line) for each Unix socket bound under `directory` and held open by a process:
    /proc/net/unix names the bound path and inode, /proc/PID/fd links to `socket:[inode]`."""
    inodes: dict[str, Path] = {}
    with contextlib.suppress(OSError), open("/proc/net/unix") as table:
        for line in table.readlines()[1:]:
            parts = line.split()
            if len(parts) >= 8 and parts[7].startswith(f"{directory}/"):
                inodes[parts[6]] = Path(parts[7])
    owners = []
    for entry in os.listdir("/proc") if inodes else []:
        if not entry.isdigit():
            continue
        with contextlib.suppress(OSError):
            for fd in os.listdir(f"/proc/{entry}/fd"):
                target = os.readlink(f"/proc/{entry}/fd/{fd}")
                inode = target[len("socket:["):-1] if target.startswith("socket:[") else ""
                if inode in inodes:
                    cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
                    owners.append((inodes[inode], int(entry), cmdline))
    return owners


def parent_pid(pid: int) -> int | None:
    """The process's parent (None when it is gone): 1 for an orphan whose starter died without stopping it."""
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def stop_orphans_serving(directory: Path, marker: str = "kubegpu") -> list[tuple[Path, int, str]]:
    """Stop the orphaned processes (parent 1, `marker` in the command line: an agent whose test run was killed)
    that serve a Unix socket under `directory`; returns the other owners, which are not ours to stop."""
    foreign = []
    for path, pid, cmdline in unix_socket_owners(directory):
        if parent_pid(pid) == 1 and marker in cmdline:
            log.warning("stopping an orphaned process serving %s (pid %d: %s)", path, pid, cmdline)
            stop(pid, cmdline.split()[0], "orphan")
        else:
            foreign.append((path, pid, cmdline))
    return foreign


def stop_child(process: subprocess.Popen[bytes], timeout: float = STOP_TIMEOUT_S,
               signum: int = signal.SIGTERM) -> None:
    """Signal (SIGTERM) a child started with its own session (its process group), SIGKILL after `timeout`; always
    reaps it. For processes a test or benchmark spawned itself, not the ones a control plane recorded in DIR/pids."""
    if process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signum)
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout)
