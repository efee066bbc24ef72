"""EC2NodeClass conditions as Karpenter gives them, and what a pod hears when its NodePool's class is not ready:
pure condition logic, then the provider, the provisioning pass, `kubegpu provision` and the controller
against moto's local server."""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from kubegpu.autoscaler.aws.conditions import compute, not_ready, terms_text
from kubegpu.autoscaler.aws.nodeclass import EC2NodeClassStatus, SubnetStatus, parse_ec2nodeclass
from kubegpu.autoscaler.aws.provider import AwsProvider, NodeClassNotReadyError
from kubegpu.autoscaler.provisioner import run_pass
from kubegpu.clock import VirtualClock
from tests.autoscaler.aws.moto_env import DISCOVERY, K8S, SSM_PREFIX, Account, nodeclass_manifest
from tests.autoscaler.aws.test_cli import A10G, gpu_pods, write
from tests.autoscaler.aws.test_cli import gpu_pool as gpu_pool_manifest
from tests.autoscaler.aws.test_provider import GPU_NAME, gpu_cluster, gpu_pod, gpu_pool, provider_for
from tests.autoscaler.test_cli import invoke

NOWHERE = {"karpenter.sh/discovery": "nowhere"}
NOWHERE_TEXT = '[{"tags": {"karpenter.sh/discovery": "nowhere"}}]'
T0 = datetime(2026, 11, 27, 3, 0, tzinfo=UTC)
T1 = datetime(2026, 11, 27, 4, 0, tzinfo=UTC)


def _by_type(conditions: list[Any]) -> dict[str, Any]:
    return {c.type: c for c in conditions}


# -- pure ----------------------------------------------------------------------------------------------------------

def test_conditions_have_karpenters_shape_and_name_the_selector() -> None:
    manifest = nodeclass_manifest(subnetSelectorTerms=[{"tags": NOWHERE}])
    manifest["metadata"]["generation"] = 3
    nodeclass = parse_ec2nodeclass(manifest)
    status = EC2NodeClassStatus(subnets=[], securityGroups=[], amis=[])
    conditions = compute(nodeclass, status, now=T0)
    assert [c.type for c in conditions] == ["Ready", "AMIsReady", "SubnetsReady", "SecurityGroupsReady",
                                            "InstanceProfileReady", "CapacityReservationsReady",
                                            "ValidationSucceeded"]
    by = _by_type(conditions)
    subnets = by["SubnetsReady"]
    assert (subnets.status, subnets.reason) == ("False", "SubnetsNotFound")
    assert subnets.message == f"subnetSelectorTerms {NOWHERE_TEXT} matched no subnet"
    assert (by["AMIsReady"].reason, by["SecurityGroupsReady"].reason) == ("AMINotFound", "SecurityGroupsNotFound")
    assert by["InstanceProfileReady"].status == "True" and by["InstanceProfileReady"].reason == "InstanceProfileReady"
    ready = by["Ready"]
    assert (ready.status, ready.reason) == ("False", "UnhealthyDependents")
    assert f"SubnetsReady=False: subnetSelectorTerms {NOWHERE_TEXT} matched no subnet" in ready.message
    assert all(c.lastTransitionTime == "2026-11-27T03:00:00Z" and c.observedGeneration == 3 for c in conditions)
    assert not_ready(EC2NodeClassStatus(conditions=conditions)) == ready.message


def test_last_transition_time_moves_only_when_the_status_changes() -> None:
    nodeclass = parse_ec2nodeclass(nodeclass_manifest())
    first = compute(nodeclass, EC2NodeClassStatus(), now=T0)   # nothing resolved: not ready
    nodeclass.status.conditions = first
    fixed = EC2NodeClassStatus(subnets=[SubnetStatus(id="subnet-1", zone="us-east-1a")])
    second = _by_type(compute(nodeclass, fixed, now=T1))
    subnets = second["SubnetsReady"]
    assert subnets.status == "True" and subnets.lastTransitionTime == "2026-11-27T04:00:00Z"
    assert second["AMIsReady"].status == "False" and second["AMIsReady"].lastTransitionTime == "2026-11-27T03:00:00Z"
    assert second["ValidationSucceeded"].lastTransitionTime == "2026-11-27T03:00:00Z"


def test_ready_when_every_dependent_is() -> None:
    nodeclass = parse_ec2nodeclass(nodeclass_manifest())
    status = EC2NodeClassStatus.model_validate({"subnets": [{"id": "subnet-1", "zone": "a"}],
                                                "securityGroups": [{"id": "sg-1"}], "amis": [{"id": "ami-1"}]})
    status.conditions = compute(nodeclass, status, now=T0)
    ready = _by_type(status.conditions)["Ready"]
    assert (ready.status, ready.reason, ready.message) == ("True", "Ready", "")
    assert not_ready(status) is None


def test_terms_text_is_what_the_user_wrote() -> None:
    nodeclass = parse_ec2nodeclass(nodeclass_manifest(securityGroupSelectorTerms=[{"name": "nodes"},
                                                                                  {"id": "sg-123"}]))
    assert terms_text(nodeclass.spec.securityGroupSelectorTerms) == '[{"name": "nodes"}, {"id": "sg-123"}]'


# -- against moto ----------------------------------------------------------------------------------------------------

