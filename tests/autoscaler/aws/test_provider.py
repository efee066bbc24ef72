"""The AWS provider against moto's local server: NodeClass resolution, instance types with GPU labels, launch with
CreateFleet, insufficient-capacity fallback and cache, termination, garbage collection, drift."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from botocore.awsrequest import AWSResponse

from kubegpu.autoscaler import labels as L
from kubegpu.autoscaler.aws import labels as A
from kubegpu.autoscaler.aws.launch import parse_provider_id
from kubegpu.autoscaler.aws.nodeclass import parse_ec2nodeclass
from kubegpu.autoscaler.aws.provider import AwsProvider, NodeClassNotReadyError
from kubegpu.autoscaler.aws.upkeep import aws_autoscaler
from kubegpu.autoscaler.controller import Autoscaler, Options
from kubegpu.autoscaler.provider import InsufficientCapacityError, NodeClaimNotFoundError
from kubegpu.autoscaler.provisioner import nodeclaim_object, run_pass
from kubegpu.clock import VirtualClock
from kubegpu.kube import MemoryCluster
from tests.autoscaler.aws.moto_env import (
    K8S,
    SSM_PREFIX,
    Account,
    default_amis,
    nodeclass_manifest,
)
from tests.autoscaler.builders import nodepool, pod, pool

PATTERNS = ("g5.*", "g4dn.xlarge", "p4d.24xlarge", "m5.large", "m5.xlarge", "m5.2xlarge")
GPU_NAME = {"key": A.INSTANCE_GPU_NAME, "operator": "In", "values": ["a10g"]}
ON_DEMAND = {"key": A.CAPACITY_TYPE_LABEL, "operator": "In", "values": ["on-demand"]}


def provider_for(account: Account, clock: VirtualClock | None = None, **spec: Any) -> AwsProvider:
    nodeclass = parse_ec2nodeclass(nodeclass_manifest(**spec))
    return AwsProvider(account.clients, "gpu-cluster", {"gpu": nodeclass}, clock or VirtualClock(time.time()),
                       type_patterns=PATTERNS, use_pricing_api=False, ssm_prefix=SSM_PREFIX, k8s_version=K8S)


def gpu_pod(name: str, gpus: int = 1) -> dict[str, Any]:
    return pod(name, cpu="2", memory="4Gi", limits={"nvidia.com/gpu": str(gpus)})


def gpu_pool(*requirements: dict[str, Any]) -> Any:
    nodepool = pool("gpu", list(requirements))
    nodepool.spec.template.spec.nodeClassRef.kind = "EC2NodeClass"
    nodepool.spec.template.spec.nodeClassRef.name = "gpu"
    return nodepool


def gpu_cluster(provider: AwsProvider, clock: VirtualClock,
                nodeclass: dict[str, Any] | None = None) -> tuple[MemoryCluster, Autoscaler]:
    """What `kubegpu autoscaler --provider aws` meets in the tests that run it whole: the EC2NodeClass `gpu` (the
    default manifest unless given), a NodePool `gpu` of on-demand A10G nodes on it and the pending GPU pod `train`;
    and the autoscaler, reading its NodeClasses from the cluster."""
    cluster = MemoryCluster(clock)
    scaler = aws_autoscaler(cluster, provider, clock, Options(validation_delay=0))
    cluster.create(nodeclass or nodeclass_manifest())
    manifest = nodepool("gpu", [GPU_NAME, ON_DEMAND])
    manifest["spec"]["template"]["spec"]["nodeClassRef"] = {"group": "kubegpu.io", "kind": "EC2NodeClass",
                                                            "name": "gpu"}
    cluster.create(manifest)
    cluster.create(gpu_pod("train"))
    return cluster, scaler


def claims_for(provider: AwsProvider, pods: list[dict[str, Any]], *requirements: dict[str, Any]) -> list[Any]:
    nodepool = gpu_pool(*requirements)
    result = run_pass([nodepool], provider.instance_types, pods)
    assert not result.unschedulable, result.unschedulable
    return [nodeclaim_object(plan, nodepool, f"gpu-{i}", 0.0) for i, plan in enumerate(result.claims)]


def test_nodeclass_resolves_subnets_groups_and_amis_from_tags(account: Account) -> None:
    provider = provider_for(account)
    resolved = provider.nodeclass("gpu")
    assert [(s.zone, s.id) for s in resolved.status.subnets] == sorted(account.subnets.items())
    assert all(s.zoneID and s.zoneID.startswith("use1-az") for s in resolved.status.subnets)
    assert [g.id for g in resolved.status.securityGroups] == [account.security_group]
    by_id = {a.id: a for a in resolved.status.amis}
    assert set(by_id) == set(account.amis.values())
    nvidia = by_id[account.amis["nvidia"]].requirements
    assert {"key": A.INSTANCE_GPU_COUNT, "operator": "Exists"} in nvidia
    assert {"key": A.INSTANCE_GPU_COUNT, "operator": "DoesNotExist"} in by_id[account.amis["standard"]].requirements
    ready = {c.type: c.status for c in resolved.status.conditions}
    assert ready["Ready"] == ready["SubnetsReady"] == ready["AMIsReady"] == "True"


def test_nodeclass_with_no_matching_subnet_is_not_ready(account: Account) -> None:
    provider = provider_for(account, subnetSelectorTerms=[{"tags": {"karpenter.sh/discovery": "other"}}])
    with pytest.raises(NodeClassNotReadyError, match=r"SubnetsReady=False: subnetSelectorTerms .* matched no subnet"):
        provider.nodeclass("gpu")
    assert provider.instance_types(gpu_pool()) == []


def test_instance_types_carry_karpenter_gpu_labels_and_subnet_zones(account: Account) -> None:
    types = {t.name: t for t in provider_for(account).instance_types(gpu_pool())}
    g5 = types["g5.xlarge"]
    assert {k: g5.labels[k] for k in (A.INSTANCE_GPU_NAME, A.INSTANCE_GPU_COUNT, A.INSTANCE_GPU_MEMORY,
                                      A.INSTANCE_GPU_MANUFACTURER, A.INSTANCE_FAMILY, A.INSTANCE_CATEGORY,
                                      A.INSTANCE_GENERATION, A.INSTANCE_SIZE, A.INSTANCE_CPU, A.INSTANCE_MEMORY)} == {
        A.INSTANCE_GPU_NAME: "a10g", A.INSTANCE_GPU_COUNT: "1", A.INSTANCE_GPU_MEMORY: "22888",
        A.INSTANCE_GPU_MANUFACTURER: "nvidia", A.INSTANCE_FAMILY: "g5", A.INSTANCE_CATEGORY: "g",
        A.INSTANCE_GENERATION: "5", A.INSTANCE_SIZE: "xlarge", A.INSTANCE_CPU: "4", A.INSTANCE_MEMORY: "16384"}
    assert g5.gpu_model == "A10G" and g5.capacity["nvidia.com/gpu"] == 1
    assert g5.capacity["memory"] == (16384 - 1229) * 2**20   # 7.5 % VM overhead, rounded up
    assert types["p4d.24xlarge"].gpu_model == "A100-SXM4-40GB" and types["p4d.24xlarge"].gpu_count == 8
    assert A.INSTANCE_GPU_NAME not in types["m5.large"].labels and types["m5.large"].gpu_count == 0
    # offerings only in the NodeClass's subnet zones (us-east-1c has an untagged subnet), both capacity types
    assert {(o.zone, o.capacity_type) for o in g5.offerings} == {
        (z, c) for z in ("us-east-1a", "us-east-1b") for c in ("on-demand", "spot")}
    on_demand = {o.price for o in g5.offerings if o.capacity_type == "on-demand"}
    assert on_demand == {1.006}   # the shipped table (moto has no Pricing API)


def test_a10g_nodepool_launches_only_g5_types_with_karpenter_tags(account: Account) -> None:
    provider = provider_for(account)
    pods = [gpu_pod(f"p{i}") for i in range(3)]
    claims = claims_for(provider, pods, GPU_NAME, ON_DEMAND)
    assert claims
    for claim in claims:
        options = next(r for r in claim["spec"]["requirements"] if r["key"] == L.INSTANCE_TYPE_LABEL)["values"]
        assert options and all(o.startswith("g5.") for o in options)
        launched = provider.create(claim)
        zone, instance_id = parse_provider_id(launched["status"]["providerID"]) or ("", "")
        assert zone in ("us-east-1a", "us-east-1b") and instance_id.startswith("i-")
        labels = launched["metadata"]["labels"]
        assert labels[L.INSTANCE_TYPE_LABEL].startswith("g5.") and labels[A.INSTANCE_GPU_NAME] == "a10g"
        assert labels[A.CAPACITY_TYPE_LABEL] == labels[L.CAPACITY_TYPE_LABEL] == "on-demand"
        inst = account.clients.ec2.describe_instances(InstanceIds=[instance_id])["Reservations"][0]["Instances"][0]
        assert inst["InstanceType"] == labels[L.INSTANCE_TYPE_LABEL]
        assert inst["SubnetId"] == account.subnets[zone]
        assert inst["ImageId"] == account.amis["nvidia"]   # the NVIDIA AMI variant for a GPU type
        tags = {t["Key"]: t["Value"] for t in inst["Tags"]}
        assert tags["karpenter.sh/nodepool"] == "gpu" and tags["karpenter.k8s.aws/ec2nodeclass"] == "gpu"
        assert tags["karpenter.sh/nodeclaim"] == claim["metadata"]["name"]
        assert tags["kubernetes.io/cluster/gpu-cluster"] == "owned" and tags["team"] == "ml"


def test_fleet_request_has_overrides_per_type_and_subnet(account: Account) -> None:
    provider = provider_for(account)
    claim = claims_for(provider, [gpu_pod("a")], GPU_NAME, ON_DEMAND)[0]
    provider.create(claim)
    request = provider.fleet_requests[-1]
    assert request["Type"] == "instant"
    assert request["TargetCapacitySpecification"] == {"TotalTargetCapacity": 1,
                                                      "DefaultTargetCapacityType": "on-demand"}
    assert request["OnDemandOptions"] == {"AllocationStrategy": "lowest-price"} and "SpotOptions" not in request
    overrides = [o for c in request["LaunchTemplateConfigs"] for o in c["Overrides"]]
    options = next(r for r in claim["spec"]["requirements"] if r["key"] == L.INSTANCE_TYPE_LABEL)["values"]
    assert {(o["InstanceType"], o["AvailabilityZone"], o["SubnetId"]) for o in overrides} == {
        (t, z, s) for t in options for z, s in account.subnets.items()}
    names = [c["LaunchTemplateSpecification"]["LaunchTemplateName"] for c in request["LaunchTemplateConfigs"]]
    templates = account.clients.ec2.describe_launch_templates(LaunchTemplateNames=names)["LaunchTemplates"]
    assert len(templates) == len(names) == 1   # one AMI (NVIDIA) for GPU types → one template
    kinds = {s["ResourceType"] for s in request["TagSpecifications"]}
    assert kinds == {"instance", "volume", "fleet"}


def test_spot_claims_use_price_capacity_optimized(account: Account) -> None:
    provider = provider_for(account)
    spot = {"key": A.CAPACITY_TYPE_LABEL, "operator": "In", "values": ["spot"]}
    claim = claims_for(provider, [gpu_pod("s")], GPU_NAME, spot)[0]
    launched = provider.create(claim)
    assert provider.fleet_requests[-1]["SpotOptions"] == {"AllocationStrategy": "price-capacity-optimized"}
    assert launched["metadata"]["labels"][A.CAPACITY_TYPE_LABEL] == "spot"
    _, instance_id = parse_provider_id(launched["status"]["providerID"]) or ("", "")
    inst = account.clients.ec2.describe_instances(InstanceIds=[instance_id])["Reservations"][0]["Instances"][0]
    assert inst.get("InstanceLifecycle") == "spot"


def _ice(provider: AwsProvider, victims: set[str], everything: bool = False) -> list[int]:
    """Insufficient capacity for `victims` (or every override): botocore hooks on the provider's real client."""
    calls: list[int] = []
    ec2 = provider.clients.ec2

    def errors_for(overrides: list[dict[str, Any]], lifecycle: str) -> list[dict[str, Any]]:
        return [{"ErrorCode": "InsufficientInstanceCapacity", "ErrorMessage": "no capacity", "Lifecycle": lifecycle,
                 "LaunchTemplateAndOverrides": {"Overrides": dict(o)}} for o in overrides]

    def before_params(params: dict[str, Any], context: dict[str, Any], **_: Any) -> None:
        calls.append(1)
        lifecycle = params["TargetCapacitySpecification"]["DefaultTargetCapacityType"]
        hit: list[dict[str, Any]] = []
        for config in params["LaunchTemplateConfigs"]:
            keep = [o for o in config["Overrides"] if o["InstanceType"] not in victims and not everything]
            hit += [o for o in config["Overrides"] if o not in keep]
            config["Overrides"] = keep or config["Overrides"]
        context["ice"] = errors_for(hit, lifecycle)
        context["all"] = everything or all(not c["Overrides"] or all(o in hit for o in c["Overrides"])
                                           for c in params["LaunchTemplateConfigs"])

    def before_call(model: Any, params: dict[str, Any], context: dict[str, Any], **_: Any) -> Any:
        if not context.get("all"):
            return None
        return AWSResponse("http://127.0.0.1", 200, {}, None), {"FleetId": "fleet-ice", "Instances": [],
                                                                "Errors": context["ice"]}

    def after_call(parsed: dict[str, Any], context: dict[str, Any], **_: Any) -> None:
        if not context.get("all"):
            parsed.setdefault("Errors", []).extend(context.get("ice", []))

    ec2.meta.events.register("before-parameter-build.ec2.CreateFleet", before_params)
    ec2.meta.events.register("before-call.ec2.CreateFleet", before_call)
    ec2.meta.events.register("after-call.ec2.CreateFleet", after_call)
    return calls


