"""The autoscaler buys nodes for pods whose GPUs come only through DRA ResourceClaims, on the real control plane:
kube-controller-manager makes each pod's claims from its templates, the autoscaler plans them with the allocator over
the slices each instance type's GPUs would publish and launches kwok nodes that publish exactly those slices, and the
REAL kube-scheduler allocates the claims there and binds the pods — beside extended-resource pods of the same burst."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from kubegpu.autoscaler.controller import Autoscaler, Options
from kubegpu.autoscaler.instancetypes import to_kwok
from kubegpu.autoscaler.provider import SimulatedProvider
from kubegpu.clock import RealClock
from kubegpu.dra.classes import shipped_class_objects
from kubegpu.kube import ApiError, NotFound
from kubegpu.testing.processes import stop_child
from kubegpu.testing.session import RealCluster, WaitTimeout, wait_for
from tests.autoscaler.builders import instance_type, nodepool, pod

pytestmark = pytest.mark.apiserver
A100, H100 = "A100-SXM4-80GB", "H100-SXM5-80GB"
TYPES = [instance_type("cpu.x8", 8, 32, 0.40),
         instance_type("a100.x1", 8, 64, 4.0, gpus=1, model=A100),
         instance_type("a100.x2", 16, 128, 8.0, gpus=2, model=A100),
         instance_type("h100.x1", 8, 64, 6.0, gpus=1, model=H100)]
POOL_LABEL = "kubegpu.io/nodepool"
DEVICE_CLASSES = Path(__file__).resolve().parents[2] / "deploy" / "kubernetes" / "dra" / "deviceclasses.yaml"
PRODUCT = "device.attributes['gpu.nvidia.com'].productName"


def _request(name: str, device_class: str, selector: str) -> dict[str, Any]:
    return {"name": name, "exactly": {"deviceClassName": device_class, "selectors": [{"cel": {"expression":
                                                                                                 selector}}]}}


def _profile(name: str) -> str:
    return f"device.attributes['gpu.nvidia.com'].profile == '{name}'"


def _spec(*requests: dict[str, Any], constraints: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return {"devices": {"requests": list(requests), **({"constraints": constraints} if constraints else {})}}


TEMPLATES = {
    "h100": _spec(_request("gpu", "gpu.nvidia.com", f"{PRODUCT}.contains('H100')")),
    "small": _spec(_request("mig", "mig.nvidia.com", _profile("1g.10gb"))),
    "pair": _spec(_request("small", "mig.nvidia.com", _profile("1g.10gb")),
                  _request("large", "mig.nvidia.com", _profile("3g.40gb")),
                  constraints=[{"requests": ["small", "large"], "matchAttribute": "gpu.nvidia.com/parentUUID"}]),
}


def _delete_claims_of(cluster: Any, pool: str) -> None:
    """Cleanup: delete the pool's NodeClaims through the API; the autoscaler's termination then removes their nodes."""
    for claim in cluster.list("NodeClaim"):
        if (claim["metadata"].get("labels") or {}).get(POOL_LABEL) == pool:
            with contextlib.suppress(NotFound):
                cluster.delete("NodeClaim", claim["metadata"]["name"])


@pytest.fixture
def world(real_cluster: RealCluster, namespace: str, crds: list[str]) -> Iterator[tuple[Any, str, Autoscaler]]:
    cluster = real_cluster.cluster()
    for device_class in shipped_class_objects():
        with contextlib.suppress(ApiError):   # the session's other DRA tests may have made them already
            cluster.create(device_class)
    name = f"dra-{uuid.uuid4().hex[:6]}"
    taint = {"key": "e2e-pool", "value": name, "effect": "NoSchedule"}
    cluster.create(nodepool(name, labels={"e2e-pool": name}, taints=[taint],
                            disruption={"consolidationPolicy": "WhenEmpty", "consolidateAfter": "Never"}))
    clock = RealClock()
    provider = SimulatedProvider(cluster, TYPES, clock, registration_delay=0.5)
    options = Options(batch_idle=0.5, batch_max=3.0, validation_delay=0.0)
    scaler = Autoscaler(cluster, provider, clock, options)
    try:
        yield cluster, name, scaler
    finally:
        _delete_claims_of(cluster, name)
        with contextlib.suppress(WaitTimeout):
            wait_for(lambda: scaler.step() and not [n for n in cluster.list("Node") if
                                                    (n["metadata"].get("labels") or {}).get(POOL_LABEL) == name],
                     "the test's nodes to terminate", 30, interval=0.2)
        cluster.delete("NodePool", name)
        scaler.close()


def test_claim_pods_and_extended_resource_pods_all_bind_on_nodes_the_autoscaler_bought(
        world: tuple[Any, str, Autoscaler], namespace: str) -> None:
    cluster, pool, scaler = world
    placement = {"nodeSelector": {"e2e-pool": pool},
                 "tolerations": [{"key": "e2e-pool", "operator": "Equal", "value": pool, "effect": "NoSchedule"}]}
    for name, spec in TEMPLATES.items():
        cluster.create({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
                        "metadata": {"name": name, "namespace": namespace}, "spec": {"spec": spec}})
    cluster.create({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                    "metadata": {"name": "mps", "namespace": namespace},
                    "spec": _spec(_request("gpu", "mps.gpu.kubegpu.io", f"{PRODUCT}.contains('A100')"))})
    wanted: dict[str, set[str]] = {}   # pod → the GPU models whose devices its claims can get
    mig = {A100, H100}   # both have 1g.10gb and 3g.40gb placements
    plan = [("h100", "template", "h100", 4, {H100}), ("small", "template", "small", 12, mig),
            ("pair", "template", "pair", 6, mig), ("mps", "claim", "mps", 4, {A100})]
    for prefix, kind, target, count, models in plan:
        ref = {"resourceClaimTemplateName" if kind == "template" else "resourceClaimName": target}
        for i in range(count):
            name = f"{prefix}-{i}"
            cluster.create(pod(name, cpu="500m", memory="1Gi", namespace=namespace,
                               spec={**placement, "resourceClaims": [{"name": "gpu", **ref}],
                                     "containers": [{"name": "main", "image": "x", "resources": {
                                         "requests": {"cpu": "500m", "memory": "1Gi"}, "claims": [{"name": "gpu"}]}}]}))
            wanted[name] = models
    for i in range(8):
        cluster.create(pod(f"ext-{i}", cpu="500m", memory="1Gi", namespace=namespace,
                           limits={"nvidia.com/gpu": 1}, spec=placement))
        wanted[f"ext-{i}"] = {A100, H100}

    def all_bound() -> dict[str, str] | None:
        scaler.step()
        where = {p["metadata"]["name"]: p["spec"].get("nodeName") for p in cluster.list("Pod", namespace)}
        return where if len(where) == len(wanted) and all(where.values()) else None

    where = wait_for(all_bound, "kube-scheduler to bind every pod to the autoscaler's nodes", 180, interval=0.3)

    def claims_in_use() -> list[dict[str, Any]] | None:
        """The pool's NodeClaims once none is left empty (one bought for pods kube-scheduler put elsewhere is let go
        as unused a few seconds later)."""
        scaler.step()
        claims = [c for c in cluster.list("NodeClaim") if (c["metadata"].get("labels") or {}).get(POOL_LABEL) == pool
                  and not c["metadata"].get("deletionTimestamp")]
        return claims if {(c.get("status") or {}).get("nodeName") for c in claims} <= set(where.values()) else None

    claims = wait_for(claims_in_use, "no NodeClaim left empty", 60, interval=0.3)
    nodes = {n["metadata"]["name"]: n for n in cluster.list("Node")
             if (n["metadata"].get("labels") or {}).get(POOL_LABEL) == pool}
    assert set(where.values()) <= set(nodes)   # every pod on a node this test's autoscaler bought
    assert {c["status"]["nodeName"] for c in claims} == set(where.values())
    types = {name: n["metadata"]["labels"]["node.kubernetes.io/instance-type"] for name, n in nodes.items()}
    model_of = {it.name: it.gpu_model for it in TYPES}
    for name, models in wanted.items():
        assert model_of[types[where[name]]] in models, f"{name} on {types[where[name]]}"
    assert len({where[f"mps-{i}"] for i in range(4)}) == 1   # one shared claim: its pods share its node
    allocated = cluster.get("ResourceClaim", "mps", namespace)["status"]["allocation"]["devices"]["results"]
    assert len(allocated) == 1 and allocated[0]["pool"] == where["mps-0"]
    # the pair's two partitions come from one GPU, as the template's matchAttribute asks
    made = [c for c in cluster.list("ResourceClaim", namespace) if c["metadata"]["name"].startswith("pair-0")]
    devices = [r["device"] for r in made[0]["status"]["allocation"]["devices"]["results"]]
    assert len(devices) == 2 and len({d.split("-mig-")[0] for d in devices}) == 1


def test_the_command_buys_nodes_for_pods_whose_gpus_come_only_from_claim_templates(
        real_cluster: RealCluster, namespace: str, crds: list[str], tmp_path: Path) -> None:
    """As a user runs it: the shipped DeviceClasses applied from their file, `kubegpu autoscaler --instance-types FILE
    --registration-delay 0` in its own process with its defaults, and pods whose GPUs come only from
    ResourceClaimTemplates of classes `gpu.nvidia.com` and `mig.nvidia.com`: every pod bound, on nodes it bought."""
    cluster = real_cluster.cluster()
    for device_class in yaml.safe_load_all(DEVICE_CLASSES.read_text()):
        with contextlib.suppress(ApiError):   # the session's other DRA tests may have made them already
            cluster.create(device_class)
    pool = f"cmd-{uuid.uuid4().hex[:6]}"
    placement = {"nodeSelector": {"e2e-pool": pool},
                 "tolerations": [{"key": "e2e-pool", "operator": "Equal", "value": pool, "effect": "NoSchedule"}]}
    cluster.create(nodepool(pool, labels={"e2e-pool": pool}, taints=[{"key": "e2e-pool", "value": pool,
                                                                       "effect": "NoSchedule"}],
                            disruption={"consolidationPolicy": "WhenEmpty", "consolidateAfter": "Never"}))
    types = tmp_path / "instance-types.json"
    types.write_text(json.dumps(to_kwok(TYPES)))
    log = (tmp_path / "autoscaler.log").open("w")
    process = subprocess.Popen(
        [sys.executable, "-m", "kubegpu", "autoscaler", "--instance-types", str(types), "--registration-delay", "0",
         "--metrics-address", "", "--identity", pool, "--lease-namespace", namespace],
        env={**os.environ, **real_cluster.env()}, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        for name, spec in (("whole", TEMPLATES["h100"]), ("pair", TEMPLATES["pair"])):
            cluster.create({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
                            "metadata": {"name": name, "namespace": namespace}, "spec": {"spec": spec}})
        names = [f"{template}-{i}" for template in ("whole", "pair") for i in range(3)]
        for name in names:
            cluster.create(pod(name, cpu="500m", memory="1Gi", namespace=namespace,
                               spec={**placement, "resourceClaims": [
                                   {"name": "gpu", "resourceClaimTemplateName": name.split("-")[0]}],
                                     "containers": [{"name": "main", "image": "x", "resources": {
                                         "requests": {"cpu": "500m", "memory": "1Gi"}, "claims": [{"name": "gpu"}]}}]}))

        def bound() -> dict[str, str] | None:
            if process.poll() is not None:
                raise AssertionError(f"the autoscaler exited {process.returncode}: "
                                     f"{(tmp_path / 'autoscaler.log').read_text()[-2000:]}")
            where = {p["metadata"]["name"]: p["spec"].get("nodeName") for p in cluster.list("Pod", namespace)}
            return where if all(where.get(n) for n in names) else None

        where = wait_for(bound, "every claim pod bound", 180, interval=0.5)
        nodes = {n["metadata"]["name"]: n["metadata"]["labels"]["node.kubernetes.io/instance-type"]
                 for n in cluster.list("Node") if (n["metadata"].get("labels") or {}).get(POOL_LABEL) == pool}
        assert set(where.values()) <= set(nodes)   # on nodes the command bought for this pool
        assert {nodes[where[f"whole-{i}"]] for i in range(3)} == {"h100.x1"}   # the only H100 type
    finally:
        _delete_claims_of(cluster, pool)
        with contextlib.suppress(WaitTimeout):
            wait_for(lambda: not any((c["metadata"].get("labels") or {}).get(POOL_LABEL) == pool
                                     for c in cluster.list("NodeClaim")), "the test's NodeClaims terminated", 60)
        stop_child(process, 20)
        log.close()
        cluster.delete("NodePool", pool)