def test_no_matching_subnet_makes_the_class_not_ready_and_says_which_selector(account: Account) -> None:
    provider = provider_for(account, subnetSelectorTerms=[{"tags": NOWHERE}])
    resolved = _by_type(provider.resolved("gpu").status.conditions)
    assert (resolved["SubnetsReady"].status, resolved["SubnetsReady"].reason) == ("False", "SubnetsNotFound")
    assert NOWHERE_TEXT in resolved["SubnetsReady"].message
    assert resolved["SecurityGroupsReady"].status == resolved["AMIsReady"].status == "True"
    assert resolved["Ready"].status == "False"
    with pytest.raises(NodeClassNotReadyError, match="EC2NodeClass gpu is not ready: SubnetsReady=False"):
        provider.nodeclass("gpu")
    assert provider.pool_not_ready(gpu_pool()) == (
        f"nodepool gpu: EC2NodeClass gpu is not ready: SubnetsReady=False: subnetSelectorTerms {NOWHERE_TEXT} "
        "matched no subnet")


@pytest.mark.parametrize(("spec", "kind", "reason", "selector"), [
    ({"securityGroupSelectorTerms": [{"name": "no-such-group"}]}, "SecurityGroupsReady", "SecurityGroupsNotFound",
     'securityGroupSelectorTerms [{"name": "no-such-group"}] matched no security group'),
    ({"amiFamily": "AL2023", "amiSelectorTerms": [{"tags": {"image": "none"}}]}, "AMIsReady", "AMINotFound",
     'amiSelectorTerms [{"tags": {"image": "none"}}] matched no AMI'),
])
def test_each_selector_that_matches_nothing_is_named(account: Account, spec: dict[str, Any], kind: str,
                                                     reason: str, selector: str) -> None:
    conditions = _by_type(provider_for(account, **spec).resolved("gpu").status.conditions)
    assert (conditions[kind].status, conditions[kind].reason, conditions[kind].message) == ("False", reason, selector)
    assert conditions["SubnetsReady"].status == "True"
    assert f"{kind}=False: {selector}" == conditions["Ready"].message


def test_instance_profile_must_exist(account: Account) -> None:
    manifest = nodeclass_manifest(instanceProfile="gpu-nodes")
    del manifest["spec"]["role"]
    nodeclass = parse_ec2nodeclass(manifest)

    def profile_condition() -> Any:
        provider = AwsProvider(account.clients, "gpu-cluster", {"gpu": nodeclass}, VirtualClock(time.time()),
                               use_pricing_api=False, ssm_prefix=SSM_PREFIX, k8s_version=K8S)
        return _by_type(provider.resolved("gpu").status.conditions)["InstanceProfileReady"]

    missing = profile_condition()
    assert (missing.status, missing.reason) == ("False", "InstanceProfileNotFound")
    assert missing.message == "instanceProfile 'gpu-nodes' does not exist"
    account.clients.client("iam").create_instance_profile(InstanceProfileName="gpu-nodes")
    assert profile_condition().status == "True"


def test_a_pool_whose_class_is_not_ready_launches_nothing_and_its_pods_hear_why(account: Account) -> None:
    provider = provider_for(account, subnetSelectorTerms=[{"tags": NOWHERE}])
    result = run_pass([gpu_pool(GPU_NAME)], provider.instance_types, [gpu_pod("a"), gpu_pod("b")],
                      not_ready=provider.pool_not_ready)
    assert result.claims == []
    assert set(result.unschedulable.values()) == {provider.pool_not_ready(gpu_pool())}
    assert "instance type" not in next(iter(result.unschedulable.values()))


def test_provision_reports_the_not_ready_class_per_pod(tmp_path: Path, account: Account,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KUBEGPU_AWS_INSTANCE_TYPES", "g5.*,m5.large")
    args = write(tmp_path, account, [gpu_pool_manifest(A10G)], gpu_pods(3), subnetSelectorTerms=[{"tags": NOWHERE}])
    code, out = invoke("provision", *args, "-o", "json", "--isolated-vpc")
    assert code == 0, out
    summary = json.loads(out)
    assert summary["nodeclaims"] == []
    reasons = {entry["pod"]: entry["reason"] for entry in summary["unschedulable"]}
    expected = (f"nodepool gpu: EC2NodeClass gpu is not ready: SubnetsReady=False: subnetSelectorTerms "
                f"{NOWHERE_TEXT} matched no subnet")
    assert reasons == {f"train-{i}": expected for i in range(3)}
    code, table = invoke("provision", *args, "--isolated-vpc")
    assert code == 0 and table.count(expected) == 3 and "no instance type offers" not in table


def test_the_controller_writes_a_not_ready_status_and_launches_nothing(account: Account) -> None:
    clock = VirtualClock(time.time())
    provider = AwsProvider(account.clients, "gpu-cluster", {}, clock, use_pricing_api=False, ssm_prefix=SSM_PREFIX,
                           k8s_version=K8S, type_patterns=("g5.xlarge",))
    cluster, scaler = gpu_cluster(provider, clock, nodeclass_manifest(subnetSelectorTerms=[{"tags": NOWHERE}]))
    for _ in range(4):
        scaler.step()
        clock.advance(2)
    conditions = {c["type"]: c for c in cluster.get("EC2NodeClass", "gpu")["status"]["conditions"]}
    assert conditions["SubnetsReady"]["status"] == "False" and NOWHERE_TEXT in conditions["SubnetsReady"]["message"]
    assert conditions["Ready"]["reason"] == "UnhealthyDependents" and conditions["Ready"]["lastTransitionTime"]
    assert cluster.list("NodeClaim") == []
    assert account.clients.ec2.describe_instances()["Reservations"] == []
    assert DISCOVERY != NOWHERE
