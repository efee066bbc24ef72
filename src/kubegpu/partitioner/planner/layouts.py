"""The exact planner's columns: every layout a MIG GPU can take while its in-use instances stay where they are,
reduced to the best one per multiset of free instances.

Every legal layout of a model (reference §1.4: 723 placed layouts on an 8-slot GPU without `+me` profiles, 2,319
with them) is enumerated once per model as bit masks over the model's (profile, start) placements, with the same
rules as `geometry.layout_errors` (legal starts, disjoint memory, per-profile maximum, compute slices, one `+me`).
A GPU class (same model, same in-use instances, same free instances) then keeps the layouts that contain its in-use
instances and whose free part only holds profiles some pod asks for or the GPU already has; of the layouts with the
same free multiset only the best survives: fewest instances created plus destroyed, then least fragmentation
(`geometry.free_space_score`), then the lowest index (deterministic). All classes of a model are computed together
as arrays over (layout, class) pairs (a few numpy operations instead of a Python loop per class and layout), and
each class's options are remembered across plans by the planner's `LayoutCache`. Pure.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np
import numpy.typing as npt

from kubegpu.gpu.catalog import GpuModel, MigProfile
from kubegpu.gpu.geometry import PlacedInstance


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


Ints = npt.NDArray[np.int64]


@dataclass(frozen=True, eq=False)
class Options:
    """A GPU class's options as arrays, one row each (sorted by their free multiset): the exact planner builds its
    columns from them in bulk, and only the options a plan chooses become `LayoutOption`s (`option`); iterating
    gives every one as a `LayoutOption`."""

    world: Universe
    free: Ints  # [option, profile]: free instances per profile, in `Universe.profile_ids` order
    layout: Ints  # index of the whole layout in `world.layouts`
    created: Ints
    destroyed: Ints
    frag: Ints

    def __len__(self) -> int:
        return len(self.layout)

    @property
    def churn(self) -> Ints:
        return self.created + self.destroyed

    def option(self, k: int) -> LayoutOption:
        return LayoutOption(tuple(self.free[k].tolist()), self.world.instances(self.world.layouts[int(self.layout[k])]),
                            int(self.created[k]), int(self.destroyed[k]), int(self.frag[k]))

    def __iter__(self) -> Iterator[LayoutOption]:
        return (self.option(k) for k in range(len(self)))


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
        self.memory: list[int] = []  # occupied memory slots of each layout, as a bit mask
        self._enumerate(profiles)
        self._instances: dict[int, tuple[PlacedInstance, ...]] = {}

    def _enumerate(self, profiles: list[MigProfile]) -> None:
        position = {p.profile_id: k for k, p in enumerate(profiles)}
        slots = [(((1 << p.memory_slots) - 1) << s, position[p.profile_id], p) for p, s in self.placements]
        counts = [0] * len(profiles)
        limit = self.model.mig_compute_slices

        def walk(first: int, mask: int, memory: int, slices: int, media: int) -> None:
            self.layouts.append(mask)
            self.counts.append(tuple(counts))
            self.memory.append(memory)
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
        """Minus `geometry.free_space_score` of one layout."""
        return int(self._frags[index])

    @cached_property
    def arrays(self) -> tuple[npt.NDArray[np.bool_], Ints, Ints]:
        """The layouts as arrays: which placements each holds, its instances per profile and its instance count."""
        placements = len(self.placements)
        if placements < 63:
            masks = np.array(self.layouts, dtype=np.int64)
            bits = (masks[:, None] >> np.arange(placements, dtype=np.int64)) & 1 != 0
        else:  # never on the catalog's models (25 placements at most); kept exact all the same
            bits = np.array([[mask >> k & 1 for k in range(placements)] for mask in self.layouts], dtype=bool)
        counts = np.array(self.counts, dtype=np.int64).reshape(len(self.layouts), len(self.profile_ids))
        return bits, counts, bits.sum(axis=1)

    @cached_property
    def _frags(self) -> Ints:
        """`frag` of every layout at once: `geometry.free_space_score` over arrays (the same sum, term by term: for
        each profile that could still be added, its free legal starts times its size squared)."""
        memory = np.array(self.memory, dtype=np.int64)
        _, counts, _ = self.arrays
        position = {p: k for k, p in enumerate(self.profile_ids)}
        by_id = self.model.profile_by_id()
        # as geometry counts them: each profile present once, whatever its count
        compute = (counts > 0).astype(np.int64) @ np.array([by_id[p].compute_slices for p in self.profile_ids],
                                                            dtype=np.int64)
        slices_left = self.model.mig_compute_slices - compute
        score = np.zeros(len(self.layouts), dtype=np.int64)
        for profile in self.model.mig_profiles:
            if profile.media_extensions:
                continue
            k = position.get(profile.profile_id)
            room = slices_left >= profile.compute_slices
            if k is not None:
                room &= counts[:, k] < profile.max_count
            elif profile.max_count <= 0:
                continue
            free_starts = np.zeros(len(self.layouts), dtype=np.int64)
            for start in profile.starts:
                free_starts += (memory & (((1 << profile.memory_slots) - 1) << start)) == 0
            score += np.where(room, free_starts * profile.memory_slots**2, 0)
        return -score

    def frags(self, indices: Ints) -> Ints:
        """Fragmentation (`frag`) of these layouts, as an array."""
        return self._frags[indices]


_PAIRS = 1 << 22  # (row, row) pairs of one batch compared directly; a larger batch takes the lattice


def _undominated(group: npt.NDArray[np.int64], offers: npt.NDArray[np.int64]) -> npt.NDArray[np.bool_]:
    """Which rows (sorted by group, best-ranked first within it) no better-ranked row of their group covers (offers
    at least as much in every profile; offers are distinct within a group).

    Pairs within groups are compared directly while there are few enough; otherwise the best rank over every offer
    covering a point is a suffix minimum over the small lattice of counts, one pass per profile, and a row is
    undominated when that minimum at its own point is its own rank."""
    if not len(offers):
        return np.zeros(0, dtype=bool)
    starts = np.flatnonzero(np.r_[True, np.diff(group) != 0])
    sizes = np.diff(np.r_[starts, len(offers)])
    rank = np.arange(len(offers)) - np.repeat(starts, sizes)
    if int((sizes.astype(np.int64) ** 2).sum()) <= _PAIRS:
        # every (row, better-ranked row of its group) pair at once: a few times cheaper than the lattice on the
        # planner's classes (tens of options each)
        row = np.repeat(np.arange(len(offers), dtype=np.int32), rank)
        step = np.arange(len(row), dtype=np.int32) - np.repeat((np.cumsum(rank) - rank).astype(np.int32), rank)
        other = row - 1 - step
        width = int(offers.max()).bit_length() + 1  # each count in a field with a guard bit above it
        if width * offers.shape[1] <= 62:
            # all profiles compared at once, the counts packed into one integer: (a | guard) - b keeps a field's
            # guard bit exactly when that field of a is at least b's (no borrow crosses a guard bit)
            shifts = np.arange(offers.shape[1], dtype=np.int64) * width
            packed = (offers.astype(np.int64) << shifts).sum(axis=1)
            guard = int(((1 << (width - 1)) << shifts).sum())
            covered = ((packed[other] | guard) - packed[row]) & guard == guard
        else:
            covered = (offers[other] >= offers[row]).all(axis=1)
        keep = np.ones(len(offers), dtype=bool)
        keep[row[covered]] = False
        return keep
    slot = np.repeat(np.arange(len(starts)), sizes)
    dims = tuple(int(n) + 1 for n in offers.max(axis=0))
    if len(starts) * math.prod(dims) > 1 << 24:  # an unusually wide lattice: compare pairs within each group
        keep = np.ones(len(offers), dtype=bool)
        for first, end in zip(starts, np.r_[starts[1:], len(offers)], strict=True):
            block = offers[first:end]
            cover = (block[None, :, :] >= block[:, None, :]).all(axis=2)  # [i, j]: j offers all i does
            keep[first:end] = ~np.tril(cover, k=-1).any(axis=1)
        return keep
    lattice = np.full((len(starts), *dims), len(offers), dtype=np.int32)
    at = (slot, *offers.T)
    lattice[at] = rank
    for axis in range(1, len(dims) + 1):
        lattice = np.flip(np.minimum.accumulate(np.flip(lattice, axis), axis=axis), axis)
    return np.asarray(lattice[at] == rank)


def _counts_of(universe: Universe, mask: int) -> tuple[int, ...]:
    counts = [0] * len(universe.profile_ids)
    position = {p: k for k, p in enumerate(universe.profile_ids)}
    for k, (profile, _) in enumerate(universe.placements):
        if mask >> k & 1:
            counts[position[profile.profile_id]] += 1
    return tuple(counts)


def _pairs(world: Universe, used: npt.NDArray[np.bool_], free: npt.NDArray[np.bool_], barred: npt.NDArray[np.bool_]
           ) -> tuple[Ints, Ints, Ints]:
    """The (layout, class) pairs where the layout keeps the class's in-use instances and adds none of its barred
    placements, with the class's free instances each keeps: on placement bit masks (one integer per layout and
    class) where they fit in 63 bits, as they do on every model of the catalog, else on boolean matrices."""
    bits, _, _ = world.arrays
    placements = len(world.placements)
    if placements < 63:
        weights = np.int64(1) << np.arange(placements, dtype=np.int64)
        masks = np.array(world.layouts, dtype=np.int64)
        used_masks, free_masks, barred_masks = ((m.astype(np.int64) * weights).sum(axis=1)
                                                for m in (used, free, barred))
        grid = masks[:, None]
        holds = ((grid & used_masks) == used_masks) & ((grid & barred_masks) == 0)
        layout, cls = np.nonzero(holds)
        return layout, cls, np.bitwise_count(masks[layout] & free_masks[cls]).astype(np.int64)
    holds = (bits.astype(np.int64) @ used.T.astype(np.int64)) == used.sum(axis=1)
    holds &= (bits.astype(np.int64) @ barred.T.astype(np.int64)) == 0
    layout, cls = np.nonzero(holds)
    return layout, cls, (bits[layout] & free[cls]).sum(axis=1).astype(np.int64)


def _order(keys: tuple[Ints, ...]) -> Ints:
    """`np.lexsort` with the first key most significant: the keys packed into one integer when their ranges fit
    in 62 bits (one sort instead of one per key), else lexsort itself."""
    packed = np.zeros(len(keys[0]), dtype=np.int64)
    width = 0
    for key in keys:
        if not len(key):
            return np.zeros(0, dtype=np.int64)
        low = int(key.min())
        span = (int(key.max()) - low).bit_length()
        width += span
        if width > 62:
            return np.lexsort(keys[::-1])
        packed = (packed << span) | (key - low)
    return np.argsort(packed, kind="stable")


Request = tuple[tuple[PlacedInstance, ...], tuple[PlacedInstance, ...], bool]  # in-use, free instances, frozen
_CHUNK = 1024  # classes computed together (bounds the layouts x classes x profiles arrays)


class LayoutCache:
    """Each model's layout universe (enumerated once) and each GPU class's options, remembered for the planner that
    owns this cache: the options of a class are a pure function of its model, shape and the wanted profiles, and a
    controller re-plans clusters whose GPUs mostly keep their shape (keyed on the model's identity, as hashing a
    whole GpuModel costs more than the lookup saves)."""

    LIMIT = 50_000  # remembered classes before the table is cleared

    def __init__(self) -> None:
        self._universes: dict[tuple[str, int, bool], Universe] = {}
        self._options: dict[tuple[Any, ...], tuple[Universe, Options]] = {}

    def universe(self, model: GpuModel, media_extensions: bool) -> Universe:
        key = (model.key, id(model), media_extensions)
        found = self._universes.get(key)
        if found is None or found.model is not model:
            found = self._universes[key] = Universe(model, media_extensions)
        return found

    def mig_options(self, model: GpuModel, used: tuple[PlacedInstance, ...], free: tuple[PlacedInstance, ...],
                    wanted: frozenset[int], frozen: bool = False) -> tuple[Universe, Options]:
        """The columns of one GPU class (see `mig_options_many`)."""
        return self.mig_options_many(model, wanted, [(used, free, frozen)])[0]

    def mig_options_many(self, model: GpuModel, wanted: frozenset[int], requests: Sequence[Request]
                         ) -> list[tuple[Universe, Options]]:
        """The columns of GPU classes of one model: per class, the best layout per multiset of free instances pods
        want, sorted by it.

        `wanted` are the profile ids pending pods ask for; free counts of other profiles are left out (zero), as
        they serve nobody. A class keeps the layouts holding its in-use instances whose free part only has wanted
        profiles or ones it already has; of those with the same free multiset the best survives (fewest instances
        created plus destroyed, then least fragmentation, then the lowest index: deterministic), and a layout
        another one dominates (at least as many wanted instances of every profile, no more churn and
        fragmentation) is dropped. A frozen GPU keeps its current layout (one option). Classes are computed
        together, as arrays over (layout, class) pairs."""
        found: list[tuple[Universe, Options] | None] = [None] * len(requests)
        batches: dict[bool, list[int]] = {}
        with_media = {p.profile_id for p in model.mig_profiles if p.media_extensions}
        wants_media = bool(with_media & wanted)
        for k, (used, free, frozen) in enumerate(requests):
            remembered = self._options.get((model.key, id(model), wanted, used, free, frozen))
            if remembered is not None and remembered[0].model is model:
                found[k] = remembered
                continue
            media = wants_media or any(i.profile_id in with_media for i in (*used, *free))
            world = self.universe(model, media)
            if frozen:
                used_mask, free_mask = world.mask(used), world.mask(free)
                assert used_mask is not None and free_mask is not None, "a legal layout is always in its universe"
                index = world.layouts.index(used_mask | free_mask)
                now = tuple(a - b for a, b in zip(world.counts[index], _counts_of(world, used_mask), strict=True))
                found[k] = (world, Options(world, np.array([now], dtype=np.int64).reshape(1, len(now)),
                                           np.array([index]), np.zeros(1, dtype=np.int64),
                                           np.zeros(1, dtype=np.int64), np.array([world.frag(index)])))
            else:
                batches.setdefault(media, []).append(k)
        for media, members in batches.items():
            world = self.universe(model, media)
            for first in range(0, len(members), _CHUNK):
                chunk = members[first:first + _CHUNK]
                for k, batched in zip(chunk, _batch(world, wanted, [requests[k] for k in chunk]), strict=True):
                    found[k] = (world, batched)
        if len(self._options) > self.LIMIT:
            self._options.clear()
        for (used, free, frozen), entry in zip(requests, found, strict=True):
            assert entry is not None
            self._options[(model.key, id(model), wanted, used, free, frozen)] = entry
        return [f for f in found if f is not None]


def _batch(world: Universe, wanted: frozenset[int], requests: Sequence[Request]) -> list[Options]:
    _, counts, sizes = world.arrays
    placements = len(world.placements)
    used = np.zeros((len(requests), placements), dtype=bool)
    free = np.zeros((len(requests), placements), dtype=bool)
    allowed = np.zeros((len(requests), len(world.profile_ids)), dtype=bool)
    want = np.array([p in wanted for p in world.profile_ids])
    bit = world.bit
    for c, (in_use, spare, _) in enumerate(requests):
        used[c, [bit[(i.profile_id, i.start)] for i in in_use]] = True
        free[c, [bit[(i.profile_id, i.start)] for i in spare]] = True
        present = {i.profile_id for i in spare}
        allowed[c] = [p in wanted or p in present for p in world.profile_ids]
    position = {p: k for k, p in enumerate(world.profile_ids)}
    of_profile = np.array([position[profile.profile_id] for profile, _ in world.placements], dtype=np.int64)
    # the placements a class may not add: those of profiles no pod wants and the class has no free instance of
    barred = ~allowed[:, of_profile] & ~used
    layout, cls, kept = _pairs(world, used, free, barred)
    base = np.zeros((len(requests), len(world.profile_ids)), dtype=np.int64)
    np.add.at(base, (np.nonzero(used)[0], of_profile[np.nonzero(used)[1]]), 1)  # in-use instances per profile
    n_used, have = used.sum(axis=1), free.sum(axis=1)
    offered = (counts[layout] - base[cls]) * want  # free instances of the layout; unwanted ones serve nobody
    # each offer as one integer, ordered as the offers are lexicographically (first profile most significant)
    radix = int(offered.max(initial=0)) + 1
    weights = radix ** np.arange(offered.shape[1] - 1, -1, -1, dtype=np.int64)
    if radix ** offered.shape[1] >= 1 << 62:  # never on the catalog's models; kept exact all the same
        key = np.unique(offered, axis=0, return_inverse=True)[1].reshape(-1)
    else:
        key = offered @ weights
    churn = have[cls] + (sizes[layout] - n_used[cls]) - 2 * kept
    frag = world.frags(layout)
    # the best layout per (class, offer): fewest changes, then least fragmentation, then the lowest index
    order = _order((cls, key, churn, frag, layout))
    first = np.ones(len(order), dtype=bool)
    first[1:] = (np.diff(key[order]) != 0) | (np.diff(cls[order]) != 0)
    best = order[first]
    # ranked per class by changes, fragmentation, then larger offers: an option is dominated when a better-ranked
    # one of its class offers at least as much of every profile
    best = best[_order((cls[best], churn[best], frag[best], -offered[best].sum(axis=1), key[best]))]
    front = best[_undominated(cls[best], offered[best])]
    front = front[_order((cls[front], key[front]))]
    destroyed = have[cls[front]] - kept[front]
    created = churn[front] - destroyed
    # front is sorted by class: each class's options are one slice of these arrays
    ends = np.cumsum(np.bincount(cls[front], minlength=len(requests))).tolist()
    free_front, layout_front, frag_front = offered[front], layout[front], frag[front]
    found: list[Options] = []
    first_row = 0
    for end in ends:
        rows = slice(first_row, end)
        found.append(Options(world, free_front[rows], layout_front[rows], created[rows], destroyed[rows],
                             frag_front[rows]))
        first_row = end
    return found
