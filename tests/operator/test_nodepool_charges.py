"""The operator puts the GPUs the cluster's NodePools may launch (kubegpu's and Karpenter's) into the quota's charge
table, so a pod that selects a pool of H200 nodes pays an H200's 141Gi before any such node exists."""

from __future__ import annotations

from typing import Any

from kubegpu.operator.passes import run_pass
from kubegpu.quota.policy import TABLE_NAME
from kubegpu.sharing.charges import GIB, ChargeTable, pod_charge, table_data
from tests.operator.fakeapi import FakeApi

NS = "kubegpu"
MODELS = ["A100-SXM4-80GB"]
REPLICAS = {"nvidia.com/gpu.shared": 4}   # the ClusterPolicy's default


def pool(api_version: str, name: str, requirements: list[dict[str, Any]]) -> dict[str, Any]:
    return {"apiVersion": api_version, "kind": "NodePool", "metadata": {"name": name},
            "spec": {"template": {"spec": {"requirements": requirements}}}}


def instance_types(*names: str) -> list[dict[str, Any]]:
    return [{"key": "node.kubernetes.io/instance-type", "operator": "In", "values": list(names)}]


def table(api: FakeApi) -> dict[str, str]:
    [found] = [o for k, o in api.objects.items() if k[1] == "ConfigMap" and k[3] == TABLE_NAME]
    return dict(found["data"])


def charged(selector: dict[str, str], pools: list[dict[str, Any]]) -> int:
    body = {"metadata": {"name": "p", "namespace": "a"}, "spec": {"nodeSelector": selector, "containers": [
        {"name": "main", "resources": {"limits": {"nvidia.com/gpu": 1}}}]}}
    return pod_charge(body, ChargeTable.for_cluster(MODELS, [], None, pools)).gpu_memory_bytes


def test_a_pod_selecting_a_nodepool_of_h200s_pays_an_h200_before_any_node_exists() -> None:
    api = FakeApi()
    api.add_policy("p", {"quota": {"enabled": True, "gpuModels": MODELS}}, "2026-01-01T00:00:00Z")
    api.nodepools = [pool("kubegpu.io/v1", "h200", instance_types("p5e.48xlarge")),
                     pool("karpenter.sh/v1", "l4", instance_types("g6.xlarge", "g6.2xlarge"))]
    run_pass(api, "p", NS, 0.0, "t0")
    data = table(api)
    assert data == table_data(ChargeTable.for_cluster(MODELS, [], REPLICAS, api.nodepools))
    assert "kubegpu.io/nodepool" in data["keys"].split(",") and "karpenter.sh/nodepool" in data["keys"].split(",")
    assert data["default"] == str(141 * GIB)   # an unpinned pod may land on what the h200 pool launches
    assert charged({"kubegpu.io/nodepool": "h200"}, api.nodepools) == 141 * GIB
    assert charged({"karpenter.sh/nodepool": "l4"}, api.nodepools) == 22 * GIB


def test_a_nodepool_whose_requirements_cannot_be_read_is_left_out_with_a_note() -> None:
    api = FakeApi()
    api.add_policy("p", {"quota": {"enabled": True, "gpuModels": MODELS}}, "2026-01-01T00:00:00Z")
    good = pool("kubegpu.io/v1", "h200", instance_types("p5e.48xlarge"))
    api.nodepools = [good, pool("kubegpu.io/v1", "bad", [{"key": "nvidia.com/gpu.memory", "operator": "Gt",
                                                          "values": ["x"]}])]
    result = run_pass(api, "p", NS, 0.0, "t0")
    assert result.status.reason != "ReconcileFailed"
    assert any("NodePool bad: spec.template.spec.requirements" in note for note in result.notes)
    assert table(api) == table_data(ChargeTable.for_cluster(MODELS, [], REPLICAS, [good]))


def test_without_quotas_no_nodepool_is_read() -> None:
    class Counting(FakeApi):
        reads = 0

        def list_nodepools(self) -> list[dict[str, Any]]:
            self.reads += 1
            return super().list_nodepools()

    api = Counting()
    api.add_policy("p", {}, "2026-01-01T00:00:00Z")
    run_pass(api, "p", NS, 0.0, "t0")
    assert api.reads == 0
