"""CreateFleet requests and launch templates, built as plain dicts (pure) so tests can read exactly what is sent.

One launch template per (NodeClass, AMI, capacity reservation): its name is a hash of everything it holds, so a
changed NodeClass gets a new template and the old one is left for the NodeClass's cleanup. One fleet request per
NodeClaim: `Type: instant`, target capacity 1, one launch-template config per template with one override per
instance type × zone (the zone's subnet with the most free addresses), spot `price-capacity-optimized`, on-demand
and reserved `lowest-price`, and Karpenter's tags on the instance, its volumes and the fleet.
"""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kubegpu.autoscaler.aws import labels as A
from kubegpu.autoscaler.aws.nodeclass import EC2NodeClass

LT_PREFIX = "kubegpu.io"
MAX_INSTANCE_TYPES = 60
# Fleet error codes that mean "no capacity for this offering now" (Karpenter's pkg/errors list)
CAPACITY_ERRORS = frozenset({"InsufficientInstanceCapacity", "MaxSpotInstanceCountExceeded", "VcpuLimitExceeded",
                             "UnfulfillableCapacity", "Unsupported", "InsufficientFreeAddressesInSubnet",
                             "MaxFleetCountExceeded", "ReservationCapacityExceeded"})
NOT_FOUND_ERRORS = frozenset({"InvalidInstanceID.NotFound", "InvalidLaunchTemplateName.NotFoundException",
                              "InvalidLaunchTemplateId.NotFound", "InvalidCapacityReservationId.NotFound"})


@dataclass(frozen=True)
class Candidate:
    """One offering the fleet may fill: type, zone, subnet, capacity type, price, AMI, reservation."""

    instance_type: str
    zone: str
    subnet_id: str
    capacity_type: str
    price: float
    ami_id: str
    reservation_id: str | None = None


def launch_tags(nodeclass: EC2NodeClass, cluster: str, nodepool: str, nodeclaim: str) -> dict[str, str]:
    """NodeClass tags plus Karpenter's static ones (they win over user tags of the same key)."""
    return {**nodeclass.spec.tags, A.cluster_tag(cluster): "owned", A.CLUSTER_NAME_TAG: cluster,
            A.NODEPOOL_TAG: nodepool, A.NODECLASS_TAG: nodeclass.name, A.NODECLAIM_TAG: nodeclaim,
            A.MANAGED_BY_TAG: cluster}


def _tag_list(tags: Mapping[str, str]) -> list[dict[str, str]]:
    return [{"Key": k, "Value": v} for k, v in sorted(tags.items())]


