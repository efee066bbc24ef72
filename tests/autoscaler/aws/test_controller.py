"""`kubegpu autoscaler --provider aws` as one loop: EC2NodeClasses from the cluster with status written back, a
pending GPU pod provisioned to a real (moto) instance, and orphaned instances garbage-collected."""

from __future__ import annotations

import time

from kubegpu.autoscaler import labels as L
from kubegpu.autoscaler.aws.provider import AwsProvider
from kubegpu.autoscaler.aws.upkeep import garbage_collection
from kubegpu.clock import VirtualClock
from tests.autoscaler.aws.moto_env import (
    K8S,
    SSM_PREFIX,
    Account,
)
from tests.autoscaler.aws.test_provider import PATTERNS, gpu_cluster


def test_pending_gpu_pod_gets_an_instance_and_orphans_are_collected(account: Account) -> None:
    clock = VirtualClock(time.time())
    provider = AwsProvider(account.clients, "gpu-cluster", {}, clock, type_patterns=PATTERNS, use_pricing_api=False,
                           ssm_prefix=SSM_PREFIX, k8s_version=K8S)
    cluster, scaler = gpu_cluster(provider, clock)
    for _ in range(4):
        scaler.step()
        clock.advance(2)
    status = cluster.get("EC2NodeClass", "gpu")["status"]
    assert sorted(s["zone"] for s in status["subnets"]) == ["us-east-1a", "us-east-1b"]
    assert next(c for c in status["conditions"] if c["type"] == "Ready")["status"] == "True"
    claims = cluster.list("NodeClaim")
    assert len(claims) == 1
    pid = claims[0]["status"]["providerID"]
    assert pid.startswith("aws:///us-east-1") and claims[0]["metadata"]["labels"][L.INSTANCE_TYPE_LABEL] == "g5.xlarge"
    instance = pid.rsplit("/", 1)[1]
    orphan = account.clients.ec2.run_instances(
        ImageId=account.amis["nvidia"], MinCount=1, MaxCount=1, InstanceType="g5.xlarge",
        TagSpecifications=[{"ResourceType": "instance", "Tags": [
            {"Key": "karpenter.sh/nodepool", "Value": "gpu"}, {"Key": "karpenter.k8s.aws/ec2nodeclass", "Value": "gpu"},
            {"Key": "eks:eks-cluster-name", "Value": "gpu-cluster"}]}])["Instances"][0]["InstanceId"]
    clock.advance_to(time.time() + 60)
    collector = garbage_collection(scaler)
    assert collector is not None and collector.collect(scaler, force=True) == [orphan]
    assert [c["status"]["providerID"] for c in provider.list()] == [pid]
    assert instance != orphan
