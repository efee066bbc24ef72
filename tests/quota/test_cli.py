"""`kubegpu quota explain` and `kubegpu quota manifests` through the CLI."""

from __future__ import annotations

import json
from pathlib import Path

import yaml
from typer.testing import CliRunner

from kubegpu.cli import app
from kubegpu.quota.manifests import REPO_DIR, manifest_files, render_file

GIB = 1 << 30


def write(tmp_path: Path, name: str, data: object) -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data))
    return path


POD = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "train", "namespace": "team-a"},
       "spec": {"nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-H100-NVL"},
                "containers": [{"name": "main", "resources": {"limits": {"nvidia.com/gpu": 1,
                                                                         "nvidia.com/gpu.shared": 2}}},
                               {"name": "side", "resources": {"limits": {"nvidia.com/mig-1g.10gb": "3"}}}]}}


def test_explain_json_shape(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["quota", "explain", "-f", str(write(tmp_path, "pod.yaml", POD)), "-o", "json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == {"pod": "team-a/train", "gpuMemoryBytes": 94 * GIB + 2 * (94 * GIB // 4)
                                         + 30 * GIB, "lines": [
        {"container": "main", "resource": "nvidia.com/gpu", "count": 1, "bytesEach": 94 * GIB},
        {"container": "main", "resource": "nvidia.com/gpu.shared", "count": 2, "bytesEach": 94 * GIB // 4},
        {"container": "side", "resource": "nvidia.com/mig-1g.10gb", "count": 3, "bytesEach": 10 * GIB}]}


def test_explain_config_gives_replicas(tmp_path: Path) -> None:
    config = write(tmp_path, "config.yaml", {"version": "v1", "sharing": {"timeSlicing": {
        "renameByDefault": True, "resources": [{"name": "nvidia.com/gpu", "replicas": 2}]}}})
    pod = write(tmp_path, "pod.yaml", POD)
    result = CliRunner().invoke(app, ["quota", "explain", "-f", str(pod), "--config", str(config), "-o", "json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["lines"][1]["bytesEach"] == 47 * GIB
    table = CliRunner().invoke(app, ["quota", "explain", "-f", str(pod), "--config", str(config)])
    assert table.exit_code == 0 and "47Gi" in table.stdout and "total" in table.stdout


def test_explain_a_workloads_pod_template(tmp_path: Path) -> None:
    job = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "j", "namespace": "ns"},
           "spec": {"template": {"spec": {"containers": [{"name": "c", "resources": {"limits": {
               "nvidia.com/gpu-20gb": 1}}}]}}}}
    result = CliRunner().invoke(app, ["quota", "explain", "-f", str(write(tmp_path, "job.yaml", job)), "-o", "json"])
    assert json.loads(result.stdout)["gpuMemoryBytes"] == 20 * GIB


def test_explain_charges_resource_claims_as_the_controller_does(tmp_path: Path) -> None:
    """A pod's ResourceClaims are charged (no longer only warned about): its template in the same file, a named
    claim from another -f; a missing one is one line naming it."""
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "dra", "namespace": "ns"},
           "spec": {"resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "one-mig"},
                                       {"name": "shared", "resourceClaimName": "team-gpu"}],
                    "containers": [{"name": "c", "resources": {"claims": [{"name": "gpu"}]}}]}}
    template = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
                "metadata": {"name": "one-mig", "namespace": "ns"},
                "spec": {"spec": {"devices": {"requests": [{"name": "mig", "exactly": {
                    "deviceClassName": "mig.nvidia.com", "count": 2, "selectors": [
                        {"cel": {"expression": "device.attributes['gpu.nvidia.com'].profile == '3g.40gb'"}}]}}]}}}}
    claim = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": "team-gpu"},
             "spec": {"devices": {"requests": [{"name": "share", "exactly": {
                 "deviceClassName": "fraction.gpu.kubegpu.io", "capacity": {"requests": {"compute": "250"}}}}]}}}
    path = tmp_path / "pod.yaml"
    path.write_text(yaml.safe_dump_all([pod, template]))
    result = CliRunner().invoke(app, ["quota", "explain", "-f", str(path), "-f",
                                      str(write(tmp_path, "claim.yaml", claim)), "-o", "json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    # 2 x 3g.40gb; a quarter of the largest GPU (B200, 180Gi) for the shared named claim
    assert [c["gpuMemoryBytes"] for c in data["claims"]] == [80 * GIB, 45 * GIB]
    assert data["gpuMemoryBytes"] == 125 * GIB and "warning" not in result.stderr
    missing = CliRunner().invoke(app, ["quota", "explain", "-f", str(write(tmp_path, "alone.yaml", pod))])
    assert missing.exit_code == 1
    assert missing.output.strip() == ("error: ns/dra: claim gpu: ResourceClaimTemplate ns/one-mig not found "
                                      "(give it with -f)")


def test_explain_bad_input_is_one_line(tmp_path: Path) -> None:
    runner = CliRunner()
    bad = dict(POD, spec={"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "half"}}}]})
    for args in (["-f", str(write(tmp_path, "bad.yaml", bad))], ["-f", str(tmp_path / "missing.yaml")],
                 ["-f", str(write(tmp_path, "list.yaml", [1])), "-o", "json"],
                 ["-f", str(write(tmp_path, "ok.yaml", POD)), "-o", "xml"],
                 ["-f", str(write(tmp_path, "ok2.yaml", POD)), "--config",
                  str(write(tmp_path, "c.yaml", {"version": "v2"}))]):
        result = runner.invoke(app, ["quota", "explain", *args])
        # a bad file exits 1; a bad option value (-o xml) exits 2, as everywhere (the CLI contract)
        assert result.exit_code == (2 if "xml" in args else 1), (args, result.output)
        assert result.output.startswith("error: ") and len(result.output.strip().splitlines()) == 1, result.output


def test_shipped_manifests_are_fresh() -> None:
    for name, objects in manifest_files().items():
        assert (REPO_DIR / name).read_text() == render_file(objects), \
            "deploy/kubernetes/quota is stale: run `kubegpu quota manifests -o deploy/kubernetes/quota`"
    assert sorted(p.name for p in REPO_DIR.glob("*.yaml")) == sorted(manifest_files())


def test_the_shipped_controller_serves_metrics_with_a_readiness_probe() -> None:
    """The Deployment runs `--metrics-address` (a flag the command has) and probes /readyz on it: a controller whose
    informers are stale is taken out of readiness, as the other controllers are."""
    [deployment] = [o for o in manifest_files()["50-quota-controller.yaml"] if o["kind"] == "Deployment"]
    [container] = deployment["spec"]["template"]["spec"]["containers"]
    assert "--metrics-address=:8084" in container["args"]
    assert container["ports"] == [{"name": "metrics", "containerPort": 8084}]
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}
    assert "--metrics-address" in CliRunner().invoke(app, ["quota", "controller", "--help"]).output
