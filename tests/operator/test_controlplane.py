"""The operator against the real control plane (kube-apiserver, controller-manager, scheduler, kwok nodes): CRDs
applied at start, server-side apply of every operand, status notReady → ready as the real DaemonSet controller and
kwok bring pods up, a disabled component deleted, an invalid policy reported with nothing deleted, a second policy
ignored, node labels and the MIG wedge healer on a real Node."""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from lightkube.resources.core_v1 import Node

from kubegpu.operator.controller import LightkubeOperatorApi, Scheduler, apply_crds
from kubegpu.operator.crds import REPO_CRDS
from kubegpu.testing.session import RealCluster, wait_for

pytestmark = pytest.mark.apiserver
NFD = "feature.node.kubernetes.io/pci-10de.present"
DEPLOY = "nvidia.com/gpu.deploy."


@pytest.fixture(scope="module")
def api(real_cluster: RealCluster) -> LightkubeOperatorApi:
    from lightkube.resources.apiextensions_v1 import CustomResourceDefinition

    operator_api = LightkubeOperatorApi(real_cluster.client())
    names = apply_crds(operator_api, REPO_CRDS)
    assert "clusterpolicies.kubegpu.io" in names

    def established() -> bool:
        crd = operator_api.client.get(CustomResourceDefinition, "clusterpolicies.kubegpu.io")
        return any(c.type == "Established" and c.status == "True" for c in (crd.status.conditions or []))

    wait_for(established, "ClusterPolicy CRD Established")
    return operator_api


@pytest.fixture
def gpu_node(real_cluster: RealCluster) -> Iterator[str]:
    name = f"op-gpu-{uuid.uuid4().hex[:6]}"
    real_cluster.add_gpu_node(name, "2xA100-SXM4-80GB", labels={NFD: "true"})
    yield name
    real_cluster.delete_node(name)


def create_policy(api: LightkubeOperatorApi, name: str, spec: dict[str, Any]) -> None:
    from lightkube import codecs

    api.client.create(codecs.from_dict({"apiVersion": "kubegpu.io/v1", "kind": "ClusterPolicy",
                                        "metadata": {"name": name}, "spec": spec}))


def patch_spec(api: LightkubeOperatorApi, name: str, spec: dict[str, Any]) -> None:
    from lightkube.generic_resource import get_generic_resource
    from lightkube.types import PatchType

    resource = get_generic_resource("kubegpu.io/v1", "ClusterPolicy")
    api.client.patch(resource, name, {"spec": spec}, patch_type=PatchType.MERGE)


def delete_policy(api: LightkubeOperatorApi, name: str) -> None:
    from lightkube import ApiError
    from lightkube.generic_resource import get_generic_resource

    with contextlib.suppress(ApiError):
        api.client.delete(get_generic_resource("kubegpu.io/v1", "ClusterPolicy"), name)


def policy(api: LightkubeOperatorApi, name: str) -> dict[str, Any]:
    return next(p for p in api.list_policies() if p["metadata"]["name"] == name)


def workloads(api: LightkubeOperatorApi, name: str, namespace: str) -> set[str]:
    return {o["metadata"]["name"] for o in api.list_owned(name, namespace) if o["kind"] in ("DaemonSet", "Deployment")}


