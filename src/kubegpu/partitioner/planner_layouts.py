"""The exact planner's columns: every layout a MIG GPU can take while its in-use instances stay where they are,
reduced to the best one per multiset of free instances.

Every legal layout of a model (reference §1.4: 723 placed layouts on an 8-slot GPU without `+me` profiles, 2,319
with them) is enumerated once per model as bit masks over the model's (profile, start) placements, with the same
rules as `geometry.layout_errors` (legal starts, disjoint memory, per-profile maximum, compute slices, one `+me`).
A GPU class (same model, same in-use instances, same free instances) then keeps the layouts that contain its in-use
instances and whose free part only holds profiles some pod asks for or the GPU already has; of the layouts with the
same free multiset only the best survives: fewest instances created plus destroyed, then least fragmentation
(`geometry.free_space_score`), then the lowest index (deterministic). Pure, memoised per model and in-use set.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from kubegpu.gpu.catalog import GpuModel, MigProfile
from kubegpu.gpu.geometry import PlacedInstance, free_space_score


@dataclass(frozen=True)
class LayoutOption:
    """One column of a GPU class: the whole layout, the free instances it offers and what it costs."""

    free: tuple[int, ...]  # free instances per profile, in `Universe.profile_ids` order
    instances: tuple[PlacedInstance, ...]  # the whole layout, in-use instances included, sorted by start
    created: int
    destroyed: int
    frag: int  # minus `free_space_score`: lower is less fragmented

    @property
    def churn(self) -> int:
        return self.created + self.destroyed


class Universe:
    """Every legal layout of one model (with or without `+me` profiles), as masks over its placements."""

    def __init__(self, model: GpuModel, media_extensions: bool) -> None:
        self.model = model
        profiles = [p for p in model.mig_profiles if media_extensions or not p.media_extensions]
        self.profile_ids = tuple(p.profile_id for p in profiles)
        self.placements: list[tuple[MigProfile, int]] = [(p, s) for p in profiles for s in p.starts]
        self.bit = {(p.profile_id, s): k for k, (p, s) in enumerate(self.placements)}
        self.layouts: list[int] = []
        self.counts: list[tuple[int, ...]] = []
        self._enumerate(profiles)
        self._frag: dict[int, int] = {}
        self._instances: dict[int, tuple[PlacedInstance, ...]] = {}

    def _enumerate(self, profiles: list[MigProfile]) -> None:
        position = {p.profile_id: k for k, p in enumerate(profiles)}
        slots = [(((1 << p.memory_slots) - 1) << s, position[p.profile_id], p) for p, s in self.placements]
        counts = [0] * len(profiles)
        limit = self.model.mig_compute_slices

        def walk(first: int, mask: int, memory: int, slices: int, media: int) -> None:
            self.layouts.append(mask)
            self.counts.append(tuple(counts))
            for k in range(first, len(slots)):
                memory_mask, index, profile = slots[k]
                if (memory & memory_mask or counts[index] >= profile.max_count
                        or slices + profile.compute_slices > limit
                        or (profile.media_extensions and media)):
                    continue
                counts[index] += 1
                walk(k + 1, mask | 1 << k, memory | memory_mask, slices + profile.compute_slices,
                     media + profile.media_extensions)
                counts[index] -= 1

        walk(0, 0, 0, 0, 0)

    def mask(self, instances: tuple[PlacedInstance, ...]) -> int | None:
        """The placement mask of `instances`, None if one of them is outside this universe."""
        mask = 0
        for inst in instances:
            k = self.bit.get((inst.profile_id, inst.start))
            if k is None:
                return None
            mask |= 1 << k
        return mask

    def instances(self, mask: int) -> tuple[PlacedInstance, ...]:
        """The placed instances of a layout mask, sorted by start (memoised: plans ask for the same layouts)."""
        found = self._instances.get(mask)
        if found is None:
            placed = [PlacedInstance(p.profile_id, s) for k, (p, s) in enumerate(self.placements) if mask >> k & 1]
            found = self._instances[mask] = tuple(sorted(placed, key=lambda i: (i.start, i.profile_id)))
        return found

    def frag(self, index: int) -> int:
        if index not in self._frag:
            self._frag[index] = -free_space_score(self.model, list(self.instances(self.layouts[index])))
        return self._frag[index]

    @lru_cache(maxsize=4096)  # noqa: B019 - one Universe per model lives for the process; the cache is the point
    def around(self, used: int, allowed: frozenset[int], wanted: frozenset[int]
               ) -> tuple[tuple[int, int, tuple[int, ...]], ...]:
        """(layout index, layout mask, free counts of wanted profiles) of the layouts holding every `used`
        placement whose free part only has profiles in `allowed` (profile ids); other profiles count as zero."""
        base = _counts_of(self, used)
        found = []
        banned = [k for k, p in enumerate(self.profile_ids) if p not in allowed]
        keep = [p in wanted for p in self.profile_ids]
        for index, mask in enumerate(self.layouts):
            if mask & used != used:
                continue
            free = [a - b for a, b in zip(self.counts[index], base, strict=True)]
            if any(free[k] for k in banned):
                continue
            found.append((index, mask, tuple(n if k else 0 for n, k in zip(free, keep, strict=True))))
        return tuple(found)


def _counts_of(universe: Universe, mask: int) -> tuple[int, ...]:
    counts = [0] * len(universe.profile_ids)
    position = {p: k for k, p in enumerate(universe.profile_ids)}
    for k, (profile, _) in enumerate(universe.placements):
        if mask >> k & 1:
            counts[position[profile.profile_id]] += 1
    return tuple(counts)


@lru_cache(maxsize=64)
def universe(model: GpuModel, media_extensions: bool) -> Universe:
    return Universe(model, media_extensions)


def mig_options(model: GpuModel, used: tuple[PlacedInstance, ...], free: tuple[PlacedInstance, ...],
                wanted: frozenset[int], frozen: bool = False) -> tuple[Universe, list[LayoutOption]]:
    """The columns of one GPU class: the best layout per multiset of free instances pods want, sorted by it.

    `wanted` are the profile ids pending pods ask for; free counts of other profiles are left out (zero), as they
    serve nobody. A layout another one dominates (at least as many wanted instances of every profile, no more churn
    and fragmentation) is dropped. A frozen GPU keeps its current layout (one option).
    """
    media = any(model.profile(p).media_extensions for p in wanted) or any(
        model.profile(i.profile_id).media_extensions for i in (*used, *free))
    world = universe(model, media)
    used_mask, free_mask = world.mask(used), world.mask(free)
    assert used_mask is not None and free_mask is not None, "a legal layout is always inside its universe"
    have = free_mask.bit_count()
    if frozen:
        index = world.layouts.index(used_mask | free_mask)
        counts = tuple(a - b for a, b in zip(world.counts[index], _counts_of(world, used_mask), strict=True))
        return world, [LayoutOption(counts, world.instances(used_mask | free_mask), 0, 0, world.frag(index))]
    allowed = frozenset(wanted | {i.profile_id for i in free})
    best: dict[tuple[int, ...], tuple[int, int, int, int]] = {}  # wanted free counts → (churn, frag, index, kept)
    for index, mask, counts in world.around(used_mask, allowed, frozenset(wanted)):  # unwanted ones serve nobody
        kept = (mask & free_mask).bit_count()
        churn = have + (mask & ~used_mask).bit_count() - 2 * kept
        current = best.get(counts)
        if current is not None and current[0] < churn:
            continue
        key = (churn, world.frag(index), index, kept)
        if current is None or key < current:
            best[counts] = key
    guard = sum(16 << 5 * k for k in range(len(world.profile_ids)))
    front: list[tuple[tuple[int, ...], int, int, int, int]] = []  # the options no other one dominates
    packed_front: list[int] = []
    for counts, (churn, frag, index, kept) in sorted(best.items(), key=lambda kv: (kv[1][:2], -sum(kv[0]), kv[0])):
        # sorted by churn and fragmentation: only an earlier option can dominate this one (offer at least as much).
        # Counts are packed 5 bits each with a guard bit, so "every count >= " is one subtraction (no count > 15).
        packed = sum(n << 5 * k for k, n in enumerate(counts))
        if not any((other | guard) - packed & guard == guard for other in packed_front):
            front.append((counts, churn, frag, index, kept))
            packed_front.append(packed)
    options = []
    for counts, churn, frag, index, kept in sorted(front):
        destroyed = have - kept
        options.append(LayoutOption(counts, world.instances(world.layouts[index]), churn - destroyed, destroyed,
                                    frag))
    return world, options
