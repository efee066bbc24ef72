"""The ResourceSlices a node publishes, and the device taints that follow GPU health.

One pool per node (pool name = node name, as NVIDIA's driver does), split over as many slices as the API's limits
need: at most 128 devices per slice, 64 once any device has taints or consumes counters (1.35+), and at most 8
counter sets per slice. Two layouts for partitionable devices (reference/dra.md §5.4): `split` (1.35+: counter sets
in their own slices, one device slice per GPU) and `combined` (1.34: each GPU's slice carries its counter set).
Every slice of a publication carries the same pool generation, bumped by the publisher whenever the content
changes, so consumers never mix two versions of the pool. Pure: offers in, slice objects out.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kubegpu.dra.devices import DRIVER, GpuOffer
from kubegpu.gpu.xid import is_fatal

API_VERSION = "resource.k8s.io/v1"
MAX_DEVICES = 128
MAX_DEVICES_ADVANCED = 64  # ResourceSliceMaxDevicesWithAdvancedFeatures (taints or consumesCounters)
MAX_COUNTER_SETS = 8
LAYOUTS = ("split", "combined")

XID_TAINT_KEY = f"{DRIVER}/xid"


@dataclass(frozen=True)
class GpuHealth:
    """The last critical XID seen on a GPU that has not recovered."""

    xid: int

    def taint(self) -> dict[str, str]:
        effect = "NoExecute" if is_fatal(self.xid) else "NoSchedule"
        return {"key": XID_TAINT_KEY, "value": str(self.xid), "effect": effect}


def build_slices(node_name: str, offers: Sequence[GpuOffer], unhealthy: Mapping[int, GpuHealth] | None = None,
                 generation: int = 1, driver: str = DRIVER, layout: str = "split") -> list[dict[str, Any]]:
    """ResourceSlices for one node's pool; `unhealthy` (GPU index → last critical XID) taints that GPU's devices."""
    if layout not in LAYOUTS:
        raise ValueError(f"unknown slice layout {layout!r}")
    unhealthy = unhealthy or {}
    per_gpu = [[_with_taint(d, unhealthy.get(o.gpu.index)) for d in o.devices] for o in offers]
    counter_sets = [o.counter_set for o in offers if o.counter_set is not None]
    specs: list[dict[str, Any]] = []
    if counter_sets and layout == "combined":
        for offer, devices in zip(offers, per_gpu, strict=True):
            extra = {"sharedCounters": [offer.counter_set]} if offer.counter_set else {}
            specs.extend({"devices": chunk, **extra} if i == 0 else {"devices": chunk}
                         for i, chunk in enumerate(_chunks(devices, _limit(devices))))
    elif counter_sets:
        specs.extend({"sharedCounters": chunk} for chunk in _chunks(counter_sets, MAX_COUNTER_SETS))
        for devices in per_gpu:
            specs.extend({"devices": chunk} for chunk in _chunks(devices, _limit(devices)))
    else:
        devices = [d for group in per_gpu for d in group]
        specs.extend({"devices": chunk} for chunk in _chunks(devices, _limit(devices)))
    specs = [s for s in specs if s.get("devices") or s.get("sharedCounters")] or [{"devices": []}]
    return [
        {
            "apiVersion": API_VERSION,
            "kind": "ResourceSlice",
            "metadata": {"name": slice_name(node_name, driver, index)},
            "spec": {
                "driver": driver,
                "pool": {"name": node_name, "generation": generation, "resourceSliceCount": len(specs)},
                "nodeName": node_name,
                **spec,
            },
        }
        for index, spec in enumerate(specs)
    ]


def slice_name(node_name: str, driver: str, index: int) -> str:
    """`<node>-<driver>-<NNN>`: zero-padded so name order (the order consumers read slices in) is GPU order; a name
    beyond the 253 characters of a DNS subdomain keeps a hash of the node name instead of its tail."""
    name = f"{node_name}-{driver}-{index:03d}"
    if len(name) <= 253:
        return name
    digest = hashlib.sha256(node_name.encode()).hexdigest()[:10]
    return f"{node_name[:253 - len(driver) - 17].rstrip('.-')}-{digest}-{driver}-{index:03d}"


def _with_taint(device: dict[str, Any], health: GpuHealth | None) -> dict[str, Any]:
    if health is None:
        return device
    return {**device, "taints": [health.taint()]}


def _limit(devices: Iterable[Mapping[str, Any]]) -> int:
    advanced = any("taints" in d or "consumesCounters" in d for d in devices)
    return MAX_DEVICES_ADVANCED if advanced else MAX_DEVICES


def _chunks(items: Sequence[Any], size: int) -> list[list[Any]]:
    return [list(items[i:i + size]) for i in range(0, len(items), size)]