def options_of(claim: dict[str, Any]) -> list[str]:
    values: list[str] = next(r for r in claim["spec"]["requirements"] if r["key"] == L.INSTANCE_TYPE_LABEL)["values"]
    return values


def test_insufficient_capacity_is_cached_and_the_next_pass_takes_the_next_cheapest(account: Account) -> None:
    clock = VirtualClock(time.time())
    provider = provider_for(account, clock)
    claim = claims_for(provider, [gpu_pod("a")], GPU_NAME, ON_DEMAND)[0]
    assert options_of(claim) == ["g5.xlarge"]     # the cheapest fit, $1.006/h on demand
    _ice(provider, {"g5.xlarge"})
    with pytest.raises(InsufficientCapacityError, match=r"InsufficientInstanceCapacity g5\.xlarge"):
        provider.create(claim)
    assert provider.unavailable.keys() == sorted(f"on-demand:g5.xlarge:{z}" for z in account.subnets)
    g5 = next(t for t in provider.instance_types(gpu_pool()) if t.name == "g5.xlarge")
    offered = {(o.zone, o.capacity_type): o.available for o in g5.offerings}
    assert offered[("us-east-1a", "on-demand")] is False and offered[("us-east-1a", "spot")] is True
    # the NodeClaim is deleted and the pod re-scheduled against the filtered offerings: the next-cheapest type
    again = claims_for(provider, [gpu_pod("a")], GPU_NAME, ON_DEMAND)[0]
    assert "g5.xlarge" not in options_of(again)
    launched = provider.create(again)
    assert launched["metadata"]["labels"][L.INSTANCE_TYPE_LABEL] == "g5.2xlarge"   # $1.212/h
    clock.advance(181)    # the cache entry lives 3 minutes
    assert provider.unavailable.keys() == []
    assert options_of(claims_for(provider, [gpu_pod("a")], GPU_NAME, ON_DEMAND)[0]) == ["g5.xlarge"]