def test_operator_lifecycle_on_the_real_control_plane(api: LightkubeOperatorApi, namespace: str,
                                                      gpu_node: str) -> None:
    name = f"cp-{uuid.uuid4().hex[:6]}"
    other = f"{name}-later"
    create_policy(api, name, {"gfd": {"enabled": False}})
    scheduler = Scheduler(api, namespace)
    try:
        status = scheduler.run(name, force=True)
        assert status is not None and status.state == "notReady" and status.reason == "OperandNotReady"
        assert workloads(api, name, namespace) == {
            "kubegpu-driver", "kubegpu-container-toolkit", "kubegpu-operator-validator", "kubegpu-device-plugin",
            "kubegpu-mps-control-daemon", "kubegpu-dcgm-exporter", "kubegpu-mig-manager"}
        owned = api.list_owned(name, namespace)
        assert all(o["metadata"]["ownerReferences"][0]["name"] == name for o in owned)
        labels = api.client.get(Node, gpu_node).metadata.labels
        assert labels["nvidia.com/gpu.present"] == "true" and labels[DEPLOY + "device-plugin"] == "true"
        assert labels[DEPLOY + "mig-manager"] == "true" and DEPLOY + "gpu-feature-discovery" not in labels

        # the real DaemonSet controller places pods on the labelled kwok node; kwok runs them
        def ready() -> bool:
            result = scheduler.run(name, force=True)
            return result is not None and result.state == "ready"

        wait_for(ready, "ClusterPolicy ready once every DaemonSet rolled out", timeout=90)
        conditions = {c["type"]: c for c in policy(api, name)["status"]["conditions"]}
        assert conditions["Ready"]["status"] == "True" and conditions["Ready"]["reason"] == "Reconciled"

        patch_spec(api, name, {"dcgmExporter": {"enabled": False}})
        scheduler.run(name, force=True)
        assert "kubegpu-dcgm-exporter" not in workloads(api, name, namespace)

        before = workloads(api, name, namespace)
        patch_spec(api, name, {"driver": {"upgradePolicy": {"maxUnavailable": "150%"}}})  # the CRD lets it pass
        status = scheduler.run(name, force=True)
        assert status is not None and status.reason == "ReconcileFailed"
        error = next(c for c in policy(api, name)["status"]["conditions"] if c["type"] == "Error")
        assert error["status"] == "True" and "spec.driver.upgradePolicy.maxUnavailable" in error["message"]
        assert workloads(api, name, namespace) == before  # nothing deleted
        patch_spec(api, name, {"driver": {"upgradePolicy": {"maxUnavailable": "25%"}}})

        time.sleep(1.1)  # creationTimestamp has one-second resolution
        create_policy(api, other, {})
        ignored = scheduler.run(other, force=True)
        assert ignored is not None and policy(api, other)["status"]["state"] == "ignored"
        assert workloads(api, other, namespace) == set()

        # a MIG manager that crashed mid-change left a client paused: the next pass restores it
        api.patch_node(gpu_node, {DEPLOY + "device-plugin": "paused-for-mig-change",
                                  "nvidia.com/mig.config.state": "failed"}, {})
        scheduler.run(name, force=True)
        node = api.client.get(Node, gpu_node)
        assert node.metadata.labels[DEPLOY + "device-plugin"] == "true"
    finally:
        delete_policy(api, other)
        delete_policy(api, name)


