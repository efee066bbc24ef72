"""The structured-parameters allocator: what kube-scheduler's DRA plugin decides, as a pure function.

Given ResourceSlices, DeviceClasses, the devices other claims already hold and some claims, find devices for every
request of every claim on one node. The search is the scheduler's (reference/dra.md §4): claims in order, each
claim's requests in spec order, for a request its device slots one by one, candidates in (driver, pool) order then
slice name then device order, the next slot resuming after the previous pick; depth-first with backtracking, first
complete solution wins. `firstAvailable` tries its subrequests in order. Per candidate, cheapest check first: in
use, class and request selectors (cached per expression and device), consumable capacity, shared counters, taints,
constraints. A device that allows multiple allocations is never in use as a whole: it fits while its capacities
hold what other claims consumed plus this request's share (`capacity`), and its result carries that share's
`consumedCapacity` and a `shareID`.

Like the scheduler, it first checks every claim of the pod — classes exist, an `All` request sees only complete,
valid pools (its selectors run on every device there), the claim's fewest devices fit in 32 — and such a failure, or
an `All` device breaking the claim's constraint during the search, is a `ClaimError` (kube-scheduler's
SchedulerError: the claim can never be allocated as written), not "no fit". Other selectors run lazily, device by
device after the in-use check. tests/dra/test_controlplane.py holds all of this against the real kube-scheduler.

Why exhaustive first-fit and not something smarter: the point is to predict what the real scheduler will do with
our slices, including its quirks (a driver's device order steers the result). A step budget bounds the exponential
worst case the way the scheduler's Filter timeout does.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from kubegpu.errors import KubegpuError
from kubegpu.scheduling.dra.capacity import fits, share_id, within
from kubegpu.scheduling.dra.celenv import compile_selector
from kubegpu.scheduling.dra.model import (
    BLOCKING_EFFECTS,
    AttrValue,
    Claim,
    Constraint,
    Device,
    DeviceClass,
    DeviceId,
    Request,
    ResourceSlice,
    Result,
    SubRequest,
)

MAX_DEVICES_PER_CLAIM = 32  # AllocationResultsMaxSize
DEFAULT_STEP_BUDGET = 200_000
Candidate = tuple[Device, str]  # a device the selectors accept (""), or the error one of them raised on it
Consumed = Mapping[DeviceId, Mapping[str, float]]  # per shared device, what allocations consumed of each capacity


class Candidates(list[Candidate]):
    """A request's candidates in search order; `errors`: whether any carries a selector error."""

    errors: bool = False


class ClaimError(KubegpuError):
    """A claim that can never be allocated as written (unknown class, failing CEL, All over an incomplete pool)."""


@dataclass
class Pool:
    driver: str
    name: str
    generation: int
    devices: list[Device]
    counters: dict[tuple[str, str], float]  # (counter set, counter) -> total
    node_names: set[str]
    all_nodes: bool
    incomplete: bool
    invalid: str = ""

    def on_node(self, node: str | None) -> bool:
        return self.all_nodes or node is None or node in self.node_names


@dataclass
class _Search:
    """Mutable state of one Allocate call (what is picked, counters used, constraint values)."""

    in_use: set[DeviceId] | frozenset[DeviceId]
    available: dict[tuple[str, str], dict[tuple[str, str], float]]  # pool key -> counter -> available
    consumed: dict[tuple[str, str], dict[tuple[str, str], float]] = field(default_factory=dict)
    picked: list[tuple[Device, SubRequest]] = field(default_factory=list)
    picked_ids: set[DeviceId] = field(default_factory=set)
    shared: Consumed = field(default_factory=dict)  # consumed by claims allocated before this call
    shares: list[dict[str, float] | None] = field(default_factory=list)  # per pick: its consumedCapacity
    taking: dict[DeviceId, dict[str, float]] = field(default_factory=dict)  # consumed by this call's picks
    owner: dict[int, str] = field(default_factory=dict)  # id(SubRequest) -> claim key
    steps: int = 0
    deepest: tuple[int, str] = (-1, "")  # the furthest request the search could not satisfy
    rejected: str = ""  # why the last `_try` refused its device ("" when it took it)


