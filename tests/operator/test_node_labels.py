"""`kubegpu operator node-labels`: NFD → gpu.present, deploy labels filled only when absent or empty."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml
from typer.testing import CliRunner

from kubegpu.cli import app

runner = CliRunner()
NFD = "feature.node.kubernetes.io/pci-10de.present"
DEPLOY = "nvidia.com/gpu.deploy."
DEFAULT_ON = ("driver", "container-toolkit", "device-plugin", "gpu-feature-discovery", "dcgm-exporter",
              "operator-validator")


def node(name: str, **labels: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels}}


def run(tmp_path: Path, nodes: Any, spec: dict[str, Any] | None = None) -> dict[str, Any]:
    policy = tmp_path / "policy.yaml"
    policy.write_text(yaml.safe_dump({"apiVersion": "kubegpu.io/v1", "kind": "ClusterPolicy",
                                      "metadata": {"name": "p"}, "spec": spec or {}}))
    nodes_file = tmp_path / "nodes.yaml"
    nodes_file.write_text(yaml.safe_dump(nodes))
    result = runner.invoke(app, ["operator", "node-labels", "--policy", str(policy), "--nodes", str(nodes_file),
                                 "-o", "json"])
    assert result.exit_code == 0, result.stderr
    out: dict[str, Any] = json.loads(result.stdout)
    return out


def test_nfd_gpu_node_gets_present_and_every_enabled_component(tmp_path: Path) -> None:
    out = run(tmp_path, [node("gpu-a", **{NFD: "true", "nvidia.com/gpu.product": "NVIDIA-L4"}), node("cpu")])
    assert out["cpu"] == {"set": {}, "remove": []}
    labels = out["gpu-a"]["set"]
    assert labels.pop("nvidia.com/gpu.present") == "true"
    assert labels == {DEPLOY + c: "true" for c in DEFAULT_ON}  # L4: not MIG-capable, so no mig-manager
    assert out["gpu-a"]["remove"] == []


def test_mig_capable_node_gets_mig_manager_and_all_disabled_config(tmp_path: Path) -> None:
    out = run(tmp_path, {"apiVersion": "v1", "kind": "List", "items": [
        node("a100", **{NFD: "true", "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"}),
        node("capable", **{NFD: "true", "nvidia.com/mig.capable": "true", "nvidia.com/mig.config": "all-1g.10gb"}),
        node("not-capable", **{NFD: "true", "nvidia.com/mig.capable": "false", "nvidia.com/gpu.product": "H100"}),
    ]})
    assert out["a100"]["set"][DEPLOY + "mig-manager"] == "true"
    assert out["a100"]["set"]["nvidia.com/mig.config"] == "all-disabled"
    assert out["capable"]["set"][DEPLOY + "mig-manager"] == "true"
    assert "nvidia.com/mig.config" not in out["capable"]["set"]  # an existing choice is kept
    assert DEPLOY + "mig-manager" not in out["not-capable"]["set"]


def test_existing_non_empty_values_are_honoured_and_empty_ones_filled(tmp_path: Path) -> None:
    out = run(tmp_path, [node("n", **{NFD: "true", "nvidia.com/gpu.present": "true",
                                      DEPLOY + "device-plugin": "paused-for-mig-change", DEPLOY + "driver": "false",
                                      DEPLOY + "dcgm-exporter": ""})])
    assert "nvidia.com/gpu.present" not in out["n"]["set"]
    assert DEPLOY + "device-plugin" not in out["n"]["set"] and DEPLOY + "driver" not in out["n"]["set"]
    assert out["n"]["set"][DEPLOY + "dcgm-exporter"] == "true"


def test_operands_false_removes_every_deploy_label(tmp_path: Path) -> None:
    out = run(tmp_path, [node("n", **{NFD: "true", DEPLOY + "operands": "false", DEPLOY + "driver": "true",
                                      DEPLOY + "device-plugin": "paused-for-mig-change"})])
    assert out["n"]["remove"] == [DEPLOY + "device-plugin", DEPLOY + "driver"]
    assert set(out["n"]["set"]) == {"nvidia.com/gpu.present"}


def test_disabled_and_our_components(tmp_path: Path) -> None:
    spec = {"dcgmExporter": {"enabled": False}, "partitioner": {"enabled": True}, "draDriver": {"enabled": True}}
    a100 = {NFD: "true", "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"}
    out = run(tmp_path, [node("n", **{NFD: "true", DEPLOY + "dcgm-exporter": "true"}),
                         node("static", **a100), node("dynamic", **a100, **{"kubegpu.io/gpu-partitioning": "mig"})],
              spec)
    assert out["n"]["remove"] == [DEPLOY + "dcgm-exporter"]
    assert out["n"]["set"][DEPLOY + "dra-driver"] == "true"
    # the partition agent and the MIG manager never share a node
    assert DEPLOY + "partition-agent" not in out["static"]["set"] and DEPLOY + "mig-manager" in out["static"]["set"]
    assert DEPLOY + "partition-agent" in out["dynamic"]["set"] and DEPLOY + "mig-manager" not in out["dynamic"]["set"]


def test_bad_nodes_file_is_one_line(tmp_path: Path) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text("apiVersion: kubegpu.io/v1\nkind: ClusterPolicy\nmetadata: {name: p}\n")
    nodes = tmp_path / "nodes.yaml"
    nodes.write_text("- metadata: {labels: {}}\n")
    result = runner.invoke(app, ["operator", "node-labels", "--policy", str(policy), "--nodes", str(nodes)])
    assert result.exit_code == 1 and "items[0].metadata.name" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
