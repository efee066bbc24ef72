"""DRA with structured parameters, scheduler side: the objects, CEL selectors and the allocator (pure, no I/O).

- `model`: ResourceSlice / DeviceClass / ResourceClaim parsed strictly (errors name object and field).
- `celenv`: selectors on `common-expression-language`, with Kubernetes' quantity/semver functions; compiled once.
- `allocator`: kube-scheduler's first-fit, backtracking allocator for one node (counters, taints, constraints).
- `offline`: claims allocated one after another across nodes (`kubegpu dra allocate`, the simulator).
"""

from __future__ import annotations

from kubegpu.scheduling.dra.allocator import Allocator, ClaimError, Pool, gather_pools
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
    "Device",
    "DeviceClass",
    "DeviceId",
    "Outcome",
    "Pool",
    "Request",
    "ResourceSlice",
    "Result",
    "SubRequest",
    "Taint",
    "Toleration",
    "allocate_in_order",
    "allocate_one",
    "compile_selector",
    "flatten",
    "gather_pools",
    "parse_all",
    "parse_claim",
    "parse_class",
    "parse_slice",
]
