"""`scripts/control-plane.sh up` then `down`, twice in a row, with the real binaries: the API server answers with
the admin kubeconfig, the kwok GPU nodes are Ready, and afterwards no process and no port is left behind. A port
taken by someone else is reported as such by the real etcd's own error."""

from __future__ import annotations

import os
import socket
import subprocess
from pathlib import Path

import pytest

from kubegpu.testing import controlplane
from kubegpu.testing.controlplane import ControlPlaneError
from kubegpu.testing.kubeconfig import admin_cluster

pytestmark = pytest.mark.apiserver
SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "control-plane.sh"


def _pids(directory: Path) -> list[tuple[int, str]]:
    return [(int(pid), name) for pid, name, _ in (line.split(maxsplit=2)
                                                   for line in (directory / "pids").read_text().splitlines())]


def _listening_ports(pid: int) -> set[int]:
    """TCP ports the process listens on (from /proc: its socket inodes matched against /proc/net/tcp)."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        target = os.readlink(fd) if fd.is_symlink() else ""
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    ports = set()
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if fields[3] == "0A" and fields[9] in inodes:  # LISTEN
            ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


def _port_free(port: int) -> bool:
    """Nothing listens there any more (SO_REUSEADDR: connections left in TIME_WAIT do not count)."""
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
            sock.listen()
        except OSError:
            return False
    return True


def test_up_down_twice_leaves_nothing_behind(k8s_binaries: Path, tmp_path: Path) -> None:
    directory = tmp_path / "cp"
    try:
        _up_down_twice(directory)
    finally:
        controlplane.down(directory)  # whatever happened above, nothing of this test outlives it


def _up_down_twice(directory: Path) -> None:
    for _ in range(2):
        up = subprocess.run(["bash", str(SCRIPT), "up", str(directory), "--nodes", "2", "--gpus", "4xH100-SXM5-80GB"],
                            capture_output=True, text=True, timeout=180, check=False)
        assert up.returncode == 0, up.stderr[-2000:]
        assert f"export KUBECONFIG={directory / 'kubeconfig'}" in up.stdout
        assert "kube-apiserver ready in" in up.stderr and "control plane up in" in up.stderr  # timings logged
        processes = _pids(directory)
        assert [name for _, name in processes][-4:] == ["kube-apiserver", "kube-controller-manager",
                                                        "kube-scheduler", "kwok"]
        ports = set().union(*(_listening_ports(pid) for pid, _ in processes))
        # kube-controller-manager and kube-scheduler write at the rates the benchmarks state, not at their defaults
        flags = {name: Path(f"/proc/{pid}/cmdline").read_text().split("\0") for pid, name in processes}
        assert f"--kube-api-qps={controlplane.CONTROLLER_MANAGER_QPS}" in flags["kube-controller-manager"]
        assert f"--kube-api-burst={controlplane.CONTROLLER_MANAGER_BURST}" in flags["kube-controller-manager"]
        assert f"--kube-api-qps={controlplane.SCHEDULER_QPS}" in flags["kube-scheduler"]
        nodes = admin_cluster(directory / "kubeconfig").list("Node")
        assert sorted(n["metadata"]["name"] for n in nodes) == ["kwok-gpu-0", "kwok-gpu-1"]
        assert all(n["status"]["allocatable"]["nvidia.com/gpu"] == "4" for n in nodes)

        down = subprocess.run(["bash", str(SCRIPT), "down", str(directory)], capture_output=True, text=True,
                              timeout=60, check=False)
        assert down.returncode == 0, down.stderr
        assert all(not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text().split()[2]
                   for pid, _ in processes)
        assert ports and all(_port_free(port) for port in ports)
        assert not (directory / "pids").exists()


def test_a_taken_port_names_the_component(k8s_binaries: Path, tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        ports = iter([port])
        original = controlplane.free_port
        monkeypatch.setattr(controlplane, "free_port", lambda: next(ports, None) or original())
        with pytest.raises(ControlPlaneError, match=rf"^etcd: port {port} is taken"):
            controlplane.up(tmp_path / "cp", nodes=0, bins=k8s_binaries)
    assert not (tmp_path / "cp" / "pids").exists()


def test_kube_scheduler_runs_the_profiles_it_is_given(k8s_binaries: Path, tmp_path: Path) -> None:
    """`up(scheduler_profiles=...)`: kube-scheduler reads them from a config file (the Karpenter benchmark's
    bin-packing profile here). With MostAllocated scoring a GPU pod goes to the node already running one, where the
    default profile (LeastAllocated) would put it on the empty one."""
    from benchmarks.karpenter_e2e import SCHEDULER_PROFILES
    from kubegpu.testing.schedview import wait_scheduler_sees_bound_pods
    from kubegpu.testing.session import wait_for

    plane = controlplane.up(tmp_path / "cp", nodes=2, bins=k8s_binaries,
                            scheduler_profiles=SCHEDULER_PROFILES["bin-packing"])
    try:
        cluster = admin_cluster(plane.kubeconfig)
        first, _ = plane.nodes

        def gpu_pod(name: str, node: str | None = None) -> dict[str, object]:
            spec: dict[str, object] = {"containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10",
                                                       "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}
            return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "default"},
                    "spec": {**spec, **({"nodeName": node} if node else {})}}

        cluster.create(gpu_pod("already-there", first))
        # the scheduler scores by what its cache says a node runs: place the second pod only once it counts the first
        wait_scheduler_sees_bound_pods(plane, cluster)
        cluster.create(gpu_pod("placed"))
        wait_for(lambda: bool(cluster.get("Pod", "placed", "default")["spec"].get("nodeName")),
                 "pod placed bound", 60.0)
        assert cluster.get("Pod", "placed", "default")["spec"]["nodeName"] == first
        assert "MostAllocated" in (plane.directory / "scheduler-config.yaml").read_text()
    finally:
        controlplane.down(plane.directory)
