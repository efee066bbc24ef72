"""What every custom resource model we read shares: the strict base and the metadata we need of an object.

NodePool, EC2NodeClass and ClusterPolicy are read by different components but follow one API convention, so the
base (unknown fields are errors, so a typo is named instead of silently ignored) and `metadata` live here once.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class ApiModel(BaseModel):
    """A part of a custom resource's spec or status: unknown fields are rejected, camelCase aliases accepted."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class ObjectMeta(ApiModel):
    """The object metadata: only `name` is required; labels, annotations and server fields pass through."""

    model_config = ConfigDict(extra="allow")
    name: str = Field(min_length=1)


__all__ = ["ApiModel", "ObjectMeta"]
