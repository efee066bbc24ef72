"""Security defaults, written down in docs/security.md and held here (issue #18, "Hardening")."""

from __future__ import annotations

import asyncio
import re
import stat
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from kubegpu.deviceplugin.server import ResourceServer, ServingState

ROOT = Path(__file__).resolve().parents[2]
MANIFESTS = ROOT / "deploy/kubernetes/manifests"
POLICIES = ROOT / "deploy/kubernetes/policies"
NAMESPACE = "kubegpu"
PRIVILEGED_ALLOWED = {"kubegpu-mig-manager", "kubegpu-partition-agent"}  # MIG changes need the GPUs' capabilities
NON_ROOT = {"kubegpu-discover", "kubegpu-partitioner", "kubegpu-autoscaler"}
NODE_AGENTS = {"kubegpu-discover", "kubegpu-mig-manager", "kubegpu-partition-agent"}


def _documents() -> list[dict[str, Any]]:
    return [d for p in sorted(MANIFESTS.glob("*.yaml")) for d in yaml.safe_load_all(p.read_text()) if d]


def _workloads() -> list[dict[str, Any]]:
    return [d for d in _documents() if d["kind"] in ("DaemonSet", "Deployment")]


def grants() -> dict[str, list[str]]:
    """Every (scope, group/resource, verbs) each ServiceAccount's bindings give it."""
    docs = _documents()
    roles = {(d["kind"], d["metadata"]["name"]): d for d in docs if d["kind"] in ("Role", "ClusterRole")}
    result: dict[str, list[str]] = {}
    for account in sorted(d["metadata"]["name"] for d in docs if d["kind"] == "ServiceAccount"):
        lines = []
        for binding in (d for d in docs if d["kind"] in ("RoleBinding", "ClusterRoleBinding")):
            if not any(s["kind"] == "ServiceAccount" and s["name"] == account for s in binding["subjects"]):
                continue
            role = roles[(binding["roleRef"]["kind"], binding["roleRef"]["name"])]
            scope = "cluster" if binding["kind"] == "ClusterRoleBinding" else \
                f"namespace {binding['metadata'].get('namespace', NAMESPACE)}"
            for rule in role["rules"]:
                lines.extend(f"{scope}: {group or 'core'}/{resource}: {' '.join(sorted(rule['verbs']))}"
                             for group in rule["apiGroups"] for resource in rule["resources"])
        result[account] = sorted(lines)
    return result


def test_rbac_matches_the_checked_in_expectation() -> None:
    expected = yaml.safe_load((Path(__file__).parent / "rbac_expected.yaml").read_text())
    assert grants() == expected


def test_rbac_has_no_wildcards_and_no_secrets() -> None:
    for doc in _documents():
        for rule in doc.get("rules") or []:
            for key in ("apiGroups", "resources", "verbs"):
                assert "*" not in rule.get(key, []), f"{doc['metadata']['name']}: wildcard {key}"
            assert "secrets" not in rule["resources"]


def test_every_pod_uses_the_runtime_default_seccomp_profile() -> None:
    for workload in _workloads():
        pod = workload["spec"]["template"]["spec"]
        assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}, workload["metadata"]["name"]


def test_privileged_only_for_mig_changes_and_with_the_reason_written() -> None:
    for path in sorted(MANIFESTS.glob("*.yaml")):
        lines = path.read_text().splitlines()
        for i, line in enumerate(lines):
            if re.match(r"\s*privileged: true", line):
                assert lines[i - 1].strip().startswith("#"), f"{path.name}:{i + 1}: privileged without a reason"
    for workload in _workloads():
        name = workload["metadata"]["name"]
        for container in workload["spec"]["template"]["spec"]["containers"]:
            context = container.get("securityContext") or {}
            if context.get("privileged"):
                assert name in PRIVILEGED_ALLOWED, name
                continue
            assert context.get("allowPrivilegeEscalation") is False, name
            assert context.get("readOnlyRootFilesystem") is True, name
            assert context.get("capabilities") == {"drop": ["ALL"]}, name  # nothing added (no SYS_ADMIN)
            if name in NON_ROOT:
                assert context.get("runAsNonRoot") is True and context.get("runAsUser", 0) != 0, name


def test_root_containers_say_why() -> None:
    for path in sorted(MANIFESTS.glob("*.yaml")):
        text = path.read_text()
        for match in re.finditer(r"\n( *)runAsUser: 0\n", text):
            before = text[: match.start()].splitlines()[-1].strip()
            assert before.startswith("#"), f"{path.name}: runAsUser 0 without a reason"


