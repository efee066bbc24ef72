"""A whole GPU is charged the largest GPU the pod could land on, whatever label pins it: GFD's product or memory, the
instance type, Karpenter's GPU labels, any operator of required node affinity — and a pod that pins nothing pays
the largest model of the cluster. Nodes advertise room for those charges, so charged pods fit where their GPUs do."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from kubegpu.cli import app
from kubegpu.gpu.catalog import CATALOG
from kubegpu.gpu.instances import GPU_INSTANCE_TYPES
from kubegpu.sharing.capacity import GpuSharing, gpu_allocatable, sharing_capacity
from kubegpu.sharing.charges import GIB, ChargeTable, model_memory_bytes, node_gpu_memory, pod_charge, product_label
from kubegpu.sharing.names import GPU_MEMORY_RESOURCE

H200 = 141 * GIB
B200 = 180 * GIB


def gpu_pod(*, selector: dict[str, str] | None = None, terms: list[dict[str, Any]] | None = None,
            resource: str = "nvidia.com/gpu", count: int = 1) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": [{"name": "main", "resources": {"limits": {resource: count}}}]}
    if selector is not None:
        spec["nodeSelector"] = selector
    if terms is not None:
        spec["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": terms}}}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "team-a"}, "spec": spec}


def expr(key: str, operator: str, *values: str) -> dict[str, Any]:
    return {"key": key, "operator": operator, **({"values": list(values)} if values else {})}


def charged(body: dict[str, Any], table: ChargeTable | None = None) -> int:
    return pod_charge(body, table).gpu_memory_bytes


# ------------------------------------------------------------------------------------------ the acceptance pins


H200_PINS = {
    "instance-type": gpu_pod(selector={"node.kubernetes.io/instance-type": "p5e.48xlarge"}),
    "karpenter-gpu-name": gpu_pod(selector={"karpenter.k8s.aws/instance-gpu-name": "h200"}),
    "affinity-instance-type": gpu_pod(terms=[{"matchExpressions": [
        expr("node.kubernetes.io/instance-type", "In", "p5e.48xlarge", "p4d.24xlarge")]}]),
    "affinity-karpenter-memory": gpu_pod(terms=[{"matchExpressions": [
        expr("karpenter.k8s.aws/instance-gpu-memory", "Gt", "100000"),
        expr("karpenter.k8s.aws/instance-gpu-name", "NotIn", "b200")]}]),
    "affinity-gfd-memory": gpu_pod(terms=[{"matchExpressions": [expr("nvidia.com/gpu.memory", "In", "143771")]}]),
    "affinity-family": gpu_pod(terms=[{"matchExpressions": [expr("karpenter.k8s.aws/instance-family", "In", "p5e")]}]),
}


@pytest.mark.parametrize("name", list(H200_PINS))
def test_quota_explain_charges_a_pod_pinned_to_an_h200_at_least_its_memory(name: str, tmp_path: Path) -> None:
    path = tmp_path / "pod.yaml"
    path.write_text(json.dumps(H200_PINS[name]))
    result = CliRunner().invoke(app, ["quota", "explain", "-f", str(path), "-o", "json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["gpuMemoryBytes"] >= H200


def test_a_pin_that_leaves_only_smaller_gpus_is_charged_their_memory() -> None:
    assert charged(gpu_pod(selector={"node.kubernetes.io/instance-type": "p4d.24xlarge"})) == 40 * GIB
    assert charged(gpu_pod(selector={"karpenter.k8s.aws/instance-gpu-name": "l4"})) == 22 * GIB
    assert charged(gpu_pod(terms=[{"matchExpressions": [
        expr("node.kubernetes.io/instance-type", "In", "g6.xlarge", "g5.48xlarge"),
        expr("topology.kubernetes.io/zone", "In", "us-east-1a")]}])) == 22 * GIB  # a zone says nothing of the GPU
    assert charged(gpu_pod(terms=[{"matchExpressions": [expr("nvidia.com/gpu.memory", "Lt", "30000")]}])) == 24 * GIB


def test_allowing_a_gpu_the_table_does_not_know_pays_the_largest() -> None:
    """Another cloud's instance type, next to a small one the table knows: a node of that type may come, holding any
    GPU, so the pin narrows nothing."""
    assert charged(gpu_pod(terms=[{"matchExpressions": [
        expr("node.kubernetes.io/instance-type", "In", "a3-ultragpu-8g", "g6.xlarge")]}])) == B200
    assert charged(gpu_pod(terms=[{"matchExpressions": [expr("nvidia.com/gpu.product", "In", "NVIDIA-L4")]},
                                  {"matchExpressions": [expr("nvidia.com/gpu.product", "In", "ACME-X1")]}])) == B200
    assert charged(gpu_pod(selector={"karpenter.k8s.aws/instance-gpu-name": "l4",
                                     "node.kubernetes.io/instance-type": "g7.xlarge"})) == B200
    cluster = ChargeTable.for_models(["L4"])
    assert charged(gpu_pod(selector={"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"}), cluster) == 22 * GIB


@pytest.mark.parametrize("name", sorted(GPU_INSTANCE_TYPES))
def test_every_gpu_instance_type_pins_its_model(name: str) -> None:
    model = CATALOG[GPU_INSTANCE_TYPES[name][0]]
    assert charged(gpu_pod(selector={"node.kubernetes.io/instance-type": name})) == model_memory_bytes(model)


def test_pins_that_leave_a_larger_gpu_possible_pay_for_it() -> None:
    # NotIn, DoesNotExist and an untracked label leave the B200 (or a B200 shared in place) possible
    assert charged(gpu_pod(terms=[{"matchExpressions": [expr("nvidia.com/gpu.product", "NotIn", "NVIDIA-B200")]}])) \
        == B200
    assert charged(gpu_pod(terms=[{"matchExpressions": [
        expr("karpenter.k8s.aws/instance-gpu-name", "DoesNotExist")]}])) == B200
    assert charged(gpu_pod(selector={"team": "ml"})) == B200
    # the terms are ORed: the largest of either
    assert charged(gpu_pod(terms=[
        {"matchExpressions": [expr("nvidia.com/gpu.product", "In", "NVIDIA-L4")]},
        {"matchExpressions": [expr("node.kubernetes.io/instance-type", "In", "p5e.48xlarge")]}])) == H200
    # a term of matchFields only may match any node; an empty term matches none, leaving nothing to narrow by
    assert charged(gpu_pod(terms=[{"matchFields": [expr("metadata.name", "In", "n1")]}])) == B200
    assert charged(gpu_pod(terms=[{}, {"matchExpressions": [expr("nvidia.com/gpu.product", "In", "NVIDIA-L4")]}])) \
        == 22 * GIB


def test_an_unpinned_pod_pays_the_largest_model_of_the_cluster() -> None:
    assert charged(gpu_pod()) == B200
    cluster = ChargeTable.for_models(["A100-SXM4-80GB", "L4"])
    assert charged(gpu_pod(), cluster) == 80 * GIB
    assert charged(gpu_pod(selector={"nvidia.com/gpu.product": "NVIDIA-L4"}), cluster) == 22 * GIB
    assert charged(gpu_pod(selector={"node.kubernetes.io/instance-type": "p5e.48xlarge"}), cluster) == 80 * GIB


def test_replicas_of_a_mig_device_divide_its_slice() -> None:
    config = {"version": "v1", "sharing": {"timeSlicing": {"renameByDefault": True, "resources": [
        {"name": "nvidia.com/mig-1g.10gb", "replicas": 2}, {"name": "nvidia.com/gpu", "replicas": 4}]}}}
    table = ChargeTable.from_device_plugin_config(config)
    assert charged(gpu_pod(resource="nvidia.com/mig-1g.10gb.shared", count=2), table) == 10 * GIB
    assert charged(gpu_pod(resource="nvidia.com/gpu.shared", count=4,
                           selector={"nvidia.com/gpu.product": "NVIDIA-H200-SHARED"}), table) == H200


def test_a_bad_affinity_is_a_one_line_error_naming_the_field() -> None:
    from kubegpu.errors import ConfigError

    with pytest.raises(ConfigError, match=r"team-a/p: spec.affinity.*nodeSelectorTerms\[0\].matchExpressions\[0\]"):
        charged(gpu_pod(terms=[{"matchExpressions": [expr("nvidia.com/gpu.memory", "Gt", "lots")]}]))


# ------------------------------------------------------------------------------------------ the shipped catalogue


def test_the_gpu_instance_facts_agree_with_the_autoscalers_shipped_catalogue() -> None:
    from kubegpu.autoscaler.instancetypes import default_instance_types

    shipped = {it.name: (it.gpu_model, it.gpu_count) for it in default_instance_types() if it.gpu_count}
    assert shipped
    assert {name: GPU_INSTANCE_TYPES[name] for name in shipped} == shipped


# ------------------------------------------------------------------------------------------ nodes hold the charges


SHARINGS = {
    "whole": (None, {"version": "v1"}),
    "mig": ("all-balanced", None),
    "time-slicing": (None, {"version": "v1", "sharing": {"timeSlicing": {"renameByDefault": True, "resources": [
        {"name": "nvidia.com/gpu", "replicas": 4}]}}}),
}


FILLED = [(model, name) for model in ("A100-SXM4-80GB", "L4", "B200-180GB") for name in SHARINGS
          if CATALOG[model].mig_capable or SHARINGS[name][0] is None]


@pytest.mark.parametrize(("model", "sharing_name"), FILLED)
def test_a_node_full_of_unpinned_pods_still_fits_their_charge(model: str, sharing_name: str) -> None:
    """Whatever fills a node's GPU resources, charged as unpinned pods are (the most any pod is), fits the
    `kubegpu.io/gpu-memory` the node advertises: the scheduler's fit on the charge never refuses a fit on GPUs."""
    mig, plugin = SHARINGS[sharing_name]
    plugin = plugin or {"version": "v1", "flags": {"migStrategy": "mixed"}}
    sharing = GpuSharing(mig, json.dumps(plugin, sort_keys=True))
    allocatable = gpu_allocatable(model, 2, sharing)
    table = ChargeTable.from_device_plugin_config(plugin)
    capacity = node_gpu_memory(allocatable, product_label(CATALOG[model]), table)
    pods = sum(charged(gpu_pod(resource=name, count=int(count)), table) for name, count in allocatable.items())
    assert 0 < pods <= capacity
    # and the capacity before the node exists (instance types, NodeClaims) is the same number
    assert sharing_capacity(sharing, model, 2, {"cpu": 8.0})[GPU_MEMORY_RESOURCE] == capacity