class Allocator:
    """Allocates claims against a fixed set of slices and classes; cheap to query for many nodes and claims."""

    def __init__(self, slices: Iterable[ResourceSlice], classes: Mapping[str, DeviceClass],
                 step_budget: int = DEFAULT_STEP_BUDGET) -> None:
        self.classes = dict(classes)
        self.pools = gather_pools(slices)
        self.step_budget = step_budget
        self._devices = {d.id: d for pool in self.pools for d in pool.devices}
        self._candidate_cache: dict[tuple[tuple[int, ...], tuple[str, ...]], Candidates] = {}
        self._on_node: dict[str | None, list[Pool]] = {}  # the pools a node sees, in pool order (asked per claim)

    # --- queries ----------------------------------------------------------------------------------------------------

    def nodes(self) -> list[str]:
        """Every node some slice names (sorted); [""] when every pool serves all nodes."""
        names = sorted({n for pool in self.pools for n in pool.node_names})
        return names or [""]

    def device(self, device_id: DeviceId) -> Device | None:
        return self._devices.get(device_id)

    # --- allocation -------------------------------------------------------------------------------------------------

    def allocate(self, node: str | None, claims: Sequence[Claim], in_use: Iterable[DeviceId] = (),
                 consumed: Consumed | None = None) -> dict[str, tuple[Result, ...]] | None:
        """Results per claim key when all `claims` fit on `node` together, else None.

        `in_use`: devices held by claims already allocated in the cluster (their counters are taken too);
        `consumed`: what those claims consumed of shared devices (`consumed_by`). Raises ClaimError for a claim that
        cannot be allocated anywhere as written.
        """
        used = in_use if isinstance(in_use, set | frozenset) else set(in_use)  # only read: no copy needed
        on_node = self._on_node.get(node)
        if on_node is None:
            on_node = self._on_node[node] = [p for p in self.pools if p.on_node(node)]
        # like kube-scheduler, never allocate from a pool that is being updated (incomplete) or is invalid
        pools = [p for p in on_node if not p.invalid and not p.incomplete]
        for claim in claims:
            self._validate(on_node, pools, claim)
        search = _Search(in_use=used, available={(p.driver, p.name): self._available(p, used) for p in pools},
                         owner={id(alt): c.key for c in claims for r in c.requests for alt in r.alternatives},
                         shared=consumed or {})
        steps = [(claim, request) for claim in claims for request in claim.requests]
        if self._search(pools, steps, 0, search):
            out: dict[str, list[Result]] = {claim.key: [] for claim in claims}
            uids = {claim.key: claim.uid or claim.key for claim in claims}
            for (device, sub), share in zip(search.picked, search.shares, strict=True):
                key = search.owner[id(sub)]
                if share is None:
                    out[key].append(Result(sub.name, device.id.driver, device.id.pool, device.id.device))
                    continue
                slot = sum(1 for r in out[key] if r.request == sub.name)
                out[key].append(Result(sub.name, device.id.driver, device.id.pool, device.id.device,
                                       share_id=share_id(uids[key], sub.name, slot, device.id.device),
                                       consumed=tuple(sorted(share.items()))))
            return {key: tuple(value) for key, value in out.items()}
        self.last_failure = search.deepest[1]
        return None

    last_failure: str = ""
    """After a failed `allocate`: the furthest request (`<request>` or `<request>/<sub>`) that found no devices."""

    def _validate(self, on_node: list[Pool], pools: list[Pool], claim: Claim) -> None:
        """What kube-scheduler checks before searching, for every claim of the pod: each class exists, an `All`
        (sub)request sees only complete, valid pools, and the fewest devices the claim could take (per request the
        smallest alternative: its count, or for `All` every matching device) fits in one allocation result. Only
        `All` selectors are evaluated here (a selector failing on any device is then fatal); others run lazily."""
        least = 0
        for request in claim.requests:
            needs = []
            for sub in request.alternatives:
                if sub.mode != "All":
                    self._class(claim, sub)
                    needs.append(sub.count)
                    continue
                for pool in on_node:
                    if pool.incomplete or pool.invalid:
                        state = "incomplete" if pool.incomplete else f"invalid ({pool.invalid})"
                        raise ClaimError(f"ResourceClaim {claim.key}: request {sub.name!r} asks for All devices "
                                         f"but pool {pool.driver}/{pool.name} is {state}")
                candidates = self._candidates(pools, claim, sub)
                for device, error in candidates:
                    if error:
                        raise _selector_error(claim, device, error)
                needs.append(len(candidates))
            fewest = min(needs)
            if least + fewest > MAX_DEVICES_PER_CLAIM:
                raise ClaimError(f"ResourceClaim {claim.key}: request {request.name!r}: adding {fewest} devices "
                                 f"exceeds the claim limit of {MAX_DEVICES_PER_CLAIM}, with {least} already "
                                 "accounted for")
            least += fewest

    def _available(self, pool: Pool, used: set[DeviceId] | frozenset[DeviceId]) -> dict[tuple[str, str], float]:
        available = dict(pool.counters)
        for device in pool.devices:
            if device.id in used:
                for set_name, counters in device.consumes:
                    for counter, amount in counters:
                        key = (set_name, counter)
                        if key in available:
                            available[key] = available[key] - amount
        return available

    def _search(self, pools: list[Pool], steps: list[tuple[Claim, Request]], index: int, search: _Search) -> bool:
        if index == len(steps):
            return True
        claim, request = steps[index]
        for sub in request.alternatives:
            candidates = self._candidates(pools, claim, sub)
            if sub.mode == "All":
                if candidates and self._take_all(pools, steps, index, claim, sub, candidates, 0, search):
                    return True
            elif self._take_slot(pools, steps, index, claim, sub, candidates, 0, 0, search):
                return True
            if index >= search.deepest[0]:
                search.deepest = (index, sub.name)
        return False

    def _take_slot(self, pools: list[Pool], steps: list[tuple[Claim, Request]], index: int, claim: Claim,
                   sub: SubRequest, candidates: Candidates, slot: int, start: int, search: _Search) -> bool:
        if slot == sub.count:
            return self._search(pools, steps, index + 1, search)
        if _claim_devices(claim, search) + sub.count - slot > MAX_DEVICES_PER_CLAIM:
            return False
        # stop where too few candidates remain for the open slots, unless a selector error further on would still
        # be reached (and be fatal) in the scheduler's device-by-device walk
        stop = len(candidates) if candidates.errors else len(candidates) - (sub.count - slot) + 1
        for position in range(start, stop):
            device, error = candidates[position]
            if error:  # the scheduler evaluates selectors only on free devices it reaches, and then fails
                if not device.multiple and (device.id in search.picked_ids
                                            or (device.id in search.in_use and not sub.admin_access)):
                    continue
                raise _selector_error(claim, device, error)
            if self._try(device, claim, sub, search):
                if self._take_slot(pools, steps, index, claim, sub, candidates, slot + 1, position + 1, search):
                    return True
                self._release(search)
        return False

    def _take_all(self, pools: list[Pool], steps: list[tuple[Claim, Request]], index: int, claim: Claim,
                  sub: SubRequest, candidates: Candidates, slot: int, search: _Search) -> bool:
        if slot == len(candidates):
            return self._search(pools, steps, index + 1, search)
        device = candidates[slot][0]  # `_validate` raised for any selector error of an All request
        if len(candidates) - slot > MAX_DEVICES_PER_CLAIM - _claim_devices(claim, search):
            return False  # the rest cannot fit in the claim's result: no device is even tried (so no error)
        if not self._try(device, claim, sub, search):
            if search.rejected == "constraint":  # the claim's own constraint rules out a device it must take
                raise ClaimError(f"ResourceClaim {claim.key}: request {sub.name!r}: cannot add device "
                                 f"{device.id.pool}/{device.id.device} because a claim constraint would not be "
                                 "satisfied")
            return False
        if self._take_all(pools, steps, index, claim, sub, candidates, slot + 1, search):
            return True
        self._release(search)
        return False

    def _class(self, claim: Claim, sub: SubRequest) -> DeviceClass:
        device_class = self.classes.get(sub.class_name)
        if device_class is None:
            raise ClaimError(f"ResourceClaim {claim.key}: request {sub.name!r}: DeviceClass {sub.class_name!r} "
                             "not found")
        return device_class

    def _candidates(self, pools: list[Pool], claim: Claim, sub: SubRequest) -> Candidates:
        """Devices of `pools` the class and request selectors accept, in search order, plus those where a selector
        fails at run time, with the error (cached: slices are fixed)."""
        expressions = (*self._class(claim, sub).selectors, *sub.selectors)
        key = (tuple(id(p) for p in pools), expressions)
        cached = self._candidate_cache.get(key)
        if cached is None:
            cached = Candidates((d, error) for pool in pools for d in pool.devices
                                if (error := _selection(d, expressions)) is not None)
            cached.errors = any(error for _, error in cached)
            self._candidate_cache[key] = cached
        return cached

    # --- per-device checks ------------------------------------------------------------------------------------------

    def _try(self, device: Device, claim: Claim, sub: SubRequest, search: _Search) -> bool:
        """Pick `device` for `sub` if every check passes (then the caller must `_release` on backtrack)."""
        search.steps += 1
        if search.steps > self.step_budget:
            raise ClaimError(f"ResourceClaim {claim.key}: allocation search exceeded {self.step_budget} steps")
        search.rejected = "in use"
        share = None
        if device.multiple:
            share = self._share(device, sub, search)
            if share is None:
                search.rejected = "capacity"
                return False
        elif device.id in search.picked_ids or (device.id in search.in_use and not sub.admin_access):
            return False
        elif sub.capacity and not within(device.capacity, _requested(device, sub)):
            search.rejected = "capacity"
            return False
        search.rejected = "counters"
        if not self._counters_fit(device, search):
            return False
        search.rejected = "taint"
        for taint in device.taints:
            if taint.effect in BLOCKING_EFFECTS and not any(t.tolerates(taint) for t in sub.tolerations):
                return False
        search.rejected = "constraint"
        if not _constraints_hold(claim.constraints, device, sub, claim, search):
            return False
        search.rejected = ""
        self._consume(device, search, 1.0)
        search.picked.append((device, sub))
        search.shares.append(share)
        if share is None:
            search.picked_ids.add(device.id)
        else:
            taking = search.taking.setdefault(device.id, {})
            for name, amount in share.items():
                taking[name] = taking.get(name, 0.0) + amount
        return True

    def _release(self, search: _Search) -> None:
        device, _ = search.picked.pop()
        share = search.shares.pop()
        if share is None:
            search.picked_ids.discard(device.id)
        else:
            taking = search.taking[device.id]
            for name, amount in share.items():
                taking[name] -= amount
        self._consume(device, search, -1.0)

    def _share(self, device: Device, sub: SubRequest, search: _Search) -> dict[str, float] | None:
        """What `sub` would consume of a shared device, when that fits beside the device's other allocations."""
        before = dict(search.shared.get(device.id, {}))
        for name, amount in search.taking.get(device.id, {}).items():
            before[name] = before.get(name, 0.0) + amount
        return fits(device.capacity, device.policies, _requested(device, sub), before)

    def _counters_fit(self, device: Device, search: _Search) -> bool:
        if not device.consumes:
            return True
        pool_key = (device.id.driver, device.id.pool)
        available = search.available.get(pool_key, {})
        consumed = search.consumed.get(pool_key, {})
        for set_name, counters in device.consumes:
            for counter, amount in counters:
                key = (set_name, counter)
                if key not in available:
                    return False
                if consumed.get(key, 0.0) + amount > max(available[key], 0.0):
                    return False
        return True

    def _consume(self, device: Device, search: _Search, sign: float) -> None:
        if not device.consumes:
            return
        consumed = search.consumed.setdefault((device.id.driver, device.id.pool), {})
        for set_name, counters in device.consumes:
            for counter, amount in counters:
                consumed[(set_name, counter)] = consumed.get((set_name, counter), 0.0) + sign * amount


