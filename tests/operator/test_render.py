"""ClusterPolicy model, generated CRD, `kubegpu operator render` and the NVIDIA ClusterPolicy mapping."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from typer.testing import CliRunner

from kubegpu.cli import app
from kubegpu.config.crds import model_schema
from kubegpu.operator.components import OPERANDS, STATES, VALIDATIONS_DIR
from kubegpu.operator.crds import REPO_CRDS, generated_crds
from kubegpu.operator.policy import ClusterPolicySpec, parse_policy
from kubegpu.operator.render import COMPONENT_LABEL, NAME_LABEL, render

DATA = Path(__file__).parent / "data"
VERSIONS = ("1.33", "1.34", "1.35")
runner = CliRunner()


def policy(spec: dict[str, Any] | None = None, name: str = "p") -> Any:
    return parse_policy({"apiVersion": "kubegpu.io/v1", "kind": "ClusterPolicy", "metadata": {"name": name},
                         "spec": spec or {}})


def objects_of(p: Any) -> list[dict[str, Any]]:
    return [obj for _, objs in render(p) for obj in objs]


def strict_validate(objects: list[dict[str, Any]]) -> int:
    """Every built-in object validated strictly against each Kubernetes version; returns how many were checked."""
    checked = 0
    for obj in objects:
        if obj["apiVersion"].startswith("monitoring.coreos.com"):
            continue  # prometheus-operator CRD kind: not in the built-in schemas
        if obj["kind"].startswith("MutatingAdmissionPolicy"):
            continue  # GA in 1.36, newer than the schemas here: tests/quota/test_admission.py runs it on 1.37
        for version in VERSIONS:
            kubernetes_validate.validate(obj, version, strict=True)
        checked += 1
    return checked


def walk(node: dict[str, Any]) -> list[dict[str, Any]]:
    """Every schema node under NODE (properties, items, additionalProperties)."""
    children = list(node.get("properties", {}).values())
    children += [node[k] for k in ("items", "additionalProperties") if isinstance(node.get(k), dict)]
    return [node, *[n for child in children for n in walk(child)]]


def test_generated_crd_is_structural_valid_and_on_disk() -> None:
    crd = generated_crds()[0]
    for version in VERSIONS:
        kubernetes_validate.validate(crd, version, strict=True)
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    for node in walk(schema["properties"]["spec"]):
        assert "type" in node or "x-kubernetes-int-or-string" in node, node
        assert "$ref" not in node and "anyOf" not in node and "title" not in node
    spec = schema["properties"]["spec"]["properties"]
    assert spec["mig"]["properties"]["strategy"]["enum"] == ["none", "single", "mixed"]
    assert spec["migManager"]["properties"]["config"]["properties"]["default"]["type"] == "string"
    upgrade = spec["driver"]["properties"]["upgradePolicy"]["properties"]
    assert set(upgrade) == {"autoUpgrade", "maxParallelUpgrades", "maxUnavailable", "waitForCompletion",
                            "podDeletion", "drain"}
    assert crd["spec"]["scope"] == "Cluster" and crd["metadata"]["name"] == "clusterpolicies.kubegpu.io"
    assert set(schema["properties"]["status"]["properties"]["state"]["enum"]) == {"ready", "notReady", "ignored"}
    on_disk = yaml.safe_load((REPO_CRDS / "clusterpolicies.kubegpu.io.yaml").read_text())
    assert on_disk == crd, "deploy/crds is stale: run `kubegpu operator crds --output-dir deploy/crds`"


def test_every_block_has_the_common_fields() -> None:
    schema = model_schema(ClusterPolicySpec)["properties"]
    for name in ("operator", "driver", "toolkit", "devicePlugin", "migManager", "gfd", "dcgmExporter", "validator",
                 "nodeStatusExporter", "partitioner", "autoscaler", "draDriver", "gpuGuard", "quota"):
        assert {"enabled", "image", "version", "imagePullPolicy", "env", "resources", "tolerations",
                "args"} <= set(schema[name]["properties"]), name


@pytest.mark.parametrize(("spec", "field"), [
    ({"mig": {"strategy": "half"}}, "mig.strategy"),
    ({"driver": {"upgradePolicy": {"maxParallelUpgrades": -1}}}, "driver.upgradePolicy.maxParallelUpgrades"),
    ({"driver": {"upgradePolicy": {"maxUnavailable": "150%"}}}, "driver.upgradePolicy.maxUnavailable"),
    ({"devicePlugin": {"enabled": "maybe"}}, "devicePlugin.enabled"),
    ({"gfd": {"colour": "blue"}}, "gfd.colour"),
])
def test_invalid_policy_is_one_line_naming_the_field(tmp_path: Path, spec: dict[str, Any], field: str) -> None:
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump({"apiVersion": "kubegpu.io/v1", "kind": "ClusterPolicy",
                                    "metadata": {"name": "bad"}, "spec": spec}))
    result = runner.invoke(app, ["operator", "render", "--policy", str(path)])
    assert result.exit_code == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and f"spec.{field}" in lines[0], lines


def test_default_policy_renders_the_container_stack_in_state_order() -> None:
    states = render(policy())
    assert [s for s, _ in states] == list(STATES)
    by_state = {s: objs for s, objs in states}
    assert by_state["pre-requisites"][0]["kind"] == "RuntimeClass"
    workloads = {o["metadata"]["name"]: o for o in objects_of(policy()) if o["kind"] in ("DaemonSet", "Deployment")}
    assert set(workloads) == {"kubegpu-driver", "kubegpu-container-toolkit", "kubegpu-operator-validator",
                              "kubegpu-device-plugin", "kubegpu-mps-control-daemon", "kubegpu-dcgm-exporter",
                              "kubegpu-gpu-feature-discovery", "kubegpu-mig-manager"}
    for state in ("state-partitioner", "state-autoscaler", "state-dra-driver", "state-node-status-exporter",
                  "state-gpu-guard", "state-quota"):
        assert by_state[state] == []
    # within a state: ServiceAccount before RBAC before the workload
    kinds = [o["kind"] for o in by_state["state-device-plugin"]]
    assert kinds.index("ServiceAccount") < kinds.index("ClusterRole") < kinds.index("DaemonSet")


def test_everything_enabled_renders_valid_objects_with_labels_selectors_and_barriers() -> None:
    p, _ = load(DATA / "everything.yaml")
    objects = objects_of(p)
    mutating = sum(o["kind"].startswith("MutatingAdmissionPolicy") for o in objects)
    assert mutating == 6  # the charge, the quota gate and the claim gate, each a policy and a binding
    monitors = sum(o["kind"] == "ServiceMonitor" for o in objects)
    assert monitors and strict_validate(objects) == len(objects) - monitors - mutating  # all but ServiceMonitors
    for obj in objects:
        labels = obj["metadata"]["labels"]
        assert labels[NAME_LABEL] == "kubegpu" and labels[COMPONENT_LABEL]
    workloads = {o["metadata"]["labels"][COMPONENT_LABEL]: o for o in objects if o["kind"] in ("DaemonSet",
                                                                                              "Deployment")}
    assert len(workloads) == len(OPERANDS)
    for op in OPERANDS:
        pod = workloads[op.component]["spec"]["template"]["spec"]
        containers = pod["containers"]
        if op.kind == "DaemonSet":
            assert pod["nodeSelector"] == {f"nvidia.com/gpu.deploy.{op.deploy_as or op.component}": "true",
                                           **dict(op.node_selector)}
        if op.nvidia_image:
            assert containers[0]["image"].startswith("nvcr.io/nvidia/")
        else:
            assert containers[0]["image"].startswith("ghcr.io/kubegpu/kubegpu:")
            assert containers[0]["command"][:2] == (["kubegpu", op.command[1]])
        if op.waits_for:
            wait = pod["initContainers"][0]
            assert f"{VALIDATIONS_DIR}/{op.waits_for}" in wait["command"][-1]
    assert workloads["container-toolkit"]["spec"]["template"]["spec"]["initContainers"][0]["name"] == \
        "wait-driver-ready"
    validator = workloads["operator-validator"]["spec"]["template"]["spec"]
    assert [c["command"][2] for c in validator["initContainers"]] == ["driver", "toolkit", "cuda", "plugin"]
    assert "rm -f /run/nvidia/validations/*-ready" in validator["containers"][0]["lifecycle"]["preStop"]["exec"][
        "command"][-1]
    plugin = workloads["device-plugin"]["spec"]["template"]["spec"]["containers"][0]
    assert "--config-file=/config/config.yaml" in plugin["args"]  # per-node configs: tests/operator/test_node_config
    assert {"name": "FAIL_ON_INIT_ERROR", "value": "false"} in plugin["env"]
    assert "--no-timestamp" in workloads["gpu-feature-discovery"]["spec"]["template"]["spec"]["containers"][0]["args"]


def test_every_volume_mount_names_a_pod_volume() -> None:
    """What the schema cannot check and the API server rejects: a mount of a volume the pod does not have."""
    p, _ = load(DATA / "everything.yaml")
    for obj in objects_of(p):
        if obj["kind"] not in ("DaemonSet", "Deployment"):
            continue
        pod = obj["spec"]["template"]["spec"]
        volumes = {v["name"] for v in pod.get("volumes", [])}
        for container in [*pod.get("initContainers", []), *pod["containers"]]:
            for mount in container.get("volumeMounts", []):
                assert mount["name"] in volumes, (obj["metadata"]["name"], container["name"], mount["name"])
        if pod.get("automountServiceAccountToken") is False:
            assert not [o for o in objects_of(p) if o["kind"] == "ClusterRoleBinding"
                        and o["subjects"][0]["name"] == pod["serviceAccountName"]]


def test_rbac_is_least_privilege() -> None:
    p, _ = load(DATA / "everything.yaml")
    roles = [o for o in objects_of(p) if o["kind"] in ("ClusterRole", "Role")]
    assert roles
    for role in roles:
        for rule in role["rules"]:
            assert "*" not in rule["verbs"] and "*" not in rule["resources"] and "*" not in rule["apiGroups"]
    bindings = [o for o in objects_of(p) if o["kind"] in ("ClusterRoleBinding", "RoleBinding")]
    assert all(b["roleRef"]["name"] != "cluster-admin" for b in bindings)
    names = {r["metadata"]["name"] for r in roles}
    assert "kubegpu-dcgm-exporter" not in names  # the exporter needs no API access


def test_disabled_component_renders_nothing() -> None:
    objects = objects_of(policy({"dcgmExporter": {"enabled": False}, "driver": {"enabled": False}}))
    components = {o["metadata"]["labels"][COMPONENT_LABEL] for o in objects}
    assert "dcgm-exporter" not in components and "driver" not in components
    assert "operator-validator" in components  # validation is always on


def load(path: Path) -> tuple[Any, list[str]]:
    from kubegpu.operator.cli import load_policy

    return load_policy(path)


def test_render_cli_is_deterministic_and_writes_a_directory(tmp_path: Path) -> None:
    args = ["operator", "render", "--policy", str(DATA / "everything.yaml")]
    first, second = runner.invoke(app, args), runner.invoke(app, args)
    assert first.exit_code == 0 and first.stdout == second.stdout
    docs = [d for d in yaml.safe_load_all(first.stdout) if d]
    assert docs == objects_of(load(DATA / "everything.yaml")[0])
    out = tmp_path / "out"
    result = runner.invoke(app, [*args, "-o", str(out)])
    assert result.exit_code == 0
    files = sorted(out.iterdir())
    assert len(files) == len(docs)
    assert [yaml.safe_load(f.read_text()) for f in files] == docs


def test_nvidia_clusterpolicy_is_mapped_and_unhonoured_fields_reported() -> None:
    result = runner.invoke(app, ["operator", "render", "--policy", str(DATA / "nvidia-clusterpolicy.yaml")])
    assert result.exit_code == 0, result.stderr
    warnings = result.stderr.strip().splitlines()
    fields = {line.removeprefix("warning: ").split(":")[0] for line in warnings}
    assert {"spec.operator.initContainer.image", "spec.driver.rdma.enabled", "spec.gds.enabled",
            "spec.devicePlugin.repository", "spec.devicePlugin.image", "spec.devicePlugin.version"} == fields
    assert len(warnings) == len(fields)  # one line per field
    p, _ = load(DATA / "nvidia-clusterpolicy.yaml")
    assert p.spec.mig.strategy == "mixed"
    assert p.spec.driver.version == "550.90.07" and p.spec.driver.upgradePolicy.maxParallelUpgrades == 2
    assert p.spec.driver.upgradePolicy.drain.enable is True
    assert p.spec.devicePlugin.config.name == "time-slicing" and p.spec.devicePlugin.image == "kubegpu"
    assert p.spec.daemonsets.maxUnavailable == "1"
    assert p.spec.validator.plugin.env[0].name == "WITH_WORKLOAD"
    objects = [d for d in yaml.safe_load_all(result.stdout) if d]
    assert strict_validate(objects) >= len(objects) - 1


def test_wrong_api_version_is_one_line(tmp_path: Path) -> None:
    path = tmp_path / "p.yaml"
    path.write_text("apiVersion: example.com/v1\nkind: ClusterPolicy\nmetadata: {name: x}\n")
    result = runner.invoke(app, ["operator", "render", "--policy", str(path)])
    assert result.exit_code == 1 and "apiVersion" in result.stderr and len(result.stderr.splitlines()) == 1


def test_convert_prints_our_policy_from_nvidias() -> None:
    result = runner.invoke(app, ["operator", "convert", "--policy", str(DATA / "nvidia-clusterpolicy.yaml")])
    assert result.exit_code == 0, result.stderr
    converted = yaml.safe_load(result.stdout)
    assert converted["apiVersion"] == "kubegpu.io/v1" and converted["metadata"]["name"] == "cluster-policy"
    ours = parse_policy(converted)
    assert ours.spec.mig.strategy == "mixed" and ours.spec.driver.version == "550.90.07"
    assert "spec.gds.enabled" in result.stderr


def test_every_kubegpu_command_line_rendered_is_accepted_by_our_cli() -> None:
    """Flags the operands get must exist: each command line is parsed by the real CLI (an unknown flag fails
    before `--help` is reached)."""
    p, _ = load(DATA / "everything.yaml")
    checked = 0
    for obj in objects_of(p):
        if obj["kind"] not in ("DaemonSet", "Deployment"):
            continue
        pod = obj["spec"]["template"]["spec"]
        for container in [*pod.get("initContainers", []), *pod["containers"]]:
            command = container.get("command") or []
            if command[:1] != ["kubegpu"]:
                continue
            result = runner.invoke(app, [*command[1:], *container.get("args", []), "--help"])
            assert result.exit_code == 0, (obj["metadata"]["name"], container["name"], result.stderr)
            checked += 1
    assert checked == 23  # 16 operand and validator lines, the MPS daemon, 3 × config-manager init + sidecar
    helm_args = ["operator", "--namespace=kubegpu", "--skip-crds", "--help"]  # what the chart's Deployment passes
    assert runner.invoke(app, helm_args).exit_code == 0


def test_validate_config_knows_cluster_policies(tmp_path: Path) -> None:
    result = runner.invoke(app, ["validate-config", str(DATA / "nvidia-clusterpolicy.yaml")])
    assert result.exit_code == 0 and "valid ClusterPolicy" in result.stdout and "6 NVIDIA fields" in result.stdout
    bad = tmp_path / "bad.yaml"
    bad.write_text("apiVersion: kubegpu.io/v1\nkind: ClusterPolicy\nmetadata: {name: x}\nspec: {gfd: {enabled: 3}}\n")
    result = runner.invoke(app, ["validate-config", str(bad)])
    assert result.exit_code == 1 and "spec.gfd.enabled" in result.stderr


def test_the_gpu_guard_is_off_by_default_and_on_per_policy_field() -> None:
    assert not any(o["metadata"]["name"] == "kubegpu-gpu-guard" for o in objects_of(policy()))
    on = parse_policy({"apiVersion": "kubegpu.io/v1", "kind": "ClusterPolicy", "metadata": {"name": "p"},
                       "spec": {"gpuGuard": {"enabled": True, "args": ["--action=kill-process"]}}})
    guard = next(o for o in objects_of(on) if o["kind"] == "DaemonSet" and o["metadata"]["name"] == "kubegpu-gpu-guard")
    pod = guard["spec"]["template"]["spec"]
    assert pod["hostPID"] is True
    container = pod["containers"][0]
    assert container["command"] == ["kubegpu", "gpu-guard"]
    assert "--proc-root=/host/proc" in container["args"] and container["args"][-1] == "--action=kill-process"
    mounts = {m["mountPath"] for m in container["volumeMounts"]}
    assert {"/host/proc", "/var/lib/kubelet/pod-resources"} <= mounts
    rules = next(o for o in objects_of(on)
                 if o["kind"] == "ClusterRole" and o["metadata"]["name"] == "kubegpu-gpu-guard")
    assert {"apiGroups": [""], "resources": ["pods/eviction"], "verbs": ["create"]} in rules["rules"]
