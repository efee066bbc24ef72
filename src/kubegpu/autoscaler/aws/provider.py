"""`AwsProvider`: the autoscaler's CloudProvider on EC2 (Karpenter's AWS provider, GPU-sharing aware).

create: the NodeClaim's instance types (narrowed by its requirements, fitting its requests under the NodePool's
GPU sharing config), every available offering in the NodeClass's subnets → one CreateFleet (`instant`), capacity
reservations first, then spot if the claim allows it, then on-demand. Offerings the fleet reports as
insufficient capacity go into the unavailable-offerings cache (3 min) and the next-cheapest remaining offerings
are tried. providerID `aws:///<zone>/<instance-id>`; delete = TerminateInstances; get/list = DescribeInstances on
our tags; `garbage_collect` terminates tagged instances that no NodeClaim owns.

Confirm, never assume: EC2's reads are eventually consistent, and DescribeInstances answers
`InvalidInstanceID.NotFound` for an instance RunInstances/CreateFleet started moments ago. Within
`consistency_window` (5 min) of its launch, NotFound (or a providerID that does not parse) is "not known yet"
(`InstanceNotYetKnownError`, which termination retries with backoff), never "gone", so no finalizer is removed while
the instance may run. Past the window NotFound is believed: an instance that exists after all carries our tags and
no NodeClaim, and the garbage collection sweep terminates it.
"""

from __future__ import annotations

import builtins
from collections.abc import Callable, Iterable, Mapping
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from kubegpu.autoscaler import labels as L
from kubegpu.autoscaler.aws import labels as A
from kubegpu.autoscaler.aws.clients import AwsApiError, AwsClients, call, paginate
from kubegpu.autoscaler.aws.conditions import pool_reason
from kubegpu.autoscaler.aws.instancetypes import AwsOffering, InstanceTypeProvider, UnavailableOfferings
from kubegpu.autoscaler.aws.launch import (
    CAPACITY_ERRORS,
    Candidate,
    fleet_errors,
    fleet_request,
    launch_tags,
    launch_template_data,
    launch_template_name,
    launched,
    order_candidates,
    parse_provider_id,
    provider_id,
)
from kubegpu.autoscaler.aws.nodeclass import EC2NodeClass
from kubegpu.autoscaler.aws.resolve import DEFAULT_K8S_VERSION, SSM_PREFIX, ready_message, resolve
from kubegpu.autoscaler.instancetypes import InstanceType
from kubegpu.autoscaler.objects import condition, created_at, parse_timestamp
from kubegpu.autoscaler.provider import InsufficientCapacityError, NodeClaimNotFoundError, quantities
from kubegpu.autoscaler.requirements import Requirements
from kubegpu.errors import KubegpuError
from kubegpu.scheduling import parse_quantity
from kubegpu.sharing.capacity import sharing_capacity, sharing_of

if TYPE_CHECKING:
    from kubegpu.autoscaler.api import NodePool
    from kubegpu.clock import Clock

NODECLASS_REFRESH = 60.0     # Karpenter re-resolves AMIs and subnets every minute
GC_MIN_AGE = 30.0            # an instance younger than this may still be getting its NodeClaim written
CONSISTENCY_WINDOW = 300.0   # how long after a launch EC2 may still answer NotFound for the instance
LIVE_STATES = ["pending", "running", "stopping", "stopped", "shutting-down"]
_TYPE_KEYS = frozenset({L.INSTANCE_TYPE_LABEL, L.ARCH_LABEL, L.OS_LABEL, L.INSTANCE_FAMILY_LABEL,
                        L.INSTANCE_SIZE_LABEL, L.INSTANCE_CPU_LABEL, L.INSTANCE_MEMORY_LABEL,
                        L.INSTANCE_GPU_COUNT_LABEL, L.GPU_PRODUCT_LABEL, L.GPU_COUNT_LABEL}) | A.INSTANCE_TYPE_KEYS
_OFFERING_KEYS = frozenset({L.ZONE_LABEL, L.CAPACITY_TYPE_LABEL, A.CAPACITY_TYPE_LABEL, A.CAPACITY_RESERVATION_ID,
                            A.CAPACITY_RESERVATION_TYPE})


