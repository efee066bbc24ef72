"""A real node beside the control plane: containerd and a real kubelet registered as Node `real-node-0`.

`start` (called by `controlplane.up(..., real_node=True)`) takes the machine-wide lock /tmp/kubegpu-real-node.lock —
the kubelet hard-wires /var/lib/kubelet/device-plugins, so only one real node can run per machine — and hands it to
a tiny holder process listed in DIR/pids, so the lock is held exactly as long as the node is up. It writes
containerd's, CNI's and the kubelet's configuration (`kubegpu.testing.nodeconfig`), starts containerd, imports the
test and pause images into its `k8s.io` namespace, creates the simulated node file DIR/real-node-0.json, starts the
kubelet and returns once the Node is Ready; kubegpu's DeviceClasses are applied so claims can name them.

`teardown` (called first by `controlplane.down`) stops the kubelet, kills every container of this containerd and its
shims, stops containerd, unmounts everything under DIR, removes what the kubelet wrote outside DIR (the entries it
added to /var/lib/kubelet/device-plugins, its /var/log/containers symlinks, /var/log/pods when it made it), the CNI
bridge and the kubelet's pod cgroups, and releases the lock. What existed before `start` is recorded in
DIR/real-node.json, so nothing of anyone else's is removed.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import json
import logging
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kubegpu.errors import KubegpuError
from kubegpu.kube.resources import ResourceKind, register_kind
from kubegpu.testing import nodebuild, nodeimages
from kubegpu.testing.nodeconfig import (
    BRIDGE,
    CNI_BIN_DIR,
    CNI_PLUGINS,
    NODE_IP,
    NODE_NAME,
    NodePaths,
    cni_conflist,
    containerd_config,
    kubelet_args,
    kubelet_config,
)
from kubegpu.testing.processes import stop_orphans_serving

if TYPE_CHECKING:
    from kubegpu.testing.controlplane import _Launcher

log = logging.getLogger("kubegpu.testing.realnode")

DEVICE_CLASS = register_kind(ResourceKind("DeviceClass", "resource.k8s.io", "v1", "deviceclasses", namespaced=False,
                                          status_subresource=False, strategic_merge=False))

LOCK_PATH = Path(os.environ.get("KUBEGPU_REAL_NODE_LOCK", "/tmp/kubegpu-real-node.lock"))
LOCK_WAIT_S = float(os.environ.get("KUBEGPU_REAL_NODE_LOCK_WAIT", "1800"))
DEVICE_PLUGIN_DIR = Path("/var/lib/kubelet/device-plugins")
CONTAINER_LOGS = Path("/var/log/containers")
POD_LOGS = Path("/var/log/pods")
SHIM_SOCKETS = Path("/run/containerd")  # containerd 2.x puts shim sockets under /run/containerd/s, whatever its state
CGROUP_ROOT = Path("/sys/fs/cgroup")
STATE = "real-node.json"
DEFAULT_GPUS = "2xA100-SXM4-80GB"
LOCK_HOLDER = "real-node-lock"
CONTAINERD_READY_S = 30.0
NODE_READY_S = 90.0
STOP_S = 15.0


class RealNodeError(KubegpuError):
    """The real node cannot start here (no root, missing binaries or packages) or one of its parts failed."""


@dataclass
class RealNode:
    """A running real node: Node `name`, its paths, and the images its pods can use without a registry."""

    paths: NodePaths
    name: str = NODE_NAME
    gpus: str = DEFAULT_GPUS
    test_image: str = nodeimages.TEST_IMAGE
    pause_image: str = nodeimages.PAUSE_IMAGE
    bins: Path | None = None

    @property
    def node_file(self) -> Path:
        return self.paths.node_file

    @property
    def gpu_backend(self) -> str:
        """`--gpu-backend` for kubegpu's node agents on this node."""
        return f"sim:{self.paths.node_file}"


def unavailable_reason() -> str | None:
    """Why a real node cannot start on this machine (one line), or None when it can."""
    if os.geteuid() != 0:
        return "a real node needs root (containerd, runc, mounts, device nodes)"
    try:
        missing = nodebuild.missing()
    except KubegpuError as exc:
        return str(exc)
    if missing:
        return (f"{nodebuild.node_dir()}: missing {', '.join(missing)} "
                "(run `scripts/control-plane.sh build`)")
    absent = [p for p in CNI_PLUGINS if not (CNI_BIN_DIR / p).is_file()]
    if absent:
        return (f"{CNI_BIN_DIR}: no CNI plugin {', '.join(absent)} "
                "(apt-get install containernetworking-plugins)")
    return None


