"""The writes that hold a new node for the pods it was bought for (what and why: `nomination.py`): tolerations onto
the planned pods, nominations onto their status, and the reservation taint off a node once its pods are bound.

Each step stands alone and is retried by the next pass when it fails; a failure costs only the hold (kube-scheduler
places the pod as it would without it), except a missing toleration, which keeps the pod off its reserved node until
the toleration is written or the reservation is lifted — both of which the next pass does.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from functools import partial
from typing import TYPE_CHECKING, Any

from kubegpu.autoscaler.fanout import each_write
from kubegpu.autoscaler.labels import RESERVED_TAINT_KEY
from kubegpu.autoscaler.nomination import (
    NominationLedger,
    by_pod,
    node_names,
    nomination_patch,
    reservation_taint,
    reservation_token,
    reservation_tokens,
    reservation_toleration,
    reservations_to_lift,
    toleration_identity,
    tolerations_due,
)
from kubegpu.autoscaler.scheduler import pod_key
from kubegpu.errors import KubegpuError
from kubegpu.kube import NotFound
from kubegpu.kube.patching import ListEdit, taint_identity, update_lists

if TYPE_CHECKING:
    from kubegpu.autoscaler.cluster_state import ClusterState, Snapshot
    from kubegpu.clock import Clock
    from kubegpu.kube import Cluster

LIFT_RESEND = 10.0   # seconds before a lift the watch does not show yet is sent again


class Reservations:
    """Holds planned nodes for their pods (`nomination.py`): lifecycle calls `prepare` just before it registers a node
    (its workers, in parallel: a burst's claims are all created first, and their pods' writes go with the launches
    that follow rather than holding up the creations), the provisioner `reconcile` every pass for what failed or
    was planned since."""

    def __init__(self, cluster: Cluster, state: ClusterState, log: Callable[[str], None], parallelism: int,
                 clock: Clock) -> None:
        self.cluster = cluster
        self.state = state
        self.log = log
        self.parallelism = parallelism
        self.clock = clock
        self.ledger = NominationLedger()
        self._lifted: dict[str, float] = {}   # node → when its reservation was lifted (not sent again meanwhile)

    def _tolerate(self, pod: Mapping[str, Any], token: str) -> None:
        meta = pod.get("metadata") or {}
        edit = ListEdit(("spec", "tolerations"), add=(reservation_toleration(token),), identity=toleration_identity)
        try:
            update_lists(self.cluster, "Pod", str(meta.get("name")), [edit], namespace=meta.get("namespace"),
                         seen=pod)
        except NotFound:
            return
        except KubegpuError as exc:
            self.log(f"pod {pod_key(pod)}: cannot let it onto its reserved node: {exc}; retried next pass")

    def reconcile(self, snapshot: Snapshot, pending: Sequence[dict[str, Any]]) -> None:
        """Tolerations and nominations the plan calls for and the pods lack; reservations nobody waits for lifted."""
        nominations = self.state.nominations_view()
        registered = [c for c in snapshot.nodeclaims if (c.get("status") or {}).get("nodeName") in snapshot.nodes]
        tokens = by_pod(nominations, reservation_tokens(registered, snapshot.nodes))
        each_write([(pod_key(pod), partial(self._tolerate, pod, token))
                    for pod, token in tolerations_due(pending, tokens)], self.parallelism, self._failed)
        names = node_names(snapshot.nodeclaims, snapshot.nodes)
        writes = self.ledger.due(pending, by_pod(nominations, names))
        done = each_write([(pod_key(pod), partial(self._nominate, pod_key(pod), node)) for pod, node in writes],
                          self.parallelism, self._failed)
        for (pod, node), ok in zip(writes, done, strict=True):
            if ok:
                self.ledger.done(pod_key(pod), node)
        node_of_claim = {k: v for k, v in names.items() if k not in snapshot.nodes}
        now = self.clock.now()
        # a lift the watch does not show yet is not sent again for a while (it would cost a 409 and a fresh read)
        self._lifted = {n: at for n, at in self._lifted.items() if n in snapshot.nodes and now - at < LIFT_RESEND}
        lift = [name for name in reservations_to_lift(snapshot.nodes, node_of_claim, nominations,
                                                      (pod_key(p) for p in pending)) if name not in self._lifted]
        done = each_write([(name, partial(self._lift, snapshot.nodes[name])) for name in lift], self.parallelism,
                          lambda name, exc: self.log(f"node {name}: cannot lift its reservation: {exc}"))
        self._lifted.update((name, now) for name, ok in zip(lift, done, strict=True) if ok)

    def prepare(self, claim: Mapping[str, Any], node: str) -> None:
        """Let the pods planned onto NodeClaim `claim` onto its Node `node` and nominate them to it, pod by pod
        (lifecycle: just before registration lifts `kubegpu.io/unregistered` and lays the reservation). A failed
        write is logged; the next pass retries."""
        token = reservation_token(claim)
        keys = sorted(self.state.nominations_view().get(str((claim.get("metadata") or {}).get("name")), ()))
        if token is not None:
            for key in keys:
                namespace, name = key.split("/", 1)
                try:
                    pod = self.cluster.get("Pod", name, namespace)   # the informer's copy
                except KubegpuError:
                    continue
                self._tolerate(pod, token)
        for key in self.ledger.unwritten(keys, node):
            try:
                self._nominate(key, node)
            except KubegpuError as exc:
                self._failed(key, exc)
                continue
            self.ledger.done(key, node)

    def _nominate(self, key: str, node: str | None) -> None:
        namespace, name = key.split("/", 1)
        self.cluster.patch("Pod", name, nomination_patch(node), namespace, subresource="status")

    def _lift(self, node: Mapping[str, Any]) -> None:
        meta = node.get("metadata") or {}
        gone = ListEdit(("spec", "taints"), remove=(reservation_taint(""),), identity=taint_identity)
        update_lists(self.cluster, "Node", str(meta.get("name")), [gone], seen=node)

    def _failed(self, key: str, exc: KubegpuError) -> None:
        self.log(f"pod {key}: cannot write its reservation or nomination: {exc}")


__all__ = ["RESERVED_TAINT_KEY", "Reservations"]
