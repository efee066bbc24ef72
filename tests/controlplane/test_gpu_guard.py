"""`kubegpu gpu-guard` against the REAL API server: the Eviction API (a PodDisruptionBudget honoured), the
`GPUMemoryExceeded` condition and the Event, for pods kube-scheduler placed on a time-sliced kwok GPU node.

The kubelet's part is played by the fakes the guard reads on a node: a PodResources socket (which replica each
pod got), a /proc with each process's pod cgroup, and the simulated node file with the GPU's processes. The guard
runs as the real command (`kubegpu gpu-guard --once`).
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from kubegpu.gpu.simulated import SimulatedBackend
from kubegpu.testing.session import RealCluster, wait_for
from tests.autoscaler.builders import pod
from tests.fakes.fake_podresources import FakePodResources
from tests.guard.helpers import fake_process

pytestmark = pytest.mark.apiserver
SHARED = "nvidia.com/gpu.shared"
NODE = "guard-node"


def _watch_conditions(real: RealCluster, namespace: str, seen: dict[str, list[dict[str, Any]]],
                      stop: threading.Event) -> None:
    """Every condition each pod ever showed (kwok may rewrite status, and an evicted pod goes away)."""
    cluster = real.cluster()
    while not stop.is_set():
        for event in cluster.watch("Pod", namespace, timeout=1.0):
            name = event.object["metadata"]["name"]
            seen.setdefault(name, []).extend((event.object.get("status") or {}).get("conditions") or [])


def test_guard_evicts_only_the_offender_and_honours_a_pdb(real_cluster: RealCluster, namespace: str,
                                                          tmp_path: Path) -> None:
    real = real_cluster
    real.add_gpu_node(NODE, "1xA100-SXM4-80GB", labels={"e2e-node": NODE}, extra_capacity={SHARED: "4"})
    node_file = tmp_path / "node.json"
    backend = SimulatedBackend.create(node_file, gpus="1xA100-SXM4-80GB", node_name=NODE)
    uuid = backend.devices()[0].uuid
    names = ["quiet", "leaky", "guarded"]
    for name in names:
        real.admin.create(pod(name, cpu="100m", memory="64Mi", namespace=namespace, limits={SHARED: 1},
                              metadata={"labels": {"app": name}}, spec={"nodeSelector": {"e2e-node": NODE}}))
    real.admin.create({"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
                       "metadata": {"name": "guarded", "namespace": namespace},
                       "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "guarded"}}}})
    uids = {}
    for name in names:
        assert real.wait_bound(name, namespace) == NODE
        uids[name] = real.admin.get("Pod", name, namespace)["metadata"]["uid"]
    wait_for(lambda: (real.admin.get("PodDisruptionBudget", "guarded", namespace).get("status") or {})
             .get("observedGeneration"), "PDB status from kube-controller-manager")
    proc = tmp_path / "proc"
    pids = {"quiet": 900001, "leaky": 900002, "guarded": 900003}  # above pid_max: no host process has them
    for name, mib in (("quiet", 12000), ("leaky", 30000), ("guarded", 25000)):
        fake_process(proc, pids[name], uids[name])
        backend.add_process(0, pids[name], mib)
    assignments = [(namespace, name, "main", SHARED, [f"{uuid}::{k}"]) for k, name in enumerate(names)]
    allocatable = [(SHARED, [f"{uuid}::{k}" for k in range(4)])]
    seen: dict[str, list[dict[str, Any]]] = {}
    stop = threading.Event()
    watcher = threading.Thread(target=_watch_conditions, args=(real, namespace, seen, stop), daemon=True)
    watcher.start()
    socket = tmp_path / "pr.sock"
    try:
        with FakePodResources(socket, assignments, allocatable=allocatable):
            result = subprocess.run(
                [sys.executable, "-m", "kubegpu", "gpu-guard", "--once", "--gpu-backend", f"sim:{node_file}",
                 "--node-name", NODE, "--pod-resources-socket", str(socket), "--proc-root", str(proc)],
                env={**os.environ, **real.env()}, capture_output=True, text=True, timeout=90, check=False)
        assert result.returncode == 0, result.stderr[-2000:]
        assert f"{namespace}/leaky: evicted (over-share)" in result.stdout, result.stdout + result.stderr
        assert f"{namespace}/guarded: killed (pdb) (over-share)" in result.stdout, result.stdout
        assert "quiet: " not in result.stdout.replace(f"{namespace}/quiet gpu", "")

        def evicted() -> bool:
            try:
                found = real.admin.get("Pod", "leaky", namespace)
            except Exception:  # gone already
                return True
            return bool(found["metadata"].get("deletionTimestamp"))

        wait_for(evicted, "leaky evicted through the Eviction API")
        wait_for(lambda: any(c.get("type") == "GPUMemoryExceeded" for c in seen.get("leaky", [])),
                 "the GPUMemoryExceeded condition on leaky")
    finally:
        stop.set()
    condition = next(c for c in seen["leaky"] if c.get("type") == "GPUMemoryExceeded")
    assert condition["status"] == "True"
    assert "share 20480 MiB" in condition["message"] and "used 30000 MiB" in condition["message"]
    assert uuid in condition["message"]
    # the PDB-protected pod stays; only its offending process went (the simulated driver freed it)
    assert not real.admin.get("Pod", "guarded", namespace)["metadata"].get("deletionTimestamp")
    assert not real.admin.get("Pod", "quiet", namespace)["metadata"].get("deletionTimestamp")
    assert sorted(p.pid for p in backend.processes(0)) == [pids["quiet"], pids["leaky"]]
    events: dict[str, list[str]] = {}
    for event in real.admin.list("Event", namespace):
        if event.get("source", {}).get("component") == "kubegpu-gpu-guard":
            assert event["reason"] == "GPUMemoryExceeded" and event["type"] == "Warning"
            events.setdefault(event["involvedObject"]["name"], []).append(event["message"])
    assert any("over its share of 20480 MiB" in m and "evicting" in m for m in events["leaky"])
    assert any("PodDisruptionBudget" in m for m in events["guarded"])
    assert "quiet" not in events
    real.delete_node(NODE)
