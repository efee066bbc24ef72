"""Holding a new node for the pods it was bought for, pure: which pods to let onto which reserved node, when a node's
reservation ends, and the `status.nominatedNodeName` each pending pod should carry.

kube-scheduler's default profile scores a node by its free CPU and memory, so left alone it puts a 1-GPU pod on the
empty 8-GPU node bought for an 8-GPU pod; that pod is then displaced and needs a node of its own, and the node bought
for the 1-GPU pod is left unused: launches with no pod to land. Two levers, both used:

- **A reservation taint.** Every NodeClaim the provisioner buys carries `kubegpu.io/reserved=<token>:NoSchedule`
  (the token is the claim's own, drawn at creation), and each pod planned onto it gets the matching toleration
  (pods may gain tolerations while pending). Until every such pod is bound, only they can land on the node; then
  (or once no pending pod is planned there any more: a pod deleted, a new leader with no plan) the taint is lifted
  and the node's leftover room is anyone's. This is what holds the plan: measured on Kubernetes 1.37.2, a
  nomination alone does not (below). The planner itself ignores the taint: it plans with its own nominations.
- **`status.nominatedNodeName`.** kube-scheduler tries a pod's nominated node first (PreferNominatedNode) and counts
  nominated pods' requests as taken when filtering others of the same or lower priority (KEP-5278,
  `NominatedNodeNameForExpectation`, beta and on in 1.37). The provisioner nominates each planned pod once its node
  has a name (lifecycle calls it just before registration). But kube-scheduler 1.37.2 still clears an external
  nomination after a failed attempt whose preemption found no victims ("No preemption victims found for incoming
  pod": every pod of a burst that fails once a full node exists) and whenever no node exists at all, so a pod
  nominated to a node still booting loses it before the node is usable. The nomination is written once per pod and
  node, not fought over; the taint does the holding.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from kubegpu.autoscaler.labels import RESERVED_TAINT_KEY
from kubegpu.autoscaler.objects import name_of
from kubegpu.autoscaler.scheduler import pod_key


def reservation_taint(token: str) -> dict[str, str]:
    return {"key": RESERVED_TAINT_KEY, "value": token, "effect": "NoSchedule"}


def reservation_toleration(token: str) -> dict[str, str]:
    return {"key": RESERVED_TAINT_KEY, "operator": "Equal", "value": token, "effect": "NoSchedule"}


def toleration_identity(toleration: Any) -> Any:
    """Two tolerations are one when every field agrees (a pod may hold several of ours, one per node it was planned
    onto)."""
    return tuple(sorted(toleration.items())) if isinstance(toleration, Mapping) else toleration


def reservation_token(obj: Mapping[str, Any]) -> str | None:
    """The token of a NodeClaim's or a Node's reservation taint; None without one."""
    for taint in (obj.get("spec") or {}).get("taints") or ():
        if taint.get("key") == RESERVED_TAINT_KEY:
            return str(taint.get("value") or "")
    return None


def without_reservation(node: dict[str, Any]) -> dict[str, Any]:
    """The Node (or in-flight stand-in) as the planner sees it: the reservation taint is the planner's own, and its
    nominations already say who may go there."""
    spec = node.get("spec") or {}
    taints = [t for t in spec.get("taints") or () if t.get("key") != RESERVED_TAINT_KEY]
    return {**node, "spec": {**spec, "taints": taints}}


def node_names(nodeclaims: Iterable[Mapping[str, Any]], nodes: Iterable[str]) -> dict[str, str]:
    """Nomination target (a NodeClaim's or a Node's name) → the Node a pod nominated to it is expected on: the claim's
    `status.nodeName` once launched, a Node's own name. A claim not launched yet has no entry."""
    names = {name: name for name in nodes}
    for claim in nodeclaims:
        node = (claim.get("status") or {}).get("nodeName") or ""
        if node and not (claim.get("metadata") or {}).get("deletionTimestamp"):
            names[name_of(claim)] = node
    return names


def by_pod(nominations: Mapping[str, set[str]], targets: Mapping[str, str]) -> dict[str, str]:
    """Pod key → what its nomination target maps to in `targets` (a node name, a token), where it has an entry."""
    found: dict[str, str] = {}
    for target, keys in nominations.items():
        value = targets.get(target) or targets.get(target.removeprefix("nodeclaim/"))
        if value:
            for key in keys:
                found[key] = value
    return found


