"""The Helm chart, with real Helm (helm-python-sdk embeds Helm's Go library), and the Dockerfile, statically."""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from helm_python import chart

from kubegpu.operator.chart import CHART_DIR, render_values_schema
from kubegpu.operator.components import OPERANDS
from kubegpu.operator.crds import REPO_CRDS
from kubegpu.operator.policy import parse_policy
from kubegpu.operator.render import render

ROOT = Path(__file__).resolve().parents[2]
DATA = Path(__file__).parent / "data"
VERSIONS = ("1.33", "1.34", "1.35")


def rendered(values: dict[str, Any]) -> list[dict[str, Any]]:
    manifests = chart.Chart.load(CHART_DIR).render(values, name="kg", namespace="gpu-system")
    return [doc for text in manifests.values() for doc in yaml.safe_load_all(text) if doc]


def validate_strictly(objects: list[dict[str, Any]]) -> None:
    for obj in objects:
        for version in VERSIONS:
            kubernetes_validate.validate(obj, version, strict=True)


def test_lint_is_clean() -> None:
    report = chart.lint(CHART_DIR, strict=True)
    assert report["errors"] == []
    assert [m for m in report["messages"] if m["severity"] >= 2] == []


def test_values_schema_is_generated_from_the_model() -> None:
    assert (CHART_DIR / "values.schema.json").read_text() == render_values_schema(), \
        "stale: run `python -m kubegpu.operator.chart`"


def test_chart_ships_every_crd_the_project_defines() -> None:
    shipped = {c["name"].removeprefix("crds/"): c["data"] for c in chart.Chart.load(CHART_DIR).crds}
    on_disk = {p.name: p.read_text() for p in REPO_CRDS.glob("*.yaml")}
    assert "clusterpolicies.kubegpu.io.yaml" in shipped and "nodepools.kubegpu.io.yaml" in shipped
    assert shipped == on_disk
    for text in shipped.values():
        validate_strictly([yaml.safe_load(text)])


@pytest.mark.parametrize("values_file", [None, "values-everything.yaml"])
def test_rendered_objects_validate_strictly(values_file: str | None) -> None:
    values = yaml.safe_load((DATA / values_file).read_text()) if values_file else {}
    objects = rendered(values)
    kinds = sorted(o["kind"] for o in objects)
    assert kinds == ["ClusterPolicy", "ClusterRole", "ClusterRoleBinding", "Deployment", "Job", "ServiceAccount"]
    validate_strictly([o for o in objects if o["kind"] != "ClusterPolicy"])
    policy = parse_policy(next(o for o in objects if o["kind"] == "ClusterPolicy"))
    image = values.get("image", {}).get("repository", "ghcr.io/kubegpu/kubegpu")
    assert policy.spec.devicePlugin.image_ref().startswith(image + ":")
    operands = [obj for _, objs in render(policy, "gpu-system") for obj in objs]  # strict-validated in test_render
    assert {o["metadata"]["namespace"] for o in operands if "namespace" in o["metadata"]} == {"gpu-system"}
    deployment = next(o for o in objects if o["kind"] == "Deployment")
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert container["args"][0] == "operator" and "--namespace=gpu-system" in container["args"]
    assert deployment["spec"]["template"]["spec"]["securityContext"]["runAsNonRoot"] is True


def test_values_schema_rejects_a_bad_policy() -> None:
    from helm_python.errors import HelmValuesError

    with pytest.raises(HelmValuesError, match="strategy"):
        rendered({"clusterPolicy": {"spec": {"mig": {"strategy": "sometimes"}}}})


def _grants(rules: list[dict[str, Any]]) -> set[tuple[str, str, str]]:
    return {(g, r, v) for rule in rules for g in rule["apiGroups"] for r in rule["resources"] for v in rule["verbs"]}


def test_operator_rbac_is_least_privilege_and_can_grant_every_operand_role() -> None:
    role = next(o for o in rendered({}) if o["kind"] == "ClusterRole")
    held = _grants(role["rules"])
    assert not any("*" in grant for grant in held)
    for op in OPERANDS:
        assert _grants([*op.cluster_rules, *op.namespace_rules]) <= held, op.component
    assert ("", "pods/eviction", "create") in held and ("", "pods", "delete") in held


def test_operator_may_inform_the_nodepools_whose_gpus_it_charges() -> None:
    role = next(o for o in rendered({}) if o["kind"] == "ClusterRole")
    held = _grants(role["rules"])
    wanted = {(group, "nodepools", verb) for group in ("kubegpu.io", "karpenter.sh") for verb in ("list", "watch")}
    assert wanted <= held


def _dockerfile() -> list[tuple[str, str]]:
    lines, buffer = [], ""
    for raw in (ROOT / "Dockerfile").read_text().splitlines():
        if raw.lstrip().startswith("#") or not raw.strip():
            continue
        buffer += raw.rstrip("\\").strip() + " "
        if not raw.endswith("\\"):
            instruction, _, rest = buffer.strip().partition(" ")
            lines.append((instruction.upper(), rest))
            buffer = ""
    return lines


def test_dockerfile_one_image_non_root_kubegpu_entrypoint() -> None:
    instructions = _dockerfile()
    final = instructions[max(i for i, (ins, _) in enumerate(instructions) if ins == "FROM"):]
    users = [rest for ins, rest in final if ins == "USER"]
    assert users and users[-1].split(":")[0] not in ("0", "root")
    assert json.loads(next(rest for ins, rest in final if ins == "ENTRYPOINT")) == ["kubegpu"]
    copies = [shlex.split(rest) for ins, rest in instructions if ins == "COPY"]
    assert ["deploy/crds", "/opt/kubegpu/crds"] in copies  # the operator applies them at start
    run = " ".join(rest for ins, rest in instructions if ins == "RUN")
    assert "pip install" in run and " ." in run  # the whole package: every component
    ignored = (ROOT / ".dockerignore").read_text().splitlines()
    assert "*" in ignored and "!src/" in ignored and "!deploy/crds/" in ignored


def test_uninstall_hook_cleans_up_with_the_operators_account() -> None:
    """`helm uninstall` runs `kubegpu operator cleanup` first (pre-delete), as the operator's ServiceAccount, whose
    role may delete ClusterPolicies and patch Nodes; `operator.cleanupOnUninstall: false` leaves it out."""
    objects = rendered({})
    [job] = [o for o in objects if o["kind"] == "Job"]
    assert job["metadata"]["annotations"]["helm.sh/hook"] == "pre-delete"
    pod = job["spec"]["template"]["spec"]
    deployment = next(o for o in objects if o["kind"] == "Deployment")
    assert pod["serviceAccountName"] == deployment["spec"]["template"]["spec"]["serviceAccountName"]
    assert pod["containers"][0]["args"] == ["operator", "cleanup", "--namespace=gpu-system"]
    role = next(o for o in objects if o["kind"] == "ClusterRole")
    assert any("clusterpolicies" in r["resources"] and "delete" in r["verbs"] for r in role["rules"])
    assert any("nodes" in r["resources"] and "patch" in r["verbs"] for r in role["rules"])
    assert not [o for o in rendered({"operator": {"cleanupOnUninstall": False}}) if o["kind"] == "Job"]