# ------------------------------------------------------------------------------------------ NodePools


def pool(name: str, requirements: list[dict[str, Any]], labels: dict[str, str] | None = None,
         api_version: str = "kubegpu.io/v1") -> dict[str, Any]:
    return {"apiVersion": api_version, "kind": "NodePool", "metadata": {"name": name},
            "spec": {"template": {"metadata": {"labels": labels or {}}, "spec": {"requirements": requirements}}}}


POOLS = [
    pool("small", [expr("karpenter.k8s.aws/instance-gpu-name", "In", "l4", "t4"),
                   expr("topology.kubernetes.io/zone", "In", "us-east-1a")], {"team": "inference"}),
    pool("big", [expr("node.kubernetes.io/instance-type", "In", "p5e.48xlarge")], api_version="karpenter.sh/v1"),
]


def test_the_gpus_a_nodepool_may_launch_are_where_its_pods_may_land() -> None:
    table = ChargeTable.for_cluster([], [], None, POOLS)
    assert table.largest_bytes == H200  # nothing bigger can come
    assert charged(gpu_pod(selector={"kubegpu.io/nodepool": "small"}), table) == 22 * GIB
    assert charged(gpu_pod(selector={"team": "inference"}), table) == 22 * GIB  # the template's label
    assert charged(gpu_pod(selector={"karpenter.sh/nodepool": "big"}), table) == H200
    assert charged(gpu_pod(), table) == H200
    # a GPU node already there with the pool's label counts with it, under the pool's label too
    node = {"nvidia.com/gpu.product": "NVIDIA-L40S", "nvidia.com/gpu.memory": "46068", "team": "inference"}
    with_node = ChargeTable.for_cluster([], [node], None, POOLS)
    assert charged(gpu_pod(selector={"team": "inference"}), with_node) == 44 * GIB


