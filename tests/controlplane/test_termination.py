"""Termination driven by the API, on the real control plane: deleting a NodeClaim through the API terminates it
through every provider (kwok-style simulated, and AWS on moto) and removes its Node; a leader failover in the middle
of a termination and of a disruption (disruption on) finishes the work; a transient API error while terminating is
retried, not swallowed. Nobody strips a finalizer by hand here: the termination controller removes it."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from kubegpu.autoscaler import labels as L
from kubegpu.autoscaler.controller import LEASE_NAME, Autoscaler, Options
from kubegpu.autoscaler.disruption import DISRUPTION_ANNOTATION
from kubegpu.autoscaler.provider import SimulatedProvider
from kubegpu.clock import RealClock
from kubegpu.kube import NotFound
from kubegpu.kube.leader import LeaderElector
from kubegpu.testing.session import RealCluster, wait_for
from tests.autoscaler.aws.conftest import account, server  # noqa: F401 - the moto fixtures, for the AWS case
from tests.autoscaler.aws.moto_env import Account, nodeclass_manifest
from tests.autoscaler.aws.test_provider import PATTERNS
from tests.autoscaler.builders import instance_type, nodepool, pod
from tests.autoscaler.test_termination import Flaky

pytestmark = pytest.mark.apiserver
A100 = "A100-SXM4-80GB"
TYPES = [instance_type("a100.x1", 8, 64, 4.0, gpus=1, model=A100),
         instance_type("a100.x2", 16, 128, 9.0, gpus=2, model=A100)]


class World:
    """One NodePool (tainted so only this test's pods use it) and autoscaler replicas made on demand."""

    def __init__(self, real: RealCluster, namespace: str, **pool_spec: Any) -> None:
        self.real, self.namespace = real, namespace
        self.api = real.cluster()
        self.pool = f"pool-{uuid.uuid4().hex[:6]}"
        self.taint = {"key": "e2e-pool", "value": self.pool, "effect": "NoSchedule"}
        self.api.create(nodepool(self.pool, labels={"e2e-pool": self.pool}, taints=[self.taint], **pool_spec))
        self.clock = RealClock()
        self.provider = SimulatedProvider(self.api, TYPES, self.clock, registration_delay=0.5)
        self.lines: list[str] = []
        self.made: list[Autoscaler] = []

    def replica(self, identity: str = "", cluster: Any = None, **options: Any) -> Autoscaler:
        opts = {"batch_idle": 0.5, "batch_max": 2.0, "validation_delay": 0.0, **options}
        elector = LeaderElector(cluster or self.api, identity, LEASE_NAME, namespace=self.namespace,
                                lease_duration=3.0) if identity else None
        scaler = Autoscaler(cluster or self.api, self.provider, self.clock, Options(**opts),
                            log=lambda line: self.lines.append(f"{identity}: {line}"), elector=elector)
        self.made.append(scaler)
        return scaler

    def gpu_pod(self, name: str, gpus: int = 1) -> dict[str, Any]:
        toleration = {"key": "e2e-pool", "operator": "Equal", "value": self.pool, "effect": "NoSchedule"}
        return pod(name, cpu="500m", memory="1Gi", namespace=self.namespace, limits={"nvidia.com/gpu": gpus},
                   spec={"nodeSelector": {"e2e-pool": self.pool}, "tolerations": [toleration]})

    def claims(self) -> list[dict[str, Any]]:
        return [c for c in self.api.list("NodeClaim") if c["metadata"].get("labels", {}).get(L.NODEPOOL_LABEL)
                == self.pool]

    def nodes(self) -> list[str]:
        return sorted(n["metadata"]["name"] for n in self.api.list("Node")
                      if n["metadata"].get("labels", {}).get(L.NODEPOOL_LABEL) == self.pool)

    def run_until(self, scaler: Autoscaler, check: Callable[[], Any], what: str, timeout: float = 60.0) -> Any:
        def step_and_check() -> Any:
            scaler.step()
            return check()

        try:
            return wait_for(step_and_check, what, timeout, interval=0.2)
        except Exception as exc:
            raise AssertionError(f"{exc}; autoscaler: {' | '.join(self.lines[-6:])}") from None

    def bound(self, name: str) -> str | None:
        return (self.api.get("Pod", name, self.namespace).get("spec") or {}).get("nodeName")

    def close(self) -> None:
        """Delete what is left through the API and let a replica terminate it (no finalizer stripped by hand)."""
        for claim in self.claims():
            self.api.delete("NodeClaim", claim["metadata"]["name"])
        for item in self.api.list("Pod", self.namespace):
            self.api.delete("Pod", item["metadata"]["name"], self.namespace)
        cleaner = self.replica(disruption=False)
        with_timeout = time.monotonic() + 30
        while (self.claims() or self.nodes()) and time.monotonic() < with_timeout:
            cleaner.step()
            time.sleep(0.2)
        self.api.delete("NodePool", self.pool)
        for scaler in self.made:
            scaler.close()


@pytest.fixture
def world(real_cluster: RealCluster, namespace: str, crds: list[str]) -> Iterator[Callable[..., World]]:
    made: list[World] = []

    def make(**pool_spec: Any) -> World:
        made.append(World(real_cluster, namespace, **pool_spec))
        return made[-1]

    yield make
    for each in made:
        each.close()


def test_deleting_a_nodeclaim_through_the_api_terminates_it_and_removes_the_node(
        world: Callable[..., World]) -> None:
    w = world(disruption={"consolidateAfter": "Never"})
    scaler = w.replica()
    w.api.create(w.gpu_pod("train"))
    node = w.run_until(scaler, lambda: w.bound("train"), "kube-scheduler to bind the pod to a launched node")
    [claim] = w.claims()
    assert L.TERMINATION_FINALIZER in claim["metadata"]["finalizers"]
    assert L.TERMINATION_FINALIZER in w.api.get("Node", node)["metadata"]["finalizers"]
    w.api.delete("NodeClaim", claim["metadata"]["name"])   # a user's kubectl delete nodeclaim
    w.run_until(scaler, lambda: not w.claims() and not w.nodes(), "the NodeClaim and its Node to be gone")
    assert claim["status"]["providerID"] not in w.provider.instances
    with pytest.raises(NotFound):
        w.api.get("Pod", "train", w.namespace)    # drained before the node went
    assert any("terminated (deleted)" in line for line in w.lines)


def test_deleting_an_aws_nodeclaim_terminates_the_instance_and_removes_the_node(
        real_cluster: RealCluster, crds: list[str], account: Account) -> None:  # noqa: F811
    from kubegpu.autoscaler.aws.provider import AwsProvider
    from kubegpu.autoscaler.aws.upkeep import aws_autoscaler, register_kind
    from tests.autoscaler.aws.moto_env import K8S, SSM_PREFIX

    register_kind()
    api = real_cluster.cluster()
    clock = RealClock()
    name = f"aws-{uuid.uuid4().hex[:6]}"
    api.create(nodeclass_manifest(name))
    pool = nodepool(name, [{"key": "karpenter.k8s.aws/instance-gpu-name", "operator": "In", "values": ["a10g"]}],
                    labels={"e2e-pool": name}, taints=[{"key": "e2e-pool", "value": name, "effect": "NoSchedule"}])
    pool["spec"]["template"]["spec"]["nodeClassRef"] = {"group": "kubegpu.io", "kind": "EC2NodeClass", "name": name}
    api.create(pool)
    provider = AwsProvider(account.clients, "gpu-cluster", {}, clock, type_patterns=PATTERNS, use_pricing_api=False,
                           ssm_prefix=SSM_PREFIX, k8s_version=K8S)
    lines: list[str] = []
    scaler = aws_autoscaler(api, provider, clock, Options(batch_idle=0.5, batch_max=2.0, disruption=False),
                            log=lines.append)
    namespace = real_cluster.create_namespace("aws-term")
    toleration = {"key": "e2e-pool", "operator": "Equal", "value": name, "effect": "NoSchedule"}
    api.create(pod("train", cpu="2", memory="4Gi", namespace=namespace, limits={"nvidia.com/gpu": 1},
                   spec={"nodeSelector": {"e2e-pool": name}, "tolerations": [toleration]}))
    try:
        def launched() -> dict[str, Any] | None:
            scaler.step()
            found = [c for c in api.list("NodeClaim") if c["metadata"]["labels"].get(L.NODEPOOL_LABEL) == name
                     and (c.get("status") or {}).get("providerID")]
            return found[0] if found else None

        claim = wait_for(launched, "an EC2 instance launched (moto) for the pending pod", 60, interval=0.3)
        instance = claim["status"]["providerID"].rsplit("/", 1)[1]
        node_name = f"ip-{uuid.uuid4().hex[:8]}"
        api.create({"apiVersion": "v1", "kind": "Node",   # the kubelet of that instance registers
                    "metadata": {"name": node_name, "labels": {"kubernetes.io/hostname": node_name}},
                    "spec": {"providerID": claim["status"]["providerID"]}})
        claim_name = claim["metadata"]["name"]

        def registered() -> bool:
            scaler.step()
            conditions = (api.get("NodeClaim", claim_name).get("status") or {}).get("conditions") or []
            return any(c.get("type") == "Registered" and c.get("status") == "True" for c in conditions)

        wait_for(registered, "the Node to register", 30, interval=0.3)
        assert L.TERMINATION_FINALIZER in api.get("Node", node_name)["metadata"]["finalizers"]
        api.delete("NodeClaim", claim_name)

        def gone() -> bool:
            scaler.step()
            names = {c["metadata"]["name"] for c in api.list("NodeClaim")}
            return claim_name not in names and node_name not in {n["metadata"]["name"] for n in api.list("Node")}

        wait_for(gone, "the NodeClaim and its Node to be gone", 60, interval=0.3)
        state = account.clients.ec2.describe_instances(InstanceIds=[instance])["Reservations"][0]["Instances"][0]
        assert state["State"]["Name"] in ("shutting-down", "terminated")
    finally:
        for leftover in api.list("NodeClaim"):
            if leftover["metadata"]["labels"].get(L.NODEPOOL_LABEL) == name:
                api.delete("NodeClaim", leftover["metadata"]["name"])
        wait_for(lambda: scaler.step() or not any(c["metadata"]["labels"].get(L.NODEPOOL_LABEL) == name
                                                  for c in api.list("NodeClaim")), "cleanup", 30, interval=0.3)
        api.delete("NodePool", name)
        api.delete("EC2NodeClass", name)
        real_cluster.delete_namespace(namespace)
        scaler.close()


def _take_over(successor: Autoscaler) -> None:
    """The old leader is gone; the successor gets the Lease once it expires (3 s) and acts from then on."""
    wait_for(lambda: successor.step() or None, "the second replica to take the Lease", 20, interval=0.2)


def test_failover_in_the_middle_of_a_termination_finishes_it(world: Callable[..., World]) -> None:
    w = world(disruption={"consolidateAfter": "Never"})
    first = w.replica("first")
    w.api.create({**w.gpu_pod("serve"), "metadata": {**w.gpu_pod("serve")["metadata"], "labels": {"app": "s"}}})
    node = w.run_until(first, lambda: w.bound("serve"), "the pod bound to a launched node")
    w.api.create({"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
                  "metadata": {"name": "hold", "namespace": w.namespace},
                  "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "s"}}}})
    wait_for(lambda: (w.api.get("PodDisruptionBudget", "hold", w.namespace).get("status") or {})
             .get("currentHealthy") == 1, "the disruption controller to count the pod healthy")
    [claim] = w.claims()
    first.termination.start(claim, "expired")
    w.run_until(first, lambda: any("drain waits" in line for line in w.lines), "the drain to wait on the PDB")
    first.close()   # the leader dies mid-termination
    second = w.replica("second")
    w.api.delete("PodDisruptionBudget", "hold", w.namespace)
    _take_over(second)
    w.run_until(second, lambda: not w.claims() and node not in w.nodes(), "the successor to finish the termination")
    assert [t[2] for t in second.termination.terminated] == ["expired"]


def test_failover_in_the_middle_of_a_disruption_finishes_the_replacement(world: Callable[..., World]) -> None:
    w = world(disruption={"consolidationPolicy": "WhenEmptyOrUnderutilized", "consolidateAfter": "1s"})
    first = w.replica("first", disruption=True)
    w.api.create(w.gpu_pod("big", gpus=2))
    w.run_until(first, lambda: w.bound("big"), "the 2-GPU pod bound to a 2-GPU node")
    [old] = w.claims()
    assert old["metadata"]["labels"][L.INSTANCE_TYPE_LABEL] == "a100.x2"
    w.api.delete("Pod", "big", w.namespace)
    w.api.create({**w.gpu_pod("small"), "spec": {**w.gpu_pod("small")["spec"], "nodeName": old["status"]["nodeName"]}})

    def annotated() -> bool:
        return DISRUPTION_ANNOTATION in (w.api.get("NodeClaim", old["metadata"]["name"])["metadata"]
                                         .get("annotations") or {})

    w.run_until(first, annotated, "the leader to launch a cheaper replacement")
    first.close()   # the leader dies with the replacement under way
    second = w.replica("second", disruption=True)
    _take_over(second)
    w.run_until(second, lambda: old["metadata"]["name"] not in {c["metadata"]["name"] for c in w.claims()},
                "the successor to finish the replacement and terminate the old node", timeout=60)
    assert any(c["metadata"]["labels"].get(L.INSTANCE_TYPE_LABEL) == "a100.x1" for c in w.claims())
    assert old["status"]["nodeName"] not in w.nodes()


def test_a_transient_api_error_during_termination_is_retried(world: Callable[..., World]) -> None:
    w = world(disruption={"consolidateAfter": "Never"})
    flaky = Flaky(w.api, "patch", "NodeClaim", 0)
    scaler = w.replica(cluster=flaky)
    w.api.create(w.gpu_pod("train"))
    w.run_until(scaler, lambda: w.bound("train"), "the pod bound to a launched node")
    [claim] = w.claims()
    name = claim["metadata"]["name"]
    w.api.delete("Pod", "train", w.namespace)
    wait_for(lambda: "train" not in {p["metadata"]["name"] for p in w.api.list("Pod", w.namespace)}, "pod gone")
    flaky.failures = 2   # the finalizer's removal fails twice, as through an API server restart
    w.api.delete("NodeClaim", name)
    w.run_until(scaler, lambda: any("attempt 1" in line for line in w.lines), "the first failure to be reported")
    assert L.TERMINATION_FINALIZER in w.api.get("NodeClaim", name)["metadata"]["finalizers"]  # not finished early
    w.run_until(scaler, lambda: not w.claims(), "the termination to be retried until it goes through", timeout=30)
    assert flaky.failures == 0  # both injected failures were met on the way, and the termination went through