def test_kubegpu_operator_process_reconciles_with_kopf_and_a_lease(api: LightkubeOperatorApi, namespace: str,
                                                                   real_cluster: RealCluster, gpu_node: str) -> None:
    """The real `kubegpu operator` process: takes the Lease, applies the CRDs, and its kopf handlers bring a new
    ClusterPolicy to ready with no help from the test."""
    import os
    import signal
    import subprocess
    import sys

    from lightkube.resources.coordination_v1 import Lease

    name = f"kopf-{uuid.uuid4().hex[:6]}"
    env = {**os.environ, **real_cluster.env(), "KUBEGPU_LOG_LEVEL": "INFO"}
    proc = subprocess.Popen([sys.executable, "-m", "kubegpu", "operator", "--namespace", namespace,
                             "--crds-dir", str(REPO_CRDS), "--metrics-address", "127.0.0.1:0"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        lease = wait_for(lambda: _lease(api, Lease, namespace), "operator holds its Lease", timeout=60)
        assert lease.spec.holderIdentity
        create_policy(api, name, {"gfd": {"enabled": False}})

        def state() -> str | None:
            status = policy(api, name).get("status") or {}
            return "ready" if status.get("state") == "ready" else None

        wait_for(state, "ClusterPolicy ready through the kopf handlers", timeout=60)
        assert "kubegpu-device-plugin" in workloads(api, name, namespace)
    finally:
        delete_policy(api, name)
        proc.send_signal(signal.SIGTERM)
        try:
            output, _ = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            output, _ = proc.communicate()
        print(output[-6000:])  # shown when the test fails
    assert proc.returncode == 0  # SIGTERM is a clean stop
    assert "applied CRDs" in output and "leader" in output, output[-3000:]


def _lease(api: LightkubeOperatorApi, lease: Any, namespace: str) -> Any:
    from lightkube import ApiError

    try:
        return api.client.get(lease, "kubegpu-operator", namespace=namespace)
    except ApiError:
        return None


@pytest.mark.timeout(600)  # ~25 s on a quiet machine; a pass is ~30 server-side applies, slow under load
def test_rolling_driver_upgrade_on_real_nodes_respects_parallelism_and_the_pdb(
        api: LightkubeOperatorApi, namespace: str, real_cluster: RealCluster) -> None:
    """Six kwok GPU nodes, a 6-replica GPU Deployment behind a PodDisruptionBudget (minAvailable 5, computed by the
    real disruption controller), maxParallelUpgrades 2: a driver version change rolls through every node, never
    more than 2 past cordon, evictions go through the real Eviction API, and every node ends uncordoned."""
    from lightkube import codecs

    from kubegpu.operator import upgrade

    tag = uuid.uuid4().hex[:5]
    nodes = [f"up-{tag}-{i}" for i in range(6)]
    for node in nodes:
        real_cluster.add_gpu_node(node, "2xA100-SXM4-80GB", labels={NFD: "true", "op-upgrade": tag}, wait=False)
    name = f"up-{tag}"
    spec = {"driver": {"version": "550.1", "upgradePolicy": {"maxParallelUpgrades": 2, "maxUnavailable": "50%",
                                                             "podDeletion": {"timeoutSeconds": 600}}},
            "devicePlugin": {"enabled": False}, "dcgmExporter": {"enabled": False}, "migManager": {"enabled": False},
            "gfd": {"enabled": False}}
    labels = {"app": f"train-{tag}"}
    train = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "train", "namespace": namespace},
             "spec": {"replicas": 6, "selector": {"matchLabels": labels},
                      "template": {"metadata": {"labels": labels}, "spec": {
                          "nodeSelector": {"op-upgrade": tag},
                          "containers": [{"name": "c", "image": "train",
                                          "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}}}
    pdb = {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": "train",
                                                                               "namespace": namespace},
           "spec": {"minAvailable": 5, "selector": {"matchLabels": labels}}}
    create_policy(api, name, spec)
    scheduler = Scheduler(api, namespace)
    try:
        for node in nodes:
            real_cluster.wait_node_ready(node)
        for obj in (train, pdb):
            api.client.create(codecs.from_dict(obj))

        def running() -> int:
            pods = api.list_pods(namespace=namespace, labels=labels)
            return sum(1 for p in pods if p["status"].get("phase") == "Running" and
                       not p["metadata"].get("deletionTimestamp"))

        def states() -> dict[str, str]:
            return {n["metadata"]["name"]: (n["metadata"].get("labels") or {}).get(upgrade.STATE_LABEL, "")
                    for n in api.list_nodes() if n["metadata"]["name"] in nodes}

        def settled(state: str) -> bool:
            scheduler.run(name, force=True)
            return set(states().values()) == {state} and running() == 6

        wait_for(lambda: settled(upgrade.DONE), "all nodes upgrade-done on the first driver", timeout=120,
                 interval=0.5)
        patch_spec(api, name, {"driver": {"version": "570.2"}})
        most, low = 0, 6
        deadline = time.monotonic() + 360  # the whole roll: 6 nodes, 2 at a time, ~9 passes per node
        while time.monotonic() < deadline:
            scheduler.run(name, force=True)
            current = states()
            most = max(most, sum(1 for s in current.values() if s in upgrade.IN_PROGRESS and s != upgrade.CORDON))
            low = min(low, running())
            if set(current.values()) == {upgrade.DONE}:
                break
            time.sleep(0.3)
        final = states()
        assert set(final.values()) == {upgrade.DONE}, f"{sorted(final.items())}; running pods {running()}"
        assert most == 2
        assert low >= 5  # the PodDisruptionBudget held throughout
        assert not any(n["spec"].get("unschedulable") for n in api.list_nodes() if n["metadata"]["name"] in nodes)
    finally:
        delete_policy(api, name)
        for node in nodes:
            real_cluster.delete_node(node)


KARPENTER_CRD = {
    "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
    "metadata": {"name": "nodepools.karpenter.sh"},
    "spec": {"group": "karpenter.sh", "scope": "Cluster",
             "names": {"kind": "NodePool", "plural": "nodepools", "singular": "nodepool", "listKind": "NodePoolList"},
             "versions": [{"name": "v1", "served": True, "storage": True, "schema": {"openAPIV3Schema": {
                 "type": "object", "x-kubernetes-preserve-unknown-fields": True}}}]}}


def test_the_nodepools_whose_gpus_the_quota_charges_are_read_from_the_server(api: LightkubeOperatorApi,
                                                                              real_cluster: RealCluster) -> None:
    """kubegpu's NodePools and, once its CRD is served, Karpenter's: read from the server and through informers."""
    from lightkube import codecs
    from lightkube.generic_resource import create_global_resource
    from lightkube.resources.apiextensions_v1 import CustomResourceDefinition

    def established(name: str) -> bool:
        conditions = api.client.get(CustomResourceDefinition, name).status.conditions or []
        return any(c.type == "Established" and c.status == "True" for c in conditions)

    wait_for(lambda: established("nodepools.kubegpu.io"), "kubegpu's NodePool CRD Established")
    suffix = uuid.uuid4().hex[:6]
    ours = create_global_resource("kubegpu.io", "v1", "NodePool", "nodepools")
    theirs = create_global_resource("karpenter.sh", "v1", "NodePool", "nodepools")
    requirements = [{"key": "node.kubernetes.io/instance-type", "operator": "In", "values": ["p5e.48xlarge"]}]
    api.client.create(codecs.from_dict({"apiVersion": "kubegpu.io/v1", "kind": "NodePool",
                                        "metadata": {"name": f"h200-{suffix}"},
                                        "spec": {"template": {"spec": {"requirements": requirements}}}}))
    informed = LightkubeOperatorApi(real_cluster.client())
    try:
        def names() -> set[tuple[str, str]]:
            return {(p["apiVersion"], p["metadata"]["name"]) for p in api.list_nodepools()}

        assert ("kubegpu.io/v1", f"h200-{suffix}") in names()   # Karpenter's CRD not installed: only ours
        informed.inform(real_cluster.cluster())
        assert ("kubegpu.io/v1", f"h200-{suffix}") in {(p["apiVersion"], p["metadata"]["name"])
                                                        for p in informed.list_nodepools()}
        api.client.create(codecs.from_dict(KARPENTER_CRD))
        wait_for(lambda: established("nodepools.karpenter.sh"), "Karpenter's NodePool CRD Established")
        api.client.create(codecs.from_dict({"apiVersion": "karpenter.sh/v1", "kind": "NodePool",
                                            "metadata": {"name": f"l4-{suffix}"},
                                            "spec": {"template": {"spec": {"requirements": []}}}}))
        assert ("karpenter.sh/v1", f"l4-{suffix}") in names()
        both = {("kubegpu.io/v1", "NodePool", f"h200-{suffix}"), ("karpenter.sh/v1", "NodePool", f"l4-{suffix}")}
        wait_for(lambda: both <= {(p["apiVersion"], p["kind"], p["metadata"]["name"])
                                  for p in informed.list_nodepools()}, "both NodePools through the informers")
        assert informed.trusted()
    finally:
        for source in (informed.informer, *informed.late.values()):
            if source is not None:
                source.stop()
        with contextlib.suppress(Exception):
            api.client.delete(ours, f"h200-{suffix}")
        with contextlib.suppress(Exception):
            api.client.delete(theirs, f"l4-{suffix}")
        with contextlib.suppress(Exception):
            api.client.delete(CustomResourceDefinition, "nodepools.karpenter.sh")