def _requested(device: Device, sub: SubRequest) -> dict[str, float]:
    """The request's `capacity.requests` by the device's (fully qualified) capacity names. As in kube-scheduler
    1.37, a requested name must be written exactly as the slice publishes it (`compute` does not match a published
    `gpu.nvidia.com/compute`, nor the other way round); one that is not stays unknown, so the device does not fit."""
    return {device.written.get(name, f"?{name}"): amount for name, amount in sub.capacity}


def consumed_by(results: Iterable[Result]) -> dict[DeviceId, dict[str, float]]:
    """What allocation results consumed of shared devices, summed per device (the `consumed` of `allocate`)."""
    out: dict[DeviceId, dict[str, float]] = {}
    for result in results:
        if result.share_id is None:
            continue
        entry = out.setdefault(result.id, {})
        for name, amount in result.consumed:
            entry[name] = entry.get(name, 0.0) + amount
    return out


def _selection(device: Device, expressions: tuple[str, ...]) -> str | None:
    """"" when every selector accepts the device, None when one rejects it, else the run-time error's text."""
    for expression in expressions:
        try:
            if not compile_selector(expression).matches(device.view, device.memo):
                return None
        except KubegpuError as exc:
            return str(exc)
    return ""


def _selector_error(claim: Claim, device: Device, error: str) -> ClaimError:
    return ClaimError(f"ResourceClaim {claim.key}: device {device.id.pool}/{device.id.device}: {error}")