def launch_template_data(nodeclass: EC2NodeClass, ami_id: str, cluster: str,
                         reservation_id: str | None = None) -> dict[str, Any]:
    """LaunchTemplateData for CreateLaunchTemplate: AMI, security groups, profile, metadata, disks, user data."""
    spec = nodeclass.spec
    meta = spec.metadataOptions
    data: dict[str, Any] = {
        "ImageId": ami_id,
        "SecurityGroupIds": [g.id for g in nodeclass.status.securityGroups],
        "MetadataOptions": {"HttpEndpoint": meta.httpEndpoint, "HttpProtocolIpv6": meta.httpProtocolIPv6,
                            "HttpPutResponseHopLimit": meta.httpPutResponseHopLimit, "HttpTokens": meta.httpTokens},
    }
    profile = nodeclass.status.instanceProfile or spec.instanceProfile
    if profile:
        data["IamInstanceProfile"] = {"Name": profile}
    if spec.userData or spec.kubelet:
        text = spec.userData or ""
        if spec.kubelet:
            text += "\n# kubelet: " + json.dumps(spec.kubelet.model_dump(exclude_none=True), sort_keys=True)
        data["UserData"] = base64.b64encode(text.encode()).decode()
    if spec.detailedMonitoring is not None:
        data["Monitoring"] = {"Enabled": spec.detailedMonitoring}
    mappings = []
    for bdm in spec.blockDeviceMappings:
        entry: dict[str, Any] = {"DeviceName": bdm.deviceName or "/dev/xvda"}
        if bdm.ebs is not None:
            ebs = {"DeleteOnTermination": bdm.ebs.deleteOnTermination, "Encrypted": bdm.ebs.encrypted,
                   "Iops": bdm.ebs.iops, "KmsKeyId": bdm.ebs.kmsKeyID, "SnapshotId": bdm.ebs.snapshotID,
                   "Throughput": bdm.ebs.throughput, "VolumeType": bdm.ebs.volumeType}
            if bdm.ebs.volumeSize:
                from kubegpu.scheduling.quantity import parse_quantity

                ebs["VolumeSize"] = max(1, int(parse_quantity(bdm.ebs.volumeSize) // 2**30))
            entry["Ebs"] = {k: v for k, v in ebs.items() if v is not None}
        mappings.append(entry)
    if mappings:
        data["BlockDeviceMappings"] = mappings
    if reservation_id:
        data["CapacityReservationSpecification"] = {
            "CapacityReservationPreference": "capacity-reservations-only",
            "CapacityReservationTarget": {"CapacityReservationId": reservation_id}}
    return data


def launch_template_name(nodeclass: EC2NodeClass, data: Mapping[str, Any], cluster: str) -> str:
    digest = hashlib.sha256(json.dumps({"class": nodeclass.name, "cluster": cluster, "data": data},
                                       sort_keys=True).encode()).hexdigest()[:20]
    return f"{LT_PREFIX}/{digest}"


def order_candidates(candidates: Sequence[Candidate]) -> list[Candidate]:
    """Reservations first, then by price; at most MAX_INSTANCE_TYPES distinct instance types (cheapest kept)."""
    ordered = sorted(candidates, key=lambda c: (c.capacity_type != "reserved", c.price, c.instance_type, c.zone))
    kept: list[Candidate] = []
    types: set[str] = set()
    for cand in ordered:
        if cand.instance_type not in types and len(types) >= MAX_INSTANCE_TYPES:
            continue
        types.add(cand.instance_type)
        kept.append(cand)
    return kept


def fleet_request(candidates: Sequence[Candidate], template_names: Mapping[tuple[str, str | None], str],
                  tags: Mapping[str, str]) -> dict[str, Any]:
    """The CreateFleet request for one NodeClaim; every candidate must share one capacity type."""
    if not candidates:
        raise ValueError("a fleet request needs at least one candidate")
    capacity_type = candidates[0].capacity_type
    configs: dict[str, dict[str, Any]] = {}
    for cand in candidates:
        name = template_names[(cand.ami_id, cand.reservation_id)]
        config = configs.setdefault(name, {"LaunchTemplateSpecification": {"LaunchTemplateName": name,
                                                                           "Version": "$Latest"},
                                           "Overrides": []})
        config["Overrides"].append({"InstanceType": cand.instance_type, "SubnetId": cand.subnet_id,
                                    "AvailabilityZone": cand.zone})
    target = {"spot": "spot"}.get(capacity_type, "on-demand")
    request: dict[str, Any] = {
        "Type": "instant",
        "TargetCapacitySpecification": {"TotalTargetCapacity": 1, "DefaultTargetCapacityType": target},
        "LaunchTemplateConfigs": list(configs.values()),
        "TagSpecifications": [{"ResourceType": kind, "Tags": _tag_list(tags)}
                              for kind in ("instance", "volume", "fleet")],
    }
    if capacity_type == "spot":
        request["SpotOptions"] = {"AllocationStrategy": "price-capacity-optimized"}
    else:
        request["OnDemandOptions"] = {"AllocationStrategy": "lowest-price"}
    return request


@dataclass(frozen=True)
class FleetError:
    code: str
    message: str
    capacity_type: str
    instance_type: str | None
    zone: str | None
    subnet_id: str | None


def fleet_errors(response: Mapping[str, Any]) -> list[FleetError]:
    out = []
    for err in response.get("Errors") or []:
        overrides = (err.get("LaunchTemplateAndOverrides") or {}).get("Overrides") or {}
        out.append(FleetError(str(err.get("ErrorCode") or ""), str(err.get("ErrorMessage") or ""),
                              str(err.get("Lifecycle") or "on-demand"), overrides.get("InstanceType"),
                              overrides.get("AvailabilityZone"), overrides.get("SubnetId")))
    return out


def launched(response: Mapping[str, Any]) -> tuple[str, str] | None:
    """(instance id, instance type) of the fleet's instance, or None when it launched nothing."""
    for group in response.get("Instances") or []:
        ids = group.get("InstanceIds") or []
        if ids:
            return str(ids[0]), str(group.get("InstanceType") or "")
    return None


def provider_id(zone: str, instance_id: str) -> str:
    return f"aws:///{zone}/{instance_id}"


def parse_provider_id(value: str) -> tuple[str, str] | None:
    """(zone, instance id) from `aws:///<zone>/<instance-id>`, or None."""
    if not value.startswith("aws:///"):
        return None
    parts = value.removeprefix("aws:///").split("/")
    if len(parts) != 2 or not parts[1].startswith("i-"):
        return None
    return parts[0], parts[1]
