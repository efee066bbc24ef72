"""The resource kinds the Cluster interface serves: where each lives in the API and how it behaves.

One registry for both implementations, so the in-memory store scopes, versions and subresources objects exactly the
way the lightkube adapter addresses them on a real API server. Components may `register_kind` more.
"""

from __future__ import annotations

from dataclasses import dataclass

from kubegpu.errors import NotFoundError

KUBEGPU_GROUP = "kubegpu.io"


@dataclass(frozen=True)
class ResourceKind:
    kind: str
    group: str  # "" for the core group
    version: str
    plural: str
    namespaced: bool
    status_subresource: bool
    strategic_merge: bool = True  # False for custom resources: the API server rejects strategic merge patches (415)

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def is_custom(self) -> bool:
        return not self.strategic_merge


KINDS: dict[str, ResourceKind] = {}


def register_kind(kind: ResourceKind) -> ResourceKind:
    """Add (or replace) a kind, e.g. a component's own custom resource."""
    KINDS[kind.kind] = kind
    return kind


for _kind in (
    ResourceKind("Node", "", "v1", "nodes", namespaced=False, status_subresource=True),
    ResourceKind("Pod", "", "v1", "pods", namespaced=True, status_subresource=True),
    ResourceKind("ConfigMap", "", "v1", "configmaps", namespaced=True, status_subresource=False),
    ResourceKind("Event", "", "v1", "events", namespaced=True, status_subresource=False),
    ResourceKind("DaemonSet", "apps", "v1", "daemonsets", namespaced=True, status_subresource=True),
    ResourceKind("Lease", "coordination.k8s.io", "v1", "leases", namespaced=True, status_subresource=False),
    ResourceKind("PodDisruptionBudget", "policy", "v1", "poddisruptionbudgets", namespaced=True,
                 status_subresource=True),
    ResourceKind("NodePool", KUBEGPU_GROUP, "v1", "nodepools", namespaced=False, status_subresource=True,
                 strategic_merge=False),
    ResourceKind("NodeClaim", KUBEGPU_GROUP, "v1", "nodeclaims", namespaced=False, status_subresource=True,
                 strategic_merge=False),
    ResourceKind("ClusterPolicy", KUBEGPU_GROUP, "v1", "clusterpolicies", namespaced=False, status_subresource=True,
                 strategic_merge=False),
):
    register_kind(_kind)


def resource_kind(kind: str) -> ResourceKind:
    """The registered kind; NotFoundError naming it (and the known ones) otherwise."""
    found = KINDS.get(kind)
    if found is None:
        raise NotFoundError(f"resource kind {kind!r} is not known (known: {', '.join(sorted(KINDS))})")
    return found
