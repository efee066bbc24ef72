"""Elastic team quotas, the pure decision: which gated pods to let through, which borrowed pods to reclaim.

Inputs are plain facts (each team's `min`/`max`, each GPU pod's charge, whether it is gated, bound or finished, when
it was created; the cluster's `kubegpu.io/gpu-memory` capacity), outputs are decisions; the controller
(`kubegpu.quota.controller`) reads and writes the API, the simulator (`kubegpu.quota.sim_strategy`) its own state.

Rules (nos's semantics, with a scheduling gate instead of a scheduler plugin, so nothing is ever rejected and lost):
* a team's `used` is what its admitted (ungated, unfinished) GPU pods are charged;
* gated pods are taken oldest first; a pod that keeps its team within `min` is always let through; one that takes it
  beyond `min` is let through only while it stays within `max` and the cluster has that much capacity no admitted pod
  holds (it borrows idle capacity);
* when a team within its `min` has admitted pods the scheduler cannot place because bound pods hold the capacity,
  borrowed pods — those of teams over their `min`, youngest first, never taking a team below its `min` — are
  evicted until the freed memory covers what it waits for.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property

from kubegpu.sharing.names import GPU_MEMORY_RESOURCE, GPU_RESOURCE

RESOURCES = (GPU_MEMORY_RESOURCE, GPU_RESOURCE)


@dataclass(frozen=True)
class TeamQuota:
    """One namespace's ElasticQuota: amounts per resource (bytes for gpu-memory, GPUs for nvidia.com/gpu)."""

    namespace: str
    min: Mapping[str, float]
    max: Mapping[str, float] | None = None  # None: no bound but the cluster


@dataclass(frozen=True)
class QuotaPod:
    """A GPU pod as the decision sees it."""

    namespace: str
    name: str
    amounts: Mapping[str, float]  # kubegpu.io/gpu-memory (and nvidia.com/gpu) it asks for
    created: float
    gated: bool = False  # still behind kubegpu.io/quota
    bound: bool = False  # spec.nodeName set: it holds capacity on a node
    terminating: bool = False  # being deleted or evicted: its capacity is on its way back

    @cached_property
    def key(self) -> str:  # cached: the simulator keeps a pod's view across passes and sorts by it every pass
        return f"{self.namespace}/{self.name}"

    @cached_property
    def memory(self) -> float:
        return float(self.amounts.get(GPU_MEMORY_RESOURCE, 0.0))


@dataclass(frozen=True)
class Eviction:
    pod: QuotaPod
    reason: str


@dataclass
class Decision:
    lift: list[QuotaPod] = field(default_factory=list)
    borrowed: set[str] = field(default_factory=set)  # keys of lifted pods that borrow beyond min
    evict: list[Eviction] = field(default_factory=list)
    used: dict[str, dict[str, float]] = field(default_factory=dict)  # per team, after the lifts


def _add(into: dict[str, float], amounts: Mapping[str, float], sign: float = 1.0) -> None:
    for name in RESOURCES:
        if name in amounts:
            into[name] = into.get(name, 0.0) + sign * float(amounts[name])


def _within(used: Mapping[str, float], extra: Mapping[str, float], limit: Mapping[str, float] | None) -> bool:
    if limit is None:
        return True
    return all(used.get(name, 0.0) + float(extra.get(name, 0.0)) <= float(amount) + 1e-6
               for name, amount in limit.items())


def team_usage(pods: Sequence[QuotaPod]) -> dict[str, dict[str, float]]:
    """namespace → what its admitted (ungated) pods ask for."""
    used: dict[str, dict[str, float]] = {}
    for pod in pods:
        if not pod.gated:
            _add(used.setdefault(pod.namespace, {}), pod.amounts)
    return used


