"""NodePool and NodeClaim (`kubegpu.io/v1`): Karpenter v1's field names, defaults and validation rules.

Field names are camelCase on purpose: a Karpenter NodePool manifest moves over by changing only `apiVersion`
(and the `karpenter.sh/` label domain). Every rule Karpenter states in CEL is a validator here, so a bad
NodePool is rejected with one line naming the field path instead of being half-applied.
"""

from __future__ import annotations

import hashlib
import json
import re
from datetime import datetime, timedelta
from typing import Any, Literal

from pydantic import ConfigDict, Field, ValidationError, field_validator, model_validator

from kubegpu.autoscaler import labels as L
from kubegpu.autoscaler.cron import CronSchedule
from kubegpu.config import model_error_message
from kubegpu.config.objects import ApiModel, ObjectMeta
from kubegpu.errors import ConfigError, KubegpuError
from kubegpu.scheduling.quantity import parse_quantity

Operator = Literal["In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt", "Gte", "Lte"]
Effect = Literal["NoSchedule", "PreferNoSchedule", "NoExecute"]
ConsolidationPolicy = Literal["WhenEmpty", "WhenEmptyOrUnderutilized"]
DisruptionReason = Literal["Underutilized", "Empty", "Drifted"]

KARPENTER_CAPACITY_TYPE = "karpenter.sh/capacity-type"
_DURATION_RE = re.compile(r"^([0-9]+(s|m|h))+$")
_DURATION_PART = re.compile(r"([0-9]+)(s|m|h)")
_BUDGET_NODES_RE = re.compile(r"^((100|[0-9]{1,2})%|[0-9]+)$")
_UNITS = {"s": 1, "m": 60, "h": 3600}


def parse_duration(value: str) -> float | None:
    """Seconds in a Go-style duration ("1h30m"); None for "Never". Raises ValueError otherwise."""
    if value == "Never":
        return None
    if not _DURATION_RE.match(value):
        raise ValueError(f"invalid duration {value!r} (want e.g. 720h, 30m, 10s or Never)")
    return float(sum(int(n) * _UNITS[u] for n, u in _DURATION_PART.findall(value)))


class NodeSelectorRequirementWithMinValues(ApiModel):
    """One NodePool/NodeClaim requirement as the API spells it (Karpenter's type name); the solver's algebra over
    these is `kubegpu.autoscaler.requirements.Requirement`."""

    key: str = Field(min_length=1, max_length=316)
    operator: Operator
    values: list[str] = Field(default_factory=list)
    minValues: int | None = Field(default=None, ge=1, le=50)

    @field_validator("key")
    @classmethod
    def _alias(cls, value: str) -> str:
        """Karpenter's `karpenter.sh/capacity-type` is our `kubegpu.io/capacity-type` (NodePools move over as-is)."""
        return L.CAPACITY_TYPE_LABEL if value == KARPENTER_CAPACITY_TYPE else value

    @model_validator(mode="after")
    def _cel_rules(self) -> NodeSelectorRequirementWithMinValues:
        if self.key in L.RESTRICTED_LABELS:
            raise ValueError(f"label {self.key!r} is restricted (the autoscaler sets it)")
        if self.operator == "In" and not self.values:
            raise ValueError("operator In needs at least one value")
        if self.operator in ("Exists", "DoesNotExist") and self.values:
            raise ValueError(f"operator {self.operator} takes no values")
        if self.operator in ("Gt", "Lt", "Gte", "Lte") and (len(self.values) != 1 or not self.values[0].isdigit()):
            raise ValueError(f"operator {self.operator} needs exactly one value that is an integer >= 0")
        if self.minValues is not None:
            if self.operator != "In":
                raise ValueError("minValues is only allowed with operator In")
            if len(self.values) < self.minValues:
                raise ValueError(f"minValues {self.minValues} is more than the {len(self.values)} values given")
        return self


class Taint(ApiModel):
    key: str = Field(min_length=1)
    value: str | None = None
    effect: Effect
    timeAdded: str | None = None


class NodeClassReference(ApiModel):
    group: str = L.GROUP
    kind: str = "KwokNodeClass"
    name: str = "default"


class TemplateMetadata(ApiModel):
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)

    @field_validator("labels")
    @classmethod
    def _no_restricted_labels(cls, value: dict[str, str]) -> dict[str, str]:
        for key in value:
            if key in L.RESTRICTED_LABELS or key in L.REQUIREMENT_ONLY_LABELS:
                raise ValueError(f"label {key!r} is restricted (the autoscaler sets it)")
        return value


def _check_duration(value: str | None, allow_never: bool) -> str | None:
    if value is None:
        return None
    if value == "Never" and not allow_never:
        raise ValueError("Never is not allowed here")
    parse_duration(value)
    return value


class NodeClaimTemplateSpec(ApiModel):
    nodeClassRef: NodeClassReference = Field(default_factory=NodeClassReference)
    requirements: list[NodeSelectorRequirementWithMinValues] = Field(max_length=100)
    taints: list[Taint] = Field(default_factory=list)
    startupTaints: list[Taint] = Field(default_factory=list)
    expireAfter: str = "720h"
    terminationGracePeriod: str | None = None

    @field_validator("expireAfter")
    @classmethod
    def _expire(cls, value: str) -> str:
        _check_duration(value, allow_never=True)
        return value

    @field_validator("terminationGracePeriod")
    @classmethod
    def _grace(cls, value: str | None) -> str | None:
        return _check_duration(value, allow_never=False)


