"""The `+guard` modifier: `kubegpu gpu-guard` on every node of a time-slicing, MPS or shared-claim strategy.

Without it, a pod that allocates more than its share of a time-sliced GPU makes the driver fail the newest
allocation on that GPU — often a neighbour within its own share (an "innocent" OOM kill). With it, the guard's own
decision core (`kubegpu.guard.core.decide`, shares from `kubegpu.sharing.shares`) looks at each shared GPU as a pod
starts allocating, and the pods over their share are evicted before their allocation completes — `GUARD_LEAD_S`
before the moment the driver would have failed someone — so only pods within their share remain, and they fit.

The simulated pod allocates all its memory in one go after it starts (`PerfParams.oom_delay_s`); a real leak grows
gradually and crosses its share before it exhausts the GPU, which is when the guard (sampling every 0.25 s) acts.
MPS enforces its limits itself, so there the guard changes nothing in the simulation (it only reports clients
without their limit, which the simulator does not model).
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
    from kubegpu.sim.world import Attempt, Partition

GUARD_LEAD_S = 1.0
"""How long before the driver would fail an allocation the guard has evicted the pod over its share."""
POLICY = Policy(GuardAction.EVICT, grace=True, reserve_mib=1024)


def apply_guard(strategy: Strategy) -> Strategy:
    if not getattr(strategy, "memory_shared", False):
        raise ConfigError(f"strategy {strategy.name}+guard: the GPU-memory guard protects pods sharing a GPU's memory; "
                          "use it with time-slicing, mps or dra-shared")
    strategy.guard = POLICY  # type: ignore[attr-defined]
    return strategy


register_modifier("guard", apply_guard)


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


def over_share(parts: Sequence[Partition], devices: Sequence[AnnotatedDevice]) -> list[Attempt]:
    """Who the guard acts on on these partitions: residents of a memory-shared GPU (not a MIG slice, not an MPS
    client with its enforced limit) using more than their share, by the guard's own decision."""
    victims: list[Attempt] = []
    for part, device in zip(parts, devices, strict=False):
        if part.mig or device.mps_memory_mib:
            continue
        entity = (part.gpu_index, None)
        holdings, processes, by_uid = [], [], {}
        for index, run in enumerate(part.residents):
            share = run.share_gib
            if share is None or run.guarded:
                continue
            uid = f"{index}"
            by_uid[uid] = run
            holdings.append(Holding(run.job.namespace, run.name, uid, entity, SharingKind.TIME_SLICING,
                                    round(share * 1024)))
            processes.append(ProcessReading(index + 1, entity, round(run.job.memory_gib * 1024), uid))
        total = round(part.memory_gib * 1024)
        used = sum(p.used_mib for p in processes)
        decision = decide([EntityReading(entity, total, max(0, total - used))], holdings, processes, POLICY)
        victims.extend(by_uid[action.holding.uid] for action in decision.actions)
    return victims
