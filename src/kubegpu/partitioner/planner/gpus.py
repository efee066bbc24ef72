"""The greedy planner's per-GPU working state: a MIG GPU's tagged layout, an MPS GPU's slices. Immutable, so an
option is a new state and trying and discarding one is free of side effects; also the exact planner's view of
which instances are in use and which are free.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property

from kubegpu.gpu.catalog import GpuModel
from kubegpu.gpu.geometry import PlacedInstance, free_space_score, layout_errors, place
from kubegpu.partitioner.planner.layouts import Universe
from kubegpu.partitioner.planner.model import CurrentInstance, GpuPlan, mig_resource, mps_resource, mps_size
from kubegpu.sharing.names import mig_resource_name

# ---------------------------------------------------------------------------------------------------------------
# Per-GPU working state. Immutable: an option is a new state, so trying and discarding is free of side effects.

FREE, CLAIMED, USED = "free", "claimed", "used"


@dataclass(frozen=True)
class MigGpu:
    index: int
    model: GpuModel
    layout: tuple[tuple[PlacedInstance, str], ...]  # each instance with its tag
    original: tuple[PlacedInstance, ...]
    frozen: bool = False
    cache: GpuCache = field(default_factory=lambda: GpuCache(), compare=False, repr=False)

    def resources(self) -> dict[str, int]:
        return self.cache.resource_ids(self.model)

    def claim(self, resource: str) -> MigGpu | None:
        """A free instance of `resource` claimed, or None. Memoised like `add` (the state is immutable)."""
        memo = self._claimed
        if resource in memo:
            return memo[resource]
        found: MigGpu | None = None
        profile_id = self.resources().get(resource)
        for i, (inst, tag) in enumerate(self.layout):
            if tag == FREE and inst.profile_id == profile_id:
                found = self._relaid((*self.layout[:i], (inst, CLAIMED), *self.layout[i + 1 :]))
                break
        memo[resource] = found
        return found

    def _relaid(self, layout: tuple[tuple[PlacedInstance, str], ...]) -> MigGpu:
        """This GPU with another tagged layout (`dataclasses.replace` costs several times more)."""
        return MigGpu(self.index, self.model, layout, self.original, self.frozen, self.cache)

    @cached_property
    def _claimed(self) -> dict[str, MigGpu | None]:
        return {}

    @cached_property
    def _memo(self) -> dict[str, MigGpu | None]:
        return {}

    def add(self, resource: str) -> MigGpu | None:
        """The cheapest way to create one more instance of `resource` (already claimed), or None. Memoised: the
        state is immutable and the same GPU is asked again for every pod order and every node re-evaluation; and
        the new layout is remembered per GPU shape (model, tagged layout, which claimed instances are original,
        frozen) in the cache, as
        a fleet has thousands of GPUs of a few shapes (the index plays no part in the search)."""
        memo = self._memo
        if resource not in memo:
            original = self.original  # it only tells claimed instances that were there before from new ones
            key = (self.model.key, id(self.model), self.layout, self.frozen, resource,
                   tuple(t == CLAIMED and i in original for i, t in self.layout))
            known = self.cache.additions.get(key)
            if known is not None and known[0] is self.model:
                memo[resource] = None if known[1] is None else self._relaid(known[1])
            else:
                found = memo[resource] = self._add(resource)
                self.cache.remember_addition(key, self.model, None if found is None else found.layout)
        return memo[resource]

    def _add(self, resource: str) -> MigGpu | None:
        profile_id = self.resources().get(resource)
        if profile_id is None or self.frozen:
            return None
        # The options come cheapest first (moving planned instances only when nothing else works): take the first.
        return next((option for option in self._additions(profile_id) if option is not None), None)

    def _additions(self, profile_id: int) -> Iterable[MigGpu | None]:
        """Options in rising cost: add beside everything; drop unclaimed free instances; re-place planned ones."""
        everything = [inst for inst, _ in self.layout]
        yield self._with(self.cache.placed(self.model, [profile_id], everything), keep=self.layout)
        pinned = [(i, t) for i, t in self.layout if t == USED or (t == CLAIMED and i in self.original)]
        movable = [i.profile_id for i, t in self.layout if t == CLAIMED and i not in self.original]
        frees = [(i, t) for i, t in self.layout if t == FREE]
        placed = self.cache.placed(self.model, [*movable, profile_id], [i for i, _ in pinned])
        if placed is not None:
            yield self._refill(pinned, placed, frees)
        used = [(i, t) for i, t in self.layout if t == USED]
        claimed = [i.profile_id for i, t in self.layout if t == CLAIMED]
        placed = self.cache.placed(self.model, [*claimed, profile_id], [i for i, _ in used])
        if placed is not None:
            yield self._refill(used, placed, frees)

    def _with(self, placed: list[PlacedInstance] | None, keep: Sequence[tuple[PlacedInstance, str]]) -> MigGpu | None:
        if placed is None:
            return None
        return self._relaid((*keep, *((i, CLAIMED) for i in placed)))

    def _refill(self, pinned: Sequence[tuple[PlacedInstance, str]], placed: list[PlacedInstance],
                frees: Sequence[tuple[PlacedInstance, str]]) -> MigGpu:
        """Put back the unclaimed free instances that still fit, so as few as possible are destroyed."""
        state = self._relaid((*pinned, *((i, CLAIMED) for i in placed)))
        for inst, tag in frees:
            trial = (*state.layout, (inst, tag))
            if self.cache.legal(self.model, [i for i, _ in trial]):
                state = self._relaid(trial)
        return state

    @cached_property
    def changes(self) -> int:
        """Instances created plus destroyed. A legal layout never holds the same placement twice, so this is the
        size of the symmetric difference of two sets."""
        return len(frozenset(i for i, _ in self.layout).symmetric_difference(self.original))

    @cached_property
    def fragmentation(self) -> int:
        """Lower is better: minus geometry's measure of how useful the free space is."""
        return self.cache.fragmentation(self.model, [i for i, _ in self.layout])

    @cached_property
    def free_counts(self) -> Counter[str]:
        """Instances a new pod could get: all but those in use."""
        return Counter(mig_resource(self.model, i.profile_id) for i, t in self.layout if t != USED)

    def plan(self) -> GpuPlan:
        now = Counter(i for i, _ in self.layout)
        before = Counter(self.original)
        return GpuPlan(
            index=self.index,
            model_key=self.model.key,
            instances=tuple(sorted(now.elements(), key=lambda i: (i.start, i.profile_id))),
            created=sum((now - before).values()),
            destroyed=sum((before - now).values()),
        )


