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

import heapq
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property

from kubegpu.scheduling.queue import INF, LARGEST, GatedQueue, search_bound
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
    capacity too); `capacity`: the cluster's `kubegpu.io/gpu-memory`. A ledger of these pods, asked once."""
    ledger = ElasticLedger(quotas)
    for pod in pods:
        ledger.put(pod)
    return ledger.decide(capacity)


class ElasticLedger:
    """The decision's facts kept as pods come, change and go, so a caller that sees every change (the simulator,
    asking on each of its scheduling passes) pays for the changes, not for every pod on every pass: each team's
    usage, the capacity admitted and held, what waits unplaced, and each team's gated pods in a `GatedQueue`.

    `decide` gives what `decide()` gives for the pods put and not removed. Sums kept as pods come and go equal sums
    made afresh when amounts are whole numbers (bytes, GPUs), as a cluster's always are."""

    def __init__(self, quotas: Sequence[TeamQuota]) -> None:
        self.teams = {q.namespace: q for q in quotas}
        self._pods: dict[str, QuotaPod] = {}
        self._used: dict[str, dict[str, float]] = {}  # per namespace, its admitted (ungated) pods' amounts
        self._counts: dict[tuple[str, str], int] = {}  # (namespace, resource) → admitted pods that name it
        self._admitted = 0.0  # memory of every admitted pod
        self._held = 0.0  # memory of admitted pods bound to a node
        self._returning = 0.0  # memory of bound pods being deleted
        self._waiting: dict[str, float] = {}  # per namespace, memory of admitted pods not yet placed
        self._waiting_pods: dict[str, int] = {}  # ... and how many
        self._bound: dict[str, dict[str, QuotaPod]] = {}  # per namespace, its bound pods that may be reclaimed
        self._queues: dict[str, GatedQueue[QuotaPod]] = {}  # per team, its gated pods
        self._version = 0
        self._last: tuple[int, float, Decision] | None = None

    def put(self, pod: QuotaPod) -> None:
        """A new pod, or a pod's new state (by key)."""
        if pod.key in self._pods:
            self.remove(pod.key)
        self._pods[pod.key] = pod
        self._version += 1
        self._count(pod, 1.0)

    def remove(self, key: str) -> None:
        pod = self._pods.pop(key, None)
        if pod is not None:
            self._version += 1
            self._count(pod, -1.0)

    def _count(self, pod: QuotaPod, sign: float) -> None:
        namespace, memory = pod.namespace, pod.memory
        if pod.bound and pod.terminating:
            self._returning += sign * memory
        if pod.gated:
            if namespace in self.teams:
                queue = self._queues.setdefault(namespace, GatedQueue())
                if sign > 0:
                    queue.add(pod.created, pod.key, memory, pod)
                else:
                    queue.remove(pod.key)
            return
        used = self._used.setdefault(namespace, {})
        for name in RESOURCES:
            if name in pod.amounts:
                count = self._counts.get((namespace, name), 0) + int(sign)
                used[name] = used.get(name, 0.0) + sign * float(pod.amounts[name])
                if count:
                    self._counts[namespace, name] = count
                else:  # as a fresh sum would have it: no pod names it
                    del self._counts[namespace, name], used[name]
        if not used:
            del self._used[namespace]
        self._admitted += sign * memory
        if pod.bound:
            self._held += sign * memory
            if not pod.terminating:
                mine = self._bound.setdefault(namespace, {})
                if sign > 0:
                    mine[pod.key] = pod
                else:
                    mine.pop(pod.key, None)
        elif not pod.terminating:
            count = self._waiting_pods.get(namespace, 0) + int(sign)
            if count:
                self._waiting_pods[namespace] = count
                self._waiting[namespace] = self._waiting.get(namespace, 0.0) + sign * memory
            else:
                del self._waiting_pods[namespace], self._waiting[namespace]

    def decide(self, capacity: float) -> Decision:
        if self._last is not None and self._last[:2] == (self._version, capacity) and not (
                self._last[2].lift or self._last[2].evict):
            return self._last[2]  # nothing changed since a decision that changed nothing
        used = {namespace: dict(amounts) for namespace, amounts in self._used.items()}
        heads = {ns: queue.first() for ns, queue in self._queues.items() if len(queue)}
        for namespace in sorted(heads.keys() - used.keys(), key=lambda ns: self._queues[ns].order(heads[ns])):
            used[namespace] = {}  # in the order of each team's oldest gated pod, as the walk would add them
        decision = Decision(used=used)
        self._lift(decision, used, capacity)
        decision.evict = self._reclaim(used, capacity)
        self._last = (self._version, capacity, decision)
        return decision

    def _lift(self, decision: Decision, used: dict[str, dict[str, float]], capacity: float) -> None:
        """Gated pods oldest first (over every team), each let through if it still fits. Each team offers its next
        pod that fits now; the oldest offer goes through, and a team's later offers only get harder (usage only
        grows during a pass), so the pods skipped over would have been skipped by a walk over every one."""
        admitted = self._admitted
        offers: list[tuple[tuple[float, str], str, int]] = []
        for namespace, queue in self._queues.items():
            if not len(queue):
                continue
            at = self._next_fit(namespace, queue, 0, used[namespace], admitted, capacity)
            if at >= 0:
                offers.append((queue.order(at), namespace, at))
        heapq.heapify(offers)
        while offers:
            _, namespace, at = heapq.heappop(offers)
            queue, mine = self._queues[namespace], used[namespace]
            pod = queue.item(at)
            verdict = _fits(self.teams[namespace], mine, pod, admitted, capacity)
            if verdict:
                if verdict == _BORROW:
                    decision.borrowed.add(pod.key)
                decision.lift.append(pod)
                _add(mine, pod.amounts)
                admitted += pod.memory
            at = self._next_fit(namespace, queue, at + 1, mine, admitted, capacity)
            if at >= 0:
                heapq.heappush(offers, (queue.order(at), namespace, at))

    def _next_fit(self, namespace: str, queue: GatedQueue[QuotaPod], start: int, mine: Mapping[str, float],
                  admitted: float, capacity: float) -> int:
        """The team's first gated pod from `start` on that fits now, or -1. Where the team's quota names only GPU
        memory, the queue skips every pod bigger than the room left (a little more than it, so that rounding never
        skips one that fits); the exact test decides."""
        team = self.teams[namespace]
        at_most = _room(team, mine, admitted, capacity)
        at = queue.first(start, at_most)
        while at >= 0:
            if _fits(team, mine, queue.item(at), admitted, capacity):
                return at
            at = queue.first(at + 1, at_most)
        return -1

    def _reclaim(self, used: Mapping[str, Mapping[str, float]], capacity: float) -> list[Eviction]:
        """Evictions that give a team within its `min` the room its unplaced pods wait for."""
        within_min = {ns: _within(used.get(ns, {}), {}, team.min) for ns, team in self.teams.items()}
        waiting = {ns: memory for ns, memory in self._waiting.items() if within_min.get(ns, False)}
        needed = sum(waiting.values()) - (capacity - self._held) - self._returning
        if needed <= 1e-6:
            return []
        teams = self.teams
        over = {ns: dict(amounts) for ns, amounts in used.items()
                if ns in teams and not _within(amounts, {}, teams[ns].min)}
        candidates = sorted((p for ns in over for p in self._bound.get(ns, {}).values()),
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


_WITHIN_MIN, _BORROW = 1, 2


def _fits(team: TeamQuota, mine: Mapping[str, float], pod: QuotaPod, admitted: float, capacity: float) -> int:
    """0 when `pod` cannot go through now; _WITHIN_MIN, or _BORROW when it borrows idle capacity beyond `min`."""
    if _within(mine, pod.amounts, team.min):
        return _WITHIN_MIN
    if _within(mine, pod.amounts, team.max) and admitted + pod.memory <= capacity + 1e-6:
        return _BORROW
    return 0


def _room(team: TeamQuota, mine: Mapping[str, float], admitted: float, capacity: float) -> float:
    """The largest pod (in GPU memory) that may fit the team now, a little generously; no bound (the largest float)
    where the quota names another resource too, since then size alone does not decide."""
    limits = [team.min] if team.max is None else [team.min, team.max]
    if any(name != GPU_MEMORY_RESOURCE for limit in limits for name in limit):
        return LARGEST
    used = mine.get(GPU_MEMORY_RESOURCE, 0.0)

    def left(limit: Mapping[str, float] | None) -> float:
        if limit is None or GPU_MEMORY_RESOURCE not in limit:
            return INF
        return float(limit[GPU_MEMORY_RESOURCE]) + 1e-6 - used

    return search_bound(max(left(team.min), min(left(team.max), capacity + 1e-6 - admitted)), used, capacity,
                        admitted)


def _gib(amounts: Mapping[str, float]) -> str:
    value = float(amounts.get(GPU_MEMORY_RESOURCE, 0.0)) / (1 << 30)
    return f"{value:g}Gi"
