"""`kubegpu gpu-guard` on the real node: pods sharing a time-sliced GPU run a long sleep, their containers' host PIDs
are registered as GPU processes of the simulated node (`sim-node add-process`), one grows past its share
(`sim-node set-process-memory`), and the guard evicts that pod — and only that pod — with the `GPUMemoryExceeded`
condition and an Event. Attribution goes the real way: host PID → /proc cgroup (cgroupfs: pod UID, container ID) →
pod, and the kubelet's PodResources API for which replica of which GPU each pod got."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import yaml

from kubegpu.gpu.simulated import SimulatedBackend
from kubegpu.guard.procs import owner_from_cgroup
from kubegpu.testing.nodepods import (
    NodeSession,
    pod_log,
    probe_pod,
    probe_result,
    running,
    settle,
    unique,
    until,
    wait_allocatable,
    wait_phase,
)

SHARED = "nvidia.com/gpu.shared"


def sleeper_pid(pod_uid: str) -> int | None:
    """The host PID of the pod's `sleep` (its container's process, as the driver would list a CUDA process)."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            owner = owner_from_cgroup((entry / "cgroup").read_text())
            command = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if owner is not None and owner.pod_uid == pod_uid and owner.container_id and command[:1] == [b"sleep"]:
            return int(entry.name)
    return None


def sim_node(real_node: NodeSession, *args: str) -> str:
    result = subprocess.run([sys.executable, "-m", "kubegpu", "sim-node", *args], capture_output=True, text=True,
                            timeout=60, check=False, env=os.environ)
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_the_guard_evicts_only_the_pod_over_its_share(real_node: NodeSession, node_ns: str, tmp_path: Path) -> None:
    cluster = real_node.cluster
    node_file = real_node.node.node_file
    config = tmp_path / "device-plugin.yaml"
    config.write_text(yaml.safe_dump({"version": "v1", "sharing": {"timeSlicing": {"renameByDefault": True,
                                                                                     "resources": [{
                                                                                         "name": "nvidia.com/gpu",
                                                                                         "replicas": 4}]}}}))
    uuids = {g.uuid: g.index for g in SimulatedBackend(node_file).devices()}
    seen: dict[str, list[dict[str, Any]]] = {}
    stop = threading.Event()

    def watch() -> None:
        watcher = real_node.real.cluster()
        while not stop.is_set():
            for event in watcher.watch("Pod", node_ns, timeout=1.0):
                name = event.object["metadata"]["name"]
                seen.setdefault(name, []).extend((event.object.get("status") or {}).get("conditions") or [])

    thread = threading.Thread(target=watch, daemon=True)
    try:
        with running(real_node.device_plugin("--config", str(config))) as plugin:
            plugin.wait_log("registered nvidia.com/gpu.shared")
            wait_allocatable(cluster, SHARED, 8)
            thread.start()
            names = [unique(f"share{i}") for i in range(4)]
            for name in names:
                cluster.create(probe_pod(name, node_ns, {SHARED: 1}, sleep=600))
            gpu_of, pid_of = {}, {}
            for name in names:
                wait_phase(cluster, name, node_ns, ("Running",))
                env = until(lambda n=name: probe_result(pod_log(cluster, n, node_ns)).env or None, f"{name}'s env")
                gpu_of[name] = uuids[env["NVIDIA_VISIBLE_DEVICES"]]
                uid = cluster.get("Pod", name, node_ns)["metadata"]["uid"]
                pid_of[name] = until(lambda u=uid: sleeper_pid(u), f"the host PID of {name}'s sleep")
            for name in names:
                sim_node(real_node, "add-process", str(node_file), "--gpu", str(gpu_of[name]), "--pid",
                         str(pid_of[name]), "--memory-mib", "12000")
            offender = names[1]
            with running(real_node.gpu_guard()) as guard:
                guard.wait_log("guarding node")
                sim_node(real_node, "set-process-memory", str(node_file), "--pid", str(pid_of[offender]),
                         "--memory-mib", "30000")  # the share is 80 GiB / 4 = 20480 MiB

                def evicted() -> bool:
                    pod = cluster.get("Pod", offender, node_ns) if _exists(cluster, offender, node_ns) else None
                    return pod is None or bool(pod["metadata"].get("deletionTimestamp"))

                until(evicted, f"{offender} evicted by the guard")
                until(lambda: any(c.get("type") == "GPUMemoryExceeded" for c in seen.get(offender, [])),
                      f"the GPUMemoryExceeded condition on {offender}")
                until(lambda: f"evicted {node_ns}/{offender}" in guard.log(), "the guard's log line")
                settle(1.5)  # a few more rounds: nobody else goes
                assert guard.log().count("evicted ") == 1, guard.log()[-2000:]
            for name in names:
                if name != offender:
                    pod = cluster.get("Pod", name, node_ns)
                    assert not pod["metadata"].get("deletionTimestamp"), name
                    assert pod["status"]["phase"] == "Running"
                    assert not any(c.get("type") == "GPUMemoryExceeded" for c in seen.get(name, []))
    finally:
        stop.set()
        SimulatedBackend.create(node_file, real_node.node.gpus, node_name="real-node-0")  # fresh GPUs
    condition = next(c for c in seen[offender] if c.get("type") == "GPUMemoryExceeded")
    assert condition["status"] == "True"
    assert "share 20480 MiB" in condition["message"] and "used 30000 MiB" in condition["message"]
    events = [e for e in cluster.list("Event", node_ns) if e["involvedObject"]["name"] == offender
              and e["reason"] == "GPUMemoryExceeded"]
    assert events and "evicting the pod" in events[0]["message"]


