"""The Cluster interface (kubegpu.kube): one contract, an in-memory store and a lightkube adapter.

    from kubegpu.kube import MemoryCluster, LightkubeCluster, NotFound, Conflict, record_event
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kubegpu.kube.cluster import PATCH_TYPES, Cluster, WatchEvent, format_timestamp, parse_timestamp, record_event
from kubegpu.kube.errors import ApiError, BadRequest, Conflict, Gone, Invalid, NotFound, error_for
from kubegpu.kube.memory import MemoryCluster
from kubegpu.kube.resources import KINDS, KUBEGPU_GROUP, ResourceKind, register_kind, resource_kind

if TYPE_CHECKING:
    from kubegpu.kube.lightkube_cluster import LightkubeCluster

__all__ = [
    "KINDS",
    "KUBEGPU_GROUP",
    "PATCH_TYPES",
    "ApiError",
    "BadRequest",
    "Cluster",
    "Conflict",
    "Gone",
    "Invalid",
    "LightkubeCluster",
    "MemoryCluster",
    "NotFound",
    "ResourceKind",
    "WatchEvent",
    "error_for",
    "format_timestamp",
    "parse_timestamp",
    "record_event",
    "register_kind",
    "resource_kind",
]


def __getattr__(name: str) -> Any:
    # lightkube (and httpx) load only when the real-cluster adapter is used, keeping the simulator's import light.
    if name == "LightkubeCluster":
        from kubegpu.kube.lightkube_cluster import LightkubeCluster

        return LightkubeCluster
    raise AttributeError(name)
