"""The operator renders the charge table from the ClusterPolicy (the cluster's GPU models, the replicas) and puts it
back when it is deleted: without it GPU pods are refused (tests/quota/test_admission.py), so it must not stay gone."""

from __future__ import annotations

from kubegpu.operator.passes import run_pass
from kubegpu.quota.policy import TABLE_GUARD, TABLE_NAME
from tests.operator.fakeapi import FakeApi

NS = "kubegpu"
GIB = 1 << 30


def table(api: FakeApi) -> dict[str, str] | None:
    found = [o for k, o in api.objects.items() if k[1] == "ConfigMap" and k[3] == TABLE_NAME]
    return found[0]["data"] if found else None


def test_the_operator_renders_the_table_and_restores_it_when_deleted() -> None:
    api = FakeApi()
    api.add_policy("p", {"quota": {"enabled": True, "gpuModels": ["A100-SXM4-80GB", "NVIDIA-L4"],
                                   "replicas": {"nvidia.com/gpu.shared": 2}}}, "2026-01-01T00:00:00Z")
    run_pass(api, "p", NS, 0.0, "t0")
    data = table(api)
    assert data is not None
    assert data["default"] == str(80 * GIB) and data["replicas.nvidia.com_gpu.shared"] == "2"
    assert ("ValidatingAdmissionPolicy", TABLE_GUARD) in api.kinds()
    [key] = [k for k in api.objects if k[1] == "ConfigMap" and k[3] == TABLE_NAME]
    api.delete(key)
    assert table(api) is None
    run_pass(api, "p", NS, 5.0, "t5")
    assert table(api) == data


def test_the_table_holds_the_clusters_gpu_nodes_so_their_pins_and_largest_gpu_count() -> None:
    from kubegpu.sharing.charges import ChargeTable, pod_charge, table_data

    api = FakeApi()
    api.add_policy("p", {"quota": {"enabled": True, "gpuModels": ["NVIDIA-L4"]}}, "2026-01-01T00:00:00Z")
    api.add_node("cpu-0", {"kubernetes.io/os": "linux"})
    api.add_node("gcp-0", {"feature.node.kubernetes.io/pci-10de.present": "true",
                           "nvidia.com/gpu.product": "NVIDIA-H200", "nvidia.com/gpu.memory": "143771",
                           "node.kubernetes.io/instance-type": "a3-ultragpu-8g", "topology.kubernetes.io/zone": "z"})
    api.add_node("odd-0", {"nvidia.com/gpu.product": "ACME-X1", "nvidia.com/gpu.memory": "98304"})
    run_pass(api, "p", NS, 0.0, "t0")
    data = table(api)
    assert data is not None and data["default"] == str(141 * GIB)  # the cluster's largest: the H200 node's
    expected = table_data(ChargeTable.for_cluster(["NVIDIA-L4"], [n["metadata"]["labels"] for n in api.list_nodes()]))
    assert data == expected

    def charged(selector: dict[str, str]) -> int:
        body = {"metadata": {"name": "p", "namespace": "a"}, "spec": {"nodeSelector": selector, "containers": [
            {"name": "main", "resources": {"limits": {"nvidia.com/gpu": 1}}}]}}
        return pod_charge(body, ChargeTable.for_cluster(["NVIDIA-L4"], [n["metadata"]["labels"]
                                                                         for n in api.list_nodes()])).gpu_memory_bytes

    assert charged({"node.kubernetes.io/instance-type": "a3-ultragpu-8g"}) == 141 * GIB
    assert charged({"nvidia.com/gpu.product": "ACME-X1"}) == 96 * GIB  # unknown to the catalog: its memory label
    assert charged({"nvidia.com/gpu.product": "NVIDIA-L4"}) == 22 * GIB