class NodeClassNotReadyError(KubegpuError):
    """The NodeClaim's EC2NodeClass is unknown or does not resolve (no subnets, security groups or AMIs)."""


class InstanceNotYetKnownError(KubegpuError):
    """EC2 does not show the instance (yet): within the consistency window that says nothing; ask again later."""


def type_matches(reqs: Requirements, labels: Mapping[str, str]) -> bool:
    """Instance-type labels against requirements; zone and capacity type are the offering's business."""
    return all(req.admits(labels.get(req.key), absent_fails=req.key in _TYPE_KEYS)
               for req in reqs if req.key not in _OFFERING_KEYS)


def offering_matches(reqs: Requirements, offering: AwsOffering) -> bool:
    labels = offering.labels()
    for key in _OFFERING_KEYS:
        req = reqs.get(key)
        label = A.CAPACITY_TYPE_LABEL if key == L.CAPACITY_TYPE_LABEL else key
        if req is not None and not req.admits(labels.get(label)):
            return False
    return True


def ami_for(nodeclass: EC2NodeClass, labels: Mapping[str, str]) -> str | None:
    """The newest resolved AMI whose requirements the type's labels meet (NVIDIA AMIs for GPU types)."""
    for ami in nodeclass.status.amis:
        if not ami.deprecated and Requirements.from_api(ami.requirements).satisfied_by(labels):
            return ami.id
    return None


def fleet_placement(response: Mapping[str, Any], nodeclass: EC2NodeClass) -> tuple[str, str]:
    """(instance type, zone) of the instance an instant fleet launched, from the override that launched it."""
    zones = {s.id: s.zone for s in nodeclass.status.subnets}
    for group in response.get("Instances") or []:
        if group.get("InstanceIds"):
            overrides = (group.get("LaunchTemplateAndOverrides") or {}).get("Overrides") or {}
            zone = overrides.get("AvailabilityZone") or zones.get(str(overrides.get("SubnetId") or ""), "")
            return str(group.get("InstanceType") or overrides.get("InstanceType") or ""), str(zone)
    return "", ""