def test_a_partially_insufficient_fleet_launches_a_surviving_override(account: Account) -> None:
    provider = provider_for(account)
    claim = claims_for(provider, [gpu_pod("a")], GPU_NAME, ON_DEMAND)[0]
    for req in claim["spec"]["requirements"]:
        if req["key"] == L.INSTANCE_TYPE_LABEL:
            req["values"] = ["g5.2xlarge", "g5.xlarge"]
    calls = _ice(provider, {"g5.xlarge"})
    launched = provider.create(claim)
    assert len(calls) == 1
    assert launched["metadata"]["labels"][L.INSTANCE_TYPE_LABEL] == "g5.2xlarge"
    assert provider.unavailable.keys() == sorted(f"on-demand:g5.xlarge:{z}" for z in account.subnets)


def test_all_offerings_insufficient_raises_and_marks_each(account: Account) -> None:
    provider = provider_for(account)
    claim = claims_for(provider, [gpu_pod("a")], GPU_NAME, ON_DEMAND)[0]
    calls = _ice(provider, set(), everything=True)
    with pytest.raises(InsufficientCapacityError, match="all requested instance types were unavailable"):
        provider.create(claim)
    options = options_of(claim)
    assert len(calls) == 1
    assert provider.unavailable.keys() == sorted(f"on-demand:{t}:{z}" for t in options for z in account.subnets)
    assert account.clients.ec2.describe_instances(Filters=[{"Name": "instance-state-name",
                                                             "Values": ["running"]}])["Reservations"] == []


