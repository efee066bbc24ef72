"""The provisioning simulation, case by case as Karpenter's scheduling suite checks it."""

from __future__ import annotations

from typing import Any

from kubegpu.autoscaler.catalog import shipped_catalogue
from kubegpu.autoscaler.instancetypes import InstanceType, Offering
from kubegpu.autoscaler.provisioner import inflight_node, run_pass
from kubegpu.scheduling import node_info
from tests.autoscaler.builders import instance_type, pod, pool

CPU_TYPES = [
    instance_type("small", 2, 8, 0.10),
    instance_type("medium", 4, 16, 0.20),
    instance_type("large", 8, 32, 0.40),
    instance_type("arm-medium", 4, 16, 0.15, arch="arm64"),
]


def solve(pools: list, pods: list, types: list[InstanceType] | None = None, **kwargs: Any) -> Any:
    chosen = types or CPU_TYPES
    return run_pass(pools, lambda _p: chosen, pods, **kwargs)


def names(claim: Any) -> list[str]:
    return sorted(p["metadata"]["name"] for p in claim.pods)


def test_cheapest_instance_type_that_fits() -> None:
    result = solve([pool()], [pod("a", cpu="3")])
    assert [c.instance_type for c in result.claims] == ["arm-medium"]
    result = solve([pool(requirements=[{"key": "kubernetes.io/arch", "operator": "In", "values": ["amd64"]}])],
                   [pod("a", cpu="3")])
    assert [c.instance_type for c in result.claims] == ["medium"]


def test_requirement_operators_narrow_instance_types() -> None:
    gt = pool(requirements=[{"key": "kubegpu.io/instance-cpu", "operator": "Gt", "values": ["4"]}])
    assert [c.instance_type for c in solve([gt], [pod("a", cpu="1")]).claims] == ["large"]
    lt = pool(requirements=[{"key": "kubegpu.io/instance-cpu", "operator": "Lt", "values": ["4"]}])
    result = solve([lt], [pod("a", cpu="3")])
    assert not result.claims and "no instance type fits" in result.unschedulable["default/a"]
    not_in = pool(requirements=[{"key": "node.kubernetes.io/instance-type", "operator": "NotIn",
                                 "values": ["small", "arm-medium"]}])
    assert [c.instance_type for c in solve([not_in], [pod("a", cpu="1")]).claims] == ["medium"]
    exists = pool(requirements=[{"key": "nvidia.com/gpu.product", "operator": "Exists"}])
    result = solve([exists], [pod("a")])
    assert "no instance type with an available offering" in result.unschedulable["default/a"]
    absent = pool(requirements=[{"key": "nvidia.com/gpu.product", "operator": "DoesNotExist"}])
    assert solve([absent], [pod("a")]).claims


def test_pod_node_selector_and_affinity_must_agree_with_pool() -> None:
    ml = pool("ml", labels={"team": "ml"})
    result = solve([ml], [pod("a", spec={"nodeSelector": {"team": "web"}}),
                          pod("b", spec={"nodeSelector": {"team": "ml"}})])
    assert [names(c) for c in result.claims] == [["b"]]
    assert "conflicts" in result.unschedulable["default/a"]
    affinity = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "kubernetes.io/arch", "operator": "In", "values": ["arm64"]}]}]}}}
    result = solve([pool()], [pod("c", cpu="3", spec={"affinity": affinity})])
    assert [c.instance_type for c in result.claims] == ["arm-medium"]


