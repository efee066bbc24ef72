"""DRA with structured parameters, scheduler side: the objects, CEL selectors and the allocator (pure, no I/O).

- `model`: ResourceSlice / DeviceClass / ResourceClaim parsed strictly (errors name object and field).
- `celenv`: selectors on `common-expression-language`, with Kubernetes' quantity/semver functions; compiled once.
- `capacity`: consumable capacity (devices shared by claims, each consuming part; policies, share IDs).
- `allocator`: kube-scheduler's first-fit, backtracking allocator for one node (counters, taints, constraints,
  consumable capacity).
- `offline`: claims allocated one after another across nodes (`kubegpu dra allocate`, the simulator).
"""

from __future__ import annotations

from kubegpu.scheduling.dra.allocator import Allocator, ClaimError, Consumed, Pool, consumed_by, gather_pools
from kubegpu.scheduling.dra.capacity import RequestPolicy
from kubegpu.scheduling.dra.celenv import CelCompileError, CelRuntimeError, compile_selector
from kubegpu.scheduling.dra.model import (
    Claim,
    Constraint,
    Device,
    DeviceClass,
    DeviceId,
    Request,
    ResourceSlice,
    Result,
    SubRequest,
    Taint,
    Toleration,
    parse_claim,
    parse_class,
    parse_slice,
)
from kubegpu.scheduling.dra.offline import Outcome, allocate_in_order, allocate_one, flatten, parse_all

__all__ = [
    "Allocator",
    "CelCompileError",
    "CelRuntimeError",
    "Claim",
    "ClaimError",
    "Constraint",
    "Consumed",
    "Device",
    "DeviceClass",
    "DeviceId",
    "Outcome",
    "Pool",
    "Request",
    "RequestPolicy",
    "ResourceSlice",
    "Result",
    "SubRequest",
    "Taint",
    "Toleration",
    "allocate_in_order",
    "allocate_one",
    "compile_selector",
    "consumed_by",
    "flatten",
    "gather_pools",
    "parse_all",
    "parse_claim",
    "parse_class",
    "parse_slice",
]
