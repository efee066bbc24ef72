"""Leader election on a `coordination.k8s.io/v1` Lease, so a controller can run several replicas and only one acts.

The holder renews the Lease on every pass; another replica takes it over only once it has expired (renewTime +
leaseDurationSeconds in the past), so a replica that stops is replaced within one lease duration. Every write
carries the resourceVersion it read, so when two replicas race for an expired lease the API server lets exactly one
write through (409 Conflict for the other). Times come from the caller (real or virtual clock).

Holding the Lease when a pass starts is not enough: a pass that runs long, or a replica whose renewals fail, would
go on writing after another replica took over. So the elector is also a fence: it counts as leader only until
`renew_deadline` (two thirds of the lease, client-go's 10 s of 15 s) after its last successful renewal, and not at
all from the moment a renewal fails or finds another holder. `FencedCluster` (and `fenced` for any other object with
write methods, such as a cloud provider) consults the fence on every write and raises `LeadershipLost` instead of
sending it, so a stage cannot forget to check: every write of the controller goes through the fence. A replica
that takes over can do so only after the lease duration, later than the old holder's deadline, so no write of the
old leader lands once a new one may act.
"""

from __future__ import annotations

import builtins
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, TypeVar

from kubegpu.clock import Clock
from kubegpu.kube.cluster import Cluster, WatchEvent, format_timestamp, parse_timestamp
from kubegpu.kube.errors import Conflict, NotFound

CLIENT_WRITES = ("create", "patch", "delete", "replace", "apply", "deletecollection")
RENEW_FRACTION = 2 / 3   # of the lease duration: how long a renewal lets the holder act (client-go: 10 s of 15 s)
T = TypeVar("T")


class LeadershipLost(Exception):
    """A write refused because this replica no longer holds its Lease. Deliberately not a `KubegpuError`: the
    per-object error handling in the stages (which logs and goes on with the next object) must not catch it; it
    ends the stage."""


@dataclass
class LeaderElector:
    cluster: Cluster
    identity: str
    name: str  # the Lease's name: one per controller (kubegpu-partitioner, kubegpu-autoscaler)
    namespace: str = "kube-system"
    lease_duration: float = 15.0
    _held_until: float = field(default=-math.inf, init=False, repr=False)

    @property
    def renew_deadline(self) -> float:
        return self.lease_duration * RENEW_FRACTION

    def holds(self, now: float) -> bool:
        """Whether this replica may still write at `now`: renewed within the renew deadline, and no renewal since
        has failed or found another holder."""
        return now < self._held_until

    def try_acquire(self, now: float) -> bool:
        """Hold (create, renew or take over) the Lease at `now`; False while another replica holds it. The fence
        (`holds`) follows: extended on success, closed at once on failure or error. While the renewal is in flight
        the deadline of the last one still holds (no other replica may take over before it), so the controller's
        other writes are not refused meanwhile: on a loaded API server a renewal takes a good part of a second."""
        try:
            held = self._acquire(now)
        except BaseException:
            self._held_until = -math.inf
            raise
        self._held_until = now + self.renew_deadline if held else -math.inf
        return held

    def _acquire(self, now: float) -> bool:
        try:
            lease = self.cluster.get("Lease", self.name, self.namespace)
        except NotFound:
            return self._create(now)
        spec = lease.get("spec") or {}
        holder = spec.get("holderIdentity")
        renewed = parse_timestamp(spec.get("renewTime"))
        duration = float(spec.get("leaseDurationSeconds") or self.lease_duration)
        expired = renewed is None or now >= renewed + duration
        if holder not in (None, "", self.identity) and not expired:
            return False
        renew = format_timestamp(now, micro=True)
        patch_spec: dict[str, Any] = {"holderIdentity": self.identity, "renewTime": renew,
                                      "leaseDurationSeconds": int(self.lease_duration)}
        if holder != self.identity:
            patch_spec["acquireTime"] = format_timestamp(now, micro=True)
            patch_spec["leaseTransitions"] = int(spec.get("leaseTransitions") or 0) + 1
        rv = (lease.get("metadata") or {}).get("resourceVersion")
        try:
            self.cluster.patch("Lease", self.name, {"metadata": {"resourceVersion": rv}, "spec": patch_spec},
                               namespace=self.namespace)
        except Conflict:
            return False
        return True

    def _create(self, now: float) -> bool:
        lease = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": self.name, "namespace": self.namespace},
            "spec": {"holderIdentity": self.identity, "leaseDurationSeconds": int(self.lease_duration),
                     "acquireTime": format_timestamp(now, micro=True),
                     "renewTime": format_timestamp(now, micro=True), "leaseTransitions": 0},
        }
        try:
            self.cluster.create(lease)
        except Conflict:
            return False
        return True