def test_taints_need_tolerations_but_startup_taints_do_not() -> None:
    gpu = pool("tainted", taints=[{"key": "nvidia.com/gpu", "effect": "NoSchedule"}],
               startupTaints=[{"key": "example.com/warming", "effect": "NoSchedule"}])
    result = solve([gpu], [pod("plain")])
    assert "taint nvidia.com/gpu" in result.unschedulable["default/plain"]
    tolerant = pod("ok", spec={"tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}]})
    assert [names(c) for c in solve([gpu], [tolerant]).claims] == [["ok"]]


def test_highest_weight_pool_first_and_fallback() -> None:
    heavy = pool("heavy", weight=50, requirements=[{"key": "kubegpu.io/instance-cpu", "operator": "Lt",
                                                     "values": ["3"]}])
    light = pool("light", weight=10)
    result = solve([light, heavy], [pod("small", cpu="1")])
    assert [(c.nodepool, names(c)) for c in result.claims] == [("heavy", ["small"])]
    result = solve([light, heavy], [pod("big", cpu="6")])
    assert [(c.nodepool, names(c)) for c in result.claims] == [("light", ["big"])]
    # as in Karpenter, a NodeClaim already opened in this pass is tried before a new one from a heavier pool
    result = solve([light, heavy], [pod("small", cpu="1"), pod("big", cpu="6")])
    assert [(c.nodepool, names(c)) for c in result.claims] == [("light", ["big", "small"])]


def test_limits_cap_new_capacity_including_gpus() -> None:
    limited = pool(limits={"cpu": "4"})
    result = solve([limited], [pod(f"p{i}", cpu="1500m") for i in range(4)])
    assert sum(c.capacity["cpu"] for c in result.claims) <= 4
    assert any("limits exceeded" in why for why in result.unschedulable.values())
    gpu_types = [instance_type("g1", 8, 32, 1.0, gpus=1, model="L4")]
    gpus = pool(limits={"nvidia.com/gpu": "2"})
    gpu_pods = [pod(f"g{i}", limits={"nvidia.com/gpu": 1}) for i in range(3)]
    result = run_pass([gpus], lambda _p: gpu_types, gpu_pods)
    assert len(result.claims) == 2 and len(result.unschedulable) == 1
    used = {"default": {"nvidia.com/gpu": 2.0, "nodes": 2.0}}
    assert not run_pass([gpus], lambda _p: gpu_types, gpu_pods, usage=used).claims


def test_node_count_limit() -> None:
    result = solve([pool(limits={"nodes": 1})], [pod("a", cpu="7"), pod("b", cpu="7")])
    assert len(result.claims) == 1 and len(result.unschedulable) == 1


def test_pods_pack_onto_one_claim_and_existing_nodes_come_first() -> None:
    result = solve([pool()], [pod(f"p{i}", cpu="500m", memory="256Mi") for i in range(6)])
    assert len(result.claims) == 1 and len(result.claims[0].pods) == 6
    node = {"metadata": {"name": "n1", "labels": {}}, "spec": {},
            "status": {"allocatable": {"cpu": "2", "memory": "8Gi", "pods": "110"}}}
    result = solve([pool()], [pod(f"p{i}", cpu="500m") for i in range(6)], existing=[node_info(node)])
    assert [p["metadata"]["name"] for p in result.existing["n1"]] == ["p0", "p1", "p2", "p3"]
    assert [names(c) for c in result.claims] == [["p4", "p5"]]


def test_inflight_nodeclaim_is_reused() -> None:
    first = solve([pool()], [pod("a", cpu="1")])
    plan = first.claims[0]
    claim = {"metadata": {"name": "default-x", "labels": {"kubegpu.io/nodepool": "default"}},
             "spec": {"requirements": [], "taints": [], "resources": {"requests": {"cpu": "1"}}},
             "status": {"allocatable": {k: str(v) for k, v in plan.allocatable.items()}}}
    second = solve([pool()], [pod("b", cpu="500m")], existing=[node_info(inflight_node(claim))])
    assert not second.claims
    assert [p["metadata"]["name"] for p in second.existing["nodeclaim/default-x"]] == ["b"]


def test_daemonset_overhead_is_reserved() -> None:
    ds = {"kind": "DaemonSet", "spec": {"template": {"spec": {"containers": [
        {"name": "agent", "resources": {"requests": {"cpu": "1"}}}]}}}}
    assert solve([pool()], [pod("a", cpu="1500m")]).claims[0].instance_type == "small"
    assert solve([pool()], [pod("a", cpu="1500m")], daemonsets=[ds]).claims[0].instance_type == "arm-medium"


def test_unavailable_offering_and_capacity_type_requirement() -> None:
    types = [InstanceType("spotty", "amd64", ("linux",), {"cpu": 4.0, "memory": 16 * 2.0**30, "pods": 110.0},
                          (Offering("z1", "spot", 0.05, available=False), Offering("z1", "on-demand", 0.3)))]
    result = solve([pool()], [pod("a")], types)
    assert result.claims[0].offering.capacity_type == "on-demand"
    spot_only = pool(requirements=[{"key": "kubegpu.io/capacity-type", "operator": "In", "values": ["spot"]}])
    assert "no instance type with an available offering" in solve([spot_only], [pod("a")], types).unschedulable[
        "default/a"]


def test_gpu_pods_get_cheapest_gpu_node() -> None:
    types = shipped_catalogue()
    result = run_pass([pool(requirements=[{"key": "kubegpu.io/capacity-type", "operator": "In",
                                           "values": ["on-demand"]}])],
                      lambda _p: types, [pod("train", cpu="2", memory="8Gi", limits={"nvidia.com/gpu": 1})])
    assert [c.instance_type for c in result.claims] == ["g4dn.xlarge"]
    pinned = pod("h100", cpu="2", limits={"nvidia.com/gpu": 1},
                 spec={"nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}})
    result = run_pass([pool()], lambda _p: types, [pinned])
    assert [c.instance_type for c in result.claims] == ["p5.48xlarge"]


def test_mig_profiles_counted_per_gpu_under_the_pool_mig_config() -> None:
    types = [instance_type("a100x1", 16, 128, 4.0, gpus=1, model="A100-SXM4-80GB"),
             instance_type("a100x2", 32, 256, 8.5, gpus=2, model="A100-SXM4-80GB")]
    mig = pool("mig", labels={"nvidia.com/mig.config": "all-1g.10gb"})
    pods = [pod(f"m{i}", cpu="100m", memory="128Mi", limits={"nvidia.com/mig-1g.10gb": 1}) for i in range(9)]
    result = run_pass([mig], lambda _p: types, pods)
    assert sorted(len(c.pods) for c in result.claims) == [2, 7]      # 7 x 1g.10gb per A100-80GB
    assert {c.instance_type for c in result.claims} == {"a100x1"}
    whole = pool("whole")
    result = run_pass([whole], lambda _p: types, pods[:1])
    assert "no instance type" in result.unschedulable["default/m0"]


def test_time_sliced_replicas_counted_per_gpu() -> None:
    config = ("version: v1\nsharing:\n  timeSlicing:\n    renameByDefault: true\n    resources:\n"
              "    - name: nvidia.com/gpu\n      replicas: 4\n")
    shared = pool("shared", annotations={"kubegpu.io/device-plugin-config": config})
    types = [instance_type("l4x1", 8, 32, 0.8, gpus=1, model="L4"), instance_type("l4x4", 48, 192, 4.6, gpus=4,
                                                                                 model="L4")]
    pods = [pod(f"s{i}", cpu="500m", memory="1Gi", limits={"nvidia.com/gpu.shared": 1}) for i in range(6)]
    result = run_pass([shared], lambda _p: types, pods)
    assert sorted(len(c.pods) for c in result.claims) == [2, 4]
    assert all(c.allocatable["nvidia.com/gpu.shared"] == 4 for c in result.claims)


def test_invalid_sharing_config_is_one_line_naming_the_pool() -> None:
    import pytest

    from kubegpu.errors import ConfigError

    bad = pool("bad", annotations={"kubegpu.io/device-plugin-config": "version: v1\nsharing: {timeSlicing: 3}\n"})
    with pytest.raises(ConfigError, match=r"NodePool bad: spec\.template\.metadata\.annotations"):
        run_pass([bad], lambda _p: CPU_TYPES, [pod("a")])


def test_hostname_anti_affinity_spreads_pods() -> None:
    anti = {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
        {"topologyKey": "kubernetes.io/hostname", "labelSelector": {"matchLabels": {"app": "db"}}}]}}
    pods = [pod(f"db{i}", cpu="100m", metadata={"labels": {"app": "db"}}, spec={"affinity": anti})
            for i in range(3)]
    result = solve([pool()], pods)
    assert len(result.claims) == 3


def test_pod_no_pool_can_serve_gets_a_reason_and_others_still_scheduled() -> None:
    result = solve([pool()], [pod("huge", cpu="64"), pod("fine", cpu="1")])
    assert "no instance type fits the requests" in result.unschedulable["default/huge"]
    assert [names(c) for c in result.claims] == [["fine"]]


def test_min_values_keeps_enough_instance_type_options() -> None:
    flexible = pool(requirements=[{"key": "node.kubernetes.io/instance-type", "operator": "In",
                                   "values": ["small", "medium", "large"], "minValues": 2}])
    result = solve([flexible], [pod("a", cpu="1")])
    assert len(result.claims[0].instance_type_options) >= 2
    result = solve([flexible], [pod("b", cpu="6")])      # only `large` fits: fewer options than minValues
    assert not result.claims and "minValues" in result.unschedulable["default/b"]
