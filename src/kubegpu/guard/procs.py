"""Which pod and container a host process belongs to, and the MPS limit it runs with: read from /proc.

The driver lists GPU processes by host PID; the kubelet runs every container in a cgroup whose path names the pod's
UID and the container's ID — `/kubepods/burstable/pod<uid>/<container id>` with the cgroupfs driver (cgroup v1 or
v2), `kubepods-burstable-pod<uid with _>.slice/cri-containerd-<id>.scope` with systemd. The parsing is pure; the
reads go through a `/proc` root the DaemonSet mounts from the host (`--proc-root`, tests point it at a directory).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from kubegpu.errors import KubegpuError
from kubegpu.files import read_bytes

_POD_UID = re.compile(r"pod([0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12})")
_CONTAINER = re.compile(r"^(?:[a-z-]+-)?([0-9a-f]{64})(?:\.scope)?$")
_LIMIT = re.compile(r"^(?:\d+=)?(\d+)([MG])B?$", re.IGNORECASE)
MPS_LIMIT_ENV = "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"
_READ_LIMIT = 256 * 1024


@dataclass(frozen=True)
class CgroupOwner:
    pod_uid: str
    container_id: str | None


def owner_from_cgroup(text: str) -> CgroupOwner | None:
    """The pod UID (and container ID, when the path goes that deep) a /proc/PID/cgroup file names; None for a
    process outside any pod (a host daemon, a process of another runtime)."""
    for line in text.splitlines():
        path = line.split(":", 2)[-1]
        match = _POD_UID.search(path)
        if match is None:
            continue
        uid = match.group(1).replace("_", "-")
        tail = path[match.end():].strip("/").split("/")
        leaf = tail[-1] if tail and tail[-1] and not tail[-1].endswith(".slice") else ""
        container = _CONTAINER.match(leaf)
        return CgroupOwner(uid, container.group(1) if container else None)
    return None


def mps_limit_from_environ(data: bytes) -> tuple[bool, int | None]:
    """(found, MiB) of `CUDA_MPS_PINNED_DEVICE_MEM_LIMIT` in a NUL-separated environment ("0=8192M,1=8G" or "8G"):
    the largest per-device limit, since any one device above its share is what matters."""
    for entry in data.split(b"\0"):
        name, sep, value = entry.partition(b"=")
        if sep and name.decode("utf-8", "replace") == MPS_LIMIT_ENV:
            limits = []
            for part in value.decode("utf-8", "replace").split(","):
                match = _LIMIT.match(part.strip())
                if match:
                    limits.append(int(match.group(1)) * (1024 if match.group(2).upper() == "G" else 1))
            return True, (max(limits) if limits else None)
    return False, None


class ProcReader:
    """Reads one process's cgroup and environment under `root` (the host's /proc); a process that is gone or
    unreadable simply has no owner or no known environment."""

    def __init__(self, root: Path | str = "/proc") -> None:
        self.root = Path(root)

    def owner(self, pid: int) -> CgroupOwner | None:
        try:
            data = read_bytes(self.root / str(pid) / "cgroup", limit=_READ_LIMIT)
        except (KubegpuError, OSError):
            return None
        return owner_from_cgroup(data.decode("utf-8", "replace"))

    def mps_limit(self, pid: int) -> tuple[bool, int | None]:
        """(environment readable, MiB or None when the variable is unset)."""
        try:
            data = read_bytes(self.root / str(pid) / "environ", limit=_READ_LIMIT)
        except (KubegpuError, OSError):
            return False, None
        found, limit = mps_limit_from_environ(data)
        return True, (limit if found else None)
