"""Exact MIG geometry: which layouts are legal, where new instances go, and every layout a GPU can hold.

A layout is a set of GPU instances, each a GI profile id at a start position. It is legal when (§1 of
reference/mig-geometry-and-partitioning.md): every start is one the profile allows, the memory intervals
`[start, start + memory_slots)` are disjoint, no profile exceeds its maximum count, the compute slices add up to
at most the model's, and at most one `+me` (media extensions) instance exists. Everything is keyed on profile id
and start; names are display labels only. Pure functions, no I/O: the planner, the MIG manager, the config
validator and the simulator all call them.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from kubegpu.errors import ConfigError, NotFoundError
from kubegpu.gpu.catalog import GpuModel, MigProfile


@dataclass(frozen=True, order=True)
class PlacedInstance:
    """One GPU instance: its GI profile id and the first memory slot it occupies."""

    profile_id: int
    start: int


def _mask(profile: MigProfile, start: int) -> int:
    return ((1 << profile.memory_slots) - 1) << start


def _label(model: GpuModel, instance: PlacedInstance) -> str:
    profile = model.profile_by_id().get(instance.profile_id)
    name = profile.name if profile else f"profile {instance.profile_id}"
    return f"{name}@{instance.start}"


def layout_errors(model: GpuModel, layout: Sequence[PlacedInstance]) -> list[str]:
    """Every reason `layout` is illegal on `model`, one short line each; [] when it is legal."""
    if not model.mig_capable:
        return [f"GPU model {model.key} is not MIG-capable"] if layout else []
    profiles = model.profile_by_id()
    errors: list[str] = []
    occupied: dict[int, PlacedInstance] = {}
    for instance in layout:
        profile = profiles.get(instance.profile_id)
        if profile is None:
            errors.append(f"GPU model {model.key} has no MIG profile id {instance.profile_id}")
            continue
        if instance.start not in profile.starts:
            legal = ",".join(map(str, profile.starts))
            errors.append(f"{_label(model, instance)}: start {instance.start} is not a legal placement "
                          f"(legal starts: {legal})")
            continue
        for slot in range(instance.start, instance.start + profile.memory_slots):
            if slot in occupied:
                other = _label(model, occupied[slot])
                errors.append(f"{_label(model, instance)} overlaps {other} at memory slot {slot}")
                break
        for slot in range(instance.start, instance.start + profile.memory_slots):
            occupied.setdefault(slot, instance)
    errors.extend(_count_errors(model, [i.profile_id for i in layout if i.profile_id in profiles]))
    return errors


def _count_errors(model: GpuModel, profile_ids: Sequence[int]) -> list[str]:
    """Placement-independent limits: per-profile maximum, compute slices, one `+me` instance."""
    profiles = model.profile_by_id()
    errors = []
    for profile_id, count in sorted(Counter(profile_ids).items()):
        profile = profiles[profile_id]
        if count > profile.max_count:
            errors.append(f"{count} x {profile.name} exceeds its maximum of {profile.max_count}")
    slices = sum(profiles[p].compute_slices for p in profile_ids)
    if slices > model.mig_compute_slices:
        errors.append(f"the instances need {slices} compute slices; {model.key} has {model.mig_compute_slices}")
    media = sum(1 for p in profile_ids if profiles[p].media_extensions)
    if media > 1:
        errors.append(f"{media} +me instances; at most one is allowed per GPU")
    return errors


def is_legal(model: GpuModel, layout: Sequence[PlacedInstance]) -> bool:
    return not layout_errors(model, layout)


def free_slots(model: GpuModel, layout: Sequence[PlacedInstance]) -> tuple[int, ...]:
    """Memory slots no instance of `layout` occupies (unknown profile ids are ignored)."""
    used = _occupied_mask(model, layout)
    return tuple(slot for slot in range(model.mig_memory_slots) if not used >> slot & 1)


def _occupied_mask(model: GpuModel, layout: Sequence[PlacedInstance]) -> int:
    profiles = model.profile_by_id()
    used = 0
    for instance in layout:
        profile = profiles.get(instance.profile_id)
        if profile is not None:
            used |= _mask(profile, instance.start)
    return used


# --- placement ------------------------------------------------------------------------------------------------------


def place(model: GpuModel, wanted: Sequence[int], fixed: Sequence[PlacedInstance] = ()) -> list[PlacedInstance] | None:
    """Give each wanted profile id a legal start around `fixed` instances, which never move; None if impossible.

    Returns the whole layout: the fixed instances first, as given, then one instance per entry of `wanted`, in
    `wanted`'s order. Among all legal completions it picks the one that leaves the most useful free space (see
    `free_space_score`), so a 3g goes to 4 and keeps 0..3 for a 4g, and small instances pack from the top edge;
    ties go to the higher starts, making the answer deterministic. An illegal `fixed` layout gives None.
    Unknown profile ids raise NotFoundError.
    """
    profiles = [model.profile(profile_id) for profile_id in wanted]
    if layout_errors(model, fixed):
        return None
    if _count_errors(model, [*(i.profile_id for i in fixed), *wanted]):
        return None
    order = sorted(range(len(profiles)), key=lambda k: (-profiles[k].memory_slots, profiles[k].profile_id, k))
    best: tuple[tuple[int, tuple[int, ...]], list[int]] | None = None
    for starts in _completions([profiles[k] for k in order], _occupied_mask(model, fixed)):
        by_wanted = [0] * len(profiles)
        for position, k in enumerate(order):
            by_wanted[k] = starts[position]
        layout = [*fixed, *(PlacedInstance(p.profile_id, s) for p, s in zip(profiles, by_wanted, strict=True))]
        key = (free_space_score(model, layout), tuple(starts))
        if best is None or key > best[0]:
            best = (key, by_wanted)
    if best is None:
        return None
    return [*fixed, *(PlacedInstance(p.profile_id, s) for p, s in zip(profiles, best[1], strict=True))]


def _completions(profiles: Sequence[MigProfile], used: int, floor: int = -1) -> Iterator[list[int]]:
    """Every way to give `profiles` (sorted so equal profiles are adjacent) disjoint legal starts.

    Equal neighbours take increasing starts, so each set of positions is produced once.
    """
    if not profiles:
        yield []
        return
    head, rest = profiles[0], profiles[1:]
    for start in head.starts:
        if start <= floor or used & _mask(head, start):
            continue
        next_floor = start if rest and rest[0].profile_id == head.profile_id else -1
        for tail in _completions(rest, used | _mask(head, start), next_floor):
            yield [start, *tail]


def free_space_score(model: GpuModel, layout: Sequence[PlacedInstance]) -> int:
    """How useful the free space around `layout` is: higher means less fragmented.

    Sums, over every profile that could still be added (count and compute permitting, `+me` variants left out as
    duplicates), the number of legal starts whose interval is entirely free, weighted by the square of the
    profile's size, so one free aligned 4-slot block outweighs scattered single slots.
    """
    used = _occupied_mask(model, layout)
    counts = Counter(i.profile_id for i in layout)
    by_id = model.profile_by_id()
    slices_left = model.mig_compute_slices - sum(by_id[p].compute_slices for p in counts if p in by_id)
    score = 0
    for profile in model.mig_profiles:
        if profile.media_extensions or counts[profile.profile_id] >= profile.max_count:
            continue
        if profile.compute_slices > slices_left:
            continue
        free_starts = sum(1 for s in profile.starts if not used & _mask(profile, s))
        score += free_starts * profile.memory_slots**2
    return score


def fits(model: GpuModel, wanted: Sequence[int], fixed: Sequence[PlacedInstance] = ()) -> bool:
    """Whether `wanted` profile ids can be added around `fixed` (a cheaper question than `place`)."""
    if layout_errors(model, fixed) or _count_errors(model, [*(i.profile_id for i in fixed), *wanted]):
        return False
    profiles = sorted((model.profile(p) for p in wanted), key=lambda p: (-p.memory_slots, p.profile_id))
    return next(_completions(profiles, _occupied_mask(model, fixed)), None) is not None


# --- enumeration ----------------------------------------------------------------------------------------------------


def feasible_multisets(model: GpuModel, include_media_extensions: bool = False) -> list[tuple[int, ...]]:
    """Every non-empty multiset of GI profiles that some legal layout realises.

    Each multiset is a sorted tuple of profile ids; the list is sorted. `+me` profiles count only when asked for.
    The empty GPU is left out: on an 8-slot GPU with the classes {1g, 1g double-mem, 2g, 3g, 4g, 7g} there are 77
    non-empty feasible multisets (78 with the empty one), which is the reference's "77 feasible" (§1.4).
    """
    profiles = _candidate_profiles(model, include_media_extensions)
    found: list[tuple[int, ...]] = []

    def extend(index: int, chosen: list[int]) -> None:
        if index == len(profiles):
            if chosen:
                found.append(tuple(sorted(chosen)))
            return
        profile = profiles[index]
        for count in range(profile.max_count + 1):
            candidate = chosen + [profile.profile_id] * count
            if count and not fits(model, candidate):
                break
            extend(index + 1, candidate)

    extend(0, [])
    return sorted(found)


def maximal_multisets(model: GpuModel, include_media_extensions: bool = False) -> list[tuple[int, ...]]:
    """Feasible multisets to which no further profile (of those considered) can be added."""
    profiles = _candidate_profiles(model, include_media_extensions)
    feasible = feasible_multisets(model, include_media_extensions)
    feasible_set = set(feasible)
    return [
        multiset for multiset in feasible
        if not any(tuple(sorted((*multiset, p.profile_id))) in feasible_set for p in profiles)
    ]


def _candidate_profiles(model: GpuModel, include_media_extensions: bool) -> list[MigProfile]:
    return [p for p in model.mig_profiles if include_media_extensions or not p.media_extensions]


# --- text form ------------------------------------------------------------------------------------------------------


def format_layout(model: GpuModel, layout: Sequence[PlacedInstance]) -> str:
    """`3g.40gb@4,1g.10gb@0`: the placement-exact form used in node annotations."""
    return ",".join(_label(model, instance) for instance in layout)


def parse_layout(model: GpuModel, text: str, source: str = "layout") -> list[PlacedInstance]:
    """Parse `format_layout`'s form (names or profile ids before `@`); ConfigError naming `source` if malformed."""
    layout = []
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, sep, start = item.rpartition("@")
        if not sep or not start.isdigit():
            raise ConfigError(f"{source}: {item!r} is not <profile>@<start>")
        key: str | int = int(name) if name.isdigit() else name
        try:
            profile = model.profile(key)
        except NotFoundError as exc:
            raise ConfigError(f"{source}: {exc}") from exc
        layout.append(PlacedInstance(profile.profile_id, int(start)))
    return layout
