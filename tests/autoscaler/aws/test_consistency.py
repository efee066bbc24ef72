"""The AWS provider confirms an instance gone, never assumes it: EC2's NotFound right after a launch, or a providerID
that does not parse, is "not known yet" within the consistency window, so termination keeps the NodeClaim's
finalizer and asks again; no instance outlives its NodeClaim."""

from __future__ import annotations

import time
from typing import Any

import pytest

from kubegpu.autoscaler import labels as L
from kubegpu.autoscaler.aws.clients import AwsClients
from kubegpu.autoscaler.aws.launch import parse_provider_id
from kubegpu.autoscaler.aws.nodeclass import parse_ec2nodeclass
from kubegpu.autoscaler.aws.provider import AwsProvider, InstanceNotYetKnownError
from kubegpu.autoscaler.aws.upkeep import aws_autoscaler, garbage_collection
from kubegpu.autoscaler.controller import Options
from kubegpu.autoscaler.provider import NodeClaimNotFoundError
from kubegpu.clock import VirtualClock
from kubegpu.kube.cluster import format_timestamp
from tests.autoscaler.aws.lagging import lagging
from tests.autoscaler.aws.moto_env import K8S, SSM_PREFIX, Account, nodeclass_manifest
from tests.autoscaler.aws.test_provider import GPU_NAME, ON_DEMAND, PATTERNS, claims_for, gpu_cluster, gpu_pod

LAG = 40.0


def running(account: Account) -> list[str]:
    reservations = account.clients.ec2.describe_instances(Filters=[
        {"Name": "instance-state-name", "Values": ["pending", "running"]}])["Reservations"]
    return sorted(i["InstanceId"] for r in reservations for i in r["Instances"])


def provider_on(account: Account, clock: VirtualClock, shim: Any = None, **options: Any) -> tuple[AwsProvider, Any]:
    """A provider on lagging EC2 (`shim`: the lag of an earlier provider's, as a restarted process sees it)."""
    clients, ec2 = lagging(account.clients, clock, LAG)
    if shim is not None:
        clients, ec2 = AwsClients(clients.region, lambda service, region: shim if service == "ec2" else
                                  account.clients.client(service, region)), shim
    nodeclass = parse_ec2nodeclass(nodeclass_manifest())
    return AwsProvider(clients, "gpu-cluster", {"gpu": nodeclass}, clock, type_patterns=PATTERNS,
                       use_pricing_api=False, ssm_prefix=SSM_PREFIX, k8s_version=K8S, **options), ec2


def test_not_found_right_after_launch_is_not_gone(account: Account) -> None:
    clock = VirtualClock(time.time())
    provider, ec2 = provider_on(account, clock)
    claim = provider.create(claims_for(provider, [gpu_pod("a")], GPU_NAME, ON_DEMAND)[0])
    # DescribeInstances did not show the instance: its type and zone come from the fleet's answer
    assert claim["metadata"]["labels"][L.INSTANCE_TYPE_LABEL] == "g5.xlarge" and ec2.not_found >= 1
    assert claim["status"]["providerID"].startswith("aws:///us-east-1")
    claim["status"]["conditions"] = [{"type": "Launched", "status": "True",
                                      "lastTransitionTime": format_timestamp(clock.now())}]
    instance = (parse_provider_id(claim["status"]["providerID"]) or ("", ""))[1]
    with pytest.raises(InstanceNotYetKnownError):
        provider.delete(claim)
    with pytest.raises(InstanceNotYetKnownError):
        provider.get(claim["status"]["providerID"])
    restarted, _ = provider_on(account, clock, ec2)   # no memory of the launch: the claim's Launched time decides
    with pytest.raises(InstanceNotYetKnownError):
        restarted.delete(claim)
    assert running(account) == [instance]
    clock.advance(LAG)
    restarted.delete(claim)   # visible now: terminated
    assert running(account) == []
    with pytest.raises(NodeClaimNotFoundError):
        restarted.delete(claim)


