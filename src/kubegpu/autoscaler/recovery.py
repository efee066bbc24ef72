"""Record before act, and the pass that finds what a crashed or deposed leader left half done.

Every act of the autoscaler that outlives a pass is written to the API before it is done, or in the same write:

- a **disruption command**: the candidates' NodeClaims carry the `kubegpu.io/disruption` record (reason, every
  candidate, the replacements' names, chosen before they are created) before any candidate is tainted
  (`disruption.py`);
- a **termination**: the NodeClaim's `kubegpu.io/termination-reason` annotation is written before its node is
  tainted and the claim deleted (`termination.py`); from the deletion on, the `deletionTimestamp` and the finalizer
  carry it;
- a **surplus cordon** or an interruption's: the taint and the Node's `kubegpu.io/disrupted-reason` annotation go
  in one write (`set_disrupted`), so a cordon never exists without its reason.

`Recovery.reconcile` runs at the start of every pass, so a new leader's first pass includes it: a termination that
was recorded but whose NodeClaim was never deleted is started again, and a `kubegpu.io/disrupted` taint that no live
record explains is lifted (as Karpenter lifts the disrupted taints of nodes not in its orchestration queue). A taint
is judged on fresh reads of the Node and the NodeClaim, never on the informers' cache alone, whose kinds are watched
separately (the taint may arrive before the record that explains it). Disruption's own records are finished or
rolled back by disruption itself (`Disruption._progress`), surplus cordons by the provisioner, which adopts them.

Writes of the taint list go through `kubegpu.kube.retry.update_with_retry` (the resourceVersion of a fresh read,
read again on 409), so a taint another controller added meanwhile is never dropped.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

from kubegpu.autoscaler import labels as L
from kubegpu.autoscaler.objects import has_taint, name_of
from kubegpu.autoscaler.termination import REASON_ANNOTATION
from kubegpu.errors import KubegpuError
from kubegpu.kube import NotFound
from kubegpu.kube.retry import update_with_retry

if TYPE_CHECKING:
    from kubegpu.autoscaler.cluster_state import Snapshot
    from kubegpu.autoscaler.termination import Termination
    from kubegpu.kube import Cluster

DISRUPTED_REASON_ANNOTATION = "kubegpu.io/disrupted-reason"   # on the Node, written with the disrupted taint
UNUSED, INTERRUPTION, DISRUPTION = "unused", "interruption", "disruption"
# cordons whose owner resolves them: the provisioner adopts its surplus cordons; an interruption's is laid before its
# SQS message is deleted, so the message comes back to whichever replica leads and is handled again
SELF_RESOLVED = frozenset({UNUSED, INTERRUPTION})
WRITE_ATTEMPTS = 10


def fresh(cluster: Cluster) -> Cluster:
    """The store behind an informed cluster: a read from it is the API server's current object, not the cache's."""
    store = getattr(cluster, "store", None)
    return store if store is not None else cluster


def set_disrupted(cluster: Cluster, node_name: str, on: bool, reason: str | None = DISRUPTION) -> bool:
    """Lay (`on`) or lift the `kubegpu.io/disrupted:NoSchedule` taint, with the Node's reason annotation in the same
    write (laid with the taint, removed with it). Lifting with a `reason` lifts only a taint laid for that reason
    (the provisioner never lifts disruption's, nor disruption the provisioner's); None lifts any. False when the
    Node is gone."""
    key = L.DISRUPTED_TAINT["key"]

    def mutate(node: dict[str, Any]) -> dict[str, Any] | None:
        taints = (node.get("spec") or {}).get("taints") or []
        rest = [t for t in taints if t.get("key") != key]
        recorded = ((node.get("metadata") or {}).get("annotations") or {}).get(DISRUPTED_REASON_ANNOTATION)
        if not on and reason is not None and recorded != reason:
            return None   # laid for another reason: its owner lifts it
        wanted = reason if on else None
        if has_taint(node, L.DISRUPTED_TAINT) == on and len(taints) - len(rest) == int(on) and recorded == wanted:
            return None
        return {"metadata": {"annotations": {DISRUPTED_REASON_ANNOTATION: wanted}},
                "spec": {"taints": [*rest, dict(L.DISRUPTED_TAINT)] if on else rest}}

    try:
        update_with_retry(cluster, "Node", node_name, mutate, attempts=WRITE_ATTEMPTS)
    except NotFound:
        return False
    return True


def disrupted_reason(node: Mapping[str, Any]) -> str | None:
    return ((node.get("metadata") or {}).get("annotations") or {}).get(DISRUPTED_REASON_ANNOTATION)


def unused_cordons(claims: Iterable[Mapping[str, Any]], nodes: Mapping[str, Mapping[str, Any]]) -> dict[str, str]:
    """NodeClaim → node, for the claims whose node carries a surplus cordon (the taint with reason `unused`): what
    the provisioner takes over from a previous leader."""
    out: dict[str, str] = {}
    for claim in claims:
        node = nodes.get((claim.get("status") or {}).get("nodeName") or "")
        if node is not None and has_taint(node, L.DISRUPTED_TAINT) and disrupted_reason(node) == UNUSED:
            out[name_of(claim)] = name_of(node)
    return out


class Recovery:
    """The pass that finishes recorded terminations and lifts orphan taints (module doc)."""

    def __init__(self, cluster: Cluster, termination: Termination, log: Callable[[str], None]) -> None:
        self.cluster = cluster
        self.termination = termination
        self.log = log
        self.lifted: list[str] = []      # nodes whose orphan taint was lifted (for tests and logs)
        self.resumed: list[str] = []     # NodeClaims whose recorded termination was started again

    def reconcile(self, snapshot: Snapshot) -> None:
        for claim in snapshot.nodeclaims:
            reason = ((claim.get("metadata") or {}).get("annotations") or {}).get(REASON_ANNOTATION)
            if reason and not self.termination.is_terminating(claim):
                self.log(f"nodeclaim {name_of(claim)}: resuming its recorded termination ({reason})")
                self.termination.start(claim, reason)
                self.resumed.append(name_of(claim))
        by_node = {(c.get("status") or {}).get("nodeName"): c for c in snapshot.nodeclaims}
        for node in snapshot.nodes.values():
            owner = by_node.get(name_of(node))
            if owner is None or not has_taint(node, L.DISRUPTED_TAINT) or self._explained(owner, node):
                continue
            try:
                self._lift_if_orphan(name_of(owner), name_of(node))
            except KubegpuError as exc:
                self.log(f"node {name_of(node)}: cannot lift an orphan disrupted taint: {exc}")

    def _explained(self, claim: Mapping[str, Any], node: Mapping[str, Any]) -> bool:
        """Whether a live record accounts for the node's disrupted taint."""
        meta = claim.get("metadata") or {}
        annotations = meta.get("annotations") or {}
        return bool((node.get("metadata") or {}).get("deletionTimestamp")
                    or self.termination.is_terminating(claim)
                    or annotations.get(REASON_ANNOTATION) or annotations.get(L.DISRUPTION_ANNOTATION)
                    or disrupted_reason(node) in SELF_RESOLVED)

    def _lift_if_orphan(self, claim_name: str, node_name: str) -> None:
        """Judge again on the API server's current objects, then lift the taint (and its reason) if still orphan."""
        try:
            claim = fresh(self.cluster).get("NodeClaim", claim_name)
            node = fresh(self.cluster).get("Node", node_name)
        except NotFound:
            return   # the claim or node is going: termination follows it
        if not has_taint(node, L.DISRUPTED_TAINT) or self._explained(claim, node):
            return
        self.log(f"node {node_name}: lifting a disrupted taint no record explains")
        if set_disrupted(self.cluster, node_name, False, None):
            self.lifted.append(node_name)
