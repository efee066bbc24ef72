"""The crash world's AWS parts: the provider on moto (behind EC2's post-launch NotFound lag), its writes counted as
crash points, a kubelet that registers a Node for each running instance, and the instances EC2 runs."""

from __future__ import annotations

from typing import Any

from kubegpu.autoscaler import labels as L
from kubegpu.autoscaler.aws.clients import AwsClients
from kubegpu.autoscaler.aws.launch import parse_provider_id, provider_id
from kubegpu.autoscaler.aws.nodeclass import parse_ec2nodeclass
from kubegpu.autoscaler.aws.provider import AwsProvider
from kubegpu.autoscaler.aws.upkeep import aws_upkeep
from kubegpu.autoscaler.objects import is_true
from kubegpu.clock import VirtualClock
from tests.autoscaler.aws.lagging import LaggingEc2
from tests.autoscaler.aws.moto_env import K8S, SSM_PREFIX, Account, nodeclass_manifest
from tests.autoscaler.aws.test_provider import PATTERNS
from tests.reliability.crashes import Counted, World, Writes

EC2_WRITES = ("create_fleet", "terminate_instances", "create_launch_template")
LAG_S = 5.0
LIVE = ["pending", "running"]


def _ec2_write(verb: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
    return f"ec2 {verb} {kwargs.get('InstanceIds') or ''}".rstrip()


class AwsCloud:
    """One moto account, seen by every replica through the same lagging EC2 (the lag is EC2's, not a process's)."""

    def __init__(self, account: Account, clock: VirtualClock) -> None:
        self.account = account
        self.lagging = LaggingEc2(account.clients.ec2, clock, LAG_S)

    def provider(self, cluster: Any, clock: VirtualClock, writes: Writes) -> AwsProvider:
        ec2 = Counted(self.lagging, writes, EC2_WRITES, _ec2_write)
        clients = AwsClients(self.account.clients.region, lambda service, region: ec2 if service == "ec2" else
                             self.account.clients.client(service, region))
        return AwsProvider(clients, "gpu-cluster", {"gpu": parse_ec2nodeclass(nodeclass_manifest())}, clock,
                           type_patterns=PATTERNS, use_pricing_api=False, ssm_prefix=SSM_PREFIX, k8s_version=K8S)

    @staticmethod
    def upkeep(provider: AwsProvider, clock: VirtualClock) -> list[Any]:
        return aws_upkeep(provider, clock, nodeclasses_from_cluster=False)

    def running(self) -> dict[str, str]:
        """providerID → instance id of every pending or running instance."""
        answer = self.account.clients.ec2.describe_instances(Filters=[{"Name": "instance-state-name",
                                                                        "Values": LIVE}])
        return {provider_id(i["Placement"]["AvailabilityZone"], i["InstanceId"]): i["InstanceId"]
                for r in answer["Reservations"] for i in r["Instances"]}

    def clear(self) -> None:
        ids = list(self.running().values())
        if ids:
            self.account.clients.ec2.terminate_instances(InstanceIds=ids)

    def instances(self, world: World) -> set[str]:
        return set(self.running())

    def kubelet(self, world: World) -> None:
        """Each running instance's kubelet registers its Node once (Ready, the claim's allocatable, the
        unregistered taint its launch template gives it); the cloud-controller-manager deletes the Node of an
        instance that no longer runs (finalizers then hold it for whoever put them there)."""
        running = self.running()
        for node in world.store.list("Node"):
            pid = (node.get("spec") or {}).get("providerID")
            if pid not in running and not node["metadata"].get("deletionTimestamp"):
                world.store.delete("Node", node["metadata"]["name"])
        nodes = {(n.get("spec") or {}).get("providerID") for n in world.store.list("Node")}
        for claim in world.store.list("NodeClaim"):
            status = claim.get("status") or {}
            pid = status.get("providerID") or ""
            if claim["metadata"].get("deletionTimestamp") or not is_true(claim, "Launched") or pid in nodes \
                    or pid not in running or parse_provider_id(pid) is None:
                continue
            world.store.create({
                "apiVersion": "v1", "kind": "Node",
                "metadata": {"name": f"ip-{running[pid]}", "labels": dict(claim["metadata"].get("labels") or {})},
                "spec": {"providerID": pid, "taints": [dict(L.UNREGISTERED_TAINT)]},
                "status": {"capacity": dict(status.get("capacity") or {}),
                           "allocatable": dict(status.get("allocatable") or {}),
                           "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"}]}})
