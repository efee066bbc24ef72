"""The autoscaler against the real control plane: pending GPU pods → NodeClaims → Nodes (kwok nodes from the
simulated provider) → the REAL kube-scheduler binds the pods there; consolidation and expiry delete nodes only as
disruption budgets and PodDisruptionBudgets (whose status the real disruption controller computes) allow."""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from kubegpu.autoscaler.controller import Autoscaler, Options
from kubegpu.autoscaler.provider import SimulatedProvider
from kubegpu.clock import RealClock
from kubegpu.kube import NotFound
from kubegpu.kube.lightkube_cluster import LightkubeCluster
from kubegpu.testing.session import RealCluster, WaitTimeout, wait_for
from tests.autoscaler.builders import instance_type, nodepool, pod

pytestmark = pytest.mark.apiserver
A100 = "A100-SXM4-80GB"
TYPES = [instance_type("a100.x1", 8, 64, 4.0, gpus=1, model=A100)]
POOL_LABEL = "kubegpu.io/nodepool"


@dataclass
class Scaler:
    """One autoscaler replica on a real clock, and the NodePool it serves in this test."""

    cluster: LightkubeCluster
    pool: str
    autoscaler: Autoscaler
    lines: list[str] = field(default_factory=list)

    def run_until(self, check: Callable[[], Any], what: str, timeout: float = 60.0) -> Any:
        def step_and_check() -> Any:
            self.autoscaler.step()
            return check()
        try:
            return wait_for(step_and_check, what, timeout, interval=0.2)
        except WaitTimeout as exc:  # say what the autoscaler was doing
            raise WaitTimeout(f"{exc}; autoscaler: {' | '.join(self.lines[-6:])}") from None

    def run_for(self, seconds: float) -> None:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            self.autoscaler.step()
            time.sleep(0.2)

    def claims(self) -> list[dict[str, Any]]:
        return [c for c in self.cluster.list("NodeClaim") if c["metadata"].get("labels", {}).get(POOL_LABEL)
                == self.pool]

    def nodes(self) -> list[str]:
        return sorted(n["metadata"]["name"] for n in self.cluster.list("Node")
                      if n["metadata"].get("labels", {}).get(POOL_LABEL) == self.pool)

    def gpu_pod(self, name: str, namespace: str, **metadata: Any) -> dict[str, Any]:
        toleration = {"key": "e2e-pool", "operator": "Equal", "value": self.pool, "effect": "NoSchedule"}
        return pod(name, cpu="500m", memory="1Gi", namespace=namespace, limits={"nvidia.com/gpu": 1},
                   spec={"nodeSelector": {"e2e-pool": self.pool}, "tolerations": [toleration]}, metadata=metadata)


@pytest.fixture
def scaler(real_cluster: RealCluster, namespace: str, crds: list[str]) -> Iterator[Callable[..., Scaler]]:
    made: list[Scaler] = []

    def make(**spec: Any) -> Scaler:
        cluster = real_cluster.cluster()
        name = f"pool-{uuid.uuid4().hex[:6]}"  # short: node names derive from it, and land in a 63-char label
        # tainted: the session is shared, and only this test's pods (which tolerate it) may make it launch nodes
        taint = {"key": "e2e-pool", "value": name, "effect": "NoSchedule"}
        cluster.create(nodepool(name, labels={"e2e-pool": name}, taints=[taint], **spec))
        clock = RealClock()
        provider = SimulatedProvider(cluster, TYPES, clock, registration_delay=0.5)
        lines: list[str] = []
        options = Options(batch_idle=0.5, batch_max=3.0, validation_delay=0.0)
        result = Scaler(cluster, name, Autoscaler(cluster, provider, clock, options, log=lines.append), lines)
        made.append(result)
        return result

    yield make
    for each in made:  # leave no NodeClaim or Node behind: deleted through the API, terminated by the autoscaler
        for claim in each.claims():
            with contextlib.suppress(NotFound):
                each.cluster.delete("NodeClaim", claim["metadata"]["name"])
        with contextlib.suppress(WaitTimeout):
            wait_for(lambda each=each: each.autoscaler.step() and not each.claims() and not each.nodes(),
                     "the test's NodeClaims to terminate", 30, interval=0.2)
        each.cluster.delete("NodePool", each.pool)
        each.autoscaler.close()