def _claim_devices(claim: Claim, search: _Search) -> int:
    return sum(1 for _, sub in search.picked if search.owner[id(sub)] == claim.key)


def _constraints_hold(constraints: tuple[Constraint, ...], device: Device, sub: SubRequest, claim: Claim,
                      search: _Search) -> bool:
    """matchAttribute: same typed value as the claim's earlier devices; distinctAttribute: different from all."""
    for constraint in constraints:
        if not constraint.applies(sub):
            continue
        value = device.attribute(constraint.attribute)
        if value is None:
            return False
        earlier: list[AttrValue | None] = [
            other.attribute(constraint.attribute) for other, other_sub in search.picked
            if search.owner[id(other_sub)] == claim.key and constraint.applies(other_sub)
        ]
        if constraint.distinct:
            if value in earlier:
                return False
        elif earlier and earlier[0] != value:
            return False
    return True


def gather_pools(slices: Iterable[ResourceSlice]) -> list[Pool]:
    """Per (driver, pool) the slices of the highest generation, sorted by (driver, pool); devices in slice-name
    order. A pool with fewer slices than `resourceSliceCount` is incomplete; one with a device name twice, invalid."""
    by_pool: dict[tuple[str, str], list[ResourceSlice]] = defaultdict(list)
    for item in slices:
        by_pool[(item.driver, item.pool)].append(item)
    pools = []
    for (driver, name), members in sorted(by_pool.items()):
        generation = max(s.generation for s in members)
        current = sorted((s for s in members if s.generation == generation), key=lambda s: s.name)
        counters: dict[tuple[str, str], float] = {}
        for item in current:
            for set_name, values in item.shared_counters.items():
                for counter, amount in values.items():
                    counters[(set_name, counter)] = counters.get((set_name, counter), 0.0) + amount
        devices = [d for s in current for d in s.devices]
        names = [d.id.device for d in devices]
        invalid = "duplicate device names" if len(names) != len(set(names)) else ""
        pools.append(Pool(driver=driver, name=name, generation=generation, devices=devices, counters=counters,
                          node_names={s.node_name for s in current if s.node_name},
                          all_nodes=any(s.all_nodes for s in current),
                          incomplete=len(current) < max(s.slice_count for s in current), invalid=invalid))
    return pools
