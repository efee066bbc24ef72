"""Quotas and the autoscaler compose: with the charge policy installed every GPU pod requests `kubegpu.io/gpu-memory`,
and instance types, in-flight NodeClaims and the nodes the autoscaler and the control plane's kwok make advertise
what discovery will write, so a charged pod is planned, launched for and bound exactly as an uncharged one."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from kubegpu.cli import app
from kubegpu.scheduling.quantity import parse_quantity
from kubegpu.sharing.charges import ChargeTable, pod_charge, quantity_of_bytes
from kubegpu.sharing.names import GPU_MEMORY_RESOURCE
from tests.autoscaler.builders import Harness, instance_type, nodepool, pod

GIB = 1 << 30
A100 = "A100-SXM4-80GB"
TIME_SLICING = json.dumps({"version": "v1", "sharing": {"timeSlicing": {"renameByDefault": True, "resources": [
    {"name": "nvidia.com/gpu", "replicas": 4}]}}})

# pool (labels, annotations), the pods' GPU resource, how many
SHARINGS: dict[str, tuple[dict[str, Any], str, int]] = {
    "whole": ({}, "nvidia.com/gpu", 3),
    "mig": ({"labels": {"nvidia.com/mig.config": "all-1g.10gb"}}, "nvidia.com/mig-1g.10gb", 9),
    "time-slicing": ({"annotations": {"kubegpu.io/device-plugin-config": TIME_SLICING}}, "nvidia.com/gpu.shared", 6),
}


def charge(body: dict[str, Any], table: ChargeTable | None = None) -> dict[str, Any]:
    """The pod as the charge policy stores it: its charge in requests and limits of the container."""
    charged = copy.deepcopy(body)
    [amount] = pod_charge(body, table).containers.values()
    resources = charged["spec"]["containers"][0]["resources"]
    for part in ("requests", "limits"):
        resources.setdefault(part, {})[GPU_MEMORY_RESOURCE] = quantity_of_bytes(amount)
    return charged


def gpu_pods(resource: str, count: int, **extra: Any) -> list[dict[str, Any]]:
    return [pod(f"p{i}", cpu="1", limits={resource: 1}, **extra) for i in range(count)]


def provision(tmp_path: Path, pools: list[dict[str, Any]], pods: list[dict[str, Any]]) -> dict[str, Any]:
    (tmp_path / "pools.yaml").write_text(yaml.safe_dump_all(pools))
    (tmp_path / "pods.json").write_text(json.dumps(pods))
    result = CliRunner().invoke(app, ["provision", "--nodepools", str(tmp_path / "pools.yaml"), "--pods",
                                      str(tmp_path / "pods.json"), "-o", "json"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return json.loads(result.output)  # type: ignore[no-any-return]


@pytest.mark.parametrize("sharing", list(SHARINGS))
def test_provision_plans_the_same_nodes_for_charged_pods(sharing: str, tmp_path: Path) -> None:
    template, resource, count = SHARINGS[sharing]
    pool = nodepool("gpu", requirements=[{"key": "node.kubernetes.io/instance-type", "operator": "In",
                                          "values": ["p4de.24xlarge", "p5e.48xlarge", "g6.xlarge"]}], **template)
    plain = gpu_pods(resource, count)
    charged = [charge(p) for p in plain]
    assert all(GPU_MEMORY_RESOURCE in p["spec"]["containers"][0]["resources"]["requests"] for p in charged)
    uncharged_plan = provision(tmp_path, [pool], plain)
    charged_plan = provision(tmp_path, [pool], charged)
    assert charged_plan["unschedulable"] == [] and charged_plan["nodeclaims"]
    assert charged_plan == uncharged_plan


def test_provision_plans_a_node_for_a_pinned_charged_pod(tmp_path: Path) -> None:
    pinned = pod("train", cpu="1", limits={"nvidia.com/gpu": 1},
                 spec={"nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-H200"}})
    charged = charge(pinned)
    assert charged["spec"]["containers"][0]["resources"]["limits"][GPU_MEMORY_RESOURCE] == "141Gi"
    plan = provision(tmp_path, [nodepool("gpu")], [charged])
    assert [(c["instanceType"], c["pods"]) for c in plan["nodeclaims"]] == [("p5e.48xlarge", ["train"])]


@pytest.mark.parametrize("sharing", list(SHARINGS))
def test_charged_pods_walk_the_lifecycle_as_uncharged_ones(sharing: str) -> None:
    """Planned into an in-flight NodeClaim (its allocatable carries the charge room), launched, published by the
    kwok provider with discovery's `kubegpu.io/gpu-memory`, and bound: the same claims and bindings either way."""
    template, resource, count = SHARINGS[sharing]
    outcomes = []
    for charged in (False, True):
        harness = Harness([instance_type("a100.x2", 16, 128, 8.5, gpus=2, model=A100)], registration_delay=5.0)
        harness.add(nodepool("gpu", **template))
        for body in gpu_pods(resource, count):
            harness.add(charge(body) if charged else body)
        harness.run(20)
        claims = harness.claims()
        nodes = harness.nodes()
        bound = sorted(p["metadata"]["name"] for p in harness.cluster.list("Pod") if p["spec"].get("nodeName"))
        outcomes.append((len(claims), len(nodes), bound))
        if charged:
            for claim in claims:
                assert parse_quantity(claim["status"]["allocatable"][GPU_MEMORY_RESOURCE]) > 0
            for node in nodes:
                assert parse_quantity(node["status"]["allocatable"][GPU_MEMORY_RESOURCE]) > 0
    assert outcomes[0] == outcomes[1]
    assert outcomes[1][2] == sorted(f"p{i}" for i in range(count))


def test_the_control_planes_kwok_nodes_carry_what_discovery_writes() -> None:
    from kubegpu.discovery.agent import discover_gpu_memory
    from kubegpu.gpu.simulated import SimulatedBackend, parse_gpu_spec
    from kubegpu.testing.kwoknodes import gpu_node

    node = gpu_node("n", "8xA100-SXM4-80GB")
    backend = SimulatedBackend(None, gpus=parse_gpu_spec("8xA100-SXM4-80GB"), node_name="n")
    try:
        expected = discover_gpu_memory(backend, {"version": "v1"})
    finally:
        backend.close()
    for part in ("capacity", "allocatable"):
        assert parse_quantity(node["status"][part][GPU_MEMORY_RESOURCE]) == expected
    # eight unpinned one-GPU pods, charged the most any pod is, fit as their GPUs do
    assert 8 * pod_charge(gpu_pods("nvidia.com/gpu", 1)[0]).gpu_memory_bytes <= expected
