"""Allocating a list of claims one after another, as `kubegpu dra allocate` and the simulator do.

The scheduler allocates a claim when the first pod using it is scheduled; later pods sharing the claim reuse that
allocation, and claims already allocated in the cluster keep theirs and hold their devices (and counters). So:
every claim with `status.allocation` is first marked as holding its devices (a share of a device that allows
multiple allocations holds its `consumedCapacity` instead); then claims are taken in order, each against what
earlier ones took, on the first node (by name) where all its requests fit. A claim named twice is allocated once.
Pure: parsed objects in, outcomes out.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kubegpu.errors import ConfigError
from kubegpu.scheduling.dra.allocator import Allocator, ClaimError, Consumed, consumed_by
from kubegpu.scheduling.dra.model import (
    Claim,
    DeviceClass,
    DeviceId,
    ResourceSlice,
    Result,
    parse_claim,
    parse_class,
    parse_slice,
)


@dataclass(frozen=True)
class Outcome:
    """One claim's answer: its results (and the node), or why it cannot be allocated."""

    results: tuple[Result, ...] | None = None
    node: str | None = None
    unschedulable: str | None = None

    def to_json(self) -> dict[str, Any]:
        if self.results is None:
            return {"unschedulable": self.unschedulable or "cannot be allocated"}
        return {"results": [r.to_json() for r in self.results]}


def flatten(documents: Iterable[object], source: str) -> list[Mapping[str, Any]]:
    """Objects of a YAML/JSON stream, `kind: List` items and plain lists expanded; anything else is one error line."""
    out: list[Mapping[str, Any]] = []
    for index, document in enumerate(documents):
        if isinstance(document, list):  # a JSON list of objects (what `kubegpu dra slices -o json` prints)
            out.extend(flatten(document, source))
            continue
        if not isinstance(document, Mapping):
            raise ConfigError(f"{source}: document {index + 1}: expected an object, got {type(document).__name__}")
        kind = document.get("kind")
        if isinstance(kind, str) and kind.endswith("List") and "items" in document:
            items = document.get("items") or []
            if not isinstance(items, list):
                raise ConfigError(f"{source}: document {index + 1}: items: expected a list")
            out.extend(flatten(items, source))
        else:
            out.append(document)
    return out


def parse_all(objects: Sequence[Mapping[str, Any]], kind: str, source: str) -> list[Any]:
    """Parse every object of `kind` (ResourceSlice, DeviceClass, ResourceClaim); errors name the file too."""
    parser = {"ResourceSlice": parse_slice, "DeviceClass": parse_class, "ResourceClaim": parse_claim}[kind]
    parsed = []
    for index, obj in enumerate(objects):
        try:
            parsed.append(parser(obj, index))
        except ConfigError as exc:
            raise ConfigError(f"{source}: {exc}") from None
    return parsed


def allocate_in_order(slices: Sequence[ResourceSlice], classes: Mapping[str, DeviceClass],
                      claims: Sequence[Claim]) -> dict[str, Outcome]:
    """Allocate `claims` in order (see module doc); the answer has one entry per distinct claim key."""
    allocator = Allocator(slices, classes)
    in_use: set[DeviceId] = set()
    consumed: dict[DeviceId, dict[str, float]] = {}
    outcomes: dict[str, Outcome] = {}
    # Devices are only ever taken here, never given back, so a claim shape that found no room on a node never will:
    # remembering (node, shape) skips those nodes for later claims of the same shape (1,000 claims x 64 nodes would
    # otherwise re-search every full node for every claim).
    full: set[tuple[str, object]] = set()
    for claim in claims:
        if claim.allocation is not None and claim.key not in outcomes:
            _hold(claim.allocation, in_use, consumed)
            outcomes[claim.key] = Outcome(results=claim.allocation, node=_node_of(allocator, claim.allocation))
    for claim in claims:
        if claim.key in outcomes:
            continue
        shape = (claim.requests, claim.constraints)
        nodes = [n for n in allocator.nodes() if (n, shape) not in full]
        outcomes[claim.key] = allocate_one(allocator, claim, in_use, nodes, failed=full, shape=shape,
                                           consumed=consumed)
        results = outcomes[claim.key].results
        if results is not None:
            admin = {alt.name for r in claim.requests for alt in r.alternatives if alt.admin_access}
            _hold([r for r in results if r.request not in admin], in_use, consumed)  # admin access holds nothing
    return {claim.key: outcomes[claim.key] for claim in claims}


def _hold(results: Sequence[Result], in_use: set[DeviceId], consumed: dict[DeviceId, dict[str, float]]) -> None:
    in_use.update(r.id for r in results if r.share_id is None)
    for device, amounts in consumed_by(results).items():
        entry = consumed.setdefault(device, {})
        for name, amount in amounts.items():
            entry[name] = entry.get(name, 0.0) + amount


def allocate_one(allocator: Allocator, claim: Claim, in_use: set[DeviceId], nodes: Sequence[str] | None = None,
                 failed: set[tuple[str, object]] | None = None, shape: object = None,
                 consumed: Consumed | None = None) -> Outcome:
    """The first node (of `nodes`, default every node by name) where `claim` fits, or why none does; nodes that
    had no room are added to `failed` as (node, shape). `consumed`: what claims took of shared devices."""
    if not claim.requests:
        return Outcome(results=(), node=None)
    failure = ""
    try:
        for node in nodes if nodes is not None else allocator.nodes():
            answer = allocator.allocate(node or None, [claim], in_use, consumed)
            if answer is not None:
                return Outcome(results=answer[claim.key], node=node or None)
            if failed is not None:
                failed.add((node, shape))
            failure = failure or allocator.last_failure
    except ClaimError as exc:
        return Outcome(unschedulable=str(exc))
    what = f"request {failure!r}" if failure else "its requests"
    return Outcome(unschedulable=f"no node has free devices for {what} (with the claim's other requests and "
                                 "constraints)")


def _node_of(allocator: Allocator, results: Sequence[Result]) -> str | None:
    for result in results:
        device = allocator.device(result.id)
        if device is not None:
            pool = next(p for p in allocator.pools if (p.driver, p.name) == (result.driver, result.pool))
            if len(pool.node_names) == 1 and not pool.all_nodes:
                return next(iter(pool.node_names))
    return None
