"""Re-planning from where pods actually landed, pure: which nominations still hold, and which NodeClaims
nobody needs any more.

kube-scheduler's default profile spreads small pods onto big empty nodes, so without more the set of nodes a pass
bought is not where its pods end up. New nodes are held for their pods (`nomination.py`); for what that does not cover
(nodes that were there before, a hold lifted by a new leader) each provisioning pass starts from the cluster as it
is — pods where they are bound, in-flight NodeClaims (launched or not, registered or not) as the capacity they will
bring — and:

- **keeps** a pending pod's nomination from the pass before while its node or NodeClaim still exists and still has
  room for it next to what really landed there (`keep_nominated`), so a re-plan does not shuffle pods between
  in-flight claims and buy more for the ones it dropped; only the pods that no longer fit (displaced by what the
  scheduler put there) and new ones are planned again, onto free existing capacity first;
- finds the NodeClaims it bought that nothing uses (`SurplusTracker`): no pod bound, no pending pod kept on or
  planned onto it, never used, for `grace` seconds in a row. They were bought for pods that landed elsewhere, so
  they are deleted even with consolidation off (Karpenter would consolidate them as Empty). A claim that once had
  pods, or whose node has been Initialized for longer than `SURPLUS_WINDOW`, is the consolidation's business, never
  this — an empty node a user keeps with `consolidateAfter: Never` stays.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kubegpu.autoscaler import labels as L
from kubegpu.autoscaler.objects import condition, do_not_disrupt, is_reschedulable, name_of
from kubegpu.autoscaler.pending import prepare_pod, repels
from kubegpu.autoscaler.scheduler import pod_key
from kubegpu.kube import parse_timestamp
from kubegpu.scheduling import NodeInfo, fits, node_info

SURPLUS_WINDOW = 120.0   # seconds after initialization during which an unused NodeClaim still counts as a mis-buy


def target_aliases(nodeclaims: Iterable[Mapping[str, Any]], nodes: Iterable[str]) -> dict[str, str]:
    """Nomination target (a NodeClaim's or a node's name) → the name of its `NodeInfo` in `existing_infos`
    (the node's name once the claim has one, `nodeclaim/<name>` before)."""
    aliases = {name: name for name in nodes}
    for claim in nodeclaims:
        node = (claim.get("status") or {}).get("nodeName") or ""
        aliases[name_of(claim)] = node or f"nodeclaim/{name_of(claim)}"
        if node:
            aliases[node] = node
    return aliases


def keep_nominated(infos: Sequence[NodeInfo], pending: Sequence[dict[str, Any]],
                   nominations: Mapping[str, set[str]], aliases: Mapping[str, str],
                   ) -> tuple[dict[str, list[dict[str, Any]]], list[dict[str, Any]]]:
    """Pending pods whose nomination still holds, counted onto their target's `NodeInfo` (which this changes), by
    info name; and the pending pods to plan again. Pods are tried in the order given, so the caller's queue order
    decides who keeps a place that is now too small for all its nominees."""
    by_name = {info.name: info for info in infos}
    target_of: dict[str, str] = {}
    for target, keys in nominations.items():
        info_name = aliases.get(target)
        if info_name is not None:
            for key in keys:
                target_of[key] = info_name
    kept: dict[str, list[dict[str, Any]]] = {}
    rest: list[dict[str, Any]] = []
    for pod in pending:
        info = by_name.get(target_of.get(pod_key(pod), ""))
        if info is not None and fits(pod, info).ok and not _repelled(pod, info.pods):
            info.add_pod(pod)
            kept.setdefault(info.name, []).append(pod)
        else:
            rest.append(pod)
    return kept, rest


def _repelled(pod: dict[str, Any], there: Sequence[dict[str, Any]]) -> bool:
    """Required hostname anti-affinity, either way, between `pod` and a pod already on the node: a nomination that
    kube-scheduler can no longer honour (a pod it repels landed there meanwhile) is planned again, not kept."""
    mine = prepare_pod(pod) if _anti_affinity(pod) else None
    for other in there:
        if mine is not None and repels(mine, other):
            return True
        if _anti_affinity(other) and repels(prepare_pod(other), pod):
            return True
    return False


def _anti_affinity(pod: Mapping[str, Any]) -> bool:
    return bool(((pod.get("spec") or {}).get("affinity") or {}).get("podAntiAffinity"))


def replacements_under_way(nodeclaims: Iterable[Mapping[str, Any]]) -> set[str]:
    """The NodeClaims disruption launched as replacements (named in its candidates' annotation): empty until their
    candidates' pods move, and never surplus."""
    names: set[str] = set()
    for claim in nodeclaims:
        raw = ((claim.get("metadata") or {}).get("annotations") or {}).get(L.DISRUPTION_ANNOTATION)
        if not raw:
            continue
        try:
            names.update(str(n) for n in json.loads(raw)["replacements"])
        except (ValueError, KeyError, TypeError):
            continue   # not ours to read (disruption leaves it alone too)
    return names


def pod_shapes(pods: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """One pod per distinct spec: what "could any of these pods go there" needs to try (a burst has few shapes)."""
    shapes: dict[str, dict[str, Any]] = {}
    for pod in pods:
        shapes.setdefault(json.dumps(pod.get("spec") or {}, sort_keys=True, default=str), pod)
    return list(shapes.values())


def could_take(node: dict[str, Any], bound: Sequence[dict[str, Any]], shapes: Sequence[dict[str, Any]]) -> bool:
    """Whether kube-scheduler could bind one of the pending pods (their `pod_shapes`) to this node right now. It
    ignores nominations, so an empty schedulable node is not let go while a pending pod fits it: deleting it could
    evict a pod bound a moment after this pass read the cluster."""
    info = node_info(node, list(bound))
    return any(fits(pod, info).ok for pod in shapes)


def _used(pods: Iterable[Mapping[str, Any]]) -> bool:
    return any(is_reschedulable(p) for p in pods)


@dataclass
class SurplusTracker:
    """NodeClaims bought for pods that went elsewhere (module doc); `grace` seconds of being unused in a row before
    one is let go, so a pod bound a moment before the informer shows it, or a plan that changes its mind once,
    does not delete (or flap) a claim."""

    grace: float = 3.0
    since: dict[str, float] = field(default_factory=dict)   # claim name → first pass it was seen unused
    used: set[str] = field(default_factory=set)             # claims seen with pods (never surplus again)

    def update(self, nodeclaims: Sequence[Mapping[str, Any]], pods_on: Mapping[str, Sequence[Mapping[str, Any]]],
               needed: set[str], now: float) -> list[Mapping[str, Any]]:
        """The claims to delete now. `needed`: info names (see `target_aliases`) and claim names that pending pods
        are kept on or planned onto in this pass."""
        surplus: list[Mapping[str, Any]] = []
        seen: set[str] = set()
        replacements = replacements_under_way(nodeclaims)
        for claim in nodeclaims:
            name = name_of(claim)
            meta = claim.get("metadata") or {}
            if meta.get("deletionTimestamp") or name in self.used or name in replacements:
                continue
            node = (claim.get("status") or {}).get("nodeName") or ""
            if node and _used(pods_on.get(node, ())):
                self.used.add(name)
                continue
            if name in needed or (node and node in needed) or f"nodeclaim/{name}" in needed:
                continue
            if do_not_disrupt(claim) or self._settled(claim, now):
                continue
            seen.add(name)
            first = self.since.setdefault(name, now)
            if now - first >= self.grace:
                surplus.append(claim)
        self.since = {k: v for k, v in self.since.items() if k in seen}
        self.used &= {name_of(c) for c in nodeclaims}
        return surplus

    @staticmethod
    def _settled(claim: Mapping[str, Any], now: float) -> bool:
        """Initialized longer than `SURPLUS_WINDOW` ago: an empty node of long standing, not a mis-buy."""
        initialized = condition(claim, "Initialized")
        if initialized is None or initialized.get("status") != "True":
            return False
        at = parse_timestamp(initialized.get("lastTransitionTime"))
        return at is not None and now - at > SURPLUS_WINDOW
