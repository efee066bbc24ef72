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
    """`kubegpu.sim.teams.Admission` over the elastic-quota decision.

    The simulator asks on every scheduling pass, over every unfinished pod; it keeps a pod's (immutable) view while
    the pod is unchanged, so the `QuotaPod` views (and the quotas) are kept too and rebuilt only for a new view — the
    decision itself still sees every pod, so its result is a fresh decision's."""

    def __init__(self) -> None:
        self._teams: Sequence[TeamLimits] | None = None
        self._quotas: list[TeamQuota] = []
        self._views: dict[str, tuple[TeamPod, QuotaPod]] = {}

    def quotas(self, teams: Sequence[TeamLimits]) -> list[TeamQuota]:
        if teams is not self._teams:
            self._teams = teams
            self._quotas = [TeamQuota(t.namespace, {GPU_MEMORY_RESOURCE: t.min_bytes},
                                      {GPU_MEMORY_RESOURCE: t.max_bytes} if t.max_bytes is not None else None)
                            for t in teams]
        return self._quotas

    def views(self, pods: Sequence[TeamPod]) -> list[QuotaPod]:
        """The decision's view of each pod, the last pass's where the simulator hands the same (immutable) view."""
        kept = self._views
        out = []
        for pod in pods:
            cached = kept.get(pod.key)
            if cached is None or cached[0] is not pod:
                cached = kept[pod.key] = (pod, QuotaPod(pod.namespace, pod.key, {GPU_MEMORY_RESOURCE: pod.charge},
                                                        pod.created, gated=pod.gated, bound=pod.bound))
            out.append(cached[1])
        if len(kept) > 2 * len(pods) + 64:  # forget finished pods now and then, not on every pass
            keys = {pod.key for pod in pods}
            self._views = {key: value for key, value in kept.items() if key in keys}
        return out

    def decide(self, teams: Sequence[TeamLimits], pods: Sequence[TeamPod],
               capacity: float) -> tuple[list[str], list[str]]:
        decision = decide(self.quotas(teams), self.views(pods), capacity)
        return [p.name for p in decision.lift], [e.pod.name for e in decision.evict]


def apply_quota(strategy: Strategy) -> Strategy:
    """`<strategy>+quota`: the scenario's teams get elastic quotas instead of plain namespace quotas."""
    strategy.team_admission = ElasticAdmission()  # type: ignore[attr-defined]
    return strategy