# ------------------------------------------------------------------------------------------------------------ lock


def _acquire_lock(directory: Path) -> int:
    """The machine-wide lock, waiting (with one message naming the holder) while another real node is up."""
    fd = os.open(LOCK_PATH, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = LOCK_PATH.read_text(errors="replace").strip() or "unknown"
        log.warning("waiting for %s: another real node is up (%s); `scripts/control-plane.sh down DIR` stops it "
                    "(giving up after %.0fs)", LOCK_PATH, holder, LOCK_WAIT_S)
        deadline = time.monotonic() + LOCK_WAIT_S
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    os.close(fd)
                    raise RealNodeError(f"{LOCK_PATH}: another real node is still up after {LOCK_WAIT_S:.0f}s "
                                        f"({holder}); only one kubelet can run per machine") from None
                time.sleep(0.5)
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"pid {os.getpid()}, directory {directory}\n".encode(), 0)
    return fd


def _hand_lock_to_holder(fd: int, launcher: _Launcher) -> None:
    """A `sleep` that inherits the locked descriptor keeps the lock until `teardown` stops it (or it dies)."""
    sleep = shutil.which("sleep") or "/bin/sleep"
    launcher.start(LOCK_HOLDER, ["infinity"], binary=Path(sleep), pass_fds=(fd,))


# ----------------------------------------------------------------------------------------------------------- start


def preflight(directory: Path, gpus: str) -> int:
    """Check that a real node can start here and take the machine-wide lock (waiting while another node is up);
    returns the locked descriptor for `start`. Called before the control plane starts, so a wait costs nothing."""
    from kubegpu.gpu.simulated import parse_gpu_spec

    parse_gpu_spec(gpus)  # a bad --gpus fails before anything starts
    if reason := unavailable_reason():
        raise RealNodeError(reason)
    fd = _acquire_lock(directory)
    for path, pid, cmdline in stop_orphans_serving(DEVICE_PLUGIN_DIR):  # would register with our kubelet
        os.close(fd)
        raise RealNodeError(f"{path}: served by pid {pid} ({cmdline}); stop it before a real node starts here")
    return fd


def start(launcher: _Launcher, lock_fd: int, kubeconfig: Path, ca_cert: Path, feature_gates: list[str],
          gpus: str = DEFAULT_GPUS) -> RealNode:
    """Start containerd and the kubelet in ``launcher``'s directory; returns once the Node is Ready. ``lock_fd``
    (from `preflight`) passes to the lock holder and is closed here."""
    from kubegpu.gpu.simulated import SimulatedBackend

    directory = launcher.directory
    paths = NodePaths(directory)
    bins = nodebuild.bin_dir()
    try:
        _record_outside_state(paths)
        _hand_lock_to_holder(lock_fd, launcher)
    finally:
        os.close(lock_fd)
    began = time.monotonic()
    SimulatedBackend.create(paths.node_file, gpus, node_name=NODE_NAME)
    for path in (paths.containerd, paths.cni_conf_dir, paths.cni_data_dir, paths.cdi_dir, paths.kubelet_root,
                 paths.pod_logs):
        path.mkdir(parents=True, exist_ok=True)
    _add_node_ip()
    paths.containerd_config.write_text(containerd_config(paths, bins / "runc"))
    (paths.cni_conf_dir / "10-kubegpu.conflist").write_text(cni_conflist(paths))
    env = {**os.environ, "PATH": f"{bins}:{os.environ.get('PATH', '/usr/sbin:/usr/bin:/sbin:/bin')}"}
    launcher.start("containerd", [f"--config={paths.containerd_config}"], binary=bins / "containerd", env=env)
    _wait_containerd(launcher, paths, bins)
    _import_images(paths, bins)
    from kubegpu.testing.controlplane import free_port

    paths.kubelet_config.write_text(kubelet_config(paths, ca_cert, free_port(), free_port(), feature_gates))
    launcher.start("kubelet", kubelet_args(paths, kubeconfig), binary=bins / "kubelet", env=env)
    node = RealNode(paths, gpus=gpus, bins=bins)
    paths.images_file.write_text(f"TEST_IMAGE={node.test_image}\nPAUSE_IMAGE={node.pause_image}\n")
    _wait_node_ready(launcher, kubeconfig)
    _apply_device_classes(kubeconfig)
    launcher.timings["real-node"] = round(time.monotonic() - began, 2)
    log.info("real node %s Ready in %.1fs (containerd %s, kubelet root %s)", NODE_NAME, launcher.timings["real-node"],
             paths.containerd_socket, paths.kubelet_root)
    return node