class AwsProvider:
    name = "aws"

    def __init__(self, clients: AwsClients, cluster_name: str, nodeclasses: Mapping[str, EC2NodeClass],
                 clock: Clock, *, type_patterns: Iterable[str] = (), use_pricing_api: bool = True,
                 ssm_prefix: str = SSM_PREFIX, k8s_version: str = DEFAULT_K8S_VERSION,
                 log: Callable[[str], None] | None = None, consistency_window: float = CONSISTENCY_WINDOW) -> None:
        self.clients = clients
        self.consistency_window = consistency_window
        self._launch_times: dict[str, float] = {}   # instance id → when this process launched it
        self.cluster_name = cluster_name
        self.nodeclasses = dict(nodeclasses)
        self.clock = clock
        self.ssm_prefix = ssm_prefix
        self.k8s_version = k8s_version
        self.log = log or (lambda _line: None)
        self.unavailable = UnavailableOfferings(clock)
        self.types = InstanceTypeProvider(clients, clock, self.unavailable, tuple(type_patterns), use_pricing_api)
        self._resolved: dict[str, tuple[float, EC2NodeClass]] = {}
        self._templates: set[str] = set()
        self.fleet_requests: list[dict[str, Any]] = []

    # -- NodeClasses ------------------------------------------------------------------------------------------------
    def resolved(self, name: str) -> EC2NodeClass:
        """The class with its status and conditions resolved (re-resolved every minute), ready or not;
        NodeClassNotReadyError only if there is no such class."""
        spec = self.nodeclasses.get(name)
        if spec is None:
            raise NodeClassNotReadyError(f"EC2NodeClass {name!r} not found")
        hit = self._resolved.get(name)
        if hit is None or self.clock.now() - hit[0] >= NODECLASS_REFRESH:
            # the controller's Clock, not the wall clock, decides which reservations are expiring
            now = datetime.fromtimestamp(self.clock.now(), UTC)
            status = resolve(self.clients, spec, self.k8s_version, self.ssm_prefix, now=now)
            hit = self._resolved[name] = (self.clock.now(), spec.model_copy(update={"status": status}))
        return hit[1]

    def nodeclass(self, name: str) -> EC2NodeClass:
        """The resolved class; NodeClassNotReadyError if it is unknown or not Ready."""
        resolved = self.resolved(name)
        why = ready_message(resolved.status)
        if why is not None:
            raise NodeClassNotReadyError(f"EC2NodeClass {name} is not ready: {why}")
        return resolved

    def pool_not_ready(self, nodepool: NodePool) -> str | None:
        """Why the pool launches nothing because of its EC2NodeClass (the reason its pods are told), or None."""
        try:
            name = self._class_name(nodepool.spec.template.spec.nodeClassRef.model_dump())
            why = ready_message(self.resolved(name).status)
        except NodeClassNotReadyError as exc:
            return f"nodepool {nodepool.name}: {exc}"
        return None if why is None else pool_reason(nodepool.name, name, why)

    def _class_name(self, ref: Mapping[str, Any] | None) -> str:
        ref = ref or {}
        if ref.get("kind") not in (None, "EC2NodeClass"):
            raise NodeClassNotReadyError(f"nodeClassRef kind {ref.get('kind')!r}: the aws provider serves "
                                         "EC2NodeClass only")
        return str(ref.get("name") or "default")

    # -- CloudProvider -----------------------------------------------------------------------------------------------
    def instance_types(self, nodepool: NodePool) -> builtins.list[InstanceType]:
        """The NodeClass's types that the pool's requirements allow. Filtering here, not only in the scheduler,
        makes a requirement on a Karpenter type label (`instance-gpu-name In [a10g]`) exclude the types without
        that label, as Karpenter's "DoesNotExist" GPU labels do."""
        ref = nodepool.spec.template.spec.nodeClassRef.model_dump()
        try:
            types = self.types.list(self.nodeclass(self._class_name(ref)))
        except NodeClassNotReadyError as exc:
            self.log(f"NodePool {nodepool.name}: {exc}")
            return []
        reqs = Requirements.from_api([r.model_dump(exclude_none=True)
                                      for r in nodepool.spec.template.spec.requirements])
        return [t for t in types if type_matches(reqs, t.labels)]

    def candidates(self, nodeclaim: Mapping[str, Any], nodeclass: EC2NodeClass) -> builtins.list[Candidate]:
        """Every (type, zone, capacity type) offering the claim could launch on, cheapest per type first."""
        meta, spec = nodeclaim.get("metadata") or {}, nodeclaim.get("spec") or {}
        reqs = Requirements.from_api(spec.get("requirements") or [])
        sharing = sharing_of(meta.get("labels") or {}, meta.get("annotations") or {},
                             f"NodeClaim {meta.get('name')}: metadata")
        need = {k: parse_quantity(v) for k, v in ((spec.get("resources") or {}).get("requests") or {}).items()}
        subnets: dict[str, str] = {}
        for subnet in nodeclass.status.subnets:
            subnets.setdefault(subnet.zone, subnet.id)
        out: builtins.list[Candidate] = []
        for it in self.types.list(nodeclass):
            if not type_matches(reqs, it.labels):
                continue
            alloc = sharing_capacity(sharing, it.gpu_model, it.gpu_count, it.allocatable)
            if any(alloc.get(k, 0.0) + 1e-9 < v for k, v in need.items()):
                continue
            ami = ami_for(nodeclass, it.labels)
            if ami is None:
                continue
            for offering in it.offerings:
                if not isinstance(offering, AwsOffering) or not offering.available:
                    continue
                if offering.zone in subnets and offering_matches(reqs, offering):
                    out.append(Candidate(it.name, offering.zone, subnets[offering.zone], offering.capacity_type,
                                         offering.price, ami, offering.reservation_id))
        return out

    def _ensure_template(self, nodeclass: EC2NodeClass, ami_id: str, reservation_id: str | None) -> str:
        data = launch_template_data(nodeclass, ami_id, self.cluster_name, reservation_id)
        name = launch_template_name(nodeclass, data, self.cluster_name)
        if name in self._templates:
            return name
        tags = {**nodeclass.spec.tags, A.cluster_tag(self.cluster_name): "owned",
                A.CLUSTER_NAME_TAG: self.cluster_name, A.NODECLASS_TAG: nodeclass.name}
        try:
            call(self.clients.ec2, "create_launch_template", LaunchTemplateName=name, LaunchTemplateData=data,
                 TagSpecifications=[{"ResourceType": "launch-template",
                                     "Tags": [{"Key": k, "Value": v} for k, v in sorted(tags.items())]}])
        except AwsApiError as exc:
            if "AlreadyExists" not in exc.code:
                raise
        self._templates.add(name)
        return name

    def create(self, nodeclaim: dict[str, Any]) -> dict[str, Any]:
        meta, spec = nodeclaim["metadata"], nodeclaim.get("spec") or {}
        nodeclass = self.nodeclass(self._class_name(spec.get("nodeClassRef")))
        pool = (meta.get("labels") or {}).get(L.NODEPOOL_LABEL, "")
        tags = launch_tags(nodeclass, self.cluster_name, pool, meta["name"])
        remaining = self.candidates(nodeclaim, nodeclass)
        errors: builtins.list[str] = []
        while remaining:
            kind = "reserved" if any(c.capacity_type == "reserved" for c in remaining) else \
                "spot" if any(c.capacity_type == "spot" for c in remaining) else "on-demand"
            batch = order_candidates([c for c in remaining if c.capacity_type == kind])
            names = {(c.ami_id, c.reservation_id): self._ensure_template(nodeclass, c.ami_id, c.reservation_id)
                     for c in batch}
            request = fleet_request(batch, names, tags)
            self.fleet_requests.append(request)
            response = call(self.clients.ec2, "create_fleet", **request)
            failed: set[tuple[str, str]] = set()
            for err in fleet_errors(response):
                errors.append(f"{err.code} {err.instance_type} {err.zone}")
                if err.code in CAPACITY_ERRORS and err.instance_type and err.zone:
                    capacity = "reserved" if kind == "reserved" else err.capacity_type
                    self.unavailable.mark(capacity, err.instance_type, err.zone)
                    failed.add((err.instance_type, err.zone))
            got = launched(response)
            if got is not None:
                self._launch_times[got[0]] = self.clock.now()
                return self._launched(nodeclaim, nodeclass, got[0], kind, response)
            # nothing launched: drop what was tried (ICE'd or not), fall back to the next offerings
            tried = {(c.instance_type, c.zone, c.capacity_type) for c in batch}
            remaining = [c for c in remaining if (c.instance_type, c.zone, c.capacity_type) not in tried]
        detail = f" ({'; '.join(errors[:5])})" if errors else ""
        raise InsufficientCapacityError(f"nodeclaim {meta['name']}: all requested instance types were unavailable "
                                        f"during launch{detail}")

    def _describe(self, instance_id: str) -> dict[str, Any] | None:
        try:
            reservations = call(self.clients.ec2, "describe_instances", InstanceIds=[instance_id])["Reservations"]
        except AwsApiError as exc:
            if exc.code == "InvalidInstanceID.NotFound":
                return None
            raise
        for res in reservations:
            for inst in res.get("Instances") or []:
                return dict(inst)
        return None

    def _launched(self, nodeclaim: dict[str, Any], nodeclass: EC2NodeClass, instance_id: str,
                  kind: str, response: Mapping[str, Any]) -> dict[str, Any]:
        """The NodeClaim as launched. DescribeInstances may not show the instance yet: then its type and zone
        come from the fleet's answer (which override launched it), never from a guess."""
        inst = self._describe(instance_id) or {}
        placed = fleet_placement(response, nodeclass)
        name = str(inst.get("InstanceType") or placed[0])
        zone = str((inst.get("Placement") or {}).get("AvailabilityZone") or placed[1])
        lifecycle = "spot" if inst.get("InstanceLifecycle") == "spot" else kind
        it = next((t for t in self.types.list(nodeclass) if t.name == name), None)
        if it is None:
            raise KubegpuError(f"instance {instance_id}: launched type {name!r} is not among the known types")
        offering = next((o for o in it.offerings if isinstance(o, AwsOffering) and o.zone == zone
                         and o.capacity_type == lifecycle), None) or AwsOffering(zone, lifecycle, 0.0)
        meta = nodeclaim["metadata"]
        labels, annotations = dict(meta.get("labels") or {}), dict(meta.get("annotations") or {})
        sharing = sharing_of(labels, annotations, f"NodeClaim {meta['name']}: metadata")
        full = sharing_capacity(sharing, it.gpu_model, it.gpu_count, it.allocatable)
        status = dict(nodeclaim.get("status") or {})
        status.update({"providerID": provider_id(zone, instance_id), "imageID": inst.get("ImageId", ""),
                       "capacity": quantities({**it.capacity, **full}), "allocatable": quantities(full)})
        result = dict(nodeclaim)
        result["metadata"] = {**meta, "labels": {**labels, **it.labels, **offering.labels(),
                                                 A.EC2NODECLASS_LABEL: nodeclass.name,
                                                 L.REGION_LABEL: self.clients.region}}
        result["status"] = status
        self.log(f"launched {instance_id} ({name}, {zone}, {lifecycle}) for nodeclaim {meta['name']}")
        return result

    def delete(self, nodeclaim: dict[str, Any]) -> None:
        """TerminateInstances; NodeClaimNotFoundError only once EC2 confirms the instance gone (module doc)."""
        pid = (nodeclaim.get("status") or {}).get("providerID") or ""
        parsed = parse_provider_id(pid)
        name = (nodeclaim.get("metadata") or {}).get("name", "?")
        inst = self._describe(parsed[1]) if parsed else None
        state = ((inst or {}).get("State") or {}).get("Name")
        if inst is None or state == "terminated":
            if state != "terminated" and self._young(nodeclaim, parsed[1] if parsed else ""):
                raise InstanceNotYetKnownError(f"nodeclaim {name}: instance {pid or '?'} not known to EC2 yet "
                                               f"(launched within {self.consistency_window:.0f}s); asking again")
            raise NodeClaimNotFoundError(f"nodeclaim {name}: instance {pid or '?'} already gone")
        if state != "shutting-down":
            call(self.clients.ec2, "terminate_instances", InstanceIds=[inst["InstanceId"]])

    def _young(self, nodeclaim: Mapping[str, Any] | None, instance_id: str) -> bool:
        """Launched within the consistency window: by this process's record of the launch, else by the NodeClaim's
        Launched condition (or its creation, which comes earlier, when it has none)."""
        now = self.clock.now()
        at = self._launch_times.get(instance_id)
        if at is None and nodeclaim is not None:
            launched_at = parse_timestamp((condition(nodeclaim, "Launched") or {}).get("lastTransitionTime"))
            at = launched_at if launched_at is not None else created_at(nodeclaim)
        return at is not None and now - at < self.consistency_window

    def _as_claim(self, inst: Mapping[str, Any]) -> dict[str, Any]:
        tags = {t["Key"]: t["Value"] for t in inst.get("Tags") or []}
        zone = str((inst.get("Placement") or {}).get("AvailabilityZone") or "")
        lifecycle = "spot" if inst.get("InstanceLifecycle") == "spot" else "on-demand"
        launch = inst.get("LaunchTime")
        return {
            "metadata": {"name": tags.get(A.NODECLAIM_TAG, inst["InstanceId"]),
                         "labels": {L.INSTANCE_TYPE_LABEL: inst.get("InstanceType", ""), L.ZONE_LABEL: zone,
                                    L.CAPACITY_TYPE_LABEL: lifecycle, A.CAPACITY_TYPE_LABEL: lifecycle,
                                    L.NODEPOOL_LABEL: tags.get(A.NODEPOOL_TAG, ""),
                                    A.EC2NODECLASS_LABEL: tags.get(A.NODECLASS_TAG, "")}},
            "status": {"providerID": provider_id(zone, inst["InstanceId"]), "imageID": inst.get("ImageId", ""),
                       "state": (inst.get("State") or {}).get("Name", "")},
            "launchTime": launch.timestamp() if isinstance(launch, datetime) else 0.0,
            "subnetID": inst.get("SubnetId"),
            "securityGroups": sorted(g["GroupId"] for g in inst.get("SecurityGroups") or []),
        }

    def get(self, provider_id: str) -> dict[str, Any]:
        parsed = parse_provider_id(provider_id)
        inst = self._describe(parsed[1]) if parsed else None
        if inst is None and parsed is not None and self._young(None, parsed[1]):
            raise InstanceNotYetKnownError(f"instance {provider_id} not known to EC2 yet; asking again")
        if inst is None or (inst.get("State") or {}).get("Name") == "terminated":
            raise NodeClaimNotFoundError(f"instance {provider_id} not found")
        return self._as_claim(inst)

    def list(self) -> builtins.list[dict[str, Any]]:
        filters = [{"Name": "tag-key", "Values": [A.NODEPOOL_TAG]}, {"Name": "tag-key", "Values": [A.NODECLASS_TAG]},
                   {"Name": f"tag:{A.CLUSTER_NAME_TAG}", "Values": [self.cluster_name]},
                   {"Name": "instance-state-name", "Values": LIVE_STATES}]
        out: builtins.list[dict[str, Any]] = []
        for res in paginate(self.clients.ec2, "describe_instances", "Reservations", Filters=filters):
            out.extend(self._as_claim(inst) for inst in res.get("Instances") or [])
        return out

    def find(self, nodeclaim: dict[str, Any]) -> str | None:
        """A live instance of this cluster tagged with the claim's name (every launch tags it so), for a claim whose
        providerID was never recorded; None when EC2 shows none. An instance EC2 does not show yet is the garbage
        collection sweep's: it carries our tags and no NodeClaim owns it."""
        name = str((nodeclaim.get("metadata") or {}).get("name") or "")
        if not name:
            return None
        filters = [{"Name": f"tag:{A.NODECLAIM_TAG}", "Values": [name]},
                   {"Name": f"tag:{A.CLUSTER_NAME_TAG}", "Values": [self.cluster_name]},
                   {"Name": "instance-state-name", "Values": LIVE_STATES}]
        for res in paginate(self.clients.ec2, "describe_instances", "Reservations", Filters=filters):
            for inst in res.get("Instances") or []:
                return str(self._as_claim(inst)["status"]["providerID"])
        return None

    def garbage_collect(self, known_provider_ids: Iterable[str]) -> builtins.list[str]:
        """Terminate our tagged instances that no NodeClaim owns and that are older than 30 s; their ids."""
        known = set(known_provider_ids)
        now = self.clock.now()
        orphans = [c for c in self.list() if c["status"]["providerID"] not in known
                   and c["status"]["state"] != "shutting-down" and now - c["launchTime"] > GC_MIN_AGE]
        ids = [parse_provider_id(c["status"]["providerID"]) for c in orphans]
        instance_ids = [p[1] for p in ids if p is not None]
        if instance_ids:
            call(self.clients.ec2, "terminate_instances", InstanceIds=instance_ids)
            self.log(f"garbage-collected instances without a NodeClaim: {', '.join(instance_ids)}")
        return instance_ids

    def is_drifted(self, nodeclaim: dict[str, Any]) -> str:
        """AMIDrift / SubnetDrift / SecurityGroupDrift when the instance no longer matches its NodeClass."""
        pid = (nodeclaim.get("status") or {}).get("providerID") or ""
        try:
            nodeclass = self.nodeclass(self._class_name((nodeclaim.get("spec") or {}).get("nodeClassRef")))
            current = self.get(pid)
        except KubegpuError:
            return ""
        if current["status"]["imageID"] and current["status"]["imageID"] not in {a.id for a in nodeclass.status.amis}:
            return "AMIDrift"
        if current["subnetID"] and current["subnetID"] not in {s.id for s in nodeclass.status.subnets}:
            return "SubnetDrift"
        groups = sorted(g.id for g in nodeclass.status.securityGroups)
        if current["securityGroups"] and current["securityGroups"] != groups:
            return "SecurityGroupDrift"
        return ""