def test_without_listed_models_the_clusters_gpu_nodes_are_its_models() -> None:
    api = FakeApi()
    api.add_policy("p", {"quota": {"enabled": True}}, "2026-01-01T00:00:00Z")
    run_pass(api, "p", NS, 0.0, "t0")
    assert table(api)["default"] == str(180 * GIB)  # type: ignore[index]  # no GPU node yet: the whole catalog
    api.add_node("a100-0", {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB", "nvidia.com/gpu.memory": "81920"})
    run_pass(api, "p", NS, 5.0, "t5")
    assert table(api)["default"] == str(80 * GIB)  # type: ignore[index]  # an unpinned pod pays an A100


def test_the_replicas_come_from_what_the_nodes_run() -> None:
    """GFD's `nvidia.com/<resource>.replicas` on each node: renamed `.shared` replicas, in-place ones (`-SHARED`
    product), MIG replicas; a name the nodes report overrides the ClusterPolicy's, the fewest where nodes differ."""
    api = FakeApi()
    api.add_policy("p", {"quota": {"enabled": True, "replicas": {"nvidia.com/gpu.shared": 4,
                                                                 "nvidia.com/half-3g": 2}}}, "2026-01-01T00:00:00Z")
    a100 = {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB", "nvidia.com/gpu.memory": "81920"}
    api.add_node("ts-8", {**a100, "nvidia.com/gpu.replicas": "8"})
    api.add_node("ts-6", {**a100, "nvidia.com/gpu.replicas": "6"})
    api.add_node("in-place", {**a100, "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB-SHARED",
                              "nvidia.com/gpu.replicas": "2"})
    api.add_node("mig", {**a100, "nvidia.com/gpu.replicas": "0", "nvidia.com/mig-1g.10gb.replicas": "3",
                         "nvidia.com/mig-1g.10gb.product": "NVIDIA-A100-SXM4-80GB-MIG-1g.10gb"})
    api.add_node("plain", {**a100, "nvidia.com/gpu.replicas": "1"})
    run_pass(api, "p", NS, 0.0, "t0")
    data = table(api)
    assert data is not None
    # `nvidia.com/gpu` is a replica on one node and a whole GPU on another: charged whole
    assert {k: v for k, v in data.items() if k.startswith("replicas.")} == {
        "replicas.nvidia.com_gpu.shared": "6", "replicas.nvidia.com_mig-1g.10gb.shared": "3",
        "replicas.nvidia.com_half-3g": "2"}
    del api.nodes["plain"]
    run_pass(api, "p", NS, 5.0, "t5")
    assert table(api)["replicas.nvidia.com_gpu"] == "2"  # type: ignore[index]  # shared in place wherever it is


def test_the_operator_renders_the_claim_gate_and_a_controller_it_can_probe() -> None:
    """With quotas on, the operator renders what `deploy/kubernetes/quota/` ships for claims (the claim gate and its
    guards, in its own namespace) and runs the controller with its metrics and a readiness probe on /readyz."""
    from pathlib import Path

    from kubegpu.operator.cli import load_policy
    from kubegpu.operator.render import render
    from kubegpu.quota.policy import CLAIM_GATE_POLICY, GATE_GUARD, HOLDER_GUARD, controller_user

    policy, _ = load_policy(Path(__file__).parents[1] / "operator" / "data" / "everything.yaml")
    objects = [obj for _, objs in render(policy, "gpu-operator") for obj in objs]
    names = {(o["kind"], o["metadata"]["name"]) for o in objects}
    assert {("MutatingAdmissionPolicy", CLAIM_GATE_POLICY), ("ValidatingAdmissionPolicy", GATE_GUARD),
            ("ValidatingAdmissionPolicy", HOLDER_GUARD)} <= names
    guard = next(o for o in objects if o["metadata"]["name"] == GATE_GUARD and o["kind"] == "ValidatingAdmissionPolicy")
    assert controller_user("gpu-operator") in guard["spec"]["validations"][0]["expression"]
    [deployment] = [o for o in objects if o["kind"] == "Deployment" and o["metadata"]["name"] == "kubegpu-quota"]
    pod = deployment["spec"]["template"]["spec"]
    assert controller_user("gpu-operator").endswith(":" + pod["serviceAccountName"])  # the account the guards admit
    [container] = pod["containers"]
    assert "--metrics-address=:8084" in container["args"]
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}