def _add_node_ip() -> None:
    result = subprocess.run(["ip", "address", "add", f"{NODE_IP}/32", "dev", "lo"], capture_output=True, text=True,
                            timeout=15, check=False)
    if result.returncode != 0 and "File exists" not in result.stderr:
        raise RealNodeError(f"ip address add {NODE_IP}/32 dev lo: {result.stderr.strip()}")


def _has_node_ip() -> bool:
    result = subprocess.run(["ip", "-4", "-o", "address", "show", "dev", "lo"], capture_output=True, text=True,
                            timeout=15, check=False)
    return f" {NODE_IP}/" in result.stdout


def _ctr(paths: NodePaths, bins: Path, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(bins / "ctr"), f"--address={paths.containerd_socket}", "--namespace=k8s.io", *args],
                          capture_output=True, text=True, timeout=timeout, check=False)


def _wait_containerd(launcher: _Launcher, paths: NodePaths, bins: Path) -> None:
    deadline = time.monotonic() + CONTAINERD_READY_S
    while time.monotonic() < deadline:
        if launcher.processes["containerd"].poll() is not None:
            launcher._fail("containerd", "exited")
        if paths.containerd_socket.exists() and _ctr(paths, bins, "version", timeout=5).returncode == 0:
            return
        time.sleep(0.2)
    launcher._fail("containerd", f"not serving {paths.containerd_socket} after {CONTAINERD_READY_S:.0f}s")


def _import_images(paths: NodePaths, bins: Path) -> None:
    images = nodebuild.images_dir()
    for tar in (nodeimages.PAUSE_TAR, nodeimages.TEST_TAR):
        result = _ctr(paths, bins, "images", "import", str(images / tar), timeout=120)
        if result.returncode != 0:
            raise RealNodeError(f"ctr images import {images / tar}: {result.stderr.strip()[-400:]}")


def _wait_node_ready(launcher: _Launcher, kubeconfig: Path) -> None:
    from kubegpu.kube.errors import NotFound
    from kubegpu.testing.kubeconfig import admin_cluster
    from kubegpu.testing.kwoknodes import is_ready

    cluster = admin_cluster(kubeconfig)
    deadline = time.monotonic() + NODE_READY_S
    while time.monotonic() < deadline:
        if launcher.processes["kubelet"].poll() is not None:
            launcher._fail("kubelet", "exited")
        with contextlib.suppress(NotFound):
            if is_ready(cluster.get("Node", NODE_NAME)):
                return
        time.sleep(0.2)
    launcher._fail("kubelet", f"Node {NODE_NAME} not Ready after {NODE_READY_S:.0f}s")


def _apply_device_classes(kubeconfig: Path) -> None:
    """kubegpu's DeviceClasses (`gpu.nvidia.com`, `mig.nvidia.com`, ...), so claims on the node can name them."""
    from kubegpu.dra.classes import shipped_class_objects
    from kubegpu.kube.errors import Conflict
    from kubegpu.testing.kubeconfig import admin_cluster

    cluster = admin_cluster(kubeconfig)
    for obj in shipped_class_objects():
        try:
            cluster.create(obj)
        except Conflict:  # AlreadyExists: someone applied them first
            cluster.patch("DeviceClass", obj["metadata"]["name"], {"spec": obj["spec"]})


# ------------------------------------------------------------------------------------------------- outside state


def _record_outside_state(paths: NodePaths) -> None:
    """What exists outside DIR before the kubelet runs, so `teardown` removes only what it added."""
    entries = sorted(p.name for p in DEVICE_PLUGIN_DIR.iterdir()) if DEVICE_PLUGIN_DIR.is_dir() else None
    state = {
        "device_plugin_dir_entries": entries,
        "var_lib_kubelet": DEVICE_PLUGIN_DIR.parent.exists(),
        "var_log_pods": POD_LOGS.exists(),
        "var_log_containers": CONTAINER_LOGS.exists(),
        "shim_socket_root": SHIM_SOCKETS.exists(),
        "node_ip": _has_node_ip(),
        "kubepods_cgroups": sorted(str(p) for p in _kubepods_cgroups()),
    }
    (paths.directory / STATE).write_text(json.dumps(state, indent=2) + "\n")