def reservation_tokens(nodeclaims: Iterable[Mapping[str, Any]],
                       nodes: Mapping[str, Mapping[str, Any]]) -> dict[str, str]:
    """Nomination target (claim name, node name) → the token of its reservation, for claims and nodes holding one."""
    tokens: dict[str, str] = {}
    for name, node in nodes.items():
        if (token := reservation_token(node)) is not None:
            tokens[name] = token
    for claim in nodeclaims:
        if (token := reservation_token(claim)) is not None and not (claim.get("metadata") or {}).get(
                "deletionTimestamp"):
            tokens[name_of(claim)] = token
    return tokens


def tolerations_due(pending: Sequence[dict[str, Any]], tokens: Mapping[str, str]) -> list[tuple[dict[str, Any], str]]:
    """(pod, token) for every pending pod planned onto a reserved node or claim (`tokens`: pod key → token) that does
    not tolerate that reservation yet."""
    due: list[tuple[dict[str, Any], str]] = []
    for pod in pending:
        token = tokens.get(pod_key(pod))
        if token is None:
            continue
        wanted = toleration_identity(reservation_toleration(token))
        held = (pod.get("spec") or {}).get("tolerations") or ()
        if not any(toleration_identity(t) == wanted for t in held):
            due.append((pod, token))
    return due


def reservations_to_lift(nodes: Mapping[str, Mapping[str, Any]], node_of_claim: Mapping[str, str],
                         nominations: Mapping[str, set[str]], pending: Iterable[str]) -> list[str]:
    """The Nodes whose reservation taint can go: no pending pod is planned onto them (or their NodeClaim) any more —
    every pod they were bought for is bound, or gone. `node_of_claim`: claim name → node name."""
    waiting = set(pending)
    held: set[str] = set()
    for target, keys in nominations.items():
        if keys & waiting:
            name = target.removeprefix("nodeclaim/")
            held.add(node_of_claim.get(name, name))
    return sorted(name for name, node in nodes.items() if reservation_token(node) is not None and name not in held)


def current_nomination(pod: Mapping[str, Any]) -> str:
    return str((pod.get("status") or {}).get("nominatedNodeName") or "")


def nomination_writes(pending: Sequence[dict[str, Any]], wanted: Mapping[str, str],
                      written: Mapping[str, str]) -> list[tuple[dict[str, Any], str | None]]:
    """(pod, node name to nominate, or None to clear) for every pending pod whose field differs from what it should
    carry. `written` is what this replica wrote (pod key → node name): a pod is nominated once per node (kube-scheduler
    may clear it after a failed attempt; it is not written again), and a nomination is cleared only if it is ours
    (a stale one would hold room on a node the pod will not go to), never one kube-scheduler set for a preemption."""
    writes: list[tuple[dict[str, Any], str | None]] = []
    for pod in pending:
        key = pod_key(pod)
        now_on = current_nomination(pod)
        target = wanted.get(key)
        if target is not None:
            if now_on != target and written.get(key) != target:
                writes.append((pod, target))
        elif now_on and written.get(key) == now_on:
            writes.append((pod, None))
    return writes


def nomination_patch(node: str | None) -> dict[str, Any]:
    """The merge patch of the pod's status subresource that sets (or, with None, removes) the nomination."""
    return {"status": {"nominatedNodeName": node}}


class NominationLedger:
    """The nominations this replica wrote (pod key → node name), for `nomination_writes`. No I/O: the provisioner
    sends the writes and records those that went through; lifecycle's workers do too, hence the lock."""

    def __init__(self) -> None:
        self.written: dict[str, str] = {}
        self._lock = threading.Lock()

    def due(self, pending: Sequence[dict[str, Any]],
            wanted: Mapping[str, str]) -> list[tuple[dict[str, Any], str | None]]:
        """The writes to send this pass; pods no longer pending are forgotten."""
        keys = {pod_key(p) for p in pending}
        with self._lock:
            self.written = {k: v for k, v in self.written.items() if k in keys}
            return nomination_writes(pending, wanted, self.written)

    def unwritten(self, keys: Iterable[str], node: str) -> list[str]:
        """Of `keys`, the pods not yet nominated to `node` by this replica."""
        with self._lock:
            return [key for key in keys if self.written.get(key) != node]

    def done(self, key: str, node: str | None) -> None:
        with self._lock:
            if node is None:
                self.written.pop(key, None)
            else:
                self.written[key] = node