def test_pending_gpu_pods_get_nodes_and_consolidation_waits_for_the_budget(
        real_cluster: RealCluster, namespace: str, scaler: Callable[..., Scaler]) -> None:
    s = scaler(disruption={"consolidationPolicy": "WhenEmpty", "consolidateAfter": "1s", "budgets": [{"nodes": "0"}]})
    for name in ("train-a", "train-b"):
        s.cluster.create(s.gpu_pod(name, namespace))

    def both_bound() -> dict[str, str] | None:
        where = {p["metadata"]["name"]: p["spec"].get("nodeName") for p in s.cluster.list("Pod", namespace)}
        return where if all(where.values()) and len(where) == 2 else None

    where = s.run_until(both_bound, "kube-scheduler to bind both GPU pods to the autoscaler's nodes")
    assert sorted(where.values()) == s.nodes() and len(set(where.values())) == 2  # one 1-GPU node per pod
    claims = s.claims()
    assert sorted(c["status"]["nodeName"] for c in claims) == s.nodes()
    node = s.cluster.get("Node", where["train-b"])
    assert node["status"]["allocatable"]["nvidia.com/gpu"] == "1"
    assert node["metadata"]["labels"]["e2e-pool"] == s.pool

    s.cluster.delete("Pod", "train-b", namespace)  # kwok finishes the deletion: node b is now empty
    wait_for(lambda: "train-b" not in {p["metadata"]["name"] for p in s.cluster.list("Pod", namespace)},
             "pod train-b gone")
    s.run_for(3.0)
    assert s.nodes() == sorted(where.values())  # empty for longer than consolidateAfter, but the budget is 0

    s.cluster.patch("NodePool", s.pool, {"spec": {"disruption": {"budgets": [{"nodes": "100%"}]}}})
    s.run_until(lambda: s.nodes() == [where["train-a"]], f"empty node {where['train-b']} consolidated away")
    assert len(s.claims()) == 1 and s.claims()[0]["status"]["nodeName"] == where["train-a"]
    assert s.cluster.get("Pod", "train-a", namespace)["spec"]["nodeName"] == where["train-a"]


def test_expiry_drains_only_once_the_pod_disruption_budget_allows(
        real_cluster: RealCluster, namespace: str, scaler: Callable[..., Scaler]) -> None:
    s = scaler(expireAfter="3s", disruption={"consolidateAfter": "Never"})
    s.cluster.create(s.gpu_pod("serve", namespace, labels={"app": "serve"}))
    s.cluster.create({"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
                      "metadata": {"name": "serve", "namespace": namespace},
                      "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "serve"}}}})
    node = s.run_until(lambda: s.cluster.get("Pod", "serve", namespace)["spec"].get("nodeName"),
                       "kube-scheduler to bind the pod to the autoscaler's node")
    wait_for(lambda: (s.cluster.get("PodDisruptionBudget", "serve", namespace).get("status") or {})
             .get("currentHealthy") == 1, "the disruption controller to count the pod healthy")

    s.run_until(lambda: any("terminating (expired)" in line for line in s.lines),
                "the expired NodeClaim to start terminating")
    s.run_for(2.0)
    assert s.cluster.get("Pod", "serve", namespace)["spec"]["nodeName"] == node  # the PDB holds the drain
    assert s.nodes() == [node]
    taints = s.cluster.get("Node", node)["spec"].get("taints") or []
    assert any(t["key"] == "kubegpu.io/disrupted" for t in taints)  # cordoned while it waits
    assert any("pdb serve" in line for line in s.lines), s.lines[-5:]

    s.cluster.delete("PodDisruptionBudget", "serve", namespace)
    s.run_until(lambda: not s.nodes() and not s.claims(), "the drained node and its NodeClaim to be deleted")
    assert "serve" not in {p["metadata"]["name"] for p in s.cluster.list("Pod", namespace)}