def test_a_config_switch_keeps_the_share_pods_were_admitted_under(real_node: NodeSession, node_ns: str,
                                                                  tmp_path: Path) -> None:
    """Two pods admitted under 2 replicas a GPU (40 GiB each), the running device plugin switched to 4 (20 GiB), a
    third pod admitted then: the early pod using 30000 MiB stays, the late one using 25000 MiB is evicted. The
    device plugin recorded each share at Allocate, through the real kubelet; the guard reads that record."""
    cluster = real_node.cluster
    node_file = real_node.node.node_file
    config, record = tmp_path / "device-plugin.yaml", tmp_path / "state" / "device-shares.json"

    def sliced(replicas: int) -> None:
        config.write_text(yaml.safe_dump({"version": "v1", "sharing": {"timeSlicing": {
            "renameByDefault": True, "resources": [{"name": "nvidia.com/gpu", "replicas": replicas}]}}}))

    uuids = {g.uuid: g.index for g in SimulatedBackend(node_file).devices()}
    gpus = len(uuids)
    sliced(2)

    def admit(name: str) -> tuple[int, int]:
        cluster.create(probe_pod(name, node_ns, {SHARED: 1}, sleep=600))
        wait_phase(cluster, name, node_ns, ("Running",))
        env = until(lambda: probe_result(pod_log(cluster, name, node_ns)).env or None, f"{name}'s env")
        uid = cluster.get("Pod", name, node_ns)["metadata"]["uid"]
        return uuids[env["NVIDIA_VISIBLE_DEVICES"]], until(lambda: sleeper_pid(uid), f"the host PID of {name}")

    try:
        with running(real_node.device_plugin("--config", str(config), "--share-record-file", str(record))) as plugin:
            plugin.wait_log("registered nvidia.com/gpu.shared")
            wait_allocatable(cluster, SHARED, 2 * gpus)
            early, quiet, late = unique("early"), unique("quiet"), unique("late")
            placed = {name: admit(name) for name in (early, quiet)}
            sliced(4)  # the running plugin follows its config file
            plugin.wait_log("config reloaded")
            wait_allocatable(cluster, SHARED, 4 * gpus)
            placed[late] = admit(late)
            for name, mib in ((early, 30000), (quiet, 12000), (late, 25000)):
                gpu, pid = placed[name]
                sim_node(real_node, "add-process", str(node_file), "--gpu", str(gpu), "--pid", str(pid),
                         "--memory-mib", str(mib))
            with running(real_node.gpu_guard("--share-record-file", str(record), "--log-level", "debug")) as guard:
                guard.wait_log("guarding node")
                until(lambda: f"evicted {node_ns}/{late}" in guard.log(), f"{late} evicted by the guard")
                settle(1.5)  # a few more rounds: the early pod, over today's share only, stays
                assert guard.log().count("evicted ") == 1, guard.log()[-2000:]
                log = guard.log()  # each round's usage line: used/share per pod and GPU
                assert f"{early} on {placed[early][0]}: 30000/40960 MiB" in log, log[-2000:]
                assert f"{late} on {placed[late][0]}: 25000/20480 MiB" in log, log[-2000:]
            pod = cluster.get("Pod", early, node_ns)
            assert not pod["metadata"].get("deletionTimestamp") and pod["status"]["phase"] == "Running"
    finally:
        SimulatedBackend.create(node_file, real_node.node.gpus, node_name="real-node-0")  # fresh GPUs


