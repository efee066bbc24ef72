"""EC2NodeClass selector terms → status: subnets with zones, security groups, AMIs, capacity reservations.

Each term is one Describe call (ids, or `tag:<key>` filters; a value of `*` means "the key exists"); terms are ORed
and the results de-duplicated, as Karpenter resolves them. AMI aliases resolve through the public SSM parameters
(`/aws/service/eks/optimized-ami/...`, `/aws/service/bottlerocket/...`), one per architecture and variant; the
prefix is injectable because a local endpoint cannot hold parameters under `/aws/` (AWS reserves that path).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from kubegpu.autoscaler import labels as L
from kubegpu.autoscaler.aws import conditions
from kubegpu.autoscaler.aws import labels as A
from kubegpu.autoscaler.aws.clients import AwsApiError, AwsClients, call, paginate
from kubegpu.autoscaler.aws.nodeclass import (
    AMISelectorTerm,
    AMIStatus,
    CapacityReservationStatus,
    EC2NodeClass,
    EC2NodeClassStatus,
    SecurityGroupStatus,
    SubnetStatus,
)

SSM_PREFIX = "/aws/service"
DEFAULT_K8S_VERSION = "1.33"
EXPIRING_WINDOW_S = 40 * 60.0   # a capacity block is "expiring" 40 min before its end (Karpenter drains then)
_ARCHES = (("x86_64", "amd64"), ("arm64", "arm64"))


def tag_filters(tags: Mapping[str, str]) -> list[dict[str, Any]]:
    """`tag:<k>=<v>` filters; `*` as the value asks only that the key exists."""
    return [{"Name": "tag-key", "Values": [k]} if v == "*" else {"Name": f"tag:{k}", "Values": [v]}
            for k, v in sorted(tags.items())]


def resolve_subnets(clients: AwsClients, nodeclass: EC2NodeClass) -> list[SubnetStatus]:
    found: dict[str, dict[str, Any]] = {}
    for term in nodeclass.spec.subnetSelectorTerms:
        kwargs: dict[str, Any] = {"SubnetIds": [term.id]} if term.id else {"Filters": tag_filters(term.tags or {})}
        for subnet in paginate(clients.ec2, "describe_subnets", "Subnets", **kwargs):
            found[subnet["SubnetId"]] = subnet
    ordered = sorted(found.values(), key=lambda s: (s["AvailabilityZone"], -int(s.get("AvailableIpAddressCount") or 0),
                                                     s["SubnetId"]))
    return [SubnetStatus(id=s["SubnetId"], zone=s["AvailabilityZone"], zoneID=s.get("AvailabilityZoneId"))
            for s in ordered]


def resolve_security_groups(clients: AwsClients, nodeclass: EC2NodeClass) -> list[SecurityGroupStatus]:
    found: dict[str, SecurityGroupStatus] = {}
    for term in nodeclass.spec.securityGroupSelectorTerms:
        if term.id:
            kwargs: dict[str, Any] = {"GroupIds": [term.id]}
        elif term.name:
            kwargs = {"Filters": [{"Name": "group-name", "Values": [term.name]}]}
        else:
            kwargs = {"Filters": tag_filters(term.tags or {})}
        for group in paginate(clients.ec2, "describe_security_groups", "SecurityGroups", **kwargs):
            found[group["GroupId"]] = SecurityGroupStatus(id=group["GroupId"], name=group.get("GroupName"))
    return sorted(found.values(), key=lambda g: g.id)


def alias_parameters(alias: str, k8s_version: str, prefix: str = SSM_PREFIX) -> list[tuple[str, str, bool]]:
    """(SSM parameter, arch, NVIDIA variant) for every AMI an alias stands for."""
    family, _, version = alias.partition("@")
    out: list[tuple[str, str, bool]] = []
    for aws_arch, arch in _ARCHES:
        if family == "al2023":
            for variant in ("standard", "nvidia"):
                name = "recommended" if version == "latest" else \
                    f"amazon-eks-node-al2023-{aws_arch}-{variant}-{k8s_version}-{version}"
                path = f"{prefix}/eks/optimized-ami/{k8s_version}/amazon-linux-2023/{aws_arch}/{variant}/{name}"
                out.append((f"{path}/image_id", arch, variant == "nvidia"))
        elif family == "bottlerocket":
            for nvidia in (False, True):
                flavour = f"aws-k8s-{k8s_version}{'-nvidia' if nvidia else ''}"
                out.append((f"{prefix}/bottlerocket/{flavour}/{aws_arch}/{version}/image_id", arch, nvidia))
        elif family == "al2":
            for suffix, nvidia in (("", False), ("-gpu", True)):
                if nvidia and aws_arch == "arm64":
                    continue
                arm = "-arm64" if aws_arch == "arm64" else ""
                out.append((f"{prefix}/eks/optimized-ami/{k8s_version}/amazon-linux-2{suffix}{arm}/recommended/image_id",
                            arch, nvidia))
        else:  # windows: x86_64 only, no NVIDIA variant
            if aws_arch == "x86_64":
                year = family.removeprefix("windows")
                out.append((f"{prefix}/ami-windows-latest/Windows_Server-{year}-English-Core-EKS_Optimized-"
                            f"{k8s_version}/image_id", arch, False))
    return out


def _gpu_requirement(nvidia: bool) -> dict[str, Any]:
    return {"key": A.INSTANCE_GPU_COUNT, "operator": "Exists" if nvidia else "DoesNotExist"}


def _images(clients: AwsClients, term: AMISelectorTerm) -> list[dict[str, Any]]:
    if term.id:
        return paginate(clients.ec2, "describe_images", "Images", ImageIds=[term.id])
    filters: list[dict[str, Any]] = []
    if term.name:
        filters.append({"Name": "name", "Values": [term.name]})
    filters.extend(tag_filters(term.tags or {}))
    kwargs: dict[str, Any] = {"Filters": filters}
    if term.owner:
        kwargs["Owners"] = [term.owner]
    elif term.name:
        kwargs["Owners"] = ["self", "amazon"]
    return paginate(clients.ec2, "describe_images", "Images", **kwargs)


def resolve_amis(clients: AwsClients, nodeclass: EC2NodeClass, k8s_version: str = DEFAULT_K8S_VERSION,
                 ssm_prefix: str = SSM_PREFIX) -> list[AMIStatus]:
    """AMIs with the requirements that pair them with instance types (arch; NVIDIA variant ↔ GPU types)."""
    out: dict[str, AMIStatus] = {}
    for term in nodeclass.spec.amiSelectorTerms:
        if term.alias:
            for path, arch, nvidia in alias_parameters(term.alias, k8s_version, ssm_prefix):
                try:
                    image_id = str(call(clients.ssm, "get_parameter", Name=path)["Parameter"]["Value"])
                except AwsApiError as exc:
                    if exc.code == "ParameterNotFound":
                        continue
                    raise
                reqs = [{"key": L.ARCH_LABEL, "operator": "In", "values": [arch]}, _gpu_requirement(nvidia)]
                out.setdefault(image_id, AMIStatus(id=image_id, name=path, requirements=reqs))
            continue
        images = _images(clients, term) if not term.ssmParameter else paginate(
            clients.ec2, "describe_images", "Images",
            ImageIds=[str(call(clients.ssm, "get_parameter", Name=term.ssmParameter)["Parameter"]["Value"])])
        for image in sorted(images, key=lambda i: str(i.get("CreationDate") or ""), reverse=True):
            arch = dict(_ARCHES).get(str(image.get("Architecture") or "x86_64"), "amd64")
            reqs = [{"key": L.ARCH_LABEL, "operator": "In", "values": [arch]}]
            out.setdefault(image["ImageId"], AMIStatus(id=image["ImageId"], name=image.get("Name"),
                                                       deprecated=bool(image.get("DeprecationTime")),
                                                       requirements=reqs))
    return list(out.values())


def _reservation_status(res: Mapping[str, Any], now: datetime) -> CapacityReservationStatus:
    end = res.get("EndDate")
    end_time = end.isoformat() if isinstance(end, datetime) else (str(end) if end else None)
    expiring = isinstance(end, datetime) and (end - now).total_seconds() <= EXPIRING_WINDOW_S
    return CapacityReservationStatus(
        id=res["CapacityReservationId"], availabilityZone=res["AvailabilityZone"], instanceType=res["InstanceType"],
        ownerID=res.get("OwnerId"), instanceMatchCriteria=str(res.get("InstanceMatchCriteria") or "open"),
        reservationType="capacity-block" if res.get("ReservationType") == "capacity-block" else "default",
        interruptible=bool(res.get("Interruptible")), endTime=end_time,
        state="expiring" if expiring else "active",
        availableInstanceCount=int(res.get("AvailableInstanceCount") or 0))


def resolve_capacity_reservations(clients: AwsClients, nodeclass: EC2NodeClass,
                                  now: datetime | None = None) -> list[CapacityReservationStatus]:
    moment = now or datetime.now(UTC)
    found: dict[str, CapacityReservationStatus] = {}
    for term in nodeclass.spec.capacityReservationSelectorTerms:
        if term.id:
            kwargs: dict[str, Any] = {"CapacityReservationIds": [term.id]}
        else:
            filters = tag_filters(term.tags or {})
            if term.ownerID:
                filters.append({"Name": "owner-id", "Values": [term.ownerID]})
            if term.instanceMatchCriteria:
                filters.append({"Name": "instance-match-criteria", "Values": [term.instanceMatchCriteria]})
            kwargs = {"Filters": filters}
        for res in call(clients.ec2, "describe_capacity_reservations", **kwargs).get("CapacityReservations") or []:
            if res.get("State") in (None, "active"):
                found[res["CapacityReservationId"]] = _reservation_status(res, moment)
    return sorted(found.values(), key=lambda r: r.id)


def instance_profile_problem(clients: AwsClients, nodeclass: EC2NodeClass) -> str | None:
    """Why the class's `instanceProfile` cannot be used (it does not exist), or None. With `role` there is nothing
    to look up: the role is the launch's business. A lookup that fails otherwise (no iam:GetInstanceProfile
    permission) is not taken as a missing profile: it does not stop launches."""
    name = nodeclass.spec.instanceProfile
    if not name:
        return None
    try:
        call(clients.client("iam"), "get_instance_profile", InstanceProfileName=name)
    except AwsApiError as exc:
        if exc.code == "NoSuchEntity":
            return f"instanceProfile {name!r} does not exist"
    return None


def resolve(clients: AwsClients, nodeclass: EC2NodeClass, k8s_version: str = DEFAULT_K8S_VERSION,
            ssm_prefix: str = SSM_PREFIX, now: datetime | None = None) -> EC2NodeClassStatus:
    """The class's status: what its selectors match now, with Karpenter's readiness conditions."""
    subnets = resolve_subnets(clients, nodeclass)
    groups = resolve_security_groups(clients, nodeclass)
    amis = resolve_amis(clients, nodeclass, k8s_version, ssm_prefix)
    reservations = resolve_capacity_reservations(clients, nodeclass, now) \
        if nodeclass.spec.capacityReservationSelectorTerms else []
    profile = nodeclass.spec.instanceProfile
    status = EC2NodeClassStatus(subnets=subnets, securityGroups=groups, amis=amis, capacityReservations=reservations,
                                instanceProfile=profile)
    status.conditions = conditions.compute(nodeclass, status, now=now,
                                           profile_problem=instance_profile_problem(clients, nodeclass))
    return status


def ready_message(status: EC2NodeClassStatus) -> str | None:
    """Why the class cannot launch (its Ready condition's message), or None when it can."""
    return conditions.not_ready(status)


def zones(status: EC2NodeClassStatus) -> Sequence[str]:
    return sorted({s.zone for s in status.subnets})
