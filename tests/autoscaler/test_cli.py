"""`kubegpu provision` and the NodePool kind in `kubegpu validate-config`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from kubegpu.cli import app
from tests.autoscaler.builders import nodepool, pod

runner = CliRunner()


def files(tmp_path: Path, pools: list, pods: list) -> tuple[Path, Path]:
    pools_path = tmp_path / "pools.yaml"
    pools_path.write_text(yaml.safe_dump_all(pools))
    pods_path = tmp_path / "pods.json"
    pods_path.write_text(json.dumps(pods))
    return pools_path, pods_path


def provision(*args: str) -> tuple[int, str]:
    return invoke("provision", *args)


def invoke(*args: str) -> tuple[int, str]:
    from kubegpu.cli import main  # noqa: F401  (the entry point wraps errors; reproduce it here)
    from kubegpu.errors import KubegpuError

    try:
        result = runner.invoke(app, list(args), catch_exceptions=False)
    except KubegpuError as exc:
        return 1, f"error: {exc}"
    return result.exit_code, result.output


def test_provision_json_lists_nodeclaims_and_unschedulable(tmp_path: Path) -> None:
    gpu_pool = nodepool("gpu", weight=10, labels={"nvidia.com/mig.config": "all-1g.10gb"},
                        requirements=[{"key": "nvidia.com/gpu.product", "operator": "In",
                                       "values": ["NVIDIA-A100-SXM4-80GB"]}])
    pods = [pod(f"m{i}", cpu="1", limits={"nvidia.com/mig-1g.10gb": 1}) for i in range(3)]
    pods.append(pod("fpga", limits={"example.com/fpga": 1}))
    pools_path, pods_path = files(tmp_path, [gpu_pool, nodepool("default")], pods)
    code, out = provision("--nodepools", str(pools_path), "--pods", str(pods_path), "-o", "json")
    assert code == 0, out
    data = json.loads(out)
    [claim] = data["nodeclaims"]
    assert claim["nodepool"] == "gpu" and claim["instanceType"] == "p4de.24xlarge"
    assert sorted(claim["pods"]) == ["m0", "m1", "m2"]
    assert claim["price"] > 0
    assert data["unschedulable"] == [{"pod": "fpga", "namespace": "default",
                                      "reason": "no instance type offers example.com/fpga"}]


def test_provision_uses_existing_nodes_from_file(tmp_path: Path) -> None:
    node = {"kind": "Node", "metadata": {"name": "n1", "labels": {}},
            "status": {"allocatable": {"cpu": "4", "memory": "16Gi", "pods": "110"}}}
    nodes_path = tmp_path / "nodes.yaml"
    nodes_path.write_text(yaml.safe_dump({"kind": "List", "items": [node]}))
    pools_path, pods_path = files(tmp_path, [nodepool("default")], [pod("a", cpu="2"), pod("b", cpu="3")])
    _code, out = provision("--nodepools", str(pools_path), "--pods", str(pods_path), "--nodes", str(nodes_path),
                          "-o", "json")
    data = json.loads(out)
    assert data["existing"] == {"n1": ["b"]}
    assert [c["pods"] for c in data["nodeclaims"]] == [["a"]]


def test_bad_inputs_are_one_line(tmp_path: Path) -> None:
    bad_pool = nodepool("bad", requirements=[{"key": "a", "operator": "Gt", "values": ["x"]}])
    pools_path, pods_path = files(tmp_path, [bad_pool], [pod("a")])
    code, out = provision("--nodepools", str(pools_path), "--pods", str(pods_path), "-o", "json")
    assert code == 1
    assert out.startswith(f"error: {pools_path}: NodePool bad: spec.template.spec.requirements[0]")
    pools_path, pods_path = files(tmp_path, [nodepool("ok")], [pod("a", cpu="lots")])
    code, out = provision("--nodepools", str(pools_path), "--pods", str(pods_path))
    assert code == 1 and str(pods_path) in out and "lots" in out and out.strip().count("\n") == 0
    pods_path.write_text("- [unclosed")
    code, out = provision("--nodepools", str(pools_path), "--pods", str(pods_path))
    assert code == 1 and "invalid YAML" in out
    code, out = provision("--nodepools", str(pools_path), "--pods", str(pods_path), "-o", "xml")
    assert code == 2 and "-o/--output: 'xml' is not one of json, yaml, table" in out and out.count("\n") == 1
    pools_path, pods_path = files(tmp_path, [nodepool("ok")], [pod("a", spec={"nodeName": "ghost"})])
    code, out = provision("--nodepools", str(pools_path), "--pods", str(pods_path))
    assert code == 1 and "spec.nodeName 'ghost' is not among the --nodes" in out
    pools_path, pods_path = files(tmp_path, [nodepool("ok")], [pod("neg", limits={"nvidia.com/gpu": "-1"})])
    code, out = provision("--nodepools", str(pools_path), "--pods", str(pods_path))
    assert code == 1 and "pod default/neg: spec.containers[0].resources.nvidia.com/gpu: must not be negative" in out


NODE = {"kind": "Node", "metadata": {"name": "n1", "labels": {}}, "spec": {"taints": []},
        "status": {"allocatable": {"cpu": "4", "memory": "16Gi", "pods": "110"}}}


def _node(**changes: Any) -> dict[str, Any]:
    node = json.loads(json.dumps(NODE))
    for path, value in changes.items():
        section, field = path.split("__")
        node[section][field] = value
    return node


@pytest.mark.parametrize(("nodes", "pods", "fragment"), [
    ([_node(status__allocatable={"cpu": "lots"})], [], "nodes.yaml: [0].status.allocatable.cpu: invalid quantity"),
    ([_node(status__allocatable={"cpu": "-4"})], [], "nodes.yaml: [0].status.allocatable.cpu: must not be negative"),
    ([_node(spec__taints=[5])], [], "nodes.yaml: [0].spec.taints[0]: expected {key, value, effect}"),
    ([_node(metadata__labels=["gpu"])], [], "nodes.yaml: [0].metadata.labels: expected a mapping"),
    ([NODE, NODE], [], "nodes.yaml: [1].metadata.name: duplicate Node 'n1'"),
    ([], [pod("a"), pod("a")], "pods.json: [1].metadata.name: duplicate Pod 'default/a'"),
    ([], [pod("a", spec={"containers": 5})], "pods.json: pod default/a: spec / containers / resources: cannot be"),
    ([], [pod("a", spec={"tolerations": ["gpu"]})], "pods.json: pod default/a: spec.affinity / nodeSelector / "
                                                     "tolerations: cannot be read"),
])
def test_malformed_nodes_and_pods_files_are_one_line(tmp_path: Path, nodes: list[dict[str, Any]],
                                                     pods: list[dict[str, Any]], fragment: str) -> None:
    nodes_path = tmp_path / "nodes.yaml"
    nodes_path.write_text(yaml.safe_dump(nodes))
    pools_path, pods_path = files(tmp_path, [nodepool("ok")], pods)
    code, out = provision("--nodepools", str(pools_path), "--pods", str(pods_path), "--nodes", str(nodes_path))
    assert code == 1 and out.strip().count("\n") == 0
    assert out.startswith(f"error: {tmp_path}/") and fragment in out


def test_duplicate_nodepool_names_are_one_line(tmp_path: Path) -> None:
    pools_path, pods_path = files(tmp_path, [nodepool("gpu"), nodepool("gpu")], [pod("a")])
    code, out = provision("--nodepools", str(pools_path), "--pods", str(pods_path))
    assert code == 1 and "pools.yaml: [1].metadata.name: duplicate NodePool 'gpu'" in out


def test_validate_config_knows_nodepools(tmp_path: Path) -> None:
    from kubegpu.config import validate_document

    kind, summary = validate_document(nodepool("x", weight=5), "pool.yaml")
    assert kind == "NodePool" and "weight 5" in summary


def test_entry_point_exits_1_with_one_line(tmp_path: Path) -> None:
    import subprocess
    import sys

    pools_path, pods_path = files(tmp_path, [nodepool("b", disruption={"budgets": [{"nodes": "-1"}]})], [pod("a")])
    proc = subprocess.run([sys.executable, "-c", "from kubegpu.cli import main; main()", "provision",
                           "--nodepools", str(pools_path), "--pods", str(pods_path)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1
    assert proc.stderr.strip().count("\n") == 0
    assert "spec.disruption.budgets[0].nodes" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.parametrize(("flags", "message"), [
    (["--registration-delay", "-5"], "Invalid value for '--registration-delay': must be at least 0 seconds"),
    (["--interval", "0"], "Invalid value for '--interval': must be more than 0"),
    (["--metrics-port", "70000"], "--metrics-port: must be 0 (off) or a port 1..65535, got 70000"),
    (["--lease-duration", "0s"], "Invalid value for '--lease-duration': must be more than 0"),
    (["--batch-idle-duration", "5s", "--batch-max-duration", "1s"],
     "--batch-max-duration: must be at least as long as --batch-idle-duration"),
    (["--provider", "gce"], "Invalid value for '--provider': 'gce' is not one of kwok, aws"),
])
def test_autoscaler_flags_are_checked_before_touching_the_cluster(flags: list[str], message: str) -> None:
    code, out = invoke("autoscaler", "--once", *flags)  # --once: the older spelling of --oneshot, still accepted
    assert code == 2 and out.count("\n") == 1 and out.startswith("error: ") and message in out, out


def test_autoscaler_durations_take_go_style_values() -> None:
    from kubegpu.autoscaler.cli import autoscaler_command

    assert "simulated provider" not in (autoscaler_command.__doc__ or "")
    code, out = invoke("autoscaler", "--oneshot", "--interval", "1m30s", "--batch-idle-duration", "500ms",
                       "--lease-duration", "abc")
    assert code == 2 and "'--lease-duration'" in out


def test_provision_plans_claim_pods_with_the_dra_file(tmp_path: Path) -> None:
    """`--dra`: the templates the pods' claims name; the shipped DeviceClasses come with them."""
    profile = "device.attributes['gpu.nvidia.com'].profile == '3g.40gb'"
    small = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
             "metadata": {"name": "small", "namespace": "default"},
             "spec": {"spec": {"devices": {"requests": [{"name": "mig", "exactly": {
                 "deviceClassName": "mig.nvidia.com",
                 "selectors": [{"cel": {"expression": profile}}]}}]}}}}
    pods = [pod(f"m{i}", spec={"resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "small"}]})
            for i in range(2)]
    pools_path, pods_path = files(tmp_path, [nodepool("default")], pods)
    dra_path = tmp_path / "dra.yaml"
    dra_path.write_text(json.dumps(small))
    code, out = provision("--nodepools", str(pools_path), "--pods", str(pods_path), "--dra", str(dra_path),
                          "-o", "json")
    assert code == 0, out
    [claim] = json.loads(out)["nodeclaims"]
    assert claim["instanceType"] in ("p4de.24xlarge", "p5.48xlarge")   # GPUs with 3g.40gb placements
    code, out = provision("--nodepools", str(pools_path), "--pods", str(pods_path), "-o", "json")
    assert code == 0, out   # without the file the template is unknown: said so, nothing bought
    assert not json.loads(out)["nodeclaims"]
    assert "resourceClaimTemplate small not found" in json.loads(out)["unschedulable"][0]["reason"]
    dra_path.write_text(json.dumps({"kind": "Pod", "metadata": {"name": "x"}}))
    code, out = provision("--nodepools", str(pools_path), "--pods", str(pods_path), "--dra", str(dra_path))
    assert code != 0 and "expected one of DeviceClass" in out