def _kubepods_cgroups() -> list[Path]:
    if not CGROUP_ROOT.is_dir():
        return []
    found = [CGROUP_ROOT / c / "kubepods" for c in os.listdir(CGROUP_ROOT)]
    found.append(CGROUP_ROOT / "unified" / "kubepods")
    return [p for p in found if p.is_dir()]


# -------------------------------------------------------------------------------------------------------- teardown


def teardown(directory: Path, entries: list[tuple[int, str, str]]) -> list[str]:
    """Stop the real node started in ``directory`` (``entries``: DIR/pids as (pid, name, binary)) and remove
    everything it left: containers, shims, mounts, the kubelet's files outside DIR, the bridge, pod cgroups, the
    lock. Harmless when no real node was started there or it is already down. Returns the names stopped."""
    from kubegpu.testing.processes import is_ours as _is_ours
    from kubegpu.testing.processes import stop as _stop

    paths = NodePaths(directory)
    state_file = directory / STATE
    if not state_file.exists():
        return []
    ours = {name: (pid, binary) for pid, name, binary in entries if _is_ours(pid, binary)}
    stopped = []
    if "kubelet" in ours:
        _stop(*ours["kubelet"], "kubelet")
        stopped.append("kubelet")
    bins = nodebuild.bin_dir()
    if "containerd" in ours and (bins / "ctr").is_file():
        _remove_tasks(paths, bins)
    _kill_shims(paths)
    if "containerd" in ours:
        _stop(*ours["containerd"], "containerd")
        stopped.append("containerd")
    _unmount_under(directory)
    try:
        state = json.loads(state_file.read_text())
    except (OSError, ValueError):
        state = {}
    _clean_outside(paths, state)
    if LOCK_HOLDER in ours:
        _stop(*ours[LOCK_HOLDER], LOCK_HOLDER)
    state_file.unlink(missing_ok=True)
    return stopped


def _remove_tasks(paths: NodePaths, bins: Path) -> None:
    """Kill and delete every task (containers and pod sandboxes) through containerd, which unmounts their rootfs."""
    listed = _ctr(paths, bins, "tasks", "ls", "-q", timeout=15)
    for task in listed.stdout.split() if listed.returncode == 0 else []:
        _ctr(paths, bins, "tasks", "kill", "--all", "--signal=SIGKILL", task, timeout=15)
    for task in listed.stdout.split() if listed.returncode == 0 else []:
        _ctr(paths, bins, "tasks", "delete", "--force", task, timeout=30)


def _processes() -> Iterator[tuple[int, int, list[bytes]]]:
    """(pid, parent pid, argv) of every live process."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
            argv = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
        except (OSError, IndexError):
            continue
        yield int(entry), int(stat[1]), argv


def _kill_shims(paths: NodePaths) -> None:
    """SIGKILL whatever is left of this containerd's shims and everything under them (containers whose task
    deletion failed): a shim names our containerd's socket in its `-address` argument."""
    address = str(paths.containerd_socket).encode()
    table = list(_processes())
    shims = {pid for pid, _, argv in table if argv and argv[0].endswith(b"containerd-shim-runc-v2") and address in argv}
    doomed = set(shims)
    grew = True
    while grew:
        children = {pid for pid, parent, _ in table if parent in doomed} - doomed
        grew = bool(children)
        doomed |= children
    for pid in doomed:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + STOP_S
    while doomed and time.monotonic() < deadline:
        doomed = {pid for pid in doomed if Path(f"/proc/{pid}").exists() and not _zombie(pid)}
        time.sleep(0.05)


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return True


def mounts_under(directory: Path) -> list[str]:
    """Mount points at or under ``directory`` (deepest last), from /proc/self/mountinfo."""
    prefix = str(directory.resolve())
    found = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = line.split()[4].encode().decode("unicode_escape")  # \040 for a space, as the kernel escapes it
        if point == prefix or point.startswith(prefix + "/"):
            found.append(point)
    return found


_MNT_DETACH = 2


