"""Pod identity and lifecycle, written once for every component that reads Pods (requests: requests.py).

`pod_key` is the `namespace/name` every controller keys pending pods by (a pod with no namespace is in "default",
as the API server puts it); `is_finished` is kube-scheduler's test for a pod that no longer holds what it asked
for (phase Succeeded or Failed).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

FINISHED_PHASES = ("Succeeded", "Failed")
QUOTA_GATE = "kubegpu.io/quota"  # the scheduling gate a GPU pod waits behind for its team's quota (docs/quotas.md)


def pod_key(pod: Mapping[str, Any]) -> str:
    meta = pod.get("metadata") or {}
    return f"{meta.get('namespace') or 'default'}/{meta.get('name', '')}"


def is_scheduling_gated(pod: Mapping[str, Any]) -> bool:
    """The pod still has scheduling gates (`spec.schedulingGates`, e.g. `kubegpu.io/quota` while it waits for its
    team's quota): kube-scheduler does not consider it, so no controller may re-cut a GPU or buy a node for it."""
    return bool((pod.get("spec") or {}).get("schedulingGates"))


def is_finished(pod: Mapping[str, Any]) -> bool:
    return (pod.get("status") or {}).get("phase") in FINISHED_PHASES
