"""The elastic decision (`kubegpu.quota.elastic.decide`) and the controllers' respect for the quota gate."""

from __future__ import annotations

from typing import Any

from kubegpu.autoscaler.objects import is_provisionable
from kubegpu.partitioner.controller import could_help
from kubegpu.quota.elastic import QuotaPod, TeamQuota, decide
from kubegpu.scheduling import is_scheduling_gated

GIB = float(1 << 30)
MEM = "kubegpu.io/gpu-memory"


def team(ns: str, low: float, high: float | None = None) -> TeamQuota:
    return TeamQuota(ns, {MEM: low * GIB}, {MEM: high * GIB} if high is not None else None)


def qpod(ns: str, name: str, gib: float, created: float, **kw: Any) -> QuotaPod:
    return QuotaPod(ns, name, {MEM: gib * GIB}, created, **kw)


def test_within_min_always_lifted_even_without_free_capacity() -> None:
    pods = [qpod("a", "x", 40, 1, bound=True), qpod("b", "y", 40, 2, gated=True)]
    decision = decide([team("a", 40), team("b", 40)], pods, capacity=40 * GIB)
    assert [p.name for p in decision.lift] == ["y"] and not decision.borrowed


def test_borrowing_up_to_max_only_while_capacity_is_idle_oldest_first() -> None:
    pods = [qpod("a", f"p{i}", 20, i, gated=True) for i in range(6)]
    decision = decide([team("a", 40, 100), team("b", 40)], pods, capacity=100 * GIB)
    assert [p.name for p in decision.lift] == ["p0", "p1", "p2", "p3", "p4"]  # 100Gi: max and capacity
    assert decision.borrowed == {"a/p2", "a/p3", "a/p4"}
    capped = decide([team("a", 40, 60)], pods, capacity=200 * GIB)
    assert [p.name for p in capped.lift] == ["p0", "p1", "p2"]
    busy = decide([team("a", 40, 100)], [*pods, qpod("other", "z", 60, 0, bound=True)], capacity=100 * GIB)
    assert [p.name for p in busy.lift] == ["p0", "p1"]  # within min; nothing idle to borrow


def test_reclaim_youngest_borrowed_pods_never_below_the_owners_min() -> None:
    borrowed = [qpod("a", f"a{i}", 20, i, bound=True) for i in range(5)]  # a: 100Gi used, min 40
    waiting = [qpod("b", "b0", 20, 10), qpod("b", "b1", 20, 11)]  # b: lifted (within min 40), unplaced
    decision = decide([team("a", 40, 100), team("b", 40)], borrowed + waiting, capacity=100 * GIB)
    assert [e.pod.name for e in decision.evict] == ["a4", "a3"]
    assert "namespace a borrows beyond its min" in decision.evict[0].reason
    # terminating pods already on their way out are counted, so the next pass evicts no more
    gone = [qpod("a", p.name, 20, p.created, bound=True, terminating=p.name in ("a3", "a4")) for p in borrowed]
    assert decide([team("a", 40, 100), team("b", 40)], gone + waiting, capacity=100 * GIB).evict == []


def test_no_reclaim_for_a_team_over_its_min_or_when_capacity_is_free() -> None:
    borrowed = [qpod("a", f"a{i}", 20, i, bound=True) for i in range(4)]
    over = [qpod("b", "b0", 20, 10, bound=True), qpod("b", "b1", 20, 11), qpod("b", "b2", 20, 12)]
    assert decide([team("a", 40), team("b", 40)], borrowed + over, capacity=100 * GIB).evict == []
    assert decide([team("a", 40), team("b", 40)], borrowed + over[:2], capacity=200 * GIB).evict == []


def _pending(gates: list[str]) -> dict[str, Any]:
    return {"metadata": {"name": "p", "namespace": "a"}, "status": {"phase": "Pending"},
            "spec": {"schedulingGates": [{"name": g} for g in gates],
                     "containers": [{"name": "c", "resources": {"limits": {"nvidia.com/mig-1g.10gb": 1}}}]}}


def test_partitioner_and_autoscaler_never_act_for_a_gated_pod() -> None:
    gated, free = _pending(["kubegpu.io/quota"]), _pending([])
    assert is_scheduling_gated(gated) and not is_scheduling_gated(free)
    assert could_help(free) and not could_help(gated)
    assert is_provisionable(free) and not is_provisionable(gated)