def decide(quotas: Sequence[TeamQuota], pods: Sequence[QuotaPod], capacity: float) -> Decision:
    """What to do now. `pods`: every unfinished GPU pod in the cluster (teams without a quota count against the
    capacity too); `capacity`: the cluster's `kubegpu.io/gpu-memory`.

    One pass over `pods` gathers usage and the gated ones (the simulator calls this on every scheduling pass, over
    thousands of pods)."""
    teams = {q.namespace: q for q in quotas}
    used: dict[str, dict[str, float]] = {}
    admitted = 0.0
    gated: list[QuotaPod] = []
    for pod in pods:
        if pod.gated:
            if pod.namespace in teams:
                gated.append(pod)
        else:
            _add(used.setdefault(pod.namespace, {}), pod.amounts)
            admitted += pod.memory
    decision = Decision()
    missing = {pod.namespace for pod in gated} - used.keys()
    for namespace in sorted(missing, key=lambda ns: min((p.created, p.key) for p in gated if p.namespace == ns)):
        used[namespace] = {}  # as the loop below would add them: in the order of each team's first gated pod
    blocked = _blocked(teams, gated, used, admitted, capacity)
    if blocked:
        gated = [pod for pod in gated if pod.namespace not in blocked]
    gated.sort(key=lambda p: (p.created, p.key))
    for pod in gated:
        team = teams[pod.namespace]
        mine = used.setdefault(pod.namespace, {})
        if _within(mine, pod.amounts, team.min):
            pass
        elif _within(mine, pod.amounts, team.max) and admitted + pod.memory <= capacity + 1e-6:
            decision.borrowed.add(pod.key)
        else:
            continue
        decision.lift.append(pod)
        _add(mine, pod.amounts)
        admitted += pod.memory
    decision.used = used
    decision.evict = _reclaim(teams, pods, used, capacity)
    return decision


def _blocked(teams: Mapping[str, TeamQuota], gated: Sequence[QuotaPod], used: Mapping[str, Mapping[str, float]],
             admitted: float, capacity: float) -> set[str]:
    """Teams none of whose gated pods can go through this pass: even a pod asking the least of every resource its
    gated pods ask for would take the team past its `min` and could not borrow. Usage only grows during a pass, so
    the decision would skip each of them; leaving them out spares sorting and checking a long queue on every pass."""
    least: dict[str, dict[str, float]] = {}
    for pod in gated:
        mine = least.get(pod.namespace)
        if mine is None:
            least[pod.namespace] = {name: float(pod.amounts.get(name, 0.0)) for name in RESOURCES}
        else:
            for name in RESOURCES:
                amount = float(pod.amounts.get(name, 0.0))
                if amount < mine[name]:
                    mine[name] = amount
    out = set()
    for namespace, smallest in least.items():
        team, usage = teams[namespace], used.get(namespace, {})
        if _within(usage, smallest, team.min):
            continue
        if _within(usage, smallest, team.max) and admitted + smallest[GPU_MEMORY_RESOURCE] <= capacity + 1e-6:
            continue
        out.add(namespace)
    return out


def _reclaim(teams: Mapping[str, TeamQuota], pods: Sequence[QuotaPod], used: Mapping[str, Mapping[str, float]],
             capacity: float) -> list[Eviction]:
    """Evictions that give a team within its `min` the room its unplaced pods wait for."""
    held = 0.0  # terminating pods still hold until gone
    returning = 0.0
    waiting: dict[str, float] = {}
    within_min = {ns: _within(used.get(ns, {}), {}, team.min) for ns, team in teams.items()}
    for pod in pods:
        if pod.bound and pod.terminating:
            returning += pod.memory
        if pod.gated:
            continue
        if pod.bound:
            held += pod.memory
        elif not pod.terminating and within_min.get(pod.namespace, False):
            waiting[pod.namespace] = waiting.get(pod.namespace, 0.0) + pod.memory
    needed = sum(waiting.values()) - (capacity - held) - returning
    if needed <= 1e-6:
        return []
    over = {ns: dict(amounts) for ns, amounts in used.items()
            if ns in teams and not _within(amounts, {}, teams[ns].min)}
    candidates = sorted((p for p in pods if p.namespace in over and p.bound and not p.gated and not p.terminating),
                        key=lambda p: (-p.created, p.key))
    out: list[Eviction] = []
    for pod in candidates:
        if needed <= 1e-6:
            break
        mine = over[pod.namespace]
        after = {name: mine.get(name, 0.0) - float(pod.amounts.get(name, 0.0)) for name in mine}
        team_min = teams[pod.namespace].min
        if not all(after.get(name, 0.0) >= float(amount) - 1e-6 for name, amount in team_min.items()):
            continue  # this pod is within the team's guarantee, not borrowed
        over[pod.namespace] = after
        needed -= pod.memory
        for_teams = ", ".join(sorted(waiting))
        out.append(Eviction(pod, f"reclaimed for team(s) {for_teams} below their ElasticQuota min: namespace "
                                 f"{pod.namespace} borrows beyond its min ({_gib(mine)} used > {_gib(team_min)})"))
    return out


def _gib(amounts: Mapping[str, float]) -> str:
    value = float(amounts.get(GPU_MEMORY_RESOURCE, 0.0)) / (1 << 30)
    return f"{value:g}Gi"
