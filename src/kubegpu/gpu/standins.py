"""Stand-in device nodes for a simulated GPU node, so a real container runtime can inject its GPUs.

A container runtime applying a CDI spec stats every `hostPath` it names and creates the node in the container from
it; a simulated node's `/dev/nvidia0` does not exist on the host, so containerd would refuse the container. Each
file-backed simulated node therefore gets a directory of its own next to its file (`<file>.dev/`) holding character
devices that stand in for the driver's (`nvidia0`, `nvidiactl`, `nvidia-caps/nvidia-cap12`, ...): aliases of
/dev/null (major 1, minor 3), harmless to open, made with mknod. The CDI specs written for the node point `hostPath`
there while `path` stays `/dev/nvidia*`, so the container sees exactly what it would on a GPU host. The host's
/dev is never touched. Creating a character device needs CAP_MKNOD (root); without it the error says so in one line.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from kubegpu.errors import KubegpuError

SUFFIX = ".dev"
STAND_IN_DEVICE = (1, 3)  # /dev/null's numbers: opening, reading or writing a stand-in does nothing
DEV_PREFIX = "/dev/"


def stand_in_dir(node_file: Path | str) -> Path:
    """`<node file>.dev`: the stand-in directory of the simulated node stored in ``node_file``."""
    return Path(f"{node_file}{SUFFIX}")


def for_backend(backend: Any) -> Path | None:
    """The stand-in directory of a file-backed simulated node; None for real hardware (NVML) or an in-memory node,
    whose CDI specs keep naming the host's own /dev nodes."""
    from kubegpu.gpu.simulated import SimulatedBackend

    if isinstance(backend, SimulatedBackend) and backend.path is not None:
        return stand_in_dir(backend.path.resolve())
    return None


def stand_in_path(directory: Path | str, container_path: str) -> str:
    """The stand-in for a container path: `/dev/nvidia-caps/nvidia-cap12` -> `<directory>/nvidia-caps/nvidia-cap12`."""
    if not container_path.startswith(DEV_PREFIX):
        raise KubegpuError(f"{container_path}: a simulated GPU only stands in for device nodes under /dev")
    relative = container_path[len(DEV_PREFIX):]
    if not relative or ".." in Path(relative).parts:
        raise KubegpuError(f"{container_path}: not a device node path")
    return f"{str(directory).rstrip('/')}/{relative}"


def ensure(directory: Path, container_paths: Iterable[str]) -> list[Path]:
    """Make the stand-in of every container path that lacks one; returns the nodes created. An existing entry that
    is not a character device, or a node that may not be made (no CAP_MKNOD, read-only file system), is one
    KubegpuError line naming it."""
    created = []
    for container_path in dict.fromkeys(container_paths):
        target = Path(stand_in_path(directory, container_path))
        try:
            mode = target.lstat().st_mode
        except FileNotFoundError:
            _mknod(target)
            created.append(target)
            continue
        except OSError as exc:
            raise KubegpuError(f"{target}: cannot check the simulated GPU's stand-in device: "
                               f"{exc.strerror or exc}") from None
        if not stat.S_ISCHR(mode):
            raise KubegpuError(f"{target}: exists but is not a character device; remove it so the simulated GPU's "
                               "stand-in can be made there")
    return created


def _mknod(target: Path) -> None:
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        os.mknod(target, 0o666 | stat.S_IFCHR, os.makedev(*STAND_IN_DEVICE))
        os.chmod(target, 0o666)  # the umask must not leave a stand-in a non-root container cannot open
    except FileExistsError:
        return  # another agent of the same node made it first
    except OSError as exc:
        why = exc.strerror or str(exc)
        if exc.errno == errno.EPERM:
            why += " (making a character device needs root: CAP_MKNOD)"
        raise KubegpuError(f"{target}: cannot create the simulated GPU's stand-in device node "
                           f"(mknod c {STAND_IN_DEVICE[0]} {STAND_IN_DEVICE[1]}): {why}") from None


def remove(directory: Path) -> None:
    """Remove a stand-in directory (the node file's owner does, with the file)."""
    import shutil

    with contextlib.suppress(FileNotFoundError):
        shutil.rmtree(directory)
