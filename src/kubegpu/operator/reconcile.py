"""The operator's decisions, pure: which policy acts, what to apply and delete, in which order, and what status to
report. The kopf handlers (controller.py) only read the cluster, call these, and write the answers back.

Outcomes follow the GPU Operator (reference §C.2): every state is applied in every pass (a not-ready state does not
stop the pass), any not-ready state makes the policy `notReady` with `OperandNotReady` and a requeue after 5 s;
all ready → `ready` with `Reconciled`, or `NoGPUNodes` / `NFDLabelsMissing` when that is the truth; a pass that
failed → `notReady` / `ReconcileFailed`; every policy but the oldest → `ignored`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kubegpu.operator.render import OWNER_LABEL, STATE_LABEL

NOT_READY_REQUEUE = 5.0
NFD_MISSING_REQUEUE = 45.0
Key = tuple[str, str, str, str]  # apiVersion, kind, namespace ("" when cluster-scoped), name


def key_of(obj: dict[str, Any]) -> Key:
    meta = obj.get("metadata") or {}
    return (obj.get("apiVersion", ""), obj.get("kind", ""), meta.get("namespace") or "", meta.get("name", ""))


def active_policy(policies: list[dict[str, Any]]) -> str | None:
    """The oldest ClusterPolicy acts (its name breaks ties); None when there is none."""
    if not policies:
        return None
    oldest = min(policies, key=lambda p: ((p.get("metadata") or {}).get("creationTimestamp") or "",
                                          (p.get("metadata") or {}).get("name") or ""))
    return str(oldest["metadata"]["name"])


def daemonset_ready(ds: dict[str, Any]) -> bool:
    """GPU Operator's isDaemonSetReady: nothing to schedule → ready; any unavailable pod → not ready; a rolling
    update is ready only once the latest generation is observed and every pod is updated and available."""
    status = ds.get("status") or {}
    generation = int((ds.get("metadata") or {}).get("generation") or 0)
    if not status or int(status.get("observedGeneration") or 0) < generation:
        return False  # the DaemonSet controller has not seen this spec yet (its zeros mean nothing)
    desired = int(status.get("desiredNumberScheduled") or 0)
    if desired == 0:
        return True
    if int(status.get("numberUnavailable") or 0) != 0:
        return False
    strategy = ((ds.get("spec") or {}).get("updateStrategy") or {}).get("type", "RollingUpdate")
    available = int(status.get("numberAvailable") or 0)
    if strategy == "RollingUpdate":
        return int(status.get("updatedNumberScheduled") or 0) == desired and available == desired
    return available == desired


def deployment_ready(dep: dict[str, Any]) -> bool:
    status = dep.get("status") or {}
    wanted = int((dep.get("spec") or {}).get("replicas", 1))
    generation = int((dep.get("metadata") or {}).get("generation") or 0)
    return int(status.get("observedGeneration") or 0) >= generation and \
        int(status.get("availableReplicas") or 0) >= wanted


def object_ready(obj: dict[str, Any]) -> bool:
    kind = obj.get("kind")
    if kind == "DaemonSet":
        return daemonset_ready(obj)
    if kind == "Deployment":
        return deployment_ready(obj)
    return True


@dataclass
class Plan:
    """One pass: objects to apply (in state order) and owned objects no longer wanted (to delete)."""

    apply: list[dict[str, Any]] = field(default_factory=list)
    delete: list[Key] = field(default_factory=list)
    states: dict[Key, str] = field(default_factory=dict)  # object → its state, for readiness


def plan(rendered: list[tuple[str, list[dict[str, Any]]]], existing: list[dict[str, Any]], policy: str) -> Plan:
    """Apply everything rendered; delete what this policy owns (its label) that is no longer rendered — a
    disabled component's objects, an operand removed from the policy. Deletion runs in reverse state order
    (workloads before the RBAC they use)."""
    result = Plan()
    wanted: set[Key] = set()
    for state, objects in rendered:
        for obj in objects:
            result.apply.append(obj)
            wanted.add(key_of(obj))
            result.states[key_of(obj)] = state
    owned = [o for o in existing if ((o.get("metadata") or {}).get("labels") or {}).get(OWNER_LABEL) == policy]
    order = {state: i for i, (state, _) in enumerate(rendered)}
    stale = [o for o in owned if key_of(o) not in wanted]
    stale.sort(key=lambda o: (-order.get(((o["metadata"].get("labels") or {}).get(STATE_LABEL, "")), -1),
                              _DELETE_ORDER.get(o.get("kind", ""), 0), key_of(o)))
    result.delete = [key_of(o) for o in stale]
    return result


_DELETE_ORDER = {"ServiceMonitor": 0, "Service": 1, "DaemonSet": 2, "Deployment": 2, "RoleBinding": 3, "Role": 4,
                 "ClusterRoleBinding": 5, "ClusterRole": 6, "ServiceAccount": 7}


def states_not_ready(p: Plan, live: dict[Key, dict[str, Any]]) -> list[str]:
    """States with a workload not ready (or not there yet), in state order."""
    out: list[str] = []
    for obj in p.apply:
        k = key_of(obj)
        if obj.get("kind") not in ("DaemonSet", "Deployment"):
            continue
        current = live.get(k)
        if (current is None or not object_ready(current)) and p.states[k] not in out:
            out.append(p.states[k])
    return out


@dataclass
class Status:
    state: str
    reason: str
    message: str
    requeue_after: float | None

    def conditions(self, now: str) -> list[dict[str, Any]]:
        ready = self.state == "ready"
        error_reason = "" if ready or self.state == "ignored" else self.reason
        return [
            {"type": "Ready", "status": "True" if ready else "False", "reason": self.reason,
             "message": self.message, "lastTransitionTime": now},
            {"type": "Error", "status": "True" if error_reason else "False", "reason": error_reason or self.reason,
             "message": self.message if error_reason else "", "lastTransitionTime": now},
        ]

    def body(self, namespace: str, now: str, previous: dict[str, Any] | None = None) -> dict[str, Any]:
        """The status subresource; a condition keeps its lastTransitionTime while its status does not change."""
        conditions = self.conditions(now)
        before = {c.get("type"): c for c in ((previous or {}).get("conditions") or [])}
        for condition in conditions:
            old = before.get(condition["type"])
            if old and old.get("status") == condition["status"] and old.get("lastTransitionTime"):
                condition["lastTransitionTime"] = old["lastTransitionTime"]
        return {"state": self.state, "namespace": namespace, "conditions": conditions}


def ignored(active: str) -> Status:
    return Status("ignored", "Ignored", f"ClusterPolicy {active} is the active one (the oldest acts)", None)


def failed(message: str) -> Status:
    return Status("notReady", "ReconcileFailed", message, NOT_READY_REQUEUE)


def outcome(not_ready: list[str], gpu_nodes: int, nfd_labelled: bool) -> Status:
    if not_ready:
        return Status("notReady", "OperandNotReady",
                      f"ClusterPolicy is not ready, states not ready: {not_ready}", NOT_READY_REQUEUE)
    if not nfd_labelled and gpu_nodes == 0:
        return Status("ready", "NFDLabelsMissing",
                      "no node has NFD's pci-10de label: install Node Feature Discovery or label GPU nodes "
                      "nvidia.com/gpu.present=true", NFD_MISSING_REQUEUE)
    if gpu_nodes == 0:
        return Status("ready", "NoGPUNodes", "no GPU node in the cluster", None)
    return Status("ready", "Reconciled", "ClusterPolicy reconciled", None)
