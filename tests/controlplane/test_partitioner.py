"""The partitioner and partition agent on a kwok GPU node, with the REAL kube-scheduler deciding where pods go.

An A100 cut all-1g.10gb runs three 1g pods (bound by kube-scheduler, their processes on the simulated GPU). A pod
asking for `nvidia.com/mig-2g.20gb` is unschedulable — kube-scheduler says so. `kubegpu partitioner` plans a re-cut
of the free slices, `kubegpu partition-agent --gpu-backend sim:` applies it to the simulated GPU and reports, the
test plays the kubelet (node status from what the device plugin's accounting advertises for the agent's backend),
and kube-scheduler binds the pod. The
three running instances keep their UUIDs and their pods keep running.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from kubegpu.gpu.catalog import get_model
from kubegpu.gpu.simulated import SimulatedBackend
from kubegpu.kube import Cluster
from kubegpu.partitionagent import annotations as ann
from kubegpu.sharing.devices import allocatable
from kubegpu.sharing.names import GPU_RESOURCE_PREFIX
from kubegpu.testing.session import RealCluster, wait_for
from tests.autoscaler.builders import pod

pytestmark = pytest.mark.apiserver
A100 = "A100-SXM4-80GB"
P1G = get_model(A100).profile("1g.10gb").profile_id
MIXED = {"version": "v1", "flags": {"migStrategy": "mixed"}}


def kubegpu(real: RealCluster, *args: str) -> str:
    """Run a kubegpu command against the real control plane (KUBECONFIG); its output, or a failure showing it."""
    result = subprocess.run([sys.executable, "-m", "kubegpu", *args], env={**os.environ, **real.env()},
                            capture_output=True, text=True, timeout=90, check=False)
    assert result.returncode == 0, f"kubegpu {' '.join(args)}: {result.stderr[-1500:]}"
    return result.stdout + result.stderr


def play_kubelet(cluster: Cluster, node_name: str, backend: SimulatedBackend) -> dict[str, int]:
    """What a kubelet does once the device plugin re-registers: node status shows the plugin's resources."""
    gpus = backend.devices()
    advertised = allocatable(gpus, {g.index: backend.mig_devices(g.index) for g in gpus if g.mig_enabled}, MIXED)
    status = cluster.get("Node", node_name)["status"]
    patch: dict[str, Any] = {}
    for field in ("capacity", "allocatable"):
        gone = {k: None for k in status.get(field, {}) if k.startswith(GPU_RESOURCE_PREFIX) and k not in advertised}
        patch[field] = {**gone, **{k: str(v) for k, v in advertised.items()}}
    cluster.patch("Node", node_name, {"status": patch}, subresource="status")
    return advertised


def mig_pod(name: str, namespace: str, profile: str, node_label: str) -> dict[str, Any]:
    return pod(name, cpu="100m", memory="64Mi", namespace=namespace, limits={f"nvidia.com/mig-{profile}": 1},
               spec={"nodeSelector": {"e2e-node": node_label}})


def test_partitioner_recut_lets_the_real_scheduler_bind_the_pod(real_cluster: RealCluster, namespace: str,
                                                                tmp_path: Path) -> None:
    cluster = real_cluster.cluster()
    node_name = f"mig-{namespace}"
    state = tmp_path / "node.json"
    backend = SimulatedBackend.create(state, gpus=f"1x{A100}", node_name=node_name)
    if backend.set_mig_mode(0, True):
        backend.reset_gpu(0)
    for start in range(7):
        backend.create_mig_device(0, P1G, start)
    real_cluster.add_gpu_node(node_name, f"1x{A100}", labels={ann.PARTITIONING_LABEL: "mig", "e2e-node": namespace})
    try:
        assert play_kubelet(cluster, node_name, backend) == {"nvidia.com/mig-1g.10gb": 7}

        for i in range(3):  # three 1g pods, placed by kube-scheduler, then "started" on their instances
            cluster.create(mig_pod(f"small-{i}", namespace, "1g.10gb", namespace))
        for i in range(3):
            assert real_cluster.wait_bound(f"small-{i}", namespace) == node_name
        busy = [m for m in backend.mig_devices(0) if m.start < 3]
        for number, mig in enumerate(busy):
            backend.add_process(0, 100 + number, 1000, gi_id=mig.gi_id)
        in_use = {m.uuid: (m.profile_id, m.start) for m in busy}

        cluster.create(mig_pod("wants-2g", namespace, "2g.20gb", namespace))
        message = wait_for(lambda: real_cluster.unschedulable_message("wants-2g", namespace),
                           "kube-scheduler to report wants-2g unschedulable")
        assert "nvidia.com/mig-2g.20gb" in message

        # the real entry points, as deployed: `kubegpu partition-agent` and `kubegpu partitioner`, one pass each
        agent = ["partition-agent", "--once", "--node-name", node_name, "--gpu-backend", f"sim:{state}",
                 "--pod-resources-kubelet-socket", str(tmp_path / "no-kubelet.sock")]
        kubegpu(real_cluster, *agent)  # first report: the node's current layout, what is in use
        kubegpu(real_cluster, "partitioner", "--once", "--batch-window-idle", "0", "--batch-window-timeout", "0",
                "--identity", "partitioner-0", "--lease-namespace", namespace)
        annotations = cluster.get("Node", node_name)["metadata"]["annotations"]
        plan_id = annotations[ann.SPEC_PLAN]
        assert annotations.get(ann.STATUS_PLAN) != plan_id  # planned, not applied yet
        assert cluster.get("Lease", "kubegpu-partitioner", namespace)["spec"]["holderIdentity"] == "partitioner-0"

        kubegpu(real_cluster, *agent)  # applies the plan on the simulated GPU and reports it
        created = [m for m in backend.mig_devices(0) if m.uuid not in in_use]
        assert any(m.profile_name == "2g.20gb" for m in created)
        advertised = play_kubelet(cluster, node_name, backend)
        assert advertised["nvidia.com/mig-2g.20gb"] >= 1

        assert real_cluster.wait_bound("wants-2g", namespace) == node_name
        after = {m.uuid: (m.profile_id, m.start) for m in backend.mig_devices(0)}
        assert all(after.get(uuid) == where for uuid, where in in_use.items())  # nothing in use was torn down
        pods = {p["metadata"]["name"]: p for p in cluster.list("Pod", namespace)}
        assert all(pods[f"small-{i}"]["spec"]["nodeName"] == node_name for i in range(3))
        annotations = cluster.get("Node", node_name)["metadata"]["annotations"]
        assert annotations[ann.STATUS_PLAN] == plan_id
    finally:
        real_cluster.delete_node(node_name)
        backend.close()
