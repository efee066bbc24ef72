"""The GPU-memory guard's decisions: shares, usage, grace and reserve in; actions out. Pure: no I/O, no clock.

On a time-sliced GPU (or a shared DRA claim) nothing stops one pod from allocating past its share, and CUDA then
fails the *next* allocation on that GPU — usually a neighbour's. The guard reads what every process holds, adds it
up per pod, and acts on the pod that is over its share before the driver has to fail anyone:

* without `grace`, as soon as a pod uses more than its share;
* with `grace`, only once the GPU's free memory has fallen to `reserve` or below (a bursty pod on a quiet GPU is
  left alone), and then on every pod over its share on that GPU.

It never acts on a whole GPU or an unshared MIG device (no holding has a share there: the hardware isolates it),
never on a process it cannot attribute to a pod holding that GPU (those are counted, nothing more), and it keeps no
state between rounds: every decision follows from one reading, so a restarted guard decides exactly the same.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum

from kubegpu.sharing.names import SharingKind

EntityKey = tuple[int, int | None]
"""(GPU index, GPU instance id or None): one GPU or one MIG device."""


class GuardAction(StrEnum):
    """What the guard does to a pod over its share (`--action`)."""

    EVICT = "evict"
    KILL_PROCESS = "kill-process"
    WARN = "warn"


class Reason(StrEnum):
    """Why the guard acted or reported (a metric label and the Event's reason)."""

    OVER_SHARE = "over-share"  # over its share, no grace
    RESERVE_EXHAUSTED = "reserve-exhausted"  # over its share while the GPU's free memory is at or below the reserve
    MPS_LIMIT_MISSING = "mps-limit-missing"  # an MPS client runs without the pinned-memory limit it should have


@dataclass(frozen=True)
class Policy:
    action: GuardAction = GuardAction.EVICT
    grace: bool = False
    reserve_mib: int = 1024


@dataclass(frozen=True)
class Holding:
    """One pod's part of one shared GPU or MIG device: its share there (summed over the replicas it holds, the
    annotation applied) and the pinned-memory limit its MPS clients must have."""

    namespace: str
    pod: str
    uid: str
    entity: EntityKey
    kind: SharingKind
    share_mib: int
    mps_limit_mib: int | None = None
    terminating: bool = False  # already being deleted (an earlier eviction): not evicted again


@dataclass(frozen=True)
class ProcessReading:
    """One GPU process as the backend lists it, with the pod its cgroup names (None when it names none)."""

    pid: int
    entity: EntityKey
    used_mib: int
    pod_uid: str | None = None
    mps_limit_mib: int | None = None  # CUDA_MPS_PINNED_DEVICE_MEM_LIMIT it runs with, None when unset or unknown
    mps_limit_known: bool = False  # whether its environment could be read at all


@dataclass(frozen=True)
class EntityReading:
    entity: EntityKey
    total_mib: int
    free_mib: int
    uuid: str = ""


@dataclass(frozen=True)
class Action:
    """One thing the guard does. `kind` is the action requested (evict may fall back to killing `pids` where a
    PodDisruptionBudget refuses); `pids` are the offending processes: the pod's largest on this GPU, until the rest
    fits its share."""

    kind: GuardAction
    reason: Reason
    holding: Holding
    used_mib: int
    free_mib: int
    uuid: str
    pids: tuple[int, ...]


@dataclass(frozen=True)
class PodUsage:
    holding: Holding
    used_mib: int


@dataclass(frozen=True)
class Finding:
    """A report that is not an action (an MPS client without its limit)."""

    reason: Reason
    holding: Holding
    pid: int
    limit_mib: int | None


@dataclass
class Decision:
    actions: list[Action] = field(default_factory=list)
    usage: list[PodUsage] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)
    unattributed: dict[EntityKey, tuple[int, int]] = field(default_factory=dict)  # entity → (processes, MiB)


def decide(entities: Iterable[EntityReading], holdings: Iterable[Holding], processes: Iterable[ProcessReading],
           policy: Policy) -> Decision:
    """Every pod's usage against its share on every shared GPU, and what to do about the ones over it."""
    decision = Decision()
    readings = {reading.entity: reading for reading in entities}
    by_key = {(h.uid, h.entity): h for h in holdings}
    used: dict[tuple[str, EntityKey], list[ProcessReading]] = {}
    for process in processes:
        holding = by_key.get((process.pod_uid or "", process.entity)) if process.pod_uid else None
        if holding is None:
            count, mib = decision.unattributed.get(process.entity, (0, 0))
            decision.unattributed[process.entity] = (count + 1, mib + process.used_mib)
            continue
        used.setdefault((holding.uid, holding.entity), []).append(process)
        if holding.kind == SharingKind.MPS and process.mps_limit_known and _limit_missing(process, holding):
            decision.findings.append(Finding(Reason.MPS_LIMIT_MISSING, holding, process.pid, process.mps_limit_mib))
    for key in sorted(by_key, key=lambda k: (k[1][0], -1 if k[1][1] is None else k[1][1], k[0])):
        holding = by_key[key]
        mine = sorted(used.get(key, []), key=lambda p: (-p.used_mib, p.pid))
        total = sum(p.used_mib for p in mine)
        decision.usage.append(PodUsage(holding, total))
        reading = readings.get(holding.entity)
        if reading is None or total <= holding.share_mib:
            continue
        reserve_gone = reading.free_mib <= policy.reserve_mib
        if policy.grace and not reserve_gone:
            continue
        reason = Reason.RESERVE_EXHAUSTED if policy.grace else Reason.OVER_SHARE
        kind = policy.action
        if holding.terminating:
            if not reserve_gone or kind == GuardAction.WARN:
                continue  # evicted already; its processes go with it unless a neighbour is about to fail
            kind = GuardAction.KILL_PROCESS
        decision.actions.append(Action(kind, reason, holding, total, reading.free_mib, reading.uuid,
                                       _offenders(mine, holding.share_mib)))
    return decision


def _limit_missing(process: ProcessReading, holding: Holding) -> bool:
    expected = holding.mps_limit_mib
    return process.mps_limit_mib is None or (expected is not None and process.mps_limit_mib > expected)


def _offenders(largest_first: Sequence[ProcessReading], share_mib: int) -> tuple[int, ...]:
    """The processes to kill: the pod's largest on this GPU first, until what is left fits its share (so a pod with a
    leaking worker and a healthy one loses only the worker)."""
    left = sum(p.used_mib for p in largest_first)
    chosen: list[int] = []
    for process in largest_first:
        if left <= share_mib:
            break
        chosen.append(process.pid)
        left -= process.used_mib
    return tuple(chosen)