class NodeClaimTemplate(ApiModel):
    metadata: TemplateMetadata = Field(default_factory=TemplateMetadata)
    spec: NodeClaimTemplateSpec


class Budget(ApiModel):
    nodes: str = "10%"
    reasons: list[DisruptionReason] | None = None
    schedule: str | None = None
    duration: str | None = None

    @field_validator("nodes")
    @classmethod
    def _nodes(cls, value: str) -> str:
        if not _BUDGET_NODES_RE.match(value):
            raise ValueError(f"nodes {value!r} must be an integer or a percentage 0%..100%")
        return value

    @field_validator("duration")
    @classmethod
    def _duration(cls, value: str | None) -> str | None:
        if value is not None and not re.match(r"^([0-9]+(m|h))+$", value):
            raise ValueError(f"duration {value!r} must use hours and minutes only (e.g. 8h, 90m)")
        return value

    @field_validator("schedule")
    @classmethod
    def _schedule(cls, value: str | None) -> str | None:
        if value is not None:
            CronSchedule.parse(value)
        return value

    @model_validator(mode="after")
    def _together(self) -> Budget:
        if (self.schedule is None) != (self.duration is None):
            raise ValueError("schedule and duration must be set together")
        return self

    def allowed(self, total_nodes: int) -> int:
        """Nodes this budget lets be disrupted at once; percentages round up, as Karpenter's do."""
        if self.nodes.endswith("%"):
            return -(-total_nodes * int(self.nodes[:-1]) // 100)
        return int(self.nodes)

    def active(self, now: datetime) -> bool:
        """A scheduled budget is active from each cron firing for `duration`; an unscheduled one always is."""
        if self.schedule is None or self.duration is None:
            return True
        window = timedelta(seconds=parse_duration(self.duration) or 0.0)
        fired = CronSchedule.parse(self.schedule).next_after(now - window, int(window.total_seconds() // 60) + 1)
        return fired is not None and fired <= now

    def applies_to(self, reason: str) -> bool:
        return not self.reasons or reason in self.reasons


class Disruption(ApiModel):
    consolidationPolicy: ConsolidationPolicy = "WhenEmptyOrUnderutilized"
    consolidateAfter: str = "0s"
    budgets: list[Budget] = Field(default_factory=lambda: [Budget(nodes="10%")], max_length=50)

    @field_validator("consolidateAfter")
    @classmethod
    def _after(cls, value: str) -> str:
        _check_duration(value, allow_never=True)
        return value


class NodePoolSpec(ApiModel):
    template: NodeClaimTemplate
    disruption: Disruption = Field(default_factory=Disruption)
    limits: dict[str, str | int | float] = Field(default_factory=dict)
    weight: int | None = Field(default=None, ge=1, le=100)

    @field_validator("limits")
    @classmethod
    def _limits(cls, value: dict[str, str | int | float]) -> dict[str, str | int | float]:
        for name, quantity in value.items():
            try:
                parse_quantity(quantity)
            except KubegpuError as exc:
                raise ValueError(f"limit {name}: {exc}") from None
        return value


class NodePool(ApiModel):
    model_config = ConfigDict(extra="ignore")
    apiVersion: Literal["kubegpu.io/v1"] = "kubegpu.io/v1"
    kind: Literal["NodePool"] = "NodePool"
    metadata: ObjectMeta
    spec: NodePoolSpec

    @property
    def name(self) -> str:
        return self.metadata.name

    @property
    def weight(self) -> int:
        return self.spec.weight or 0


class ResourceRequirements(ApiModel):
    requests: dict[str, str | int | float] = Field(default_factory=dict)


class NodeClaimSpec(ApiModel):
    nodeClassRef: NodeClassReference = Field(default_factory=NodeClassReference)
    requirements: list[NodeSelectorRequirementWithMinValues] = Field(default_factory=list)
    taints: list[Taint] = Field(default_factory=list)
    startupTaints: list[Taint] = Field(default_factory=list)
    resources: ResourceRequirements = Field(default_factory=ResourceRequirements)
    expireAfter: str = "720h"
    terminationGracePeriod: str | None = None


class NodeClaim(ApiModel):
    model_config = ConfigDict(extra="ignore")
    apiVersion: Literal["kubegpu.io/v1"] = "kubegpu.io/v1"
    kind: Literal["NodeClaim"] = "NodeClaim"
    metadata: ObjectMeta
    spec: NodeClaimSpec


def validation_message(error: ValidationError) -> str:
    """The first pydantic error as `field.path: what`, so a bad CR costs the user one line."""
    return model_error_message(error)


def parse_nodepool(data: Any, source: str = "NodePool") -> NodePool:
    """A validated NodePool, or ConfigError "SOURCE: NodePool NAME: field.path: what"."""
    name = data.get("metadata", {}).get("name", "?") if isinstance(data, dict) else "?"
    try:
        return NodePool.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(f"{source}: NodePool {name}: {validation_message(exc)}") from None


def parse_nodeclaim(data: Any, source: str = "NodeClaim") -> NodeClaim:
    name = data.get("metadata", {}).get("name", "?") if isinstance(data, dict) else "?"
    try:
        return NodeClaim.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(f"{source}: NodeClaim {name}: {validation_message(exc)}") from None


def template_hash(pool: NodePool) -> str:
    """Karpenter's NodePool hash: the template minus requirements; a change marks existing NodeClaims drifted."""
    tmpl = pool.spec.template
    data = {"metadata": tmpl.metadata.model_dump(mode="json"),
            "spec": tmpl.spec.model_dump(mode="json", exclude={"requirements"})}
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:16]
