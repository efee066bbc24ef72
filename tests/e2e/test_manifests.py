"""deploy/kubernetes: plain manifests a platform engineer applies to a real cluster.

Checked without a cluster: every document against the Kubernetes OpenAPI schemas (kubernetes-validate, strict),
every container's command line against our own CLI (each flag in `kubegpu <sub-command> --help`, and the whole line
parsed by the command's real option parser without running it), and the wiring a schema cannot see: volumes, the
ConfigMaps' contents, ServiceAccounts, bindings, the Service's selector, and RBAC against what each component does.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import typer.main
import yaml

from tests.e2e.cli import EXAMPLES, REPO, invoke

DEPLOY = REPO / "deploy" / "kubernetes"
CRDS = REPO / "deploy" / "crds"
IMAGE = "ghcr.io/kubegpu/kubegpu:0.1.0"
NAMESPACE = "kubegpu"
KUBERNETES_VERSIONS = ("1.31.0", kubernetes_validate.latest_version())
WORKLOADS = ("DaemonSet", "Deployment")
CLUSTER_SCOPED = {"Namespace", "ClusterRole", "ClusterRoleBinding", "CustomResourceDefinition",
                  "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"}

# What each component must be allowed to do: exactly the kubegpu.kube.Cluster calls its code makes (get, list,
# watch, create, patch, delete; `record_event` is create, then get + patch to fold repeats), as
# (API group, resource, verb). A grant beyond this fails the test as surely as a missing one: least privilege.
EVENTS = {("", "events", verb) for verb in ("create", "get", "patch")}
NEEDS: dict[str, set[tuple[str, str, str]]] = {
    "kubegpu-device-plugin": set(),
    "kubegpu-exporter": set(),
    "kubegpu-discover": {("", "nodes", "get"), ("", "nodes", "patch"), ("", "nodes/status", "patch")},
    "kubegpu-mig-manager": {("", "nodes", verb) for verb in ("get", "watch", "patch")} | EVENTS,
    "kubegpu-partition-agent": {("", "nodes", "get"), ("", "nodes", "patch"), ("", "pods", "list")} | EVENTS,
    "kubegpu-partitioner": {("", "nodes", "list"), ("", "nodes", "patch"), ("", "pods", "list")} | EVENTS
    | {("coordination.k8s.io", "leases", verb) for verb in ("get", "create", "patch")},
    "kubegpu-autoscaler": {("", "nodes", verb) for verb in ("get", "list", "create", "patch", "delete")}
    | {("", "nodes/status", "patch"), ("", "pods", "list"), ("", "pods", "delete"), ("", "pods/eviction", "create")}
    | {("", "pods", "get"), ("", "pods", "patch"), ("", "pods/status", "patch")}
    | {("kubegpu.io", "nodepools", "get"), ("kubegpu.io", "nodepools", "list")}
    | {("kubegpu.io", "nodeclaims", verb) for verb in ("get", "list", "create", "patch", "delete")}
    | {("kubegpu.io", "nodeclaims/status", "patch")}
    | {("kubegpu.io", "ec2nodeclasses", "list"), ("kubegpu.io", "ec2nodeclasses/status", "patch")}
    | {("apps", "daemonsets", "list"), ("policy", "poddisruptionbudgets", "list")} | EVENTS
    | {("coordination.k8s.io", "leases", verb) for verb in ("get", "create", "patch")}
    | {("resource.k8s.io", kind, "list") for kind in ("deviceclasses", "resourceclaims", "resourceclaimtemplates")}
    | {("resource.k8s.io", "resourceslices", verb) for verb in ("list", "create", "delete")},
}


@cache
def documents() -> tuple[tuple[str, dict[str, Any]], ...]:
    """(file name, object) for every document in the manifests, then the admission policies, in file order."""
    found: list[tuple[str, dict[str, Any]]] = []
    for path in [*sorted((DEPLOY / "manifests").glob("*.yaml")), *sorted((DEPLOY / "policies").glob("*.yaml"))]:
        found.extend((path.name, doc) for doc in yaml.safe_load_all(path.read_text()) if doc is not None)
    return tuple(found)


def objects(kind: str) -> list[dict[str, Any]]:
    return [doc for _, doc in documents() if doc["kind"] == kind]


def named(kind: str, name: str) -> dict[str, Any]:
    matches = [doc for doc in objects(kind) if doc["metadata"]["name"] == name]
    assert len(matches) == 1, f"{kind} {name}: {len(matches)} found"
    return matches[0]


def containers() -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
    """(workload, container) for every container of every DaemonSet and Deployment."""
    for kind in WORKLOADS:
        for workload in objects(kind):
            for container in workload["spec"]["template"]["spec"]["containers"]:
                yield workload, container


def sub_command(container: dict[str, Any]) -> str:
    command = container["command"]
    assert command[0] == "kubegpu" and len(command) == 2, command
    return str(command[1])


def flag_name(arg: str) -> str:
    return arg.split("=", 1)[0]


def test_kustomization_lists_every_manifest_and_nothing_else() -> None:
    kustomization = yaml.safe_load((DEPLOY / "kustomization.yaml").read_text())
    listed = kustomization["resources"]
    assert sorted(listed) == sorted(f"{p.parent.name}/{p.name}" for folder in ("manifests", "policies")
                                    for p in (DEPLOY / folder).glob("*.yaml"))
    assert kustomization["namespace"] == NAMESPACE


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_every_document_validates_against_the_kubernetes_schema(version: str) -> None:
    failures = []
    for name, doc in documents():
        try:
            kubernetes_validate.validate(doc, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            failures.append(f"{name}: {doc['kind']} {doc['metadata']['name']}: {str(exc).splitlines()[0]}")
    assert failures == []


def test_everything_lives_in_the_kubegpu_namespace_and_crds_are_not_duplicated() -> None:
    assert [ns["metadata"]["name"] for ns in objects("Namespace")] == [NAMESPACE]
    assert documents()[0][1]["kind"] == "Namespace"  # first, so `kubectl apply -f manifests/` creates it first
    for _, doc in documents():
        if doc["kind"] not in CLUSTER_SCOPED:
            assert doc["metadata"].get("namespace") == NAMESPACE, f"{doc['kind']} {doc['metadata']['name']}"
    assert objects("CustomResourceDefinition") == []


def test_every_component_runs_with_its_own_service_account() -> None:
    accounts = {sa["metadata"]["name"] for sa in objects("ServiceAccount")}
    used = []
    for workload, container in containers():
        assert container["image"] == IMAGE
        account = workload["spec"]["template"]["spec"]["serviceAccountName"]
        assert account == f"kubegpu-{sub_command(container)}"
        used.append(account)
    assert sorted(used) == sorted(accounts) == sorted(NEEDS)


def help_flags(command: str) -> set[str]:
    """The flags `kubegpu COMMAND --help` prints (the real app, in-process: no cold start per command)."""
    output = invoke(command, "--help").stdout
    return set(re.findall(r"(?<![\w-])(--[a-z0-9][a-z0-9-]*|-[a-zA-Z])\b", output))


def test_every_flag_in_the_manifests_is_one_the_cli_has() -> None:
    helps = {command: help_flags(command) for command in {sub_command(c) for _, c in containers()}}
    assert all("--help" in flags for flags in helps.values())  # the help text really was read
    for workload, container in containers():
        command = sub_command(container)
        for arg in container.get("args", []):
            assert arg.startswith("-"), f"{workload['metadata']['name']}: {arg!r}: use --flag=value"
            assert flag_name(arg) in helps[command], f"{workload['metadata']['name']}: kubegpu {command} {arg}"


def test_every_command_line_parses_with_the_real_option_parser(monkeypatch: pytest.MonkeyPatch) -> None:
    """Parsing only (click's make_context): values are converted and required options checked, nothing runs."""
    from kubegpu.cli import app

    group = typer.main.get_command(app)
    for workload, container in containers():
        for variable in ("NODE_NAME", "CONFIG_FILE", "KUBEGPU_GPU_BACKEND", "KUBELET_SOCKET"):
            monkeypatch.delenv(variable, raising=False)
        for env in container.get("env", []):
            monkeypatch.setenv(env["name"], env.get("value", "node-1"))  # valueFrom: the Downward API's node name
        command = group.commands[sub_command(container)]  # type: ignore[attr-defined]
        context = command.make_context(f"kubegpu {sub_command(container)}", list(container.get("args", [])))
        for arg in container.get("args", []):
            option = next(p for p in command.params if flag_name(arg) in p.opts or flag_name(arg) in p.secondary_opts)
            assert context.params[option.name] is not None, f"{workload['metadata']['name']}: {arg}"


def test_every_path_a_command_uses_is_mounted() -> None:
    for workload, container in containers():
        pod = workload["spec"]["template"]["spec"]
        volumes = {v["name"]: v for v in pod.get("volumes", [])}
        mounts = container.get("volumeMounts", [])
        for mount in mounts:
            assert mount["name"] in volumes, f"{workload['metadata']['name']}: volume {mount['name']}"
        for arg in container.get("args", []):
            value = arg.partition("=")[2]
            if value.startswith("/"):
                assert any(value == m["mountPath"] or value.startswith(m["mountPath"].rstrip("/") + "/")
                           for m in mounts), (
                    f"{workload['metadata']['name']}: {arg} is not under a volumeMount")
        for volume in volumes.values():
            if "configMap" in volume:
                named("ConfigMap", volume["configMap"]["name"])


def test_no_security_context_the_api_server_would_reject() -> None:
    """The API server refuses allowPrivilegeEscalation: false together with privileged or CAP_SYS_ADMIN."""
    for workload, container in containers():
        context = container.get("securityContext", {})
        if context.get("allowPrivilegeEscalation") is False:
            added = {c.removeprefix("CAP_") for c in context.get("capabilities", {}).get("add", [])}
            assert not context.get("privileged") and "SYS_ADMIN" not in added, workload["metadata"]["name"]


def host_paths(name: str) -> dict[str, str]:
    """hostPath → mountPath for one workload's volumes."""
    workload = next(w for kind in WORKLOADS for w in objects(kind) if w["metadata"]["name"] == name)
    pod = workload["spec"]["template"]["spec"]
    mounts = {m["name"]: m["mountPath"] for c in pod["containers"] for m in c.get("volumeMounts", [])}
    return {v["hostPath"]["path"]: mounts[v["name"]] for v in pod.get("volumes", []) if "hostPath" in v}


def test_node_agents_reach_the_kubelet_sockets_they_serve_or_read() -> None:
    assert host_paths("kubegpu-device-plugin")["/var/lib/kubelet/device-plugins"] == "/var/lib/kubelet/device-plugins"
    assert host_paths("kubegpu-exporter")["/var/lib/kubelet/pod-resources"] == "/var/lib/kubelet/pod-resources"
    # The partition agent writes the MPS slice file the device plugin reads: the same host directory for both.
    assert host_paths("kubegpu-partition-agent")["/var/lib/kubegpu"] == host_paths("kubegpu-device-plugin")[
        "/var/lib/kubegpu"]
    for kind, expected in (("DaemonSet", {"device-plugin", "discover", "mig-manager", "partition-agent",
                                          "exporter"}),
                           ("Deployment", {"partitioner", "autoscaler"})):
        assert {w["spec"]["template"]["spec"]["containers"][0]["command"][1] for w in objects(kind)} == expected


def test_selectors_match_their_pods_and_the_exporter_service_reaches_port_9400() -> None:
    for kind in WORKLOADS:
        for workload in objects(kind):
            selector = workload["spec"]["selector"]["matchLabels"]
            labels = workload["spec"]["template"]["metadata"]["labels"]
            assert selector.items() <= labels.items(), workload["metadata"]["name"]
    service = named("Service", "kubegpu-exporter")
    exporter = named("DaemonSet", "kubegpu-exporter")
    assert service["spec"]["selector"].items() <= exporter["spec"]["template"]["metadata"]["labels"].items()
    [port] = service["spec"]["ports"]
    container_ports = {p["name"]: p["containerPort"] for p in exporter["spec"]["template"]["spec"]["containers"][0][
        "ports"]}
    assert port["port"] == 9400 and container_ports[port["targetPort"]] == 9400
    assert "--address=:9400" in exporter["spec"]["template"]["spec"]["containers"][0]["args"]


def granted(account: str) -> set[tuple[str, str, str]]:
    """Every (group, resource, verb) the account's bindings give it."""
    rules = []
    for binding_kind, role_kind in (("ClusterRoleBinding", "ClusterRole"), ("RoleBinding", "Role")):
        for binding in objects(binding_kind):
            if not any(s["kind"] == "ServiceAccount" and s["name"] == account and s["namespace"] == NAMESPACE
                       for s in binding["subjects"]):
                continue
            assert binding["roleRef"]["kind"] == role_kind
            rules.extend(named(role_kind, binding["roleRef"]["name"])["rules"])
    return {(g, r, v) for rule in rules for g in rule["apiGroups"] for r in rule["resources"] for v in rule["verbs"]}


@pytest.mark.parametrize("account", sorted(NEEDS))
def test_rbac_grants_each_component_exactly_what_it_uses(account: str) -> None:
    assert granted(account) == NEEDS[account]
    accounts = {sa["metadata"]["name"]: sa for sa in objects("ServiceAccount")}
    if not NEEDS[account]:  # no API access at all: no token in the pod either
        assert accounts[account].get("automountServiceAccountToken") is False


def test_autoscaler_rbac_names_the_crds_in_deploy_crds() -> None:
    crds = [yaml.safe_load(p.read_text()) for p in sorted(CRDS.glob("*.yaml"))]
    plurals = {(c["spec"]["group"], c["spec"]["names"]["plural"]) for c in crds}
    used = {(g, r.split("/")[0]) for g, r, _ in NEEDS["kubegpu-autoscaler"] if g == "kubegpu.io"}
    assert used <= plurals


def config_map_file(name: str) -> Any:
    return yaml.safe_load(named("ConfigMap", name)["data"]["config.yaml"])


def test_config_maps_carry_the_example_configs_and_they_validate(tmp_path: Path) -> None:
    device_plugin = config_map_file("kubegpu-device-plugin-config")
    mig_parted = config_map_file("kubegpu-mig-parted-config")
    assert device_plugin == yaml.safe_load((EXAMPLES / "device-plugin-mig-mixed.yaml").read_text())
    assert mig_parted == yaml.safe_load((EXAMPLES / "mig-parted.yaml").read_text())
    files = []
    for name in ("kubegpu-device-plugin-config", "kubegpu-mig-parted-config"):
        path = tmp_path / f"{name}.yaml"
        path.write_text(named("ConfigMap", name)["data"]["config.yaml"])
        files.append(path)
    result = invoke("validate-config", *files)
    assert "valid device-plugin config" in result.stdout and "valid mig-parted config" in result.stdout