def test_delete_terminates_and_get_then_reports_not_found(account: Account) -> None:
    provider = provider_for(account)
    launched = provider.create(claims_for(provider, [gpu_pod("a")], GPU_NAME, ON_DEMAND)[0])
    pid = launched["status"]["providerID"]
    assert provider.get(pid)["metadata"]["name"] == launched["metadata"]["name"]
    assert [c["status"]["providerID"] for c in provider.list()] == [pid]
    provider.delete(launched)
    _, instance_id = parse_provider_id(pid) or ("", "")
    state = account.clients.ec2.describe_instances(InstanceIds=[instance_id])["Reservations"][0]["Instances"][0]
    assert state["State"]["Name"] in ("shutting-down", "terminated")
    with pytest.raises(NodeClaimNotFoundError):
        provider.get(pid)
    with pytest.raises(NodeClaimNotFoundError):
        provider.delete(launched)
    assert provider.list() == []


def test_garbage_collection_terminates_only_old_instances_without_nodeclaims(account: Account) -> None:
    clock = VirtualClock(time.time())
    provider = provider_for(account, clock)
    kept = provider.create(claims_for(provider, [gpu_pod("a")], GPU_NAME, ON_DEMAND)[0])
    orphan = provider.create({**kept, "metadata": {**kept["metadata"], "name": "orphan"}, "status": {}})
    known = {kept["status"]["providerID"]}
    assert provider.garbage_collect(known) == []          # younger than 30 s: may still be getting its NodeClaim
    clock.advance_to(time.time() + 31)   # the virtual clock started before moto's launch times
    orphan_id = (parse_provider_id(orphan["status"]["providerID"]) or ("", ""))[1]
    assert provider.garbage_collect(known) == [orphan_id]
    assert [c["status"]["providerID"] for c in provider.list()] == [kept["status"]["providerID"]]


