"""Each pod's part of each shared GPU, from what the kubelet assigned (PodResources) and the sharing core's shares.

Pure: the node's reading in, `Holding`s out. A pod's replicas of one device add up (two time-slicing replicas of a
GPU are two shares of it); a pod's annotation lowers its share on every GPU it holds; a DRA claim's devices are
shared by the pods the claim is reserved for, under the claim's own sharing config (`kubegpu.sharing.claimconfig`).
Devices without a share (whole GPUs, MIG devices for one pod) yield no holding, so nothing downstream can act on them.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from kubegpu.errors import KubegpuError
from kubegpu.guard.core import EntityKey, Holding
from kubegpu.sharing.attribution import DRA_DRIVERS, ContainerDevices
from kubegpu.sharing.claimconfig import Sharing, sharing_by_request
from kubegpu.sharing.names import SharingKind, parse_dra_device_name
from kubegpu.sharing.shares import DeviceShare, annotated_limit_mib, claim_consumers, claim_share, effective_share

log = logging.getLogger(__name__)

PodKey = tuple[str, str]  # (namespace, name)


def pod_key(pod: Mapping[str, Any]) -> PodKey:
    metadata = pod.get("metadata") or {}
    return str(metadata.get("namespace") or "default"), str(metadata.get("name") or "")


def build_holdings(containers: Iterable[ContainerDevices], shares: Mapping[str, DeviceShare],
                   pods: Mapping[PodKey, Mapping[str, Any]], claims: Mapping[PodKey, Mapping[str, Any]],
                   gpu_memory: Mapping[EntityKey, int], minors: Mapping[int, int],
                   placements: Mapping[tuple[int, int, int], int],
                   dra_drivers: frozenset[str] = DRA_DRIVERS) -> list[Holding]:
    """One holding per (pod, shared GPU or MIG device). `pods` are the node's pods by (namespace, name) — a pod
    the API does not know (yet) has no UID to match processes with, so it gets no holding; `claims` the
    ResourceClaims its containers use; `gpu_memory` each entity's MiB; `minors`/`placements` resolve DRA names."""
    parts: dict[tuple[PodKey, EntityKey], tuple[SharingKind, int, int | None]] = {}
    seen: set[tuple[PodKey, str]] = set()  # one device counted once per pod, however many containers list it
    for entry in containers:
        key: PodKey = (entry.namespace, entry.pod)
        if entry.claim is not None:
            if entry.resource_name in dra_drivers:
                _claim_parts(key, entry, claims.get((entry.namespace, entry.claim)), gpu_memory, minors, placements,
                             parts, seen)
            continue
        for device_id in entry.device_ids:
            share = shares.get(device_id)
            if share is None or share.share_mib is None or (key, device_id) in seen:
                continue
            seen.add((key, device_id))
            _add(parts, key, (share.gpu_index, share.gi_id), share.kind, share.share_mib, share.mps_limit_mib)
    holdings: list[Holding] = []
    for (key, entity), (kind, share_mib, limit) in sorted(parts.items(), key=lambda item: (item[0][0], item[0][1][0])):
        pod = pods.get(key)
        if pod is None:
            continue
        metadata = pod.get("metadata") or {}
        try:
            annotated = annotated_limit_mib(pod)
        except KubegpuError as exc:
            log.warning("%s; using the sharing config's share", exc)
            annotated = None
        holdings.append(Holding(key[0], key[1], str(metadata.get("uid") or ""), entity, kind,
                                effective_share(share_mib, annotated), limit,
                                terminating=bool(metadata.get("deletionTimestamp"))))
    return holdings


def _add(parts: dict[tuple[PodKey, EntityKey], tuple[SharingKind, int, int | None]], key: PodKey, entity: EntityKey,
         kind: SharingKind, share_mib: int, limit: int | None) -> None:
    previous = parts.get((key, entity))
    if previous is not None:
        share_mib += previous[1]
        limit = (limit or 0) + (previous[2] or 0) or None
    parts[(key, entity)] = (kind, share_mib, limit)


def _claim_parts(key: PodKey, entry: ContainerDevices, claim: Mapping[str, Any] | None,
                 gpu_memory: Mapping[EntityKey, int], minors: Mapping[int, int],
                 placements: Mapping[tuple[int, int, int], int],
                 parts: dict[tuple[PodKey, EntityKey], tuple[SharingKind, int, int | None]],
                 seen: set[tuple[PodKey, str]]) -> None:
    """A shared claim's devices: 1/consumers each, or the claim's MPS limit. Without the claim object no share can
    be known, and the pod is left alone (the guard never guesses against a pod)."""
    if claim is None:
        return
    consumers = claim_consumers(claim)
    sharing = _claim_sharing(claim, entry.resource_name)
    for name in entry.device_ids:
        parsed = parse_dra_device_name(name)
        if parsed is None or parsed[0] not in minors or (key, f"dra:{entry.claim}:{name}") in seen:
            continue
        seen.add((key, f"dra:{entry.claim}:{name}"))
        index = minors[parsed[0]]
        gi_id = None
        if parsed[1] is not None and parsed[2] is not None:
            found = placements.get((index, parsed[1], parsed[2]))
            if found is None:
                continue
            gi_id = found
        entity = (index, gi_id)
        memory = gpu_memory.get(entity)
        if memory is None:
            continue
        kind, share_mib, limit = claim_share(sharing.get(name), memory, consumers, str(index), mig=gi_id is not None)
        if share_mib is not None:
            _add(parts, key, entity, kind, share_mib, limit)


def _claim_sharing(claim: Mapping[str, Any], driver: str) -> dict[str, Sharing]:
    """Device name → the sharing its request was prepared with (`status.allocation.devices`)."""
    devices = ((claim.get("status") or {}).get("allocation") or {}).get("devices") or {}
    results: Sequence[Mapping[str, Any]] = [r for r in devices.get("results") or [] if r.get("driver") == driver]
    try:
        by_request = sharing_by_request(devices.get("config") or [], driver, [str(r.get("request")) for r in results])
    except KubegpuError as exc:
        log.warning("claim %s: %s", (claim.get("metadata") or {}).get("name"), exc)
        by_request = {}
    return {str(r.get("device")): by_request.get(str(r.get("request")), Sharing()) for r in results}