def test_quota_explain_reads_nodepools(tmp_path: Path) -> None:
    import yaml

    (tmp_path / "pools.yaml").write_text(yaml.safe_dump_all(POOLS))
    (tmp_path / "pod.json").write_text(json.dumps(gpu_pod(selector={"kubegpu.io/nodepool": "small"})))
    result = CliRunner().invoke(app, ["quota", "explain", "-f", str(tmp_path / "pod.json"), "--nodepools",
                                      str(tmp_path / "pools.yaml"), "-o", "json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["gpuMemoryBytes"] == 22 * GIB
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump(pool("bad", [expr("nvidia.com/gpu.memory", "Gt", "x")])))
    result = CliRunner().invoke(app, ["quota", "explain", "-f", str(tmp_path / "pod.json"), "--nodepools",
                                      str(tmp_path / "bad.yaml")])
    assert result.exit_code == 1
    assert "NodePool bad: spec.template.spec.requirements" in result.output


def test_what_a_nodes_gpus_hold_comes_from_gfds_labels() -> None:
    from kubegpu.sharing.charges import node_gpus_bytes

    assert node_gpus_bytes({"nvidia.com/gpu.product": "NVIDIA-H200", "nvidia.com/gpu.count": "8"}) == 8 * H200
    assert node_gpus_bytes({"nvidia.com/gpu.product": "NVIDIA-L4-SHARED", "nvidia.com/gpu.count": "2"}) == 44 * GIB
    # MIG under the single strategy: the devices and their memory; a GPU the catalog does not know: its memory label
    assert node_gpus_bytes({"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB-MIG-1g.10gb",
                            "nvidia.com/gpu.count": "14", "nvidia.com/gpu.memory": "9984"}) == 14 * 9 * GIB
    assert node_gpus_bytes({"nvidia.com/gpu.product": "ACME-X1", "nvidia.com/gpu.count": "1",
                            "nvidia.com/gpu.memory": "98304"}) == 96 * GIB
    assert node_gpus_bytes({"kubernetes.io/os": "linux"}) == 0
