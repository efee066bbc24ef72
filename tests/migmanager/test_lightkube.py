"""The MIG manager through the real lightkube adapter, over HTTP to the emulated API server."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

from typer.testing import CliRunner

from kubegpu.cli import app
from kubegpu.clock import VirtualClock
from kubegpu.config.migparted import default_mig_parted_config
from kubegpu.gpu.catalog import CATALOG
from kubegpu.gpu.simulated import SimulatedBackend
from kubegpu.migmanager.manager import MIG_CONFIG_LABEL, MIG_STATE_LABEL, PAUSED, MigManager
from kubegpu.sharing.migapply import assert_mismatches, read_state
from tests.fakes.apiserver import write_kubeconfig

DEPLOY = {"nvidia.com/gpu.deploy.device-plugin": "true", "nvidia.com/gpu.deploy.dcgm-exporter": PAUSED,
          "nvidia.com/gpu.deploy.dcgm": "false"}


def test_mig_manager_over_lightkube(apiserver: Any) -> None:
    cluster = apiserver.cluster()
    node = f"mig-{uuid.uuid4().hex[:8]}"
    cluster.create({"apiVersion": "v1", "kind": "Node",
                    "metadata": {"name": node, "labels": {**DEPLOY, MIG_CONFIG_LABEL: "all-balanced", "team": "a"}}})
    backend = SimulatedBackend.create(None, "2xH100-SXM5-80GB")
    config = default_mig_parted_config([CATALOG["H100-SXM5-80GB"]])
    agent = MigManager(cluster, backend, node, lambda: config, VirtualClock())
    assert agent.reconcile().state == "success"
    labels = cluster.get("Node", node)["metadata"]["labels"]
    assert labels[MIG_STATE_LABEL] == "success" and labels["team"] == "a"
    assert {k: labels[k] for k in DEPLOY} == {"nvidia.com/gpu.deploy.device-plugin": "true",
                                               "nvidia.com/gpu.deploy.dcgm-exporter": "true",
                                               "nvidia.com/gpu.deploy.dcgm": "false"}
    assert assert_mismatches(config, "all-balanced", read_state(backend)) == []

    cluster.patch("Node", node, {"metadata": {"labels": {MIG_CONFIG_LABEL: "all-2g.21gb"}}})
    assert agent.reconcile().state == "failed"
    assert cluster.get("Node", node)["metadata"]["labels"][MIG_STATE_LABEL] == "failed"
    reasons = [e["reason"] for e in cluster.list("Event", namespace="default")
               if e["involvedObject"].get("name") == node]
    assert sorted(reasons) == ["MigConfigApplied", "MigConfigInvalid"]


def test_mig_manager_command_oneshot_with_a_kubeconfig(apiserver: Any, tmp_path: Path) -> None:
    cluster = apiserver.cluster()
    node = f"migcli-{uuid.uuid4().hex[:8]}"
    cluster.create({"apiVersion": "v1", "kind": "Node",
                    "metadata": {"name": node, "labels": {**DEPLOY, MIG_CONFIG_LABEL: "all-3g.40gb"}}})
    node_file = tmp_path / "node.json"
    SimulatedBackend.create(node_file, "1xH100-SXM5-80GB,1xL4")
    result = CliRunner().invoke(
        app, ["mig-manager", "--node-name", node, "--gpu-backend", f"sim:{node_file}", "--oneshot"],
        env={"KUBECONFIG": str(write_kubeconfig(tmp_path, apiserver.url))},
    )
    assert result.exit_code == 0, result.output
    assert cluster.get("Node", node)["metadata"]["labels"][MIG_STATE_LABEL] == "success"
    state = read_state(SimulatedBackend(node_file))
    assert [d.profile_name for d in state.instances(0)] == ["3g.40gb", "3g.40gb"]  # the generated default config


def test_mig_manager_oneshot_failure_exits_1_with_one_line_and_restores(apiserver: Any, tmp_path: Path) -> None:
    cluster = apiserver.cluster()
    node = f"migbad-{uuid.uuid4().hex[:8]}"
    cluster.create({"apiVersion": "v1", "kind": "Node",
                    "metadata": {"name": node, "labels": {**DEPLOY, MIG_CONFIG_LABEL: "all-9g.99gb"}}})
    node_file = tmp_path / "node.json"
    SimulatedBackend.create(node_file, "1xH100-SXM5-80GB")
    env = {"KUBECONFIG": str(write_kubeconfig(tmp_path, apiserver.url))}
    args = ["mig-manager", "--node-name", node, "--gpu-backend", f"sim:{node_file}", "--oneshot"]
    result = CliRunner().invoke(app, args, env=env)
    lines = result.output.strip().splitlines()
    assert result.exit_code == 1 and len(lines) == 1, result.output
    assert lines[0].startswith("error: mig-manager: failed:") and "all-9g.99gb" in lines[0]
    labels = cluster.get("Node", node)["metadata"]["labels"]
    assert labels[MIG_STATE_LABEL] == "failed" and PAUSED not in {labels[k] for k in DEPLOY if k.endswith("plugin")}
    assert read_state(SimulatedBackend(node_file)).instances(0) == []  # nothing changed on the GPUs

    bad_reference = CliRunner().invoke(app, [*args, "--config-map", "only-a-name"], env=env)
    assert bad_reference.exit_code == 1 and bad_reference.output.strip().splitlines() == [
        "error: --config-map: expected NAMESPACE/NAME, got 'only-a-name'"]
