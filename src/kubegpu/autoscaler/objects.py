"""Small shared readers over Kubernetes objects (plain dicts): conditions, pod classes, NodeClaim times.

Times are seconds from the controller's `Clock`, stored as RFC 3339 in conditions (as Kubernetes does) and as a
float annotation for the NodeClaim's creation, so virtual and real clocks both give exact ages.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from kubegpu.autoscaler import labels as L
from kubegpu.kube import format_timestamp, parse_timestamp
from kubegpu.scheduling import is_finished, is_scheduling_gated

CREATED_AT_ANNOTATION = "kubegpu.io/created-at"
LAST_POD_EVENT_ANNOTATION = "kubegpu.io/last-pod-event"




def condition(obj: Mapping[str, Any], kind: str) -> dict[str, Any] | None:
    for cond in (obj.get("status") or {}).get("conditions") or []:
        if cond.get("type") == kind:
            return dict(cond)
    return None


def is_true(obj: Mapping[str, Any], kind: str) -> bool:
    cond = condition(obj, kind)
    return cond is not None and cond.get("status") == "True"


def with_condition(conditions: Iterable[Mapping[str, Any]], kind: str, status: str, reason: str, now: float,
                   message: str = "") -> list[dict[str, Any]]:
    """The condition list with `kind` set; lastTransitionTime moves only when the status changes."""
    out: list[dict[str, Any]] = []
    found = False
    for cond in conditions:
        if cond.get("type") == kind:
            found = True
            changed = cond.get("status") != status
            out.append({"type": kind, "status": status, "reason": reason, "message": message,
                        "lastTransitionTime": format_timestamp(now) if changed else cond.get("lastTransitionTime")})
        else:
            out.append(dict(cond))
    if not found:
        out.append({"type": kind, "status": status, "reason": reason, "message": message,
                    "lastTransitionTime": format_timestamp(now)})
    return out


def same_taint(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    """Taints are one taint when key and effect agree (the value does not make another one, as in the API)."""
    return a.get("key") == b.get("key") and a.get("effect") == b.get("effect")


def has_taint(node: Mapping[str, Any], taint: Mapping[str, Any]) -> bool:
    return any(same_taint(t, taint) for t in (node.get("spec") or {}).get("taints") or [])


def name_of(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("name", ""))


def created_at(obj: Mapping[str, Any]) -> float:
    meta = obj.get("metadata") or {}
    raw = (meta.get("annotations") or {}).get(CREATED_AT_ANNOTATION)
    if raw is not None:
        try:
            return float(raw)
        except ValueError:
            pass
    return parse_timestamp(meta.get("creationTimestamp")) or 0.0


def is_daemon_pod(pod: Mapping[str, Any]) -> bool:
    owners = (pod.get("metadata") or {}).get("ownerReferences") or []
    return any(o.get("kind") == "DaemonSet" for o in owners)


def is_mirror(pod: Mapping[str, Any]) -> bool:
    return "kubernetes.io/config.mirror" in ((pod.get("metadata") or {}).get("annotations") or {})


def is_reschedulable(pod: Mapping[str, Any]) -> bool:
    """Pods that must move when their node goes: not daemonset, mirror, finished or already deleting."""
    meta = pod.get("metadata") or {}
    return not (is_daemon_pod(pod) or is_mirror(pod) or is_finished(pod) or meta.get("deletionTimestamp"))


def is_provisionable(pod: Mapping[str, Any]) -> bool:
    """Pending, unbound, not gated (a pod waiting for its team's quota needs no node), not a daemonset pod, not
    deleting: the pods the provisioner works for."""
    spec, status = pod.get("spec") or {}, pod.get("status") or {}
    return (not spec.get("nodeName") and status.get("phase", "Pending") == "Pending" and not is_scheduling_gated(pod)
            and not is_daemon_pod(pod) and not (pod.get("metadata") or {}).get("deletionTimestamp"))


def do_not_disrupt(obj: Mapping[str, Any]) -> bool:
    return ((obj.get("metadata") or {}).get("annotations") or {}).get(L.DO_NOT_DISRUPT_ANNOTATION) == "true"


def pods_by_node(pods: Iterable[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for pod in pods:
        node = (pod.get("spec") or {}).get("nodeName")
        if node and not is_finished(pod):
            out.setdefault(node, []).append(pod)
    return out


def is_critical(pod: Mapping[str, Any]) -> bool:
    return (pod.get("spec") or {}).get("priorityClassName") in L.CRITICAL_PRIORITY_CLASSES


def drain_group(pod: Mapping[str, Any]) -> int:
    """Karpenter's eviction order: non-critical non-daemon, non-critical daemon, critical non-daemon, then critical
    daemon pods."""
    return 2 * int(is_critical(pod)) + int(is_daemon_pod(pod))
