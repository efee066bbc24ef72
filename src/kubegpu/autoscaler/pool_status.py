"""NodePool status as Karpenter writes it: `ValidationSucceeded`, `NodeClassReady` and the root `Ready`, plus
`status.resources` (what the pool's NodeClaims hold, with `nodes`).

A NodePool whose NodeClass is not ready (an EC2NodeClass whose subnet selector matches nothing, or that does not
exist) launches nothing — the provisioning pass gives it no instance types — and its status says why, so
`kubectl get nodepools` shows it before anyone hunts through pod events. The kwok provider has no NodeClass to wait
for: its pools' class is always ready. The status is written only when it changes, through the status subresource.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from kubegpu.autoscaler import labels as L
from kubegpu.autoscaler.objects import name_of, with_condition
from kubegpu.errors import KubegpuError
from kubegpu.scheduling.quantity import format_quantity, parse_quantity

if TYPE_CHECKING:
    from kubegpu.autoscaler.api import NodePool
    from kubegpu.clock import Clock
    from kubegpu.kube import Cluster

VALIDATION, NODECLASS, READY = "ValidationSucceeded", "NodeClassReady", "Ready"


def claim_capacity(claim: Mapping[str, Any]) -> dict[str, float]:
    status = claim.get("status") or {}
    raw = status.get("capacity") or ((claim.get("spec") or {}).get("resources") or {}).get("requests") or {}
    return {k: parse_quantity(v) for k, v in raw.items()}


def pool_usage(nodeclaims: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, float]]:
    """Per NodePool: the summed capacity of its NodeClaims and their count (for `limits`)."""
    usage: dict[str, dict[str, float]] = {}
    for claim in nodeclaims:
        pool = ((claim.get("metadata") or {}).get("labels") or {}).get(L.NODEPOOL_LABEL)
        if not pool:
            continue
        total = usage.setdefault(pool, {"nodes": 0.0})
        total["nodes"] += 1
        for k, v in claim_capacity(claim).items():
            total[k] = total.get(k, 0.0) + v
    return usage


def pool_conditions(current: Iterable[Mapping[str, Any]], invalid: str | None, class_why: str | None,
                    now: float, generation: int | None = None) -> list[dict[str, Any]]:
    """The pool's conditions given why it is invalid and why its NodeClass is not ready (None: it is)."""
    conds = [dict(c) for c in current if c.get("type") in (VALIDATION, NODECLASS, READY)]
    if invalid is None:
        conds = with_condition(conds, VALIDATION, "True", VALIDATION, now)
    else:
        conds = with_condition(conds, VALIDATION, "False", "NodePoolValidationFailed", now, invalid)
    if class_why is None:
        conds = with_condition(conds, NODECLASS, "True", NODECLASS, now)
    else:
        reason = "NodeClassNotFound" if "not found" in class_why else "NodeClassNotReady"
        conds = with_condition(conds, NODECLASS, "False", reason, now, class_why)
    failing = [c for c in conds if c["type"] != READY and c["status"] != "True"]
    if failing:
        message = "; ".join(f"{c['type']}=False: {c.get('message') or c.get('reason')}" for c in failing)
        conds = with_condition(conds, READY, "False", "UnhealthyDependents", now, message)
    else:
        conds = with_condition(conds, READY, "True", READY, now)
    if generation is not None:
        conds = [{**c, "observedGeneration": generation} for c in conds]
    order = {VALIDATION: 0, NODECLASS: 1, READY: 2}
    return sorted(conds, key=lambda c: order[c["type"]])


def _same(a: Iterable[Mapping[str, Any]], b: Iterable[Mapping[str, Any]]) -> bool:
    def key(conds: Iterable[Mapping[str, Any]]) -> list[tuple[Any, ...]]:
        return sorted((c.get("type"), c.get("status"), c.get("reason"), c.get("message") or "",
                       c.get("observedGeneration")) for c in conds)
    return key(a) == key(b)


class PoolStatus:
    """Writes each NodePool's conditions and resources when they change (module doc)."""

    def __init__(self, cluster: Cluster, clock: Clock, log: Callable[[str], None]) -> None:
        self.cluster = cluster
        self.clock = clock
        self.log = log

    def reconcile(self, raw_pools: Iterable[Mapping[str, Any]], parsed: Mapping[str, NodePool],
                  invalid: Mapping[str, str], class_not_ready: Callable[[NodePool], str | None] | None,
                  usage: Mapping[str, Mapping[str, float]]) -> None:
        now = self.clock.now()
        for raw in raw_pools:
            meta = raw.get("metadata") or {}
            if meta.get("deletionTimestamp"):
                continue
            name = name_of(raw)
            pool = parsed.get(name)
            why = None
            if pool is not None and class_not_ready is not None:
                try:
                    why = class_not_ready(pool)
                except KubegpuError as exc:
                    why = str(exc)
            status = raw.get("status") or {}
            generation = meta.get("generation")
            conds = pool_conditions(status.get("conditions") or [], invalid.get(name), why, now,
                                    generation if isinstance(generation, int) else None)
            resources = {k: format_quantity(v) for k, v in sorted((usage.get(name) or {"nodes": 0.0}).items())}
            if _same(conds, status.get("conditions") or []) and resources == (status.get("resources") or {}):
                continue
            try:
                self.cluster.patch("NodePool", name, {"status": {"conditions": conds, "resources": resources}},
                                   subresource="status")
            except KubegpuError as exc:
                self.log(f"nodepool {name}: cannot write its status: {exc}")
