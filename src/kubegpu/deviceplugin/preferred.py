"""GetPreferredAllocation: a hint to the kubelet about which of the available IDs to take.

Whole GPUs are scored by how well they talk to each other (NVLink > same PCIe switch / NUMA node > across
sockets) and the chosen set is the best one *in the best partition* of the available GPUs, so what is left over
stays well connected too (the same idea as NVIDIA's gpuallocator best-effort policy). Replicas and MIG devices
are picked greedily: `distributed` spreads over the least-used GPUs, `packed` fills the most-used first.
Pure; the kubelet has the last word anyway.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from functools import cache
from itertools import combinations

from kubegpu.errors import KubegpuError
from kubegpu.sharing.devices import AnnotatedDevice

SHARED_POLICIES = ("distributed", "packed")
CROSS_CPU, SAME_CPU, SINGLE_SWITCH, NVLINK = 10, 20, 50, 100
_EXACT_PARTITION_LIMIT = 12  # above this many GPUs, score only the chosen set (the search grows too fast)

PairScore = Callable[[AnnotatedDevice, AnnotatedDevice], int]


class PreferenceError(KubegpuError):
    """The request cannot be satisfied from the available devices."""


def numa_pair_score(a: AnnotatedDevice, b: AnnotatedDevice) -> int:
    """What we know without a link map: same NUMA node scores like NVIDIA's SameCPU, else CrossCPU."""
    return SAME_CPU if a.numa_node is not None and a.numa_node == b.numa_node else CROSS_CPU


def link_pair_score(nvlinks: Mapping[tuple[int, int], int], switches: Mapping[int, int] | None = None) -> PairScore:
    """A scorer from a topology: `nvlinks[(i, j)]` links between GPU indices, optional PCIe switch per GPU."""

    def score(a: AnnotatedDevice, b: AnnotatedDevice) -> int:
        links = nvlinks.get((a.gpu_index, b.gpu_index)) or nvlinks.get((b.gpu_index, a.gpu_index)) or 0
        switch = switches.get(a.gpu_index) if switches else None
        if switches and switch is not None and switch == switches.get(b.gpu_index):
            base = SINGLE_SWITCH
        else:
            base = numa_pair_score(a, b)
        return base + NVLINK * links

    return score


def _check_size(available: int, required: int, size: int) -> None:
    if size <= 0 or size > available or required > size:
        raise PreferenceError(
            f"cannot pick {size} devices from {available} available with {required} required"
        )


def best_effort(
    available: Sequence[AnnotatedDevice],
    required: Sequence[AnnotatedDevice],
    size: int,
    pair_score: PairScore = numa_pair_score,
) -> list[str]:
    """The best-connected set of `size` whole GPUs that holds `required`, judged with the leftovers' partition."""
    _check_size(len(available), len(required), size)
    devices = list(available)
    n = len(devices)
    scores = [[pair_score(devices[i], devices[j]) if i != j else 0 for j in range(n)] for i in range(n)]
    required_mask = sum(1 << devices.index(d) for d in required if d in devices)

    def set_score(members: Sequence[int]) -> int:
        return sum(scores[i][j] for i, j in combinations(members, 2))

    @cache
    def rest_score(mask: int) -> int:
        """Best total score of splitting the GPUs in `mask` into groups of `size` (a short last group allowed)."""
        members = [i for i in range(n) if mask >> i & 1]
        if len(members) <= size:
            return set_score(members)
        first, others = members[0], members[1:]
        best = 0
        for group in combinations(others, size - 1):
            chosen = (first, *group)
            taken = sum(1 << i for i in chosen)
            best = max(best, set_score(chosen) + rest_score(mask & ~taken))
        return best

    full = (1 << n) - 1
    exact = n <= _EXACT_PARTITION_LIMIT
    best_key: tuple[int, int] | None = None
    best_set: tuple[int, ...] = ()
    for chosen in combinations(range(n), size):
        chosen_mask = sum(1 << i for i in chosen)
        if chosen_mask & required_mask != required_mask:
            continue
        own = set_score(chosen)
        key = (own + (rest_score(full & ~chosen_mask) if exact else 0), own)
        if best_key is None or key > best_key:
            best_key, best_set = key, chosen
    return [devices[i].id for i in best_set]


def greedy_shared(
    all_devices: Sequence[AnnotatedDevice],
    available: Sequence[AnnotatedDevice],
    required: Sequence[AnnotatedDevice],
    size: int,
    policy: str = "distributed",
) -> list[str]:
    """Pick replicas / MIG devices one at a time by how loaded their physical GPU already is.

    `distributed` prefers the GPU with the fewest allocated devices, `packed` the most; ties go to the GPU
    this call has taken fewer picks from, which rotates across GPUs. Within a GPU the lowest MIG start (then
    replica) goes first, whatever order the kubelet lists the IDs in (a Go map's: random): small instances taken
    from the low end leave the high end contiguous for the larger placements a re-cut can make there.
    """
    if policy not in SHARED_POLICIES:
        raise PreferenceError(f"unknown shared devices allocation policy {policy!r}")
    if size <= 0 or (required and len(required) > size):
        raise PreferenceError(f"cannot pick {size} devices with {len(required)} required")
    total: dict[int, int] = {}
    for d in all_devices:
        total[d.gpu_index] = total.get(d.gpu_index, 0) + 1
    free: dict[int, int] = {}
    for d in available:
        free[d.gpu_index] = free.get(d.gpu_index, 0) + 1
    required_ids = {d.id for d in required}
    candidates = [d for d in available if d.id not in required_ids]
    needed = size - len(required)
    if needed > len(candidates):
        raise PreferenceError("not enough available devices to satisfy allocation")
    picks: dict[int, int] = {}
    chosen: list[str] = [d.id for d in required]
    sign = 1 if policy == "distributed" else -1
    for _ in range(needed):
        best = min(
            range(len(candidates)),
            key=lambda i: (
                sign * (total.get(candidates[i].gpu_index, 0) - free.get(candidates[i].gpu_index, 0)),
                picks.get(candidates[i].gpu_index, 0),
                _position(candidates[i]),
            ),
        )
        device = candidates.pop(best)
        free[device.gpu_index] = free.get(device.gpu_index, 0) - 1
        picks[device.gpu_index] = picks.get(device.gpu_index, 0) + 1
        chosen.append(device.id)
    return chosen


def _position(device: AnnotatedDevice) -> tuple[int, int, int, str]:
    """Where a device sits on its GPU: the order ties are broken in, independent of the kubelet's list order."""
    start = device.mig.start if device.mig is not None else -1
    return device.gpu_index, start, device.replica or 0, device.id


def preferred_allocation(
    all_devices: Sequence[AnnotatedDevice],
    available_ids: Sequence[str],
    must_include_ids: Sequence[str],
    size: int,
    policy: str = "distributed",
    pair_score: PairScore = numa_pair_score,
) -> list[str]:
    """Dispatch as NVIDIA does: best-effort scoring for whole GPUs, the greedy policy for shared or MIG."""
    known = {d.id: d for d in all_devices}
    for device_id in [*available_ids, *must_include_ids]:
        if device_id not in known:
            raise PreferenceError(f"invalid request: unknown device: {device_id}")
    available = [known[i] for i in dict.fromkeys(available_ids)]
    required = [known[i] for i in dict.fromkeys(must_include_ids)]
    if any(d.shared or d.mig is not None for d in available):
        return greedy_shared(all_devices, available, required, size, policy)
    return best_effort(available, required, size, pair_score)
