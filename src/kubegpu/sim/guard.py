"""The `+guard` modifier: `kubegpu gpu-guard` on every node of a time-slicing, MPS or shared-claim strategy.

Without it, the driver fails whichever allocation finds a time-sliced GPU full: a pod whose first allocation does
not fit, or — once a neighbour's creeping use (a leaking notebook, a growing cache) has filled the GPU — the next
allocation of any pod there, often a well-behaved neighbour within its own share (an "innocent" OOM kill). With it,
the guard's own decision core (`kubegpu.guard.core.decide`, shares from `kubegpu.sharing.shares`, grace with a
1 GiB reserve) looks at each shared GPU when its free memory reaches the reserve — `GUARD_LEAD_S` before a first
allocation that would take it there, at once for creeping use, which takes far longer than the guard's 0.25 s
sampling to eat 1 GiB — and evicts the pods over their share, so the GPU never fills while the pods within their
share fit. MPS enforces its limits itself, so there the guard changes nothing in the simulation (it only reports
clients without their limit, which the simulator does not model).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from kubegpu.errors import ConfigError
from kubegpu.guard.core import EntityReading, GuardAction, Holding, Policy, ProcessReading, decide
from kubegpu.sharing.claimconfig import Sharing
from kubegpu.sharing.names import SharingKind
from kubegpu.sharing.shares import claim_share, device_share
from kubegpu.sim.strategies import Strategy, register_modifier

if TYPE_CHECKING:
    from kubegpu.sharing.devices import AnnotatedDevice
    from kubegpu.sim.metrics import StrategyResult
    from kubegpu.sim.world import Attempt, Partition

GUARD_LEAD_S = 1.0
"""How long before the driver would fail an allocation the guard has evicted the pod over its share."""
POLICY = Policy(GuardAction.EVICT, grace=True, reserve_mib=1024)
RESERVE_GIB = POLICY.reserve_mib / 1024


def apply_guard(strategy: Strategy) -> Strategy:
    if not getattr(strategy, "memory_shared", False):
        raise ConfigError(f"strategy {strategy.name}+guard: the GPU-memory guard protects pods sharing a GPU's memory; "
                          "use it with time-slicing, mps or dra-shared")
    strategy.guard = POLICY  # type: ignore[attr-defined]
    return strategy


register_modifier("guard", apply_guard)


def credit_guard(results: Sequence[StrategyResult]) -> None:
    """Set `neighbours_saved` on each `S+guard` result run beside `S` on the same workload: the neighbours within
    their share a leak OOM-killed under `S` and not under the guard (never negative)."""
    by_name = {result.strategy: result for result in results}
    for result in results:
        base = result.strategy.removesuffix("+guard")
        if base != result.strategy and base in by_name:
            result.neighbours_saved = max(0, by_name[base].innocent_oom_kills - result.innocent_oom_kills)


def refresh_shares(strategy: Strategy, run: Attempt) -> None:
    """A starting pod's share; on a shared claim every pod's share on its GPUs, since it is the device's memory over
    the pods sharing the claim now."""
    run.share_gib = share_gib(run.devices)
    if not getattr(strategy, "claim_shared", False):
        return
    for part, device in zip(run.parts, run.devices, strict=False):
        consumers = len(part.residents)
        _, share, _ = claim_share(Sharing(strategy="TimeSlicing"), device.memory_mib, consumers)
        for resident in part.residents:
            resident.share_gib = None if share is None else share / 1024


def share_gib(devices: Sequence[AnnotatedDevice]) -> float | None:
    """A pod's memory share on its (first) shared device, in GiB; None where its device is not shared."""
    for device in devices:
        share = device_share(device).share_mib
        if share is not None:
            return share / 1024
    return None


def over_share(part: Partition, device: AnnotatedDevice, t: float) -> list[Attempt]:
    """Who the guard acts on on one device at `t`: residents of a memory-shared GPU (not a MIG slice, not an MPS
    client with its enforced limit) using more than their share then, by the guard's own decision."""
    if part.mig or device.mps_memory_mib:
        return []
    entity = (part.gpu_index, None)
    holdings, processes, by_uid = [], [], {}
    for index, run in enumerate(part.residents):
        share = run.share_gib
        if share is None:
            continue
        uid = f"{index}"
        by_uid[uid] = run
        holdings.append(Holding(run.job.namespace, run.name, uid, entity, SharingKind.TIME_SLICING,
                                round(share * 1024)))
        processes.append(ProcessReading(index + 1, entity, round(run.memory_use().at(t) * 1024), uid))
    total = round(part.memory_gib * 1024)
    used = round(sum(run.memory_use().at(t) for run in part.residents) * 1024)
    decision = decide([EntityReading(entity, total, max(0, total - used))], holdings, processes, POLICY)
    return [by_uid[action.holding.uid] for action in decision.actions]


def next_share_crossing(part: Partition, now: float) -> float | None:
    """When the next resident whose use creeps up passes its share (the guard looks again then); None if none."""
    times = []
    for run in part.residents:
        use = run.memory_use()
        if run.share_gib is None or use.growth_gib_per_s <= 0:
            continue
        times.append(max(now, use.alloc_at) + max(0.0, run.share_gib - use.at(max(now, use.alloc_at)))
                     / use.growth_gib_per_s)
    return max(now + GUARD_LEAD_S, min(times)) if times else None  # never this instant again: no busy loop
