"""Charging pods' ResourceClaims through the API server's own quota accounting: charge holders.

A pod with `spec.resourceClaims` starts behind the scheduling gate `kubegpu.io/gpu-memory` (the parameterless
`kubegpu-claim-gate` policy). For each gated pod the quota controller computes every claim's charge
(`kubegpu.quota.claims`) and creates a **charge holder** per charged claim: a pod in the same namespace that requests
(and limits) exactly that `kubegpu.io/gpu-memory`, stays behind the same gate forever (never scheduled, never runs),
and is owned by what it charges — the claim pod for a claim from a template, the ResourceClaim itself for a named one
(a shared claim is charged once, however many pods use it) — so the garbage collector gives the charge back with it;
a claim pod that finishes gives its charge back at once (the controller evicts its holders).

Creating the holder goes through the ResourceQuota admission plugin, which checks and updates `used` with its own
compare-and-swap: no race with any other pod, no cache of ours to be stale. Refused for exceeding a quota, the claim
pod stays gated with a `GPUMemoryCharged=False` condition (reason `GPUMemoryQuotaExceeded`, the API server's
message naming the quota) and an Event, and is retried every pass until quota frees. Once each claim is held the
gate is lifted under a resourceVersion precondition. Holder names follow from what they charge
(`claims.holder_name`), so a controller that crashed between a holder's create and the lift finds it (AlreadyExists)
and goes on: nothing is charged twice. A pod of that name that is not a holder (only the controller may create pods
with the holder label, `kubegpu-charge-holders`) is not taken for one: the pod stays gated, and says why.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kubegpu.clock import Clock, RealClock
from kubegpu.errors import ConfigError, KubegpuError
from kubegpu.kube import Cluster, record_event
from kubegpu.kube.cluster import format_timestamp
from kubegpu.kube.errors import ApiError, Conflict, NotFound
from kubegpu.kube.eviction import evict_pod
from kubegpu.kube.resources import ResourceKind, register_kind
from kubegpu.kube.retry import update_with_retry
from kubegpu.quota.claims import (
    CLAIM_GATE,
    HOLDER_LABEL,
    ClaimCharge,
    ClaimSourceMissing,
    holder_name,
    parse_classes,
    pod_claim_charges,
)
from kubegpu.quota.policy import NAMESPACE, TABLE_NAME
from kubegpu.scheduling import parse_quantity
from kubegpu.scheduling.pods import is_finished
from kubegpu.sharing.charges import ChargeTable, quantity_of_bytes, shipped_table, table_from_data
from kubegpu.sharing.names import GPU_MEMORY_RESOURCE

log = logging.getLogger("kubegpu.quota")
CONDITION = "kubegpu.io/GPUMemoryCharged"
EXCEEDED = "GPUMemoryQuotaExceeded"
HOLDER_IMAGE = "registry.k8s.io/pause:3.10"
DRA_KINDS = ("ResourceClaim", "ResourceClaimTemplate", "DeviceClass")
for _kind, _plural, _namespaced in (("ResourceClaim", "resourceclaims", True),
                                    ("ResourceClaimTemplate", "resourceclaimtemplates", True),
                                    ("DeviceClass", "deviceclasses", False)):
    register_kind(ResourceKind(_kind, "resource.k8s.io", "v1", _plural, namespaced=_namespaced,
                               status_subresource=_kind == "ResourceClaim", strategic_merge=False))


def has_claim_gate(pod: Mapping[str, Any]) -> bool:
    return any(g.get("name") == CLAIM_GATE for g in (pod.get("spec") or {}).get("schedulingGates") or ())


def is_holder(pod: Mapping[str, Any]) -> bool:
    return HOLDER_LABEL in ((pod.get("metadata") or {}).get("labels") or {})


def holder_pod(pod: Mapping[str, Any], charge: ClaimCharge) -> dict[str, Any]:
    """The holder of one claim's charge (module doc): requests = limits = the charge, gated for good, owned by the
    claim pod (template claim, whose PriorityClass it takes) or the named ResourceClaim."""
    meta = pod.get("metadata") or {}
    if charge.shared:
        owner = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "name": charge.source,
                 "uid": charge.owner_uid}
    else:
        owner = {"apiVersion": "v1", "kind": "Pod", "name": str(meta.get("name")), "uid": str(meta.get("uid"))}
    amount = quantity_of_bytes(charge.bytes)
    spec: dict[str, Any] = {
        "schedulingGates": [{"name": CLAIM_GATE}], "automountServiceAccountToken": False, "restartPolicy": "Never",
        "terminationGracePeriodSeconds": 0,
        "containers": [{"name": "charge", "image": HOLDER_IMAGE, "resources": {
            "requests": {GPU_MEMORY_RESOURCE: amount}, "limits": {GPU_MEMORY_RESOURCE: amount}}}]}
    priority = (pod.get("spec") or {}).get("priorityClassName")
    if priority and not charge.shared:   # a quota scoped to the pod's PriorityClass counts its claim's charge too
        spec["priorityClassName"] = priority
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": holder_name(pod, charge), "namespace": meta.get("namespace"),
                     "labels": {HOLDER_LABEL: str(owner["name"])[:63].rstrip("-_.") or "claim",
                                "app.kubernetes.io/managed-by": "kubegpu-quota"},
                     "annotations": {"kubegpu.io/charges": f"{charge.kind}/{charge.source} (claim {charge.entry} "
                                                           f"of pod {meta.get('name')})"},
                     "ownerReferences": [owner]},
        "spec": spec,
    }


def _holding(pod: Mapping[str, Any]) -> float:
    requests = ((pod.get("spec") or {}).get("containers") or [{}])[0].get("resources", {}).get("requests", {})
    try:
        return parse_quantity(requests.get(GPU_MEMORY_RESOURCE, "0"))
    except KubegpuError:
        return 0.0


def _held(existing: Mapping[str, Any], wanted: Mapping[str, Any]) -> bool:
    """`existing` (a pod of the holder's name) is a holder of at least the wanted charge, for the same owner (a
    charge computed again from a table that shrank since is still held; one that grew is not)."""
    if not is_holder(existing):
        return False
    owners = {(o.get("kind"), o.get("uid")) for o in (existing.get("metadata") or {}).get("ownerReferences") or ()}
    want = wanted["metadata"]["ownerReferences"][0]
    return (want["kind"], want["uid"]) in owners and _holding(existing) >= _holding(wanted)


@dataclass
class ClaimPass:
    """What one pass did with gated claim pods."""

    charged: int = 0   # holders created
    lifted: int = 0
    waiting: int = 0   # still gated (quota, a missing template, ...)
    released: int = 0  # holders of finished pods given back


@dataclass
class ClaimCharger:
    """The claim-charging half of the quota controller. `cluster`: the informer-backed view (reads); `api`: the API
    server itself (fresh reads after a 409)."""

    cluster: Cluster
    api: Cluster
    table: ChargeTable | None = None   # None: the cluster's, the admission policy's table ConfigMap
    component: str = "kubegpu-quota"
    namespace: str = NAMESPACE   # where the table ConfigMap lives

    def tick(self, pods: list[dict[str, Any]]) -> ClaimPass:
        result = ClaimPass(released=self._release(pods))
        gated = [p for p in pods if has_claim_gate(p) and not is_holder(p) and not is_finished(p)
                 and not (p.get("metadata") or {}).get("deletionTimestamp")]
        if not gated:
            return result
        table = self.table or self._cluster_table()
        by_name = {(p["metadata"].get("namespace"), p["metadata"].get("name")): p for p in pods}
        classes = parse_classes(self.cluster.list("DeviceClass"))
        namespaces = {str(p["metadata"].get("namespace")) for p in gated}
        templates = {ns: {t["metadata"]["name"]: t for t in self.cluster.list("ResourceClaimTemplate", ns)}
                     for ns in namespaces}
        claims = {ns: {c["metadata"]["name"]: c for c in self.cluster.list("ResourceClaim", ns)} for ns in namespaces}
        for pod in gated:
            namespace = str(pod["metadata"].get("namespace"))
            try:
                charges = pod_claim_charges(pod, templates[namespace], claims[namespace], classes, table)
            except ClaimSourceMissing as exc:
                self._condition(pod, "ClaimSourceNotFound", str(exc))
                result.waiting += 1
                continue
            except ConfigError as exc:
                self._condition(pod, "ClaimNotCharged", str(exc))
                result.waiting += 1
                continue
            held = True
            for charge in charges:
                if not charge.bytes:
                    continue
                wanted = holder_pod(pod, charge)
                name = wanted["metadata"]["name"]
                existing = by_name.get((namespace, name))
                if existing is not None and _held(existing, wanted):
                    continue
                outcome = self._create(wanted)
                if not isinstance(outcome, tuple):
                    result.charged += int(outcome)
                    by_name[(namespace, name)] = wanted   # a claim shared by pods later in this pass: held
                    continue
                self._condition(pod, *outcome)
                held = False
                break
            if not held:
                result.waiting += 1
            elif self._lift(pod):
                result.lifted += 1
        return result

    def _cluster_table(self) -> ChargeTable:
        """The table the admission policy charges whole GPUs by (the operator keeps it to the cluster's GPUs and
        NodePools), read when a claim pod waits: claims pay as `nvidia.com/gpu` does. Missing or unreadable: the
        shipped table, the whole catalogue."""
        try:
            data = self.api.get("ConfigMap", TABLE_NAME, self.namespace).get("data") or {}
            return table_from_data(data, f"ConfigMap {self.namespace}/{TABLE_NAME}")
        except (NotFound, ConfigError) as exc:
            log.warning("quota: charging claims against the shipped table: %s", exc)
            return shipped_table()

    def _release(self, pods: list[dict[str, Any]]) -> int:
        """Give back the charges of finished pods' template claims: a Succeeded or Failed pod holds no device (its
        generated claim is deallocated), as the ResourceQuota plugin stops counting its own requests. Through the
        Eviction API, like every pod kubegpu removes (no budget selects a holder)."""
        finished = {(p["metadata"].get("namespace"), p["metadata"].get("uid")) for p in pods
                    if is_finished(p) and not is_holder(p)}
        released = 0
        for holder in pods:
            meta = holder.get("metadata") or {}
            if not is_holder(holder) or meta.get("deletionTimestamp"):
                continue
            owner: Mapping[str, Any] = next(iter(meta.get("ownerReferences") or ()), {})
            if owner.get("kind") == "Pod" and (meta.get("namespace"), owner.get("uid")) in finished:
                try:
                    released += evict_pod(self.api, str(meta.get("namespace")), str(meta.get("name")))
                except NotFound:
                    continue
        return released

    def _create(self, wanted: dict[str, Any]) -> bool | tuple[str, str]:
        """Create the holder: True when created, False when it was there already (an earlier pass, a crashed
        leader), else (reason, message) why the pod must wait."""
        meta = wanted["metadata"]
        try:
            self.cluster.create(wanted)
            return True
        except Conflict as exc:
            if exc.reason != "AlreadyExists":
                raise
            return self._existing(wanted)
        except ApiError as exc:
            if exc.code == 403 and "exceeded quota" in str(exc):
                # admission runs before storage: a holder created by an earlier pass (or a crashed leader) is
                # refused by a full quota before the create could meet it as AlreadyExists
                if self._existing(wanted) is False:
                    return False
                return EXCEEDED, f"{meta['annotations']['kubegpu.io/charges']}: {exc}"
            if exc.code in (403, 422):   # refused otherwise (a LimitRange, a policy): say so on the pod, retry
                return "GPUMemoryChargeRefused", f"charge holder {meta['name']}: {exc}"
            raise

    def _existing(self, wanted: Mapping[str, Any]) -> bool | tuple[str, str]:
        """False when the API server has a holder of this charge under the wanted name (read fresh, not from the
        cache), else why the pod waits."""
        meta = wanted["metadata"]
        try:
            existing = self.api.get("Pod", meta["name"], meta["namespace"])
        except NotFound:
            return "GPUMemoryChargePending", f"charge holder {meta['name']} is not there yet; retried"
        if _held(existing, wanted):
            return False
        if is_holder(existing):   # ours, for less than the charge is now (the table grew): replaced next pass
            evict_pod(self.api, meta["namespace"], meta["name"])
            return "GPUMemoryChargePending", f"charge holder {meta['name']} holds less than the charge; replaced"
        return ("GPUMemoryChargeBlocked", f"pod {meta['namespace']}/{meta['name']} holds the name of this pod's charge "
                "holder and is none; delete it")

    def _lift(self, pod: Mapping[str, Any]) -> bool:
        """Remove our gate under a resourceVersion precondition (a fresh read and a retry on 409), and mark the pod
        charged where it said otherwise."""
        meta = pod["metadata"]

        def without_gate(current: Mapping[str, Any]) -> dict[str, Any] | None:
            gates = (current.get("spec") or {}).get("schedulingGates") or []
            remaining = [g for g in gates if g.get("name") != CLAIM_GATE]
            return None if len(remaining) == len(gates) else {"spec": {"schedulingGates": remaining or None}}

        try:
            patch = without_gate(pod)
            if patch is None:
                return False
            try:
                self.cluster.patch("Pod", meta["name"], {**patch, "metadata": {
                    "resourceVersion": meta.get("resourceVersion")}}, namespace=meta.get("namespace"))
            except Conflict:   # changed since the cache's copy (the scheduler's SchedulingGated status): afresh
                update_with_retry(self.api, "Pod", meta["name"], without_gate, namespace=meta.get("namespace"))
        except NotFound:
            return False
        if any(c.get("type") == CONDITION and c.get("status") == "False"
               for c in (pod.get("status") or {}).get("conditions") or ()):
            self._write_condition(pod, "True", "Charged", "every ResourceClaim's GPU memory is charged")
        return True

    def _condition(self, pod: Mapping[str, Any], reason: str, message: str) -> None:
        """Say on the pod why it waits (a condition and, when that changes, an Event)."""
        current = next((c for c in (pod.get("status") or {}).get("conditions") or () if c.get("type") == CONDITION),
                       None)
        if current and current.get("reason") == reason and current.get("message") == message:
            return
        self._write_condition(pod, "False", reason, message)
        record_event(self.cluster, {**pod, "kind": "Pod"}, reason, message, component=self.component)
        log.info("quota: pod %s/%s waits: %s", pod["metadata"].get("namespace"), pod["metadata"].get("name"),
                 message)

    def _write_condition(self, pod: Mapping[str, Any], status: str, reason: str, message: str) -> None:
        meta = pod["metadata"]
        clock: Clock = getattr(self.cluster, "clock", None) or RealClock()
        stamp = format_timestamp(clock.now())
        entry = {"type": CONDITION, "status": status, "reason": reason, "message": message[:1000],
                 "lastTransitionTime": stamp}

        def with_condition(current: dict[str, Any]) -> dict[str, Any] | None:
            conditions = list((current.get("status") or {}).get("conditions") or [])
            kept = [c for c in conditions if c.get("type") != CONDITION]
            return {"status": {"conditions": [*kept, entry]}}

        try:
            update_with_retry(self.api, "Pod", meta["name"], with_condition, namespace=meta.get("namespace"),
                              subresource="status")
        except NotFound:
            return