def _unmount_under(directory: Path) -> None:
    """Unmount everything under DIR, deepest (last mounted) first; a busy mount is detached."""
    libc = ctypes.CDLL(None, use_errno=True)
    for _attempt in range(3):
        points = mounts_under(directory)
        if not points:
            return
        for point in reversed(points):
            if libc.umount2(point.encode(), 0) != 0:
                libc.umount2(point.encode(), _MNT_DETACH)
    left = mounts_under(directory)
    if left:
        log.warning("could not unmount %s", ", ".join(left))


def _clean_outside(paths: NodePaths, state: dict[str, Any]) -> None:
    before = state.get("device_plugin_dir_entries")
    if DEVICE_PLUGIN_DIR.is_dir():
        for entry in DEVICE_PLUGIN_DIR.iterdir():
            if before is None or entry.name not in before:
                _remove(entry)
        if before is None:
            with contextlib.suppress(OSError):
                DEVICE_PLUGIN_DIR.rmdir()
            if not state.get("var_lib_kubelet", True):
                with contextlib.suppress(OSError):
                    DEVICE_PLUGIN_DIR.parent.rmdir()
    logs = str(paths.pod_logs)
    if CONTAINER_LOGS.is_dir():
        for link in CONTAINER_LOGS.iterdir():
            with contextlib.suppress(OSError):
                if link.is_symlink() and os.readlink(link).startswith(logs):
                    link.unlink()
    for path, key in ((POD_LOGS, "var_log_pods"), (CONTAINER_LOGS, "var_log_containers")):
        if not state.get(key, True) and path.is_dir():
            with contextlib.suppress(OSError):
                path.rmdir()  # only when empty: never anyone else's logs
    if not state.get("shim_socket_root", True):  # made by this node's shims (the lock keeps others away)
        shutil.rmtree(SHIM_SOCKETS, ignore_errors=True)
    subprocess.run(["ip", "link", "delete", BRIDGE], capture_output=True, timeout=15, check=False)
    if not state.get("node_ip", True):
        subprocess.run(["ip", "address", "del", f"{NODE_IP}/32", "dev", "lo"], capture_output=True, timeout=15,
                       check=False)
    kept = set(state.get("kubepods_cgroups") or [])
    for root in _kubepods_cgroups():
        if str(root) not in kept:
            _remove_cgroup(root)


def _remove(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink()


def _remove_cgroup(root: Path) -> None:
    """cgroup directories go bottom-up with rmdir (their files cannot be deleted); a busy one stays."""
    for current, _dirs, _files in sorted(os.walk(root), key=lambda walked: -len(walked[0])):
        with contextlib.suppress(OSError):
            os.rmdir(current)


def leftovers(directory: Path) -> list[str]:
    """What a torn-down real node left behind: live processes naming DIR (containerd, kubelet, shims) and mounts
    under it. Empty after a clean `down`; the `real_node` fixture fails its teardown otherwise."""
    marker = str(directory.resolve()).encode()
    found = [f"process {pid}: {b' '.join(argv).decode(errors='replace')[:200]}" for pid, _, argv in _processes()
             if pid != os.getpid() and any(marker in arg for arg in argv) and not _zombie(pid)]
    found.extend(f"mount {point}" for point in mounts_under(directory))
    return found


def restart_kubelet(directory: Path) -> int:
    """Stop the node's kubelet and start it again with the same arguments (as a kubelet upgrade or crash would);
    returns the new pid once it runs. Pods keep running in containerd meanwhile; plugins must re-register."""
    from kubegpu.testing.processes import PIDS
    from kubegpu.testing.processes import is_ours as _is_ours
    from kubegpu.testing.processes import read_pids as _read_pids
    from kubegpu.testing.processes import stop as _stop

    entries = [(pid, binary) for pid, name, binary in _read_pids(directory)
               if name == "kubelet" and _is_ours(pid, binary)]
    if not entries:
        raise RealNodeError(f"{directory}: no running kubelet to restart")
    pid, binary = entries[-1]
    argv = [a.decode() for a in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0") if a]
    environ = dict(line.split("=", 1) for line in Path(f"/proc/{pid}/environ").read_text().split("\0") if "=" in line)
    _stop(pid, binary, "kubelet")
    with open(directory / "logs" / "kubelet.log", "ab") as log_file:
        process = subprocess.Popen(argv, cwd=directory, stdin=subprocess.DEVNULL, stdout=log_file,
                                   stderr=subprocess.STDOUT, start_new_session=True, env=environ)
    with open(directory / PIDS, "a") as pids:
        pids.write(f"{process.pid} kubelet {binary}\n")
    return process.pid
