"""The sharing performance model: how fast a pod runs, and whether it survives, on a shared GPU.

Pure functions, no state. Every pod has a *compute need* ``c`` (the fraction of time it keeps a dedicated, whole
GPU busy, as ``nvidia-smi`` utilisation shows it) and a *memory need* in GiB. A pod's *speed* is its progress
relative to running alone on a whole GPU (1.0 = full speed). The rules, and how they were calibrated against the
only published per-pod measurements (nos' gpu-sharing comparison), are in docs/simulator.md; the constants below
come from that fit and `calibration()` reproduces it.

Two constants carry the whole model:
- ``context_switch_overhead``: time-slicing runs one context at a time; when the contexts want more than the GPU
  has, every switch costs time (measured: +11 % on top of the fair share).
- ``sm_occupancy``: a kernel stream that keeps a GPU busy 100 % of the time still leaves SMs idle (small grids,
  tails, memory stalls). This is what makes MPS (kernels of different clients run side by side) and small MIG
  slices (a slice with fewer SMs is filled better) faster than the time share alone suggests.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class PerfParams:
    context_switch_overhead: float = 0.11
    sm_occupancy: float = 0.475
    oom_delay_s: float = 30.0  # a pod makes its first allocation shortly after it starts; its use creeps from then


DEFAULT_PARAMS = PerfParams()


def exclusive_speed(need: float) -> float:
    """A whole GPU to itself: the pod runs at full speed whatever its need."""
    return 1.0


def time_slicing_speeds(needs: Sequence[float], params: PerfParams = DEFAULT_PARAMS) -> list[float]:
    """Speeds of pods time-sliced on one GPU (or one MIG slice), in the order given.

    Contexts take turns. While the summed need fits in the GPU (<= 1) nobody waits; beyond that every pod gets its
    share of the time, and the switches between contexts cost ``context_switch_overhead`` on top, so each pod is
    stretched by ``sum(needs) * (1 + overhead)``.
    """
    if len(needs) <= 1:
        return [1.0] * len(needs)
    stretch = max(1.0, sum(needs) * (1.0 + params.context_switch_overhead))
    return [1.0 / stretch] * len(needs)


def mps_speeds(
    needs: Sequence[float], thread_fractions: Sequence[float], params: PerfParams = DEFAULT_PARAMS
) -> list[float]:
    """Speeds of MPS clients on one GPU, in the order given.

    Kernels of all clients run concurrently, so a client is slowed only by the SMs the others occupy:
    stretch = 1 + occupancy * (sum of the other clients' needs), and never less than the whole GPU's SM demand
    (occupancy * sum of all needs). ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` caps a client at that fraction of the SMs,
    so a client whose occupancy-weighted need exceeds its thread fraction runs at the ratio.
    """
    total = sum(needs)
    speeds = []
    for need, threads in zip(needs, thread_fractions, strict=True):
        stretch = max(1.0 + params.sm_occupancy * (total - need), params.sm_occupancy * total)
        cap = 1.0 if need <= 0 else min(1.0, threads / (need * params.sm_occupancy))
        speeds.append(min(1.0 / stretch, cap))
    return speeds


def mig_speed(need: float, slice_sms: int, full_sms: int, params: PerfParams = DEFAULT_PARAMS) -> float:
    """Speed of a pod alone in a MIG slice: min(1, slice SMs / SMs the pod keeps busy on a whole GPU).

    The SMs a pod keeps busy on a whole GPU are need * occupancy * full SMs; a slice with at least that many runs
    it at full speed (which is why a 7g slice, 10 SMs short of a full A100, costs a typical job nothing).
    """
    if need <= 0:
        return 1.0
    return min(1.0, slice_sms / (need * params.sm_occupancy * full_sms))


@dataclass(frozen=True, slots=True)
class MemoryUse:
    """One pod's GPU memory on one device: nothing until its first allocation at `alloc_at`, `base_gib` then, and
    `growth_gib_per_s` more every second after (a notebook or a server whose use creeps up over hours)."""

    base_gib: float
    growth_gib_per_s: float
    alloc_at: float

    def at(self, t: float) -> float:
        if t < self.alloc_at:
            return 0.0
        return self.base_gib + self.growth_gib_per_s * (t - self.alloc_at)


@dataclass(frozen=True, slots=True)
class Overflow:
    """The instant an allocation finds the device full, and whose it is when that is known: the pod whose first
    allocation does not fit (`victim`), or None when creeping use fills the device and the next allocation — by
    whichever pod makes it — fails (`allocating_pod`)."""

    at: float
    victim: int | None


def first_overflow(uses: Sequence[MemoryUse], capacity_gib: float, now: float) -> Overflow | None:
    """When the pods' memory on a device without isolation first reaches `capacity_gib`, from `now` on; None when it
    never does. Use is piecewise linear: steps at first allocations, slopes from growth. A step that does not fit
    is the newest allocating pod's (the last in `uses`, which are oldest first), as the driver fails the allocation
    that finds the device full."""
    points = sorted({now, *(u.alloc_at for u in uses if u.alloc_at > now)})
    for i, start in enumerate(points):
        active = [u for u in uses if u.alloc_at <= start]
        level = sum(u.at(start) for u in active)
        if level > capacity_gib + 1e-9:
            stepping = [k for k, u in enumerate(uses) if u.alloc_at == start]
            return Overflow(start, stepping[-1] if stepping else None)
        slope = sum(u.growth_gib_per_s for u in active)
        if slope > 0:
            end = points[i + 1] if i + 1 < len(points) else math.inf
            t = start + (capacity_gib - level) / slope
            if t < end:
                return Overflow(max(t, start), None)
    return None


def allocating_pod(weights: Sequence[float], draw: float) -> int:
    """Which pod makes the allocation that finds a full device: each allocates as often as it keeps the GPU busy
    (its compute need), so the pick is weighted by `weights`; `draw` is uniform in [0, 1) (seeded by the caller)."""
    total = sum(weights)
    if total <= 0:
        return len(weights) - 1
    point = draw * total
    for index, weight in enumerate(weights):
        point -= weight
        if point < 0:
            return index
    return len(weights) - 1


def exceeds(memory_gib: float, limit_gib: float) -> bool:
    """An isolated partition (MIG slice, MPS memory limit) OOM-kills a pod that needs more than it has."""
    return memory_gib > limit_gib + 1e-9


# --- calibration -------------------------------------------------------------------------------------------------

NOS_LONE_POD_S = 0.088  # YOLOS-small mean inference time alone on an A100 80GB PCIe (nos demo)
NOS_MEASURED: dict[str, dict[int, float]] = {
    "time-slicing": {7: 0.685, 5: 0.489, 3: 0.293, 1: 0.088},
    "mps": {7: 0.320, 5: 0.241, 3: 0.164, 1: 0.088},
    "mig-1g.10gb": {7: 0.344, 5: 0.345, 3: 0.341, 1: 0.342},
}
A100_FULL_SMS = 108
A100_1G_SMS = 14


@dataclass(frozen=True)
class CalibrationRow:
    mode: str
    pods: int
    measured_s: float
    modelled_s: float

    @property
    def error(self) -> float:
        return (self.modelled_s - self.measured_s) / self.measured_s


def calibration(params: PerfParams = DEFAULT_PARAMS) -> list[CalibrationRow]:
    """The model's prediction for nos' benchmark next to the measurement, row by row.

    Setup as published: n identical inference pods (each keeps the GPU busy when alone, need = 1.0) on one A100;
    time-slicing and MPS pods share the whole GPU, MIG pods get one 1g.10gb slice each (14 of 108 SMs).
    """
    rows = []
    for mode, measured in NOS_MEASURED.items():
        for pods, seconds in measured.items():
            if mode == "time-slicing":
                speed = time_slicing_speeds([1.0] * pods, params)[0]
            elif mode == "mps":
                speed = mps_speeds([1.0] * pods, [1.0] * pods, params)[0]
            else:
                speed = mig_speed(1.0, A100_1G_SMS, A100_FULL_SMS, params)
            rows.append(CalibrationRow(mode, pods, seconds, NOS_LONE_POD_S / speed))
    return rows