def test_an_unparsable_provider_id_is_not_known_yet_then_gone(account: Account) -> None:
    clock = VirtualClock(time.time())
    provider, _ = provider_on(account, clock, consistency_window=60.0)
    claim = {"metadata": {"name": "odd", "annotations": {"kubegpu.io/created-at": repr(clock.now())}},
             "status": {"providerID": "aws:///us-east-1a/not-an-instance"}}
    with pytest.raises(InstanceNotYetKnownError):
        provider.delete(claim)
    clock.advance(61)
    with pytest.raises(NodeClaimNotFoundError):
        provider.delete(claim)


def test_a_claim_deleted_right_after_launch_keeps_its_finalizer_until_ec2_confirms(account: Account) -> None:
    clock = VirtualClock(time.time())
    provider, ec2 = provider_on(account, clock)
    provider.nodeclasses = {}
    cluster, scaler = gpu_cluster(provider, clock)
    for _ in range(3):
        scaler.step()
        clock.advance(1)
    [claim] = cluster.list("NodeClaim")
    instance = (parse_provider_id(claim["status"]["providerID"]) or ("", ""))[1]
    assert instance and running(account) == [instance]
    cluster.delete("Pod", "train")
    cluster.delete("NodeClaim", claim["metadata"]["name"])   # a user deletes it while EC2 does not show it yet
    while clock.now() - ec2.launched[instance] < LAG - 1:
        scaler.step()
        clock.advance(1)
        [held] = cluster.list("NodeClaim")   # the finalizer holds it: the instance may be running
        assert L.TERMINATION_FINALIZER in held["metadata"]["finalizers"]
    assert running(account) == [instance]
    for _ in range(90):   # visible: terminated, then the finalizer goes (termination backs off up to 60 s)
        scaler.step()
        clock.advance(1)
        if not cluster.list("NodeClaim"):
            break
    assert cluster.list("NodeClaim") == [] and running(account) == []
    clock.advance(60)   # past the sweep's minimum age: nothing of ours is left for it
    collector = garbage_collection(scaler)
    assert collector is not None and collector.collect(scaler, force=True) == []


def test_an_instance_launched_for_a_claim_that_never_recorded_it_is_terminated_before_the_claim_goes(
        account: Account) -> None:
    clock = VirtualClock(time.time())
    provider, ec2 = provider_on(account, clock)
    provider.nodeclasses = {}
    cluster, scaler = gpu_cluster(provider, clock)
    for _ in range(10):
        if cluster.list("NodeClaim"):
            break
        scaler.step()
        clock.advance(1)
    [claim] = cluster.list("NodeClaim")
    assert not (claim.get("status") or {}).get("providerID")
    launched = provider.create(claim)   # the leader launched it and died before recording the providerID
    instance = (parse_provider_id(launched["status"]["providerID"]) or ("", ""))[1]
    assert running(account) == [instance]
    cluster.create({"apiVersion": "v1", "kind": "Node",   # its kubelet registered, under a name of its own
                    "metadata": {"name": "ip-10-0-0-1.ec2.internal"},
                    "spec": {"providerID": launched["status"]["providerID"]}})
    scaler.close()
    cluster.delete("Pod", "train")
    cluster.delete("NodeClaim", claim["metadata"]["name"])   # deleted before any replica launched it again
    restarted, _ = provider_on(account, clock, ec2)   # a new leader: no memory of the launch, EC2 still lagging
    restarted.nodeclasses = {}
    scaler = aws_autoscaler(cluster, restarted, clock, Options(validation_delay=0))
    for _ in range(120):
        scaler.step()
        clock.advance(1)
        if not cluster.list("NodeClaim"):
            break
        [held] = cluster.list("NodeClaim")
        assert held["status"]["providerID"] == launched["status"]["providerID"]   # recorded before it is acted on
    assert cluster.list("NodeClaim") == [] and running(account) == [] and cluster.list("Node") == []
    scaler.close()