@dataclass(frozen=True)
class MpsGpu:
    index: int
    model_key: str
    capacity_gb: int
    slices: tuple[tuple[int, str], ...]
    original: tuple[int, ...]
    frozen: bool = False

    def claim(self, resource: str) -> MpsGpu | None:
        size = mps_size(resource)
        for i, (gb, tag) in enumerate(self.slices):
            if tag == FREE and gb == size:
                return replace(self, slices=(*self.slices[:i], (gb, CLAIMED), *self.slices[i + 1 :]))
        return None

    def add(self, resource: str) -> MpsGpu | None:
        """Add a slice in spare memory, dropping the largest unclaimed free slices first when memory is short."""
        size = mps_size(resource)
        if size is None or size <= 0 or self.frozen:
            return None
        kept = list(self.slices)
        frees = sorted((s for s in kept if s[1] == FREE), key=lambda s: -s[0])
        while sum(gb for gb, _ in kept) + size > self.capacity_gb:
            if not frees:
                return None
            kept.remove(frees.pop(0))
        return replace(self, slices=(*kept, (size, CLAIMED)))

    @cached_property
    def changes(self) -> int:
        now, before = Counter(gb for gb, _ in self.slices), Counter(self.original)
        return sum((now - before).values()) + sum((before - now).values())

    @cached_property
    def fragmentation(self) -> int:
        return self.capacity_gb - sum(gb for gb, _ in self.slices)  # best fit: fill the fullest GPU first

    @cached_property
    def free_counts(self) -> Counter[str]:
        return Counter(mps_resource(gb) for gb, t in self.slices if t != USED)

    def plan(self) -> GpuPlan:
        now, before = Counter(gb for gb, _ in self.slices), Counter(self.original)
        return GpuPlan(
            index=self.index,
            model_key=self.model_key,
            slices=tuple(sorted(now.elements())),
            created=sum((now - before).values()),
            destroyed=sum((before - now).values()),
        )


