"""Interruption events from an SQS queue on moto's local server: each kind parsed and handled (cordon, pre-spun
replacement, drain honouring PDBs and do-not-disrupt, termination), and every message deleted."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from kubegpu.autoscaler import labels as L
from kubegpu.autoscaler.aws import interruption as I
from kubegpu.autoscaler.aws.launch import parse_provider_id
from kubegpu.autoscaler.aws.provider import AwsProvider
from kubegpu.autoscaler.controller import Autoscaler, Options
from kubegpu.autoscaler.provisioner import take_snapshot
from kubegpu.clock import VirtualClock
from kubegpu.kube import MemoryCluster
from tests.autoscaler.aws.moto_env import Account
from tests.autoscaler.aws.test_provider import GPU_NAME, claims_for, gpu_pod, provider_for
from tests.autoscaler.builders import nodepool

QUEUE = "kubegpu-interruptions"


def event(source: str, detail_type: str, detail: dict[str, Any]) -> str:
    return json.dumps({"version": "0", "id": "e-1", "source": source, "detail-type": detail_type,
                       "account": "123456789012", "time": "2026-11-25T07:00:00Z", "region": "us-east-1",
                       "resources": [], "detail": detail})


def spot_warning(instance: str) -> str:
    return event("aws.ec2", "EC2 Spot Instance Interruption Warning",
                 {"instance-id": instance, "instance-action": "terminate"})


def rebalance(instance: str) -> str:
    return event("aws.ec2", "EC2 Instance Rebalance Recommendation", {"instance-id": instance})


def state_change(instance: str, state: str = "stopping") -> str:
    return event("aws.ec2", "EC2 Instance State-change Notification", {"instance-id": instance, "state": state})


def scheduled_change(instance: str) -> str:
    return event("aws.health", "AWS Health Event", {
        "service": "EC2", "eventTypeCategory": "scheduledChange", "eventTypeCode": "AWS_EC2_INSTANCE_RETIREMENT",
        "affectedEntities": [{"entityValue": instance}]})


class World:
    """A MemoryCluster with one GPU node backed by a moto instance, the autoscaler and the queue handler."""

    def __init__(self, account: Account, spot: bool = False) -> None:
        self.clock = VirtualClock(time.time())
        self.provider: AwsProvider = provider_for(account, self.clock)
        capacity = {"key": "karpenter.sh/capacity-type", "operator": "In", "values": ["spot" if spot else "on-demand"]}
        claim = claims_for(self.provider, [gpu_pod("web")], GPU_NAME, capacity)[0]
        launched = self.provider.create(claim)
        self.instance = (parse_provider_id(launched["status"]["providerID"]) or ("", ""))[1]
        self.cluster = MemoryCluster(self.clock)
        pool = nodepool("gpu", [GPU_NAME])
        pool["spec"]["template"]["spec"]["nodeClassRef"] = {"group": "kubegpu.io", "kind": "EC2NodeClass",
                                                            "name": "gpu"}
        self.cluster.create(pool)
        launched["status"]["nodeName"] = "n1"
        launched["status"]["conditions"] = [{"type": t, "status": "True"}
                                            for t in ("Launched", "Registered", "Initialized", "Ready")]
        self.claim_name = self.cluster.create(launched)["metadata"]["name"]
        labels = {**launched["metadata"]["labels"], L.HOSTNAME_LABEL: "n1"}
        self.cluster.create({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1", "labels": labels},
                             "spec": {"providerID": launched["status"]["providerID"]},
                             "status": {"allocatable": launched["status"]["allocatable"],
                                        "conditions": [{"type": "Ready", "status": "True"}]}})
        for name, notes in (("web", {}), ("train", {"karpenter.sh/do-not-disrupt": "true"})):
            p = gpu_pod(name)
            p["metadata"]["labels"] = {"app": name}
            p["metadata"]["annotations"] = notes
            p["spec"]["nodeName"] = "n1"
            p["status"] = {"phase": "Running"}
            self.cluster.create(p)
        self.scaler = Autoscaler(self.cluster, self.provider, self.clock, Options(validation_delay=0))
        sqs = account.clients.sqs
        self.queue_url = sqs.create_queue(QueueName=QUEUE)["QueueUrl"]
        self.handler = I.InterruptionHandler(self.provider, QUEUE, self.cluster, self.scaler.provisioner,
                                             self.scaler.termination, self.clock)

    def send(self, body: str) -> None:
        self.provider.clients.sqs.send_message(QueueUrl=self.queue_url, MessageBody=body)

    def step(self) -> None:
        self.handler.reconcile(take_snapshot(self.cluster))

    def pods(self) -> list[str]:
        return sorted(p["metadata"]["name"] for p in self.cluster.list("Pod"))

    def claims(self) -> list[str]:
        return sorted(c["metadata"]["name"] for c in self.cluster.list("NodeClaim"))

    def cordoned(self) -> bool:
        taints = self.cluster.get("Node", "n1").get("spec", {}).get("taints") or []
        return any(t["key"] == L.DISRUPTED_TAINT["key"] for t in taints)

    def queue_empty(self) -> bool:
        self.clock.advance(0)
        attrs = self.provider.clients.sqs.get_queue_attributes(
            QueueUrl=self.queue_url, AttributeNames=["ApproximateNumberOfMessages",
                                                     "ApproximateNumberOfMessagesNotVisible"])["Attributes"]
        return attrs["ApproximateNumberOfMessages"] == attrs["ApproximateNumberOfMessagesNotVisible"] == "0"


@pytest.mark.parametrize(("make", "kind"), [(spot_warning, I.SPOT_INTERRUPTED), (state_change, I.INSTANCE_STOPPED),
                                            (scheduled_change, I.SCHEDULED_CHANGE)])
def test_interruption_cordons_prespins_drains_and_holds_do_not_disrupt(account: Account, make: Any,
                                                                       kind: str) -> None:
    world = World(account, spot=make is spot_warning)
    world.send(make(world.instance))
    world.step()
    assert world.handler.handled == [(kind, world.claim_name)]
    assert world.cordoned() and world.queue_empty()
    assert len(world.claims()) == 2                   # the pre-spun replacement for web and train
    assert world.pods() == ["train"]                  # web evicted; the do-not-disrupt training pod keeps running
    assert not world.scaler.termination.is_terminating(world.claim_name)
    world.cluster.delete("Pod", "train", "default")   # the job checkpoints and exits
    world.step()
    assert world.scaler.termination.is_terminating(world.claim_name)
    if kind == I.SPOT_INTERRUPTED:
        labels = world.cluster.get("NodeClaim", world.claim_name)["metadata"]["labels"]
        assert world.provider.unavailable.keys() == [f"spot:{labels[L.INSTANCE_TYPE_LABEL]}:"
                                                     f"{labels[L.ZONE_LABEL]}"]
    else:
        assert world.provider.unavailable.keys() == []


def test_a_new_leader_finishes_a_drain_the_previous_one_started(account: Account) -> None:
    """The drain lives on the NodeClaim (annotation), not in the handler: a handler that never saw the message (the
    next leader after a failover, the queue message already deleted) finishes it once the held pod is gone."""
    world = World(account)
    world.send(state_change(world.instance, "stopping"))
    world.step()
    assert world.pods() == ["train"] and world.queue_empty()
    annotations = world.cluster.get("NodeClaim", world.claim_name)["metadata"]["annotations"]
    assert annotations[I.INTERRUPTION_ANNOTATION] == I.INSTANCE_STOPPED
    successor = Autoscaler(world.cluster, world.provider, world.clock, Options(validation_delay=0))
    world.handler = I.InterruptionHandler(world.provider, QUEUE, world.cluster, successor.provisioner,
                                          successor.termination, world.clock)
    world.step()                                      # the do-not-disrupt pod still holds the drain
    assert world.handler.draining == {world.claim_name: I.INSTANCE_STOPPED}
    assert not successor.termination.is_terminating(world.claim_name)
    world.cluster.delete("Pod", "train", "default")
    world.step()
    assert successor.termination.is_terminating(world.claim_name)


def test_rebalance_recommendation_cordons_and_prespins_without_draining(account: Account) -> None:
    world = World(account, spot=True)
    world.send(rebalance(world.instance))
    world.step()
    assert world.handler.handled == [(I.REBALANCE, world.claim_name)]
    assert world.cordoned() and len(world.claims()) == 2 and world.pods() == ["train", "web"]
    assert world.handler.draining == {} and world.queue_empty()


def test_termination_notice_ends_the_wait_for_do_not_disrupt_pods(account: Account) -> None:
    world = World(account)
    world.send(state_change(world.instance, "stopping"))
    world.step()
    assert world.pods() == ["train"] and not world.scaler.termination.is_terminating(world.claim_name)
    world.send(state_change(world.instance, "terminated"))
    world.step()
    assert world.scaler.termination.is_terminating(world.claim_name)


def test_pdb_holds_the_drain(account: Account) -> None:
    world = World(account)
    world.cluster.create({"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
                          "metadata": {"name": "web", "namespace": "default"},
                          "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "web"}}}})
    world.send(state_change(world.instance, "stopping"))
    world.step()
    assert world.pods() == ["train", "web"] and world.cordoned()


def test_unknown_unmatched_and_unparsable_messages_are_deleted(account: Account) -> None:
    world = World(account)
    for body in ("not json", state_change(world.instance, "running"), spot_warning("i-0000000000000000f"),
                 event("aws.ec2", "Something Else", {"instance-id": world.instance})):
        world.send(body)
    world.step()
    assert world.handler.handled == [] and world.queue_empty()
    assert not world.cordoned() and world.claims() == [world.claim_name]


@pytest.mark.parametrize(("body", "expected"), [
    (spot_warning("i-1"), I.InterruptionEvent(I.SPOT_INTERRUPTED, ("i-1",))),
    (state_change("i-2", "shutting-down"), I.InterruptionEvent(I.INSTANCE_TERMINATED, ("i-2",))),
    (state_change("i-2", "pending"), None),
    (scheduled_change("i-3"), I.InterruptionEvent(I.SCHEDULED_CHANGE, ("i-3",))),
    (event("aws.ec2", "EC2 Capacity Reservation Instance Interruption Warning", {"instance-id": "i-4"}),
     I.InterruptionEvent(I.RESERVATION_INTERRUPTED, ("i-4",))),
    ('{"detail": 5}', None),
])
def test_parse_event(body: str, expected: I.InterruptionEvent | None) -> None:
    parsed = I.parse_event(body)
    assert (parsed.kind, parsed.instance_ids) == (expected.kind, expected.instance_ids) if expected else parsed is None
