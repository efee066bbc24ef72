"""Teams in the simulator: the scenario's `teams:` (namespaces with a `min`, a `max` and a share of the workload),
charged in `kubegpu.io/gpu-memory` by the sharing core, held at admission the way a cluster would hold them.

Without a quota modifier, each team's `max` is a plain namespace ResourceQuota: a pod that would take the team past
it waits (its Job controller retries) and nothing is guaranteed — a noisy neighbour may hold every GPU. With
`+quota`, the strategy carries an `Admission` (the elastic-quota controller's decision, plugged in by
`kubegpu.quota.sim_strategy`; the simulator knows no controller): pods wait behind the quota gate, go through within
`min` or borrowing idle capacity up to `max`, and borrowed pods are evicted when a team under its `min` needs room.
Per team the report shows GPU-hours, waits and reclaims.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from kubegpu.scheduling.quantity import parse_quantity
from kubegpu.scheduling.queue import LARGEST, GatedQueue, search_bound
from kubegpu.sharing.charges import ChargeTable, model_memory_bytes, pod_charge
from kubegpu.sharing.names import GPU_SHARED_RESOURCE

if TYPE_CHECKING:
    from kubegpu.sim.scenario import TeamSpec
    from kubegpu.sim.world import Attempt


@dataclass(frozen=True)
class TeamLimits:
    namespace: str
    min_bytes: float
    max_bytes: float | None


@dataclass(frozen=True)
class TeamPod:
    """What an admission decision sees of a pod: `key` is unique per pod (attempt)."""

    key: str
    namespace: str
    charge: float
    created: float
    gated: bool
    bound: bool


class Admission(Protocol):
    """An elastic-quota decision kept up to date pod by pod: told of every pod as it is held, let through, bound and
    stopped, and asked on every scheduling pass which held pods to let through and which bound pods to evict."""

    def start(self, teams: Sequence[TeamLimits]) -> None: ...

    def put(self, pod: TeamPod) -> None: ...

    def remove(self, key: str) -> None: ...

    def decide(self, capacity: float) -> tuple[list[str], list[str]]: ...


def team_limits(teams: Sequence[TeamSpec]) -> list[TeamLimits]:
    return [TeamLimits(t.name, parse_quantity(t.min), parse_quantity(t.max) if t.max else None) for t in teams]


@dataclass
class TeamAccount:
    """The engine's quota state: held pods, each admitted pod's charge, per-team statistics."""

    limits: list[TeamLimits]
    table: ChargeTable
    admission: Admission | None
    held: dict[int, Attempt] = field(default_factory=dict)  # id → pod, in the order they were held
    charges: dict[int, float] = field(default_factory=dict)
    admitted: dict[int, Attempt] = field(default_factory=dict)
    reclaims: dict[str, int] = field(default_factory=dict)
    keys: dict[str, Attempt] = field(default_factory=dict)  # the admission's key → pod (elastic only)
    queues: dict[str, GatedQueue[Attempt]] = field(default_factory=dict)  # per namespace, its held pods (plain only)
    by_request: dict[Any, float] = field(default_factory=dict)  # GpuRequest → its pods' charge
    in_use: dict[str, float] = field(default_factory=dict)  # per namespace, the charges of its admitted pods
    changed: set[str] = field(default_factory=set)  # namespaces where a pod was held or an admitted one stopped
    # since the plain quota last looked

    def __post_init__(self) -> None:
        if self.admission is not None:
            self.admission.start(self.limits)

    @classmethod
    def for_strategy(cls, teams: Sequence[TeamSpec], strategy: Any, model_keys: Sequence[str]) -> TeamAccount:
        replicas = getattr(strategy, "replicas", None)
        table = ChargeTable.for_models(model_keys, {GPU_SHARED_RESOURCE: int(replicas)}
                                       if isinstance(replicas, int) else {})
        return cls(team_limits(teams), table, getattr(strategy, "team_admission", None))

    def charge(self, run: Attempt) -> float:
        found = self.charges.get(id(run))
        if found is None:
            # the simulator's pod spec is made from its request alone (`accounting._pod_object`): one charge each
            found = self.by_request.get(run.request)
            if found is None:
                found = self.by_request[run.request] = float(pod_charge(run.pod, self.table).gpu_memory_bytes)
            self.charges[id(run)] = found
        return found

    def hold(self, run: Attempt) -> None:
        self.held[id(run)] = run
        self.changed.add(run.job.namespace)
        if self.admission is None:
            self.queues.setdefault(run.job.namespace, GatedQueue()).add(run.queued_at, _key(run), self.charge(run),
                                                                         run)
        self._tell(run, gated=True, bound=False)

    def bound(self, run: Attempt) -> None:
        """An admitted pod was bound to a node: it holds capacity now."""
        self._tell(run, gated=False, bound=True)

    def _tell(self, run: Attempt, gated: bool, bound: bool) -> None:
        """The admission's view of a pod's new state."""
        if self.admission is not None:
            key = _key(run)
            self.keys[key] = run
            self.admission.put(TeamPod(key, run.job.namespace, self.charge(run), run.queued_at, gated, bound))

    def stopped(self, run: Attempt) -> None:
        if self.admission is not None and self.keys.pop(_key(run), None) is not None:
            self.admission.remove(_key(run))
        if self.admitted.pop(id(run), None) is not None:
            namespace = run.job.namespace
            self.in_use[namespace] = self.in_use.get(namespace, 0.0) - self.charge(run)
            self.changed.add(namespace)
        self.charges.pop(id(run), None)

    def used(self, namespace: str) -> float:
        """Kept as pods are admitted and stop: charges are whole bytes, so the running sum is exact in doubles (a
        cluster's GPU memory is far below 2**53 bytes) and equals summing the admitted pods afresh."""
        return self.in_use.get(namespace, 0.0)

    def step(self, capacity: Callable[[], float]) -> tuple[list[Attempt], list[Attempt]]:
        """(pods to let through, bound pods to evict) now; `capacity` (the cluster's GPU memory) is asked only by an
        elastic admission, which has been told of every change since the last step."""
        if self.admission is None:
            return self._plain(), []
        lift, evict = self.admission.decide(capacity())
        released = sorted((self.keys[key] for key in lift), key=lambda r: r.seq)  # in the order they were held
        evicted = set(evict)
        victims = ([r for r in self.admitted.values() if r.node is not None and _key(r) in evicted]
                   if evicted else [])
        if released:
            self._release(released)
        for run in victims:
            self.reclaims[run.job.namespace] = self.reclaims.get(run.job.namespace, 0) + 1
        return released, victims

    def _plain(self) -> list[Attempt]:
        """A plain namespace ResourceQuota at each team's `max`: FIFO per team, a pod past it waits. Every pod that
        fits goes through at once, so until a pod is held or an admitted one stops, another look lets nothing
        through: the simulator asks on every scheduling pass, and is answered without one. Teams are apart (each
        its own cap), so only a namespace where something changed is looked at again, and in its queue only the
        pods no bigger than the room left (`GatedQueue`: the room only shrinks as pods go through)."""
        if not self.changed:
            return []
        changed, self.changed = self.changed, set()
        caps = {t.namespace: t.max_bytes for t in self.limits}
        released = []
        for namespace in changed:
            queue = self.queues.get(namespace)
            if not queue:
                continue
            cap, used = caps.get(namespace), self.used(namespace)
            at = queue.first(0, _room(cap, used))
            while at >= 0:
                run = queue.item(at)
                if cap is None or used + self.charge(run) <= cap + 1e-6:
                    used += self.charge(run)
                    released.append(run)
                at = queue.first(at + 1, _room(cap, used))
        released.sort(key=lambda r: (r.queued_at, r.seq))
        self._release(released)
        return released

    def _release(self, runs: Sequence[Attempt]) -> None:
        for run in runs:
            del self.held[id(run)]
            queue = self.queues.get(run.job.namespace)
            if queue is not None:
                queue.remove(_key(run))
            self.admitted[id(run)] = run
            self.in_use[run.job.namespace] = self.in_use.get(run.job.namespace, 0.0) + self.charge(run)
            self._tell(run, gated=False, bound=False)


def _room(cap: float | None, used: float) -> float:
    """The largest charge that may still fit under `cap`, a little generously (the exact test decides)."""
    return LARGEST if cap is None else search_bound(cap + 1e-6 - used, cap, used)


def _key(run: Attempt) -> str:
    """A pod's key for the admission: its enqueue sequence, so ties in creation time break the same way every run
    (an `id()` would break them by memory address) and in the order the plain quota uses."""
    return f"{run.seq:012d}"


def capacity_bytes(nodes: Sequence[Any]) -> float:
    """The cluster's GPU memory in the charge's unit: every ready node's GPUs at their model's memory (worked out
    once per model: a cluster has a few models and many nodes)."""
    per_gpu: dict[str, int] = {}
    total = 0
    for node in nodes:
        if node.ready:
            key = node.model.key
            if key not in per_gpu:
                per_gpu[key] = model_memory_bytes(node.model)
            total += per_gpu[key] * len(node.gpus)
    return float(total)
