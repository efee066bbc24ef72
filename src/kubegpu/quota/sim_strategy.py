"""The `+quota` simulator modifier: elastic team quotas (`kubegpu.quota.elastic.decide`, the controller's own
decision) on top of any strategy, so the simulator compares them with plain namespace quotas (its default for a
scenario's `teams:`). Offered to the simulator as an entry point (`kubegpu.sim.modifiers`); the simulator imports no
controller."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from kubegpu.quota.elastic import ElasticLedger, QuotaPod, TeamQuota
from kubegpu.sharing.names import GPU_MEMORY_RESOURCE

if TYPE_CHECKING:
    from kubegpu.sim.strategies import Strategy
    from kubegpu.sim.teams import TeamLimits, TeamPod


class ElasticAdmission:
    """`kubegpu.sim.teams.Admission` over the elastic-quota decision: an `ElasticLedger` told of each pod as the
    simulator holds, admits, binds and stops it, so each scheduling pass's decision costs what changed, not every
    unfinished pod (its answer is what `decide` over every pod gives: the ledger's tests prove it)."""

    def __init__(self) -> None:
        self._ledger = ElasticLedger([])
        self._ledger_keys: dict[str, str] = {}  # the simulator's key → the ledger's (namespace/name)

    def start(self, teams: Sequence[TeamLimits]) -> None:
        """A new run with these teams: nothing held yet."""
        self._ledger = ElasticLedger([TeamQuota(t.namespace, {GPU_MEMORY_RESOURCE: t.min_bytes},
                                                {GPU_MEMORY_RESOURCE: t.max_bytes} if t.max_bytes is not None else None)
                                      for t in teams])
        self._ledger_keys = {}

    def put(self, pod: TeamPod) -> None:
        view = QuotaPod(pod.namespace, pod.key, {GPU_MEMORY_RESOURCE: pod.charge}, pod.created, gated=pod.gated,
                        bound=pod.bound)
        self._ledger_keys[pod.key] = view.key
        self._ledger.put(view)

    def remove(self, key: str) -> None:
        ledger_key = self._ledger_keys.pop(key, None)
        if ledger_key is not None:
            self._ledger.remove(ledger_key)

    def decide(self, capacity: float) -> tuple[list[str], list[str]]:
        decision = self._ledger.decide(capacity)
        return [p.name for p in decision.lift], [e.pod.name for e in decision.evict]


def apply_quota(strategy: Strategy) -> Strategy:
    """`<strategy>+quota`: the scenario's teams get elastic quotas instead of plain namespace quotas."""
    strategy.team_admission = ElasticAdmission()  # type: ignore[attr-defined]
    return strategy
