"""`node_cost`: what each new node costs beyond its price, weighed when a pass sizes new NodeClaims (the
cheapest plan of the shipped catalogue is hundreds of 1-GPU nodes, and every node costs kube-scheduler and the API
server; fewer, bigger nodes for a small premium bind a burst sooner)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from kubegpu.autoscaler.catalog import shipped_catalogue
from kubegpu.autoscaler.provisioner import run_pass
from kubegpu.autoscaler.scheduler import NODE_COST, Scheduler
from tests.autoscaler.builders import instance_type, nodepool, pod, pool
from tests.autoscaler.test_cli import invoke

A100 = "A100-SXM4-80GB"
GPU_TYPES = [instance_type("x1", 8, 64, 1.00, gpus=1, model=A100),      # $1.00 per GPU
             instance_type("x4", 32, 256, 4.80, gpus=4, model=A100)]    # $1.20 per GPU
ON_DEMAND = [{"key": "kubegpu.io/capacity-type", "operator": "In", "values": ["on-demand"]}]


def gpu_pods(count: int, gpus: int = 1) -> list[dict]:
    return [pod(f"p{i}", cpu=str(2 * gpus), memory=f"{8 * gpus}Gi", limits={"nvidia.com/gpu": gpus})
            for i in range(count)]


def test_without_a_node_cost_the_plan_is_the_cheapest() -> None:
    result = run_pass([pool()], lambda _p: GPU_TYPES, gpu_pods(8))
    assert [c.instance_type for c in result.claims] == ["x1"] * 8 and result.cost == pytest.approx(8.0)


def test_a_node_cost_buys_fewer_bigger_nodes_when_they_cost_little_more() -> None:
    # per pod: x1 1.00 + 0.50 = 1.50; x4 (4.80 + 0.50) / 4 = 1.325 -> two x4 for 9.60 instead of eight x1 for 8.00
    result = run_pass([pool()], lambda _p: GPU_TYPES, gpu_pods(8), node_cost=0.5)
    assert [c.instance_type for c in result.claims] == ["x4", "x4"] and result.cost == pytest.approx(9.6)
    assert sorted(len(c.pods) for c in result.claims) == [4, 4]
    # the plan's cost stays the price: the node cost only weighs the choice
    assert result.cost == sum(c.price for c in result.claims)


def test_a_small_node_cost_keeps_the_cheaper_small_nodes() -> None:
    # x1 1.00 + 0.20 = 1.20 per pod; x4 (4.80 + 0.20) / 4 = 1.25: the premium outweighs the saving
    result = run_pass([pool()], lambda _p: GPU_TYPES, gpu_pods(8), node_cost=0.2)
    assert [c.instance_type for c in result.claims] == ["x1"] * 8


def test_a_lone_pod_still_gets_the_small_node() -> None:
    # one pod waiting: x4 would cost (4.80 + 0.5) for one pod, x1 1.50
    result = run_pass([pool()], lambda _p: GPU_TYPES, gpu_pods(1), node_cost=0.5)
    assert [c.instance_type for c in result.claims] == ["x1"]


def test_the_shipped_catalogue_burst_at_the_default_node_cost() -> None:
    # the end-to-end benchmark's mix (per 10 pods: 4 x 1 GPU, 3 x 2, 2 x 4, 1 x 8; 260 GPUs): by price alone 1-GPU
    # pods get 1-GPU nodes (85 of them); at the default node cost nearly every node is an 8-GPU one
    mix = [gpu_pods(1, g)[0] | {"metadata": {"name": f"p{i}", "namespace": "default", "uid": f"u{i}"}}
           for i, g in enumerate((1, 1, 1, 1, 2, 2, 2, 4, 4, 8) * 10)]
    types = shipped_catalogue()
    cheapest = run_pass([pool(requirements=ON_DEMAND)], lambda _p: types, mix, node_cost=0.0)
    default = run_pass([pool(requirements=ON_DEMAND)], lambda _p: types, mix, node_cost=NODE_COST)
    assert not cheapest.unschedulable and not default.unschedulable
    assert len(cheapest.claims) == 85 and "g4dn.xlarge" in {c.instance_type for c in cheapest.claims}
    assert len(default.claims) <= 260 // 8 + 1
    assert sum(c.instance_type == "g6.48xlarge" for c in default.claims) >= len(default.claims) - 1
    assert cheapest.cost < default.cost < 1.5 * cheapest.cost


def test_a_negative_node_cost_is_refused() -> None:
    with pytest.raises(ValueError, match="node_cost"):
        Scheduler([], {}, node_cost=-1.0)


@pytest.mark.parametrize("value", ["-1", "nan"])
def test_the_commands_refuse_a_bad_node_cost_in_one_line(value: str) -> None:
    code, out = invoke("autoscaler", "--oneshot", "--node-cost", value)
    assert code == 2 and out.count("\n") == 1 and "'--node-cost'" in out and "non-negative" in out, out


def test_provision_takes_the_node_cost(tmp_path: Path) -> None:
    pools_path, pods_path = tmp_path / "pools.yaml", tmp_path / "pods.json"
    pools_path.write_text(yaml.safe_dump(nodepool("gpu", requirements=ON_DEMAND)))
    pods_path.write_text(json.dumps(gpu_pods(8)))
    plans = {}
    for cost in ("0", "5", None):
        flags = ["--node-cost", cost] if cost is not None else []
        code, out = invoke("provision", "--nodepools", str(pools_path), "--pods", str(pods_path), "-o", "json", *flags)
        assert code == 0, out
        plans[cost] = json.loads(out)["nodeclaims"]
    assert [c["instanceType"] for c in plans["0"]] == ["g4dn.xlarge"] * 8
    assert len(plans["5"]) < 8 and all(c["instanceType"] != "g4dn.xlarge" for c in plans["5"])
    # without the flag: the default node cost, eight 1-GPU pods on one 8-GPU node
    assert [c["instanceType"] for c in plans[None]] == ["g6.48xlarge"]