@dataclass
class Fence:
    """The check every write of a leader-elected controller passes (module doc)."""

    elector: LeaderElector
    clock: Clock

    def check(self, what: str) -> None:
        if not self.elector.holds(self.clock.now()):
            raise LeadershipLost(f"{what}: not sent, {self.elector.identity} no longer holds the "
                                 f"{self.elector.name} Lease")


class FencedCluster(Cluster):
    """`store` whose writes (create, patch, delete) go through only while the fence holds; reads pass through."""

    def __init__(self, store: Cluster, fence: Fence) -> None:
        self.store = store
        self.fence = fence
        self.clock = getattr(store, "clock", None)

    def __getattr__(self, name: str) -> Any:   # subscribe and the like: whatever else the store offers
        attr = getattr(self.store, name)
        if name == "client":   # the raw API client (evictions go through it): its writes are fenced too
            return fenced(attr, self.fence, CLIENT_WRITES)
        return attr

    def get(self, kind: str, name: str, namespace: str | None = None) -> dict[str, Any]:
        return self.store.get(kind, name, namespace)

    def list_with_version(self, kind: str, namespace: str | None = None, label_selector: str | None = None,
                          field_selector: str | None = None) -> tuple[builtins.list[dict[str, Any]], str]:
        return self.store.list_with_version(kind, namespace, label_selector, field_selector)

    def watch(self, kind: str, namespace: str | None = None, label_selector: str | None = None,
              field_selector: str | None = None, resource_version: str | None = None,
              timeout: float | None = None, bookmarks: bool = False) -> Iterator[WatchEvent]:
        return self.store.watch(kind, namespace, label_selector, field_selector, resource_version, timeout,
                                bookmarks=bookmarks)

    def create(self, obj: dict[str, Any]) -> dict[str, Any]:
        self.fence.check(f"create {obj.get('kind')} {(obj.get('metadata') or {}).get('name')}")
        return self.store.create(obj)

    def patch(self, kind: str, name: str, patch: dict[str, Any] | builtins.list[Any], namespace: str | None = None,
              patch_type: str = "merge", subresource: str | None = None) -> dict[str, Any]:
        self.fence.check(f"patch {kind} {name}")
        return self.store.patch(kind, name, patch, namespace, patch_type, subresource)

    def delete(self, kind: str, name: str, namespace: str | None = None) -> None:
        self.fence.check(f"delete {kind} {name}")
        self.store.delete(kind, name, namespace)


class _Fenced:
    def __init__(self, target: Any, fence: Fence, writes: frozenset[str]) -> None:
        self._target, self._fence, self._writes = target, fence, writes

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._target, name)
        if name not in self._writes or not callable(attr):
            return attr
        check = self._fence.check

        def guarded(*args: Any, **kwargs: Any) -> Any:
            check(name)
            return attr(*args, **kwargs)

        return guarded


def fenced(target: T, fence: Fence, writes: builtins.list[str] | tuple[str, ...]) -> T:
    """`target` with the methods named in `writes` refused while the fence is down (e.g. a cloud provider's
    create and delete); everything else passes through."""
    wrapper: Any = _Fenced(target, fence, frozenset(writes))
    return wrapper  # type: ignore[no-any-return]


def guard(fence: Fence | None) -> Callable[[str], None]:
    """`fence.check`, or a no-op where there is no elector (one replica, tests, the simulator)."""
    return fence.check if fence is not None else (lambda _what: None)
