"""The chart on the real node (docs/testing.md, node tier): the real Helm CLI (kubegpu.testing.helmbuild) against the
test control plane, and what that cluster lacks for in-cluster clients.

The test node runs no kube-proxy, so the `kubernetes` Service's ClusterIP leads nowhere and a pod cannot reach the API
server the way in-cluster clients do. `api_access_policy` is a MutatingAdmissionPolicy (GA in Kubernetes 1.36) for
the chart's namespace only: its pods join the host network (the API server listens on 127.0.0.1) and their
containers get `KUBERNETES_SERVICE_HOST/PORT` pointing there, as the kubelet would set them on a cluster with a
Service proxy. The chart and the operator's objects are installed unchanged.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml

from kubegpu.errors import KubegpuError
from kubegpu.kube.resources import ResourceKind, register_kind

API_ACCESS_LABEL = "kubegpu.io/test-api-access"
API_ACCESS_POLICY = "kubegpu-test-api-access"
CHART_DIR = Path(__file__).resolve().parents[3] / "deploy" / "helm" / "kubegpu"
HELM_TIMEOUT_S = 300.0
for _kind, _plural in (("MutatingAdmissionPolicy", "mutatingadmissionpolicies"),
                       ("MutatingAdmissionPolicyBinding", "mutatingadmissionpolicybindings")):
    register_kind(ResourceKind(_kind, "admissionregistration.k8s.io", "v1", _plural, namespaced=False,
                               status_subresource=False, strategic_merge=False))


def api_access_policy(server: str) -> list[dict[str, Any]]:
    """The MutatingAdmissionPolicy and its binding: pods in namespaces labelled API_ACCESS_LABEL=true reach the API
    server at ``server`` (https://127.0.0.1:PORT) from the host network."""
    url = urlsplit(server)
    host, port = url.hostname or "127.0.0.1", str(url.port or 443)
    env = (f'[Object.spec.containers.env{{name: "KUBERNETES_SERVICE_HOST", value: "{host}"}}, '
           f'Object.spec.containers.env{{name: "KUBERNETES_SERVICE_PORT", value: "{port}"}}]')

    def containers(field: str) -> str:
        # a host-network pod's ports must name their host port (defaulting ran before this admission step)
        return (f"object.spec.{field}.map(c, Object.spec.{field}{{name: c.name, env: {env.replace('containers', field)}"
                f", ports: has(c.ports) ? c.ports.map(p, Object.spec.{field}.ports{{containerPort: p.containerPort, "
                f"hostPort: p.containerPort, protocol: has(p.protocol) ? p.protocol : 'TCP'}}) : []}})")

    expression = ("Object{spec: Object.spec{hostNetwork: true, dnsPolicy: 'ClusterFirstWithHostNet', "
                  f"containers: {containers('containers')}, "
                  f"initContainers: has(object.spec.initContainers) ? {containers('initContainers')} : []}}}}")
    group = "admissionregistration.k8s.io/v1"
    return [
        {"apiVersion": group, "kind": "MutatingAdmissionPolicy", "metadata": {"name": API_ACCESS_POLICY},
         "spec": {"failurePolicy": "Fail", "reinvocationPolicy": "Never",
                  "matchConstraints": {"resourceRules": [{"apiGroups": [""], "apiVersions": ["v1"],
                                                          "operations": ["CREATE"], "resources": ["pods"]}]},
                  "mutations": [{"patchType": "ApplyConfiguration",
                                 "applyConfiguration": {"expression": expression}}]}},
        {"apiVersion": group, "kind": "MutatingAdmissionPolicyBinding", "metadata": {"name": API_ACCESS_POLICY},
         "spec": {"policyName": API_ACCESS_POLICY,
                  "matchResources": {"namespaceSelector": {"matchLabels": {API_ACCESS_LABEL: "true"}}}}},
    ]


@dataclass(frozen=True)
class Helm:
    """The real Helm CLI against one cluster."""

    binary: Path
    kubeconfig: Path

    def run(self, *args: str, timeout: float = HELM_TIMEOUT_S) -> str:
        command = [str(self.binary), f"--kubeconfig={self.kubeconfig}", *args]
        started = time.monotonic()
        try:
            result = subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=False)
        except subprocess.TimeoutExpired:
            raise KubegpuError(f"helm {' '.join(args[:2])}: ran longer than {timeout:.0f}s") from None
        if result.returncode != 0:
            lines = [line for line in result.stderr.splitlines() if line.strip()]
            raise KubegpuError(f"helm {' '.join(args[:2])} failed after {time.monotonic() - started:.0f}s: "
                               f"{' | '.join(lines[-3:]) or result.returncode}")
        return result.stdout

    def install(self, release: str, namespace: str, values: dict[str, Any], workdir: Path,
                extra: Sequence[str] = ()) -> str:
        return self.run("install", release, str(CHART_DIR), f"--namespace={namespace}",
                        f"--values={_values_file(values, workdir, 'install')}", *extra)

    def upgrade(self, release: str, namespace: str, values: dict[str, Any], workdir: Path,
                extra: Sequence[str] = ()) -> str:
        return self.run("upgrade", release, str(CHART_DIR), f"--namespace={namespace}",
                        f"--values={_values_file(values, workdir, 'upgrade')}", *extra)

    def uninstall(self, release: str, namespace: str, extra: Sequence[str] = ()) -> str:
        return self.run("uninstall", release, f"--namespace={namespace}", *extra)

    def version(self) -> str:
        return self.run("version", "--short").strip()


