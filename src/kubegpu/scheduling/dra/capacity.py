"""Consumable capacity (DRAConsumableCapacity, beta in 1.36+): a device several claims share, each taking part of it.

A device with `allowMultipleAllocations: true` is never "in use" as a whole; instead every allocation consumes an
amount of each of its capacities, and the device fits a request while, per capacity, what earlier allocations
consumed plus what this one would consume stays within the capacity's value. What one allocation consumes of a
capacity follows the scheduler's rules (reference/dra.md §4, `CmpRequestOverCapacity`):

- a capacity the request does not name consumes the policy's `default`, or the whole value when there is none;
- a named one is rounded up by the policy: below `validRange.min` to the min, else to the next `min + n*step`;
  or to the first of `validValues` at least as large; with no policy it is taken as asked;
- the result must then satisfy the policy (not above `max`, on the step grid, one of `validValues`), unless it is
  exactly the default; a request naming a capacity the device does not have never fits.

The allocation result records the amounts (`consumedCapacity`, keyed without the domain when it is the driver's)
and a `shareID` telling this share of the device from the others. Pure arithmetic on floats in base units.
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Mapping
from dataclasses import dataclass

SHARE_NAMESPACE = uuid.uuid5(uuid.NAMESPACE_DNS, "share.kubegpu.io")  # kubegpu's own, for share IDs
EPSILON = 1e-9


@dataclass(frozen=True)
class RequestPolicy:
    """A capacity's `requestPolicy`: what one allocation may consume of it."""

    default: float | None = None
    valid_values: tuple[float, ...] = ()  # ascending, as the API requires
    minimum: float | None = None  # validRange.min
    maximum: float | None = None  # validRange.max
    step: float | None = None  # validRange.step


def consumption(requested: float | None, value: float, policy: RequestPolicy | None) -> float | None:
    """What one allocation consumes of a capacity of `value` when it asks for `requested` (None: not named);
    None when the amount breaks the policy (then the device does not fit the request)."""
    if requested is None:
        amount = policy.default if policy is not None and policy.default is not None else value
    elif policy is None:
        amount = requested
    elif policy.minimum is not None:
        amount = _round_up_range(requested, policy.minimum, policy.step)
    elif policy.valid_values:
        amount = next((v for v in policy.valid_values if requested <= v + EPSILON), requested)
    else:
        amount = requested
    if policy is not None and not (policy.default is not None and abs(amount - policy.default) < EPSILON):
        if policy.minimum is not None:
            if policy.maximum is not None and amount > policy.maximum + EPSILON:
                return None
            if policy.step and not _on_grid(amount - policy.minimum, policy.step):
                return None
        elif policy.valid_values and not any(abs(amount - v) < EPSILON for v in policy.valid_values):
            return None
    return amount


def _round_up_range(requested: float, minimum: float, step: float | None) -> float:
    if requested < minimum:
        return minimum
    if not step:
        return requested
    steps = math.ceil((requested - minimum) / step - EPSILON)
    return minimum + step * steps


def _on_grid(offset: float, step: float) -> bool:
    ratio = offset / step
    return abs(ratio - round(ratio)) < 1e-6


def fits(device_capacity: Mapping[str, float], policies: Mapping[str, RequestPolicy],
         requests: Mapping[str, float], consumed: Mapping[str, float]) -> dict[str, float] | None:
    """Per capacity, what this allocation consumes, when it fits beside `consumed` (what other allocations of the
    device took); None when it does not. Names are fully qualified on both sides."""
    if any(name not in device_capacity for name in requests):
        return None
    out = {}
    for name, value in device_capacity.items():
        amount = consumption(requests.get(name), value, policies.get(name))
        if amount is None or consumed.get(name, 0.0) + amount > value + EPSILON:
            return None
        out[name] = amount
    return out


def within(device_capacity: Mapping[str, float], requests: Mapping[str, float]) -> bool:
    """A capacity request on a device that is allocated whole: it fits when every named capacity exists and is at
    least as large as asked."""
    return all(name in device_capacity and amount <= device_capacity[name] + EPSILON
               for name, amount in requests.items())


def share_id(claim: str, request: str, slot: int, device: str) -> str:
    """A share ID in RFC 4122 form (what the API validates), derived from the claim (its UID where known), the
    request, the device slot and the device: the same allocation always gets the same ID, so the simulator and
    `kubegpu dra allocate` answer deterministically, and two shares of one device never collide."""
    return str(uuid.uuid5(SHARE_NAMESPACE, f"{claim}/{request}/{slot}/{device}"))


def result_key(name: str, driver: str) -> str:
    """A consumedCapacity key as the API writes it: without the domain when it is the driver's."""
    domain, _, ident = name.rpartition("/")
    return ident if domain == driver else name
