"""The `+quota` simulator modifier: elastic team quotas (`kubegpu.quota.elastic.decide`, the controller's own
decision) on top of any strategy, so the simulator compares them with plain namespace quotas (its default for a
scenario's `teams:`). Offered to the simulator as an entry point (`kubegpu.sim.modifiers`); the simulator imports no
controller."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from kubegpu.quota.elastic import QuotaPod, TeamQuota, decide
from kubegpu.sharing.names import GPU_MEMORY_RESOURCE

if TYPE_CHECKING:
    from kubegpu.sim.strategies import Strategy
    from kubegpu.sim.teams import TeamLimits, TeamPod


class ElasticAdmission:
    """`kubegpu.sim.teams.Admission` over the elastic-quota decision."""

    def decide(self, teams: Sequence[TeamLimits], pods: Sequence[TeamPod],
               capacity: float) -> tuple[list[str], list[str]]:
        quotas = [TeamQuota(t.namespace, {GPU_MEMORY_RESOURCE: t.min_bytes},
                            {GPU_MEMORY_RESOURCE: t.max_bytes} if t.max_bytes is not None else None) for t in teams]
        views = [QuotaPod(p.namespace, p.key, {GPU_MEMORY_RESOURCE: p.charge}, p.created, gated=p.gated,
                          bound=p.bound) for p in pods]
        decision = decide(quotas, views, capacity)
        return [p.name for p in decision.lift], [e.pod.name for e in decision.evict]


def apply_quota(strategy: Strategy) -> Strategy:
    """`<strategy>+quota`: the scenario's teams get elastic quotas instead of plain namespace quotas."""
    strategy.team_admission = ElasticAdmission()  # type: ignore[attr-defined]
    return strategy
