"""Discovery's Node sink through the real lightkube adapter, over HTTP to the emulated API server."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

from typer.testing import CliRunner

from kubegpu.cli import app
from kubegpu.discovery.agent import NodeLabelSink
from kubegpu.gpu.simulated import SimulatedBackend

MIG_CONFIG_LABEL = "nvidia.com/mig.config"


def test_discovery_node_sink_over_lightkube(apiserver: Any) -> None:
    cluster = apiserver.cluster()
    node = f"gfd-{uuid.uuid4().hex[:8]}"
    cluster.create({"apiVersion": "v1", "kind": "Node", "metadata": {"name": node, "labels": {
        "nvidia.com/mig-1g.10gb.count": "7", MIG_CONFIG_LABEL: "all-1g.10gb"}}})
    NodeLabelSink(cluster, node).write({"nvidia.com/gpu.count": "2"})
    assert cluster.get("Node", node)["metadata"]["labels"] == {"nvidia.com/gpu.count": "2",
                                                               MIG_CONFIG_LABEL: "all-1g.10gb"}


def test_discover_command_labels_the_node_with_a_kubeconfig(apiserver: Any, tmp_path: Path) -> None:
    from tests.fakes.apiserver import write_kubeconfig

    cluster = apiserver.cluster()
    node = f"gfdcli-{uuid.uuid4().hex[:8]}"
    cluster.create({"apiVersion": "v1", "kind": "Node", "metadata": {"name": node, "labels": {"team": "b"}}})
    node_file = tmp_path / "node.json"
    SimulatedBackend.create(node_file, "2xL4").inject_xid(1, 79)
    result = CliRunner().invoke(
        app, ["discover", "--gpu-backend", f"sim:{node_file}", "--oneshot", "--kubernetes", "--node-name", node],
        env={"KUBECONFIG": str(write_kubeconfig(tmp_path, apiserver.url))},
    )
    assert result.exit_code == 0, result.output
    labels = cluster.get("Node", node)["metadata"]["labels"]
    assert labels["team"] == "b" and labels["nvidia.com/gpu.count"] == "2"
    assert labels["nvidia.com/gpu.product"] == "NVIDIA-L4"
    conditions = {c["type"]: c for c in cluster.get("Node", node)["status"]["conditions"]}
    # (this emulated server replaces lists on a strategic merge; test_health.py checks that Ready etc. are kept)
    hardware = conditions["AcceleratedHardwareReady"]
    assert (hardware["status"], hardware["reason"]) == ("False", "GpuXidError")
    assert "GPU 1 XID 79" in hardware["message"]
    missing_node = CliRunner().invoke(app, ["discover", "--gpu-backend", f"sim:{node_file}", "--oneshot",
                                            "--kubernetes"], env={"NODE_NAME": ""})
    assert missing_node.exit_code == 2 and "--node-name" in missing_node.output