def test_node_agent_policy_covers_every_agent_that_may_patch_nodes() -> None:
    docs = _policy_docs()
    for doc in docs:
        kubernetes_validate.validate(doc, kubernetes_validate.latest_version(), strict=True)
    [policy] = [d for d in docs if d["kind"] == "ValidatingAdmissionPolicy"]
    [binding] = [d for d in docs if d["kind"] == "ValidatingAdmissionPolicyBinding"]
    assert binding["spec"]["policyName"] == policy["metadata"]["name"] and binding["spec"]["validationActions"] == [
        "Deny"]
    patchers = {sa for sa, lines in grants().items() if any("core/nodes: " in g and "patch" in g for g in lines)}
    condition = policy["spec"]["matchConditions"][0]["expression"]
    covered = set(re.findall(r"system:serviceaccount:kubegpu:([a-z-]+)", condition))
    assert covered == NODE_AGENTS == patchers - {"kubegpu-autoscaler", "kubegpu-partitioner"}


def _policy_docs() -> list[dict[str, Any]]:
    return [d for p in sorted(POLICIES.glob("*.yaml")) for d in yaml.safe_load_all(p.read_text()) if d]


def test_kustomization_installs_the_node_agent_policy() -> None:
    kustomization = yaml.safe_load((ROOT / "deploy/kubernetes/kustomization.yaml").read_text())
    assert {f"policies/{p.name}" for p in POLICIES.glob("*.yaml")} <= set(kustomization["resources"])


def test_operator_renders_the_same_node_agent_policy_for_its_own_agents() -> None:
    """The operator (Helm install) applies the policy deploy/kubernetes ships, naming its operands' accounts."""
    from kubegpu.operator.components import OPERANDS
    from kubegpu.operator.policy import parse_policy
    from kubegpu.operator.render import render

    rendered = {o["kind"]: o for _, objs in render(parse_policy({"metadata": {"name": "p"}, "spec": {}}, "p"), "gpu")
                for o in objs if o["kind"].startswith("ValidatingAdmissionPolicy")}
    shipped = {d["kind"]: d for d in _policy_docs()}
    assert set(rendered) == set(shipped) == {"ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"}
    for kind, doc in shipped.items():
        kubernetes_validate.validate(rendered[kind], kubernetes_validate.latest_version(), strict=True)
        assert rendered[kind]["metadata"]["name"] == doc["metadata"]["name"]
        if kind == "ValidatingAdmissionPolicyBinding":
            assert rendered[kind]["spec"] == doc["spec"]
            continue
        mine, theirs = rendered[kind]["spec"], doc["spec"]
        assert {k: v for k, v in mine.items() if k != "matchConditions"} == \
            {k: v for k, v in theirs.items() if k != "matchConditions"}
        covered = set(re.findall(r"system:serviceaccount:gpu:([a-z-]+)", mine["matchConditions"][0]["expression"]))
        node_writers = {op.name for op in OPERANDS if op.kind == "DaemonSet" and any(
            "patch" in r["verbs"] and {"nodes", "nodes/status"} & set(r["resources"]) for r in op.cluster_rules)}
        assert covered == node_writers == {"kubegpu-gpu-feature-discovery", "kubegpu-mig-manager",
                                           "kubegpu-partition-agent"}


def test_operator_may_apply_the_policy_it_renders() -> None:
    from helm_python import chart

    from kubegpu.operator.chart import CHART_DIR

    manifests = chart.Chart.load(CHART_DIR).render({}, name="kg", namespace="gpu-system")
    roles = [d for text in manifests.values() for d in yaml.safe_load_all(text) if d and d["kind"] == "ClusterRole"]
    held = {(g, r, v) for role in roles for rule in role["rules"] for g in rule["apiGroups"]
            for r in rule["resources"] for v in rule["verbs"]}
    for resource in ("validatingadmissionpolicies", "validatingadmissionpolicybindings"):
        assert {("admissionregistration.k8s.io", resource, v) for v in ("get", "list", "create", "patch", "delete")} \
            <= held


def test_device_plugin_socket_is_owner_only(tmp_path: Path) -> None:
    async def run() -> int:
        server = ResourceServer("nvidia.com/gpu", tmp_path / "nvidia-gpu.sock", ServingState(devices=[]))
        await server.start()
        try:
            return stat.S_IMODE((tmp_path / "nvidia-gpu.sock").stat().st_mode)
        finally:
            await server.stop()

    assert asyncio.run(run()) == 0o600  # was 0755: any local user could talk to the plugin


@pytest.mark.parametrize("component", ["device-plugin", "exporter"])
def test_security_doc_covers_each_component(component: str) -> None:
    text = (ROOT / "docs/security.md").read_text()
    assert f"kubegpu-{component}" in text