def test_kill_process_kills_the_offenders_own_process(real_node: NodeSession, node_ns: str, tmp_path: Path) -> None:
    """`--action kill-process` on the real node: the offender's container process is pinned with a pidfd, its
    cgroup read again, and killed through the pidfd; the neighbour's process on the same GPU lives on."""
    cluster = real_node.cluster
    node_file = real_node.node.node_file
    config = tmp_path / "device-plugin.yaml"
    config.write_text(yaml.safe_dump({"version": "v1", "sharing": {"timeSlicing": {
        "renameByDefault": True, "resources": [{"name": "nvidia.com/gpu", "replicas": 4}]}}}))
    uuids = {g.uuid: g.index for g in SimulatedBackend(node_file).devices()}
    try:
        with running(real_node.device_plugin("--config", str(config))) as plugin:
            plugin.wait_log("registered nvidia.com/gpu.shared")
            wait_allocatable(cluster, SHARED, 4 * len(uuids))
            offender, neighbour = unique("leaker"), unique("neighbour")
            pid_of, uid_of = {}, {}
            for name, mib in ((offender, 30000), (neighbour, 12000)):
                cluster.create(probe_pod(name, node_ns, {SHARED: 1}, sleep=600))
                wait_phase(cluster, name, node_ns, ("Running",))
                env = until(lambda n=name: probe_result(pod_log(cluster, n, node_ns)).env or None, f"{name}'s env")
                uid_of[name] = cluster.get("Pod", name, node_ns)["metadata"]["uid"]
                pid_of[name] = until(lambda u=uid_of[name]: sleeper_pid(u), f"the host PID of {name}'s sleep")
                sim_node(real_node, "add-process", str(node_file), "--gpu",
                         str(uuids[env["NVIDIA_VISIBLE_DEVICES"]]), "--pid", str(pid_of[name]), "--memory-mib",
                         str(mib))
            with running(real_node.gpu_guard("--action", "kill-process")):
                until(lambda: sleeper_pid(uid_of[offender]) is None, f"{offender}'s sleep killed")
                settle(1.5)  # a few more rounds: the neighbour, within its share, keeps its process
            assert sleeper_pid(uid_of[neighbour]) == pid_of[neighbour]
            assert cluster.get("Pod", neighbour, node_ns)["status"]["phase"] == "Running"
            wait_phase(cluster, offender, node_ns, ("Failed", "Succeeded"))  # its shell ends without its sleep
    finally:
        SimulatedBackend.create(node_file, real_node.node.gpus, node_name="real-node-0")  # fresh GPUs
    events = [e["message"] for e in cluster.list("Event", node_ns) if e["involvedObject"]["name"] == offender
              and e["reason"] == "GPUMemoryExceeded"]
    assert any(f"killed process(es) {pid_of[offender]}" in m for m in events), events


def _exists(cluster: Any, name: str, namespace: str) -> bool:
    from kubegpu.kube.errors import NotFound

    try:
        cluster.get("Pod", name, namespace)
    except NotFound:
        return False
    return True
