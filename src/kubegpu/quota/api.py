"""`ElasticQuota` (kubegpu.io/v1, namespaced): a team's GPU quota in `kubegpu.io/gpu-memory`, guaranteed up to `min`,
borrowable up to `max` — nos's field names, so a nos user's objects read the same.

Quantities are Kubernetes quantities (`160Gi`); `min` and `max` may also name `nvidia.com/gpu` (whole GPUs). The CRD
is generated from these models (`kubegpu.config.crds`), never written by hand.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from kubegpu.config.crds import custom_resource_definition
from kubegpu.errors import ConfigError
from kubegpu.kube.resources import ResourceKind, register_kind
from kubegpu.scheduling.quantity import parse_quantity
from kubegpu.sharing.names import GPU_MEMORY_RESOURCE, GPU_RESOURCE

GROUP = "kubegpu.io"
VERSION = "v1"
KIND = "ElasticQuota"
PLURAL = "elasticquotas"
API_VERSION = f"{GROUP}/{VERSION}"
RESOURCES = (GPU_MEMORY_RESOURCE, GPU_RESOURCE)


def _check_amounts(value: dict[str, str] | None) -> dict[str, str] | None:
    if value is None:
        return None
    for name, amount in value.items():
        if name not in RESOURCES:
            raise ValueError(f"unknown resource {name!r}; expected {' or '.join(RESOURCES)}")
        if parse_quantity(amount) < 0:
            raise ValueError(f"{name}: must not be negative")
    return value


class ElasticQuotaSpec(BaseModel):
    """`min`: guaranteed (pods within it are always admitted); `max`: the most it may use by borrowing idle
    capacity (absent: no limit but the cluster)."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    min: dict[str, str] = Field(default_factory=dict, description="Guaranteed amounts (kubegpu.io/gpu-memory: 80Gi)")
    max: dict[str, str] | None = Field(default=None, description="Most it may use by borrowing; absent: unbounded")

    @field_validator("min", "max")
    @classmethod
    def _amounts(cls, value: dict[str, str] | None) -> dict[str, str] | None:
        return _check_amounts(value)

    def check(self) -> None:
        for name, low in self.min.items():
            high = (self.max or {}).get(name)
            if high is not None and parse_quantity(high) < parse_quantity(low):
                raise ValueError(f"max.{name} ({high}) is below min.{name} ({low})")


class ElasticQuotaStatus(BaseModel):
    """What the team's admitted (ungated, unfinished) GPU pods ask for now."""

    model_config = ConfigDict(extra="allow", populate_by_name=True)

    used: dict[str, str] = Field(default_factory=dict)


def parse_elastic_quota(obj: Mapping[str, Any]) -> ElasticQuotaSpec:
    """The spec of an ElasticQuota object; ConfigError naming the object and the field."""
    meta = obj.get("metadata") or {}
    where = f"ElasticQuota {meta.get('namespace', '')}/{meta.get('name', '')}"
    try:
        spec = ElasticQuotaSpec.model_validate(obj.get("spec") or {})
        spec.check()
    except ValidationError as exc:
        first = exc.errors()[0]
        path = ".".join(str(p) for p in first["loc"])
        raise ConfigError(f"{where}: spec.{path}: {first['msg']}") from None
    except (ValueError, ConfigError) as exc:
        raise ConfigError(f"{where}: spec: {exc}") from None
    return spec


def _column(name: str, path: str, description: str) -> dict[str, Any]:
    return {"name": name, "type": "string", "jsonPath": path, "description": description}


def elastic_quota_crd() -> dict[str, Any]:
    """The CRD: `kubectl get elasticquota` shows used / min / max of GPU memory."""
    escaped = GPU_MEMORY_RESOURCE.replace(".", "\\.")
    return custom_resource_definition(
        group=GROUP, kind=KIND, plural=PLURAL, spec=ElasticQuotaSpec, status=ElasticQuotaStatus, scope="Namespaced",
        version=VERSION, short_names=("eq",),
        printer_columns=(
            _column("Used", f".status.used.{escaped}", "GPU memory the team's admitted pods are charged"),
            _column("Min", f".spec.min.{escaped}", "Guaranteed GPU memory"),
            _column("Max", f".spec.max.{escaped}", "Most GPU memory it may borrow up to"),
            {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
        ),
    )


register_kind(ResourceKind(KIND, GROUP, VERSION, PLURAL, namespaced=True, status_subresource=True,
                           strategic_merge=False))
