"""The two commands end to end over HTTP: real lightkube code against the emulated API server."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from kubegpu.cli import app
from kubegpu.gpu.catalog import get_model
from kubegpu.gpu.simulated import SimulatedBackend
from kubegpu.partitionagent import annotations as ann
from tests.fakes.apiserver import write_kubeconfig

pytestmark = pytest.mark.integration


def test_agent_and_partitioner_commands_recut_a_node(apiserver: Any, tmp_path: Path) -> None:
    cluster = apiserver.cluster()
    node = f"part-{uuid.uuid4().hex[:8]}"
    namespace = f"ns-{uuid.uuid4().hex[:8]}"
    cluster.create({"apiVersion": "v1", "kind": "Node",
                    "metadata": {"name": node, "labels": {ann.PARTITIONING_LABEL: "mig"}}})
    node_file = tmp_path / "node.json"
    backend = SimulatedBackend.create(node_file, "1xH100-SXM5-80GB", node_name=node)
    backend.set_mig_mode(0, True)
    one_g = get_model("H100-SXM5-80GB").profile("1g.10gb").profile_id
    for start in range(7):
        mig = backend.create_mig_device(0, one_g, start)
        if start < 3:
            backend.add_process(0, 10 + start, 500, gi_id=mig.gi_id)
    env = {"KUBECONFIG": str(write_kubeconfig(tmp_path, apiserver.url))}
    agent = ["partition-agent", "--node-name", node, "--gpu-backend", f"sim:{node_file}", "--once"]
    result = CliRunner().invoke(app, agent, env=env)
    assert result.exit_code == 0, result.output
    assert cluster.get("Node", node)["metadata"]["annotations"]["kubegpu.io/status-gpu-0-1g.10gb-used"] == "3"

    cluster.create({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "wants-3g", "namespace": namespace},
                    "spec": {"containers": [{"name": "c", "image": "x",
                                             "resources": {"limits": {"nvidia.com/mig-3g.40gb": "1"}}}]},
                    "status": {"phase": "Pending"}})
    result = CliRunner().invoke(app, ["partitioner", "--once", "--batch-window-idle", "0",
                                      "--identity", "test", "--lease-namespace", namespace], env=env)
    assert result.exit_code == 0, result.output
    spec = cluster.get("Node", node)["metadata"]["annotations"]
    assert spec["kubegpu.io/spec-gpu-0-3g.40gb"] == "1"
    result = CliRunner().invoke(app, agent, env=env)
    assert result.exit_code == 0, result.output
    placed = {(m.profile_id, m.start) for m in SimulatedBackend(node_file).mig_devices(0)}
    assert {(one_g, 0), (one_g, 1), (one_g, 2)} <= placed
    assert (get_model("H100-SXM5-80GB").profile("3g.40gb").profile_id, 4) in placed
    status = cluster.get("Node", node)["metadata"]["annotations"]
    assert status[ann.STATUS_PLAN] == spec[ann.SPEC_PLAN]