def test_drift_when_the_nodeclass_ami_changes(account: Account) -> None:
    clock = VirtualClock(time.time())
    provider = provider_for(account, clock)
    launched = provider.create(claims_for(provider, [gpu_pod("a")], GPU_NAME, ON_DEMAND)[0])
    assert provider.is_drifted(launched) == ""
    path = f"{SSM_PREFIX}/eks/optimized-ami/{K8S}/amazon-linux-2023/x86_64/nvidia/recommended/image_id"
    newer = default_amis(account.clients.ec2)[2]
    account.clients.ssm.put_parameter(Name=path, Value=newer, Type="String", Overwrite=True)
    clock.advance(61)   # the NodeClass re-resolves every minute
    assert provider.is_drifted(launched) == "AMIDrift"


def test_capacity_reservations_are_launched_first(account: Account) -> None:
    provider = provider_for(account, capacityReservationSelectorTerms=[{"tags": {"purpose": "training"}}])
    ec2 = provider.clients.ec2
    end = datetime.now(UTC) + timedelta(days=2)
    reservation = {"CapacityReservationId": "cr-0123456789abcdef0", "InstanceType": "g5.12xlarge",
                   "AvailabilityZone": "us-east-1b", "AvailableInstanceCount": 1, "TotalInstanceCount": 1,
                   "State": "active", "InstanceMatchCriteria": "targeted", "EndDate": end,
                   "ReservationType": "default", "OwnerId": "123456789012"}
    seen: list[dict[str, Any]] = []

    def reservations(**_: Any) -> Any:   # moto does not implement this call: answer it on the client
        return AWSResponse("http://127.0.0.1", 200, {}, None), {"CapacityReservations": [reservation]}

    ec2.meta.events.register("before-parameter-build.ec2.DescribeCapacityReservations",
                             lambda params, **_: seen.append(dict(params)))
    ec2.meta.events.register("before-call.ec2.DescribeCapacityReservations", reservations)
    resolved = provider.nodeclass("gpu")
    assert [(r.id, r.instanceType, r.state) for r in resolved.status.capacityReservations] == [
        ("cr-0123456789abcdef0", "g5.12xlarge", "active")]
    g5 = next(t for t in provider.instance_types(gpu_pool()) if t.name == "g5.12xlarge")
    assert [(o.zone, o.capacity_type) for o in g5.offerings if o.capacity_type == "reserved"] == [
        ("us-east-1b", "reserved")]
    claim = claims_for(provider, [gpu_pod("r", gpus=4)], GPU_NAME)[0]
    launched = provider.create(claim)
    labels = launched["metadata"]["labels"]
    assert labels[A.CAPACITY_TYPE_LABEL] == "reserved" and labels[A.CAPACITY_RESERVATION_ID] == reservation[
        "CapacityReservationId"]
    assert labels[L.INSTANCE_TYPE_LABEL] == "g5.12xlarge" and labels[L.ZONE_LABEL] == "us-east-1b"
    name = provider.fleet_requests[-1]["LaunchTemplateConfigs"][0]["LaunchTemplateSpecification"][
        "LaunchTemplateName"]
    version = ec2.describe_launch_template_versions(LaunchTemplateName=name)["LaunchTemplateVersions"][0]
    target = version["LaunchTemplateData"]["CapacityReservationSpecification"]
    assert target["CapacityReservationTarget"]["CapacityReservationId"] == reservation["CapacityReservationId"]
    assert seen and seen[0]["Filters"] == [{"Name": "tag:purpose", "Values": ["training"]}]


def test_karpenter_labels_work_in_pod_selectors_and_exclude_types_without_them(account: Account) -> None:
    provider = provider_for(account)
    t4 = gpu_pod("sel")
    t4["spec"]["nodeSelector"] = {A.INSTANCE_GPU_NAME: "t4", A.CAPACITY_TYPE_LABEL: "on-demand"}
    assert options_of(claims_for(provider, [t4])[0]) == ["g4dn.xlarge"]
    cpu_only = claims_for(provider, [pod("cpu", cpu="1", memory="1Gi")], GPU_NAME, ON_DEMAND)[0]
    assert options_of(cpu_only) and all(o.startswith("g5.") for o in options_of(cpu_only))   # never m5
    gpu_count = {"key": A.INSTANCE_GPU_COUNT, "operator": "Gt", "values": ["0"]}
    assert all(not o.startswith("m5.") for o in options_of(claims_for(provider, [pod("c2")], gpu_count)[0]))