def _values_file(values: dict[str, Any], workdir: Path, name: str) -> Path:
    workdir.mkdir(parents=True, exist_ok=True)
    path = workdir / f"values-{name}.yaml"
    path.write_text(yaml.safe_dump(values, sort_keys=False))
    return path


def wait_policy_in_effect(client: Any, namespace: str, timeout: float = 120.0) -> None:
    """Wait until the API server applies `api_access_policy` to a pod created in `namespace` (tried with a dry run).

    An admission policy takes effect when the API server's own watch of policies and bindings has seen it, which is
    asynchronous and slower on a busy machine: a chart installed right after creating the policy may get its pods
    unmutated (pointed at the `kubernetes` Service's ClusterIP, which leads nowhere here), and the operator then
    never reaches the API server. The dry run also waits out the namespace's default ServiceAccount."""
    from lightkube import ApiError
    from lightkube.models.core_v1 import Container, PodSpec
    from lightkube.models.meta_v1 import ObjectMeta
    from lightkube.resources.core_v1 import Pod

    probe = Pod(metadata=ObjectMeta(name="kubegpu-api-access-probe", namespace=namespace),
                spec=PodSpec(containers=[Container(name="probe", image="kubegpu.local/probe:0")]))
    deadline = time.monotonic() + timeout
    last = ""
    while True:
        try:
            created = client.create(probe, dry_run=True)
            env = {e.name for c in created.spec.containers for e in c.env or ()}
            if created.spec.hostNetwork and "KUBERNETES_SERVICE_HOST" in env:
                return
            last = "a pod created there is not mutated yet"
        except ApiError as exc:
            last = str(exc.status.message or exc)
        if time.monotonic() >= deadline:
            raise KubegpuError(f"admission policy {API_ACCESS_POLICY} not in effect in namespace {namespace} after "
                               f"{timeout:.0f}s: {last}")
        time.sleep(0.2)


def prepare_namespace(kubeconfig: Path, namespace: str) -> list[str]:
    """Create `namespace` labelled for API access and the admission policy (each only when missing); returns what
    was created. What `python -m kubegpu.testing.chart KUBECONFIG NAMESPACE` does before `helm install`."""
    from lightkube import ApiError
    from lightkube.models.meta_v1 import ObjectMeta
    from lightkube.resources.core_v1 import Namespace

    from kubegpu.kube.errors import Conflict
    from kubegpu.testing.kubeconfig import admin_cluster

    cluster = admin_cluster(kubeconfig)
    config = yaml.safe_load(kubeconfig.read_text())
    server = str(config["clusters"][0]["cluster"]["server"])
    created = []
    for obj in api_access_policy(server):
        try:
            cluster.create(obj)
            created.append(f"{obj['kind']} {obj['metadata']['name']}")
        except Conflict:
            pass
    try:
        cluster.client.create(Namespace(metadata=ObjectMeta(name=namespace, labels={API_ACCESS_LABEL: "true"})))
        created.append(f"Namespace {namespace}")
    except ApiError as exc:
        if exc.status.code != 409:
            raise
        cluster.client.patch(Namespace, namespace, {"metadata": {"labels": {API_ACCESS_LABEL: "true"}}})
    wait_policy_in_effect(cluster.client, namespace)
    return created


def main(argv: list[str] | None = None) -> int:
    import sys

    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print("usage: python -m kubegpu.testing.chart KUBECONFIG NAMESPACE", file=sys.stderr)
        return 2
    try:
        created = prepare_namespace(Path(args[0]), args[1])
    except KubegpuError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(", ".join(created) or "already prepared")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())


SHARED_MOUNTS = ("/run/nvidia/validations",)
"""Host paths the operands mount with propagation (the GPU Operator's barrier directory: Bidirectional for the
validator, HostToContainer for the waits). The runtime refuses propagation from a private mount, and without systemd
this machine's `/` is private, so the fixture makes each a shared bind mount of itself for the test's lifetime."""


@dataclass
class SharedMount:
    path: Path
    created: list[Path]  # directories this made (removed again)


def share_mounts(paths: Sequence[str] = SHARED_MOUNTS) -> list[SharedMount]:
    made = []
    for raw in paths:
        path = Path(raw)
        created = [p for p in (path, *path.parents) if not p.exists()]
        path.mkdir(parents=True, exist_ok=True)
        for args in (["mount", "--bind", str(path), str(path)], ["mount", "--make-shared", str(path)]):
            result = subprocess.run(args, capture_output=True, text=True, check=False)
            if result.returncode != 0:
                raise KubegpuError(f"{' '.join(args)}: {result.stderr.strip() or result.returncode}")
        made.append(SharedMount(path, created))
    return made


def unshare_mounts(mounts: Sequence[SharedMount]) -> list[str]:
    """Undo `share_mounts`; returns what could not be undone (one line each)."""
    problems = []
    for mount in mounts:
        result = subprocess.run(["umount", str(mount.path)], capture_output=True, text=True, check=False)
        if result.returncode != 0:
            problems.append(f"umount {mount.path}: {result.stderr.strip()}")
        for directory in sorted(mount.created, key=lambda p: len(p.parts), reverse=True):
            try:
                directory.rmdir()
            except OSError as exc:
                problems.append(f"rmdir {directory}: {exc.strerror}")
    return problems