GpuState = MigGpu | MpsGpu


class GpuCache:
    """What the greedy's GPU states recompute most, remembered for the planner that owns this cache (and so across
    its plans: a controller re-plans clusters whose GPUs mostly keep their shape). Keyed on a model's key and
    identity: hashing a whole GpuModel on every call was a third of plan time."""

    LIMIT = 100_000  # entries per table before it is cleared

    def __init__(self) -> None:
        self._resource_ids: dict[tuple[str, int], dict[str, int]] = {}
        self._placed: dict[tuple[str, int, tuple[int, ...], tuple[tuple[int, int], ...]],
                           tuple[PlacedInstance, ...] | None] = {}
        self._fragmentation: dict[tuple[str, int, tuple[tuple[int, int], ...]], int] = {}
        self._errors: dict[tuple[str, int, tuple[PlacedInstance, ...]], str] = {}
        self._legal: dict[tuple[str, int, tuple[tuple[int, int], ...]], bool] = {}
        self._legal_masks: dict[tuple[str, int], tuple[GpuModel, dict[tuple[int, int], int], frozenset[int]]] = {}
        self._layouts: dict[tuple[str, int, tuple[tuple[int, int, bool], ...]], tuple[
            GpuModel, tuple[PlacedInstance, ...], tuple[tuple[PlacedInstance, str], ...], str]] = {}
        # MigGpu.add per GPU shape: key → (the model, kept alive so its id stays its own; the new tagged layout)
        self.additions: dict[tuple[object, ...], tuple[GpuModel, tuple[tuple[PlacedInstance, str], ...] | None]] = {}

    def remember_addition(self, key: tuple[object, ...], model: GpuModel,
                          layout: tuple[tuple[PlacedInstance, str], ...] | None) -> None:
        if len(self.additions) > self.LIMIT:
            self.additions.clear()
        self.additions[key] = (model, layout)

    def mig_layout(self, model: GpuModel, instances: Sequence[CurrentInstance]
                   ) -> tuple[tuple[PlacedInstance, ...], tuple[tuple[PlacedInstance, str], ...], str]:
        """A MIG GPU's current layout, its instances tagged in use or free, and the first reason it is illegal ("" if
        legal), once per distinct layout (keyed on plain numbers: a fleet has thousands of GPUs of a few hundred
        shapes, and GPUs of one shape share these tuples, so later steps can key on their identity)."""
        key = (model.key, id(model), tuple((i.profile_id, i.start, i.used) for i in instances))
        found = self._layouts.get(key)
        if found is None or found[0] is not model:
            if len(self._layouts) > self.LIMIT:
                self._layouts.clear()
            layout = tuple(PlacedInstance(i.profile_id, i.start) for i in instances)
            tagged = tuple((placed, USED if i.used else FREE) for placed, i in zip(layout, instances, strict=True))
            found = self._layouts[key] = (model, layout, tagged, self._layout_error(model, key[2]))
        return found[1], found[2], found[3]

    def _layout_error(self, model: GpuModel, instances: tuple[tuple[int, int, bool], ...]) -> str:
        """`layout_error`, short-cut by the model's legal layouts (`layouts.Universe`, with `+me` profiles): a layout
        whose placements form one of them is legal; any other is asked of `geometry.layout_errors` for its reason."""
        key = (model.key, id(model))
        found = self._legal_masks.get(key)
        if found is None or found[0] is not model:
            world = Universe(model, media_extensions=True)
            found = self._legal_masks[key] = (model, world.bit, frozenset(world.layouts))
        _, bit, legal = found
        mask = 0
        for profile_id, start, _ in instances:
            k = bit.get((profile_id, start))
            if k is None or mask >> k & 1:
                break
            mask |= 1 << k
        else:
            if mask in legal:
                return ""
        return self.layout_error(model, tuple(PlacedInstance(p, s) for p, s, _ in instances))

    def layout_error(self, model: GpuModel, layout: tuple[PlacedInstance, ...]) -> str:
        """The first of `geometry.layout_errors` for a GPU's current layout, "" when it is legal: a controller
        re-plans the same layouts pass after pass."""
        key = (model.key, id(model), layout)
        found = self._errors.get(key)
        if found is None:
            if len(self._errors) > self.LIMIT:
                self._errors.clear()
            problems = layout_errors(model, list(layout))
            found = self._errors[key] = problems[0] if problems else ""
        return found

    def legal(self, model: GpuModel, layout: Sequence[PlacedInstance]) -> bool:
        """`geometry.layout_errors` finds nothing: whether it does depends on the placements, not their order (a
        repeated placement overlaps itself, so the key keeps repeats); the same trial layouts recur across GPUs."""
        key = (model.key, id(model), tuple(sorted((i.profile_id, i.start) for i in layout)))
        found = self._legal.get(key)
        if found is None:
            if len(self._legal) > self.LIMIT:
                self._legal.clear()
            found = self._legal[key] = not layout_errors(model, list(layout))
        return found

    def resource_ids(self, model: GpuModel) -> dict[str, int]:
        """`nvidia.com/mig-<profile>` → GI profile id, for one model (ids differ between models: A30 vs A100)."""
        key = (model.key, id(model))
        found = self._resource_ids.get(key)
        if found is None:
            found = self._resource_ids[key] = {mig_resource_name(p.name): p.profile_id for p in model.mig_profiles}
        return found

    def fragmentation(self, model: GpuModel, layout: Sequence[PlacedInstance]) -> int:
        """Minus `geometry.free_space_score` of the layout sorted: the same layouts recur on many GPUs and in every
        pod order (keyed on plain (profile, start) pairs, which sort and hash several times faster)."""
        pairs = tuple(sorted((i.profile_id, i.start) for i in layout))
        key = (model.key, id(model), pairs)
        found = self._fragmentation.get(key)
        if found is None:
            if len(self._fragmentation) > self.LIMIT:
                self._fragmentation.clear()
            found = self._fragmentation[key] = -free_space_score(model, [PlacedInstance(p, s) for p, s in pairs])
        return found

    def placed(self, model: GpuModel, wanted: Sequence[int], fixed: Sequence[PlacedInstance]
               ) -> list[PlacedInstance] | None:
        """`geometry.place`, returning only the new instances (keyed on plain (profile, start) pairs: hashing and
        sorting them is several times cheaper than the dataclass)."""
        pairs = tuple(sorted((i.profile_id, i.start) for i in fixed))
        key = (model.key, id(model), tuple(sorted(wanted)), pairs)
        if key not in self._placed:
            if len(self._placed) > self.LIMIT:
                self._placed.clear()
            result = place(model, key[2], [PlacedInstance(p, s) for p, s in pairs])
            # place returns the fixed instances first, as given, then the new ones
            self._placed[key] = None if result is None else tuple(result[len(pairs):])
        found = self._placed[key]
        return list(found) if found is not None else None
