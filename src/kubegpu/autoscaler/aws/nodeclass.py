"""EC2NodeClass (`kubegpu.io/v1`): Karpenter's `karpenter.k8s.aws/v1` EC2NodeClass under our API group.

Field names and validation follow Karpenter's (pkg/apis/v1/ec2nodeclass.go at 1d92708): a Karpenter manifest moves
over by changing `apiVersion`. Every CEL rule there is a validator here, so an invalid class is one line naming the
field path. The CRD in deploy/crds is generated from these models (`crd()`), like the operator's.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from kubegpu.autoscaler import labels as L
from kubegpu.autoscaler.api import validation_message
from kubegpu.config.objects import ApiModel, ObjectMeta
from kubegpu.errors import ConfigError, KubegpuError
from kubegpu.scheduling.quantity import parse_quantity

KIND = "EC2NodeClass"
PLURAL = "ec2nodeclasses"
AMI_FAMILIES = ("AL2", "AL2023", "Bottlerocket", "Custom", "Windows2019", "Windows2022", "Windows2025")
ALIAS_FAMILIES = {"al2": "AL2", "al2023": "AL2023", "bottlerocket": "Bottlerocket", "windows2019": "Windows2019",
                  "windows2022": "Windows2022", "windows2025": "Windows2025"}
RESERVED_TAG_PREFIXES = ("kubernetes.io/cluster",)
RESERVED_TAGS = frozenset({"eks:eks-cluster-name", "karpenter.sh/nodepool", "karpenter.sh/nodeclaim",
                           "karpenter.k8s.aws/ec2nodeclass"})
MAX_VOLUME_BYTES = 64 * 10**12  # 64T


def _check_tags(tags: dict[str, str], allow_empty_values: bool = False) -> dict[str, str]:
    if len(tags) > 20:
        raise ValueError("at most 20 tags per term")
    for key, value in tags.items():
        if not key:
            raise ValueError("empty tag keys are not supported")
        if not value and not allow_empty_values:
            raise ValueError(f"tag {key!r}: empty tag values are not supported")
    return tags


class AMISelectorTerm(ApiModel):
    alias: str | None = Field(default=None, max_length=30)
    id: str | None = Field(default=None, pattern=r"^ami-[0-9a-z]+$")
    name: str | None = None
    owner: str | None = None
    ssmParameter: str | None = None
    tags: dict[str, str] | None = None

    @field_validator("tags")
    @classmethod
    def _tags(cls, value: dict[str, str] | None) -> dict[str, str] | None:
        return None if value is None else _check_tags(value)

    @field_validator("alias")
    @classmethod
    def _alias(cls, value: str | None) -> str | None:
        if value is None:
            return None
        family, _, version = value.partition("@")
        if family not in ALIAS_FAMILIES or not version:
            raise ValueError(f"alias {value!r} must be family@version with family one of "
                             f"{', '.join(ALIAS_FAMILIES)}")
        if family.startswith("windows") and version != "latest":
            raise ValueError("Windows aliases only support @latest")
        return value

    @model_validator(mode="after")
    def _one_kind(self) -> AMISelectorTerm:
        set_fields = [k for k in ("alias", "id", "name", "ssmParameter", "tags") if getattr(self, k) is not None]
        if not set_fields:
            raise ValueError("expected at least one of alias, id, name, ssmParameter or tags")
        if self.alias is not None and (len(set_fields) > 1 or self.owner is not None):
            raise ValueError("alias may not be combined with other fields")
        if self.id is not None and (len(set_fields) > 1 or self.owner is not None):
            raise ValueError("id may not be combined with other fields")
        return self


class SubnetSelectorTerm(ApiModel):
    id: str | None = Field(default=None, pattern=r"^subnet-[0-9a-z]+$")
    tags: dict[str, str] | None = None

    @field_validator("tags")
    @classmethod
    def _tags(cls, value: dict[str, str] | None) -> dict[str, str] | None:
        return None if value is None else _check_tags(value)

    @model_validator(mode="after")
    def _one(self) -> SubnetSelectorTerm:
        if (self.id is None) == (self.tags is None):
            raise ValueError("expected exactly one of id or tags")
        return self


class SecurityGroupSelectorTerm(ApiModel):
    id: str | None = Field(default=None, pattern=r"^sg-[0-9a-z]+$")
    name: str | None = None
    tags: dict[str, str] | None = None

    @field_validator("tags")
    @classmethod
    def _tags(cls, value: dict[str, str] | None) -> dict[str, str] | None:
        return None if value is None else _check_tags(value)

    @model_validator(mode="after")
    def _one(self) -> SecurityGroupSelectorTerm:
        if sum(v is not None for v in (self.id, self.name, self.tags)) != 1:
            raise ValueError("expected exactly one of id, name or tags")
        return self


class CapacityReservationSelectorTerm(ApiModel):
    id: str | None = Field(default=None, pattern=r"^cr-[0-9a-z]+$")
    ownerID: str | None = Field(default=None, pattern=r"^[0-9]{12}$")
    tags: dict[str, str] | None = None
    instanceMatchCriteria: Literal["open", "targeted"] | None = None

    @field_validator("tags")
    @classmethod
    def _tags(cls, value: dict[str, str] | None) -> dict[str, str] | None:
        return None if value is None else _check_tags(value)

    @model_validator(mode="after")
    def _one(self) -> CapacityReservationSelectorTerm:
        if self.id is None and self.tags is None and self.instanceMatchCriteria is None:
            raise ValueError("expected one of id, tags or instanceMatchCriteria")
        if self.id is not None and (self.tags is not None or self.ownerID is not None
                                    or self.instanceMatchCriteria is not None):
            raise ValueError("id may not be combined with other fields")
        return self


class PlacementGroupSelector(ApiModel):
    id: str | None = Field(default=None, pattern=r"^pg-[0-9a-z]+$")
    name: str | None = None

    @model_validator(mode="after")
    def _one(self) -> PlacementGroupSelector:
        if (self.id is None) == (self.name is None):
            raise ValueError("expected exactly one of id or name")
        return self


class BlockDevice(ApiModel):
    deleteOnTermination: bool | None = None
    encrypted: bool | None = None
    iops: int | None = Field(default=None, ge=0)
    kmsKeyID: str | None = None
    snapshotID: str | None = None
    throughput: int | None = Field(default=None, ge=0)
    volumeInitializationRate: int | None = Field(default=None, ge=100, le=300)
    volumeSize: str | None = None
    volumeType: Literal["standard", "io1", "io2", "gp2", "sc1", "st1", "gp3"] | None = None

    @field_validator("volumeSize")
    @classmethod
    def _size(cls, value: str | None) -> str | None:
        if value is None:
            return None
        try:
            size = parse_quantity(value)
        except KubegpuError:
            size = -1.0
        if not 0 < size <= MAX_VOLUME_BYTES:
            raise ValueError(f"volumeSize {value!r} must be a size above 0 and up to 64T (e.g. 100Gi)")
        return value

    @model_validator(mode="after")
    def _source(self) -> BlockDevice:
        if self.snapshotID is None and self.volumeSize is None:
            raise ValueError("ebs needs snapshotID or volumeSize")
        return self


class BlockDeviceMapping(ApiModel):
    deviceName: str | None = None
    ebs: BlockDevice | None = None
    rootVolume: bool = False


class MetadataOptions(ApiModel):
    httpEndpoint: Literal["enabled", "disabled"] = "enabled"
    httpProtocolIPv6: Literal["enabled", "disabled"] = "disabled"
    httpPutResponseHopLimit: int = Field(default=1, ge=1, le=64)
    httpTokens: Literal["required", "optional"] = "required"


class KubeletConfiguration(BaseModel):
    """Karpenter reads these fields; any other upstream KubeletConfiguration field passes through (pruning kept)."""

    model_config = ConfigDict(extra="allow")
    maxPods: int | None = Field(default=None, ge=0)
    podsPerCore: int | None = Field(default=None, ge=0)
    systemReserved: dict[str, str] | None = None
    kubeReserved: dict[str, str] | None = None
    evictionHard: dict[str, str] | None = None
    evictionSoft: dict[str, str] | None = None
    evictionSoftGracePeriod: dict[str, str] | None = None
    evictionMaxPodGracePeriod: int | None = None
    imageGCHighThresholdPercent: int | None = Field(default=None, ge=0, le=100)
    imageGCLowThresholdPercent: int | None = Field(default=None, ge=0, le=100)
    cpuCFSQuota: bool | None = None
    clusterDNS: list[str] | None = None

    @model_validator(mode="after")
    def _gc(self) -> KubeletConfiguration:
        high, low = self.imageGCHighThresholdPercent, self.imageGCLowThresholdPercent
        if high is not None and low is not None and high <= low:
            raise ValueError("imageGCHighThresholdPercent must be greater than imageGCLowThresholdPercent")
        return self


class EC2NodeClassSpec(ApiModel):
    amiFamily: Literal["AL2", "AL2023", "Bottlerocket", "Custom", "Windows2019", "Windows2022",
                       "Windows2025"] | None = None
    amiSelectorTerms: list[AMISelectorTerm] = Field(min_length=1, max_length=30)
    subnetSelectorTerms: list[SubnetSelectorTerm] = Field(min_length=1, max_length=30)
    securityGroupSelectorTerms: list[SecurityGroupSelectorTerm] = Field(min_length=1, max_length=30)
    capacityReservationSelectorTerms: list[CapacityReservationSelectorTerm] = Field(default_factory=list,
                                                                                    max_length=30)
    placementGroupSelector: PlacementGroupSelector | None = None
    role: str | None = Field(default=None, min_length=1)
    instanceProfile: str | None = Field(default=None, min_length=1)
    tags: dict[str, str] = Field(default_factory=dict)
    kubelet: KubeletConfiguration | None = None
    blockDeviceMappings: list[BlockDeviceMapping] = Field(default_factory=list, max_length=50)
    instanceStorePolicy: Literal["RAID0"] | None = None
    metadataOptions: MetadataOptions = Field(default_factory=MetadataOptions)
    userData: str | None = None
    detailedMonitoring: bool | None = None
    associatePublicIPAddress: bool | None = None
    context: str | None = None

    @field_validator("tags")
    @classmethod
    def _tags(cls, value: dict[str, str]) -> dict[str, str]:
        for key in value:
            if not key:
                raise ValueError("empty tag keys aren't supported")
            if key in RESERVED_TAGS or key.startswith(RESERVED_TAG_PREFIXES):
                raise ValueError(f"tag {key!r} is restricted (the autoscaler sets it)")
        return value

    @field_validator("blockDeviceMappings")
    @classmethod
    def _one_root(cls, value: list[BlockDeviceMapping]) -> list[BlockDeviceMapping]:
        if sum(m.rootVolume for m in value) > 1:
            raise ValueError("must have only one blockDeviceMappings with rootVolume")
        return value

    @model_validator(mode="after")
    def _cel(self) -> EC2NodeClassSpec:
        if (self.role is None) == (self.instanceProfile is None):
            raise ValueError("must specify exactly one of ['role', 'instanceProfile']")
        aliases = [t.alias for t in self.amiSelectorTerms if t.alias is not None]
        if aliases and len(self.amiSelectorTerms) > 1:
            raise ValueError("amiSelectorTerms: 'alias' is mutually exclusive, it must be the only term")
        if not aliases and self.amiFamily is None:
            raise ValueError("amiFamily: required unless amiSelectorTerms uses an alias")
        if aliases and self.amiFamily not in (None, "Custom", ALIAS_FAMILIES[aliases[0].split("@")[0]]):
            raise ValueError("amiFamily: must match the alias family or be Custom")
        return self

    @property
    def ami_family(self) -> str:
        alias = self.alias
        return self.amiFamily or ALIAS_FAMILIES[alias.split("@")[0]] if alias else (self.amiFamily or "Custom")

    @property
    def alias(self) -> str | None:
        return next((t.alias for t in self.amiSelectorTerms if t.alias), None)


class SubnetStatus(ApiModel):
    id: str
    zone: str
    zoneID: str | None = None


class SecurityGroupStatus(ApiModel):
    id: str
    name: str | None = None


class AMIStatus(ApiModel):
    id: str
    name: str | None = None
    deprecated: bool = False
    requirements: list[dict[str, Any]] = Field(default_factory=list)


class CapacityReservationStatus(ApiModel):
    id: str
    availabilityZone: str
    instanceType: str
    ownerID: str | None = None
    instanceMatchCriteria: str = "open"
    reservationType: Literal["default", "capacity-block"] = "default"
    interruptible: bool = False
    endTime: str | None = None
    state: Literal["active", "expiring"] = "active"
    availableInstanceCount: int = 0


class Condition(BaseModel):
    """A Kubernetes condition as Karpenter writes them (kubegpu.autoscaler.aws.conditions computes them)."""

    model_config = ConfigDict(extra="allow")
    type: str
    status: Literal["True", "False", "Unknown"]
    reason: str = ""
    message: str = ""
    lastTransitionTime: str | None = None
    observedGeneration: int | None = None


class EC2NodeClassStatus(ApiModel):
    subnets: list[SubnetStatus] = Field(default_factory=list)
    securityGroups: list[SecurityGroupStatus] = Field(default_factory=list)
    amis: list[AMIStatus] = Field(default_factory=list)
    capacityReservations: list[CapacityReservationStatus] = Field(default_factory=list)
    instanceProfile: str | None = None
    conditions: list[Condition] = Field(default_factory=list)


class EC2NodeClass(ApiModel):
    model_config = ConfigDict(extra="ignore")
    apiVersion: Literal["kubegpu.io/v1"] = "kubegpu.io/v1"
    kind: Literal["EC2NodeClass"] = "EC2NodeClass"
    metadata: ObjectMeta
    spec: EC2NodeClassSpec
    status: EC2NodeClassStatus = Field(default_factory=EC2NodeClassStatus)

    @property
    def name(self) -> str:
        return self.metadata.name


def parse_ec2nodeclass(data: Any, source: str = "EC2NodeClass") -> EC2NodeClass:
    """A validated EC2NodeClass, or ConfigError "SOURCE: EC2NodeClass NAME: field.path: what"."""
    name = (data.get("metadata") or {}).get("name", "?") if isinstance(data, dict) else "?"
    try:
        return EC2NodeClass.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(f"{source}: EC2NodeClass {name}: {validation_message(exc)}") from None


def load_nodeclasses(path: Path) -> dict[str, EC2NodeClass]:
    """EC2NodeClasses from a manifest file (one, a list or several documents), keyed by name."""
    from kubegpu.files import parse_yaml_documents, read_text

    items: list[Any] = []
    for doc in parse_yaml_documents(read_text(path), str(path)):
        items.extend(doc if isinstance(doc, list) else (doc.get("items") or []) if isinstance(doc, dict) and str(
            doc.get("kind", "")).endswith("List") else [doc])
    classes = []
    for i, raw in enumerate(items):
        if not isinstance(raw, dict) or raw.get("kind", KIND) != KIND:
            raise ConfigError(f"{path}: [{i}]: expected an {KIND} object")
        classes.append(parse_ec2nodeclass(raw, str(path)))
    if len({c.name for c in classes}) != len(classes):
        raise ConfigError(f"{path}: metadata.name: duplicate {KIND}")
    if not classes:
        raise ConfigError(f"{path}: no EC2NodeClass in the file")
    return {c.name: c for c in classes}


def looks_like_ec2nodeclass(data: object) -> bool:
    return isinstance(data, dict) and data.get("kind") == KIND


def validate_ec2nodeclass(data: object, source: str, _options: object) -> str:
    """For `kubegpu validate-config`: the one-line summary of a valid class (ConfigError otherwise)."""
    spec = parse_ec2nodeclass(data, source).spec
    return (f"{spec.ami_family}, {len(spec.amiSelectorTerms)} AMI / {len(spec.subnetSelectorTerms)} subnet / "
            f"{len(spec.securityGroupSelectorTerms)} security-group terms")


def crd() -> dict[str, Any]:
    """The EC2NodeClass CustomResourceDefinition, generated from the models above."""
    from kubegpu.config.crds import custom_resource_definition

    return custom_resource_definition(
        group=L.GROUP, kind=KIND, plural=PLURAL, spec=EC2NodeClassSpec, status=EC2NodeClassStatus,
        short_names=("ec2nc", "ec2ncs"),
        printer_columns=({"name": "Ready", "type": "string",
                          "jsonPath": ".status.conditions[?(@.type==\"Ready\")].status"},
                         {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
                         {"name": "Role", "type": "string", "priority": 1, "jsonPath": ".spec.role"}),
    )


CRD_HEADER = ("EC2NodeClass (kubegpu.io/v1): Karpenter's karpenter.k8s.aws/v1 EC2NodeClass under our group.\n"
              "Generated by `python -m kubegpu.autoscaler.aws.nodeclass` from kubegpu.autoscaler.aws.nodeclass;\n"
              "do not edit by hand.")


if __name__ == "__main__":  # pragma: no cover - regenerates deploy/crds/ec2nodeclasses.kubegpu.io.yaml
    import sys

    from kubegpu.config.crds import write_crd

    target = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parents[4] / "deploy" / "crds"
    print(write_crd(crd(), target, CRD_HEADER))
