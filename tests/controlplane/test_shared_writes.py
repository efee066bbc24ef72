"""The autoscaler's writes of shared lists on the real API server: another client changes the same Node or NodeClaim
between the autoscaler's (informer's) read and its write — a taint, a finalizer, a label, an annotation — and that
change survives every writer: registration (taints, finalizer, labels on the Node), the NodeClaim finalizer's
re-adding, the termination's start (finalizer and reason on the NodeClaim, the cordon taint on the Node), and the
removal of the finalizers from the Node and the NodeClaim."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from kubegpu.autoscaler import labels as L
from kubegpu.kube import Conflict, NotFound
from kubegpu.kube.lightkube_cluster import LightkubeCluster
from kubegpu.testing.session import wait_for
from tests.controlplane.test_termination import World, world  # noqa: F401 - the fixture

pytestmark = pytest.mark.apiserver
THEIRS = "example.com/theirs"


class Interloper:
    """The API, with another client's change landing right before our next matching write is sent, so our write
    carries a read that is already stale (what a busy node lifecycle controller or a user makes happen)."""

    def __init__(self, api: LightkubeCluster, admin: LightkubeCluster) -> None:
        self.api, self.admin = api, admin
        self.armed: list[tuple[str, tuple[str, str], Callable[[LightkubeCluster, str], None]]] = []
        self.fired: list[tuple[str, str]] = []

    def arm(self, kind: str, field: tuple[str, str], change: Callable[[LightkubeCluster, str], None]) -> None:
        """Before the next patch of a `kind` that writes `field` (e.g. ("metadata", "finalizers")), run `change`."""
        self.armed.append((kind, field, change))

    def patch(self, kind: str, name: str, patch: Any, namespace: str | None = None, patch_type: str = "merge",
              subresource: str | None = None) -> dict[str, Any]:
        for entry in list(self.armed):
            armed_kind, (outer, inner), change = entry
            if armed_kind == kind and isinstance(patch, dict) and inner in (patch.get(outer) or {}):
                self.armed.remove(entry)
                change(self.admin, name)
                self.fired.append((kind, inner))
        return self.api.patch(kind, name, patch, namespace, patch_type, subresource)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.api, name)


def _theirs_on(kind: str, taint: bool = False) -> Callable[[LightkubeCluster, str], None]:
    """Another client adds its finalizer, label and annotation (and, on a Node, a taint) to the object."""

    def change(admin: LightkubeCluster, name: str) -> None:
        for _ in range(20):   # a careful client too: kwok and kube-controller-manager write the Node meanwhile
            try:
                once(admin, name)
                return
            except Conflict:
                continue
        raise AssertionError(f"{kind} {name}: the other client's change kept meeting conflicts")

    def once(admin: LightkubeCluster, name: str) -> None:
        current = admin.get(kind, name)
        meta = current["metadata"]
        patch: dict[str, Any] = {"metadata": {
            "resourceVersion": meta["resourceVersion"],
            "labels": {"example.com/theirs": "1"}, "annotations": {THEIRS: "1"},
            "finalizers": [*(meta.get("finalizers") or []), THEIRS] if not meta.get("deletionTimestamp")
            else meta.get("finalizers")}}
        if taint:
            patch["spec"] = {"taints": [*((current.get("spec") or {}).get("taints") or []),
                                        {"key": THEIRS, "effect": "PreferNoSchedule"}]}
        admin.patch(kind, name, patch)

    return change


def _release(admin: LightkubeCluster, kind: str, name: str) -> None:
    """Their finalizer off again (what its owner would do), so the object can go."""
    try:
        current = admin.get(kind, name)
    except NotFound:
        return
    rest = [f for f in current["metadata"].get("finalizers") or [] if f != THEIRS]
    admin.patch(kind, name, {"metadata": {"finalizers": rest or None}})


def test_registration_and_the_finalizer_keep_what_another_client_added(
        world: Callable[..., World]) -> None:  # noqa: F811
    w = world(disruption={"consolidateAfter": "Never"})
    admin = w.real.cluster()   # another client
    spy = Interloper(w.api, admin)
    scaler = w.replica(cluster=spy)
    spy.arm("Node", ("metadata", "finalizers"), _theirs_on("Node", taint=True))   # registration's write
    w.api.create(w.gpu_pod("train"))
    node = w.run_until(scaler, lambda: w.bound("train"), "the pod bound to a launched, registered node")
    assert ("Node", "finalizers") in spy.fired
    got = w.api.get("Node", node)
    assert {L.TERMINATION_FINALIZER, THEIRS} <= set(got["metadata"]["finalizers"])
    assert got["metadata"]["labels"]["example.com/theirs"] == "1" and got["metadata"]["labels"][L.REGISTERED_LABEL]
    taints = {(t["key"], t["effect"]) for t in got["spec"].get("taints") or []}
    assert (THEIRS, "PreferNoSchedule") in taints and (L.UNREGISTERED_TAINT["key"], "NoExecute") not in taints

    [claim] = w.claims()
    name = claim["metadata"]["name"]
    admin.patch("NodeClaim", name, {"metadata": {"finalizers": None}})   # a claim without ours: lifecycle re-adds it
    spy.arm("NodeClaim", ("metadata", "finalizers"), _theirs_on("NodeClaim"))
    w.run_until(scaler, lambda: L.TERMINATION_FINALIZER in (w.api.get("NodeClaim", name)["metadata"]
                                                            .get("finalizers") or []), "our finalizer back")
    assert ("NodeClaim", "finalizers") in spy.fired
    assert THEIRS in w.api.get("NodeClaim", name)["metadata"]["finalizers"]
    _release(admin, "NodeClaim", name)
    _release(admin, "Node", node)


def test_termination_keeps_what_another_client_added(world: Callable[..., World]) -> None:  # noqa: F811
    w = world(disruption={"consolidateAfter": "Never"})
    admin = w.real.cluster()   # another client
    spy = Interloper(w.api, admin)
    scaler = w.replica(cluster=spy)
    w.api.create(w.gpu_pod("train"))
    node = w.run_until(scaler, lambda: w.bound("train"), "the pod bound to a launched node")
    [claim] = w.claims()
    name = claim["metadata"]["name"]

    spy.arm("NodeClaim", ("metadata", "annotations"), _theirs_on("NodeClaim"))   # start: the reason (ours is there)
    spy.arm("Node", ("spec", "taints"), _theirs_on("Node", taint=True))           # start: the cordon
    scaler.termination.start(claim, "expired")
    assert spy.fired == [("NodeClaim", "annotations"), ("Node", "taints")]
    got = w.api.get("NodeClaim", name)
    assert {L.TERMINATION_FINALIZER, THEIRS} <= set(got["metadata"]["finalizers"])
    assert got["metadata"]["annotations"]["kubegpu.io/termination-reason"] == "expired"
    taints = {(t["key"], t["effect"]) for t in w.api.get("Node", node)["spec"]["taints"]}
    assert {(THEIRS, "PreferNoSchedule"), (L.DISRUPTED_TAINT["key"], "NoSchedule")} <= taints

    # the last write: our finalizer off the NodeClaim; theirs lands in between and stays
    spy.arm("NodeClaim", ("metadata", "finalizers"), _theirs_on("NodeClaim"))

    def ours_gone() -> bool:
        try:
            return L.TERMINATION_FINALIZER not in (w.api.get("NodeClaim", name)["metadata"].get("finalizers") or [])
        except NotFound:
            return True

    w.run_until(scaler, ours_gone, "the termination to remove our finalizer")
    assert spy.fired[2:] == [("NodeClaim", "finalizers")]
    got = w.api.get("NodeClaim", name)["metadata"]
    assert got["finalizers"] == [THEIRS] and got["labels"]["example.com/theirs"] == "1"   # held by theirs alone
    # the Node is held by their finalizer too: the provider deleted it and took off none but its own
    assert w.api.get("Node", node)["metadata"]["finalizers"] == [THEIRS]
    _release(admin, "NodeClaim", name)
    _release(admin, "Node", node)
    wait_for(lambda: not w.claims() and node not in w.nodes(), "the NodeClaim and Node gone once theirs are released")


def test_releasing_a_deleted_node_does_not_put_back_a_finalizer_its_owner_removed(
        world: Callable[..., World]) -> None:  # noqa: F811
    """A Node deleted directly with no NodeClaim behind it: the termination lets it go by taking our finalizer off.
    Another finalizer's owner finishes between the informer's copy and our write; a list rebuilt from the copy would
    put theirs back, which the API server refuses on a deleted object (422) — a failed pass, the Node kept. Ours
    only, from the object as it is: the Node goes in that one write."""
    w = world(disruption={"consolidateAfter": "Never"})
    admin = w.real.cluster()   # another client
    spy = Interloper(w.api, admin)
    scaler = w.replica(cluster=spy)
    name = f"orphan-{w.pool}"
    admin.create({"apiVersion": "v1", "kind": "Node", "metadata": {
        "name": name, "finalizers": [L.TERMINATION_FINALIZER, THEIRS]}})
    admin.delete("Node", name)
    spy.arm("Node", ("metadata", "finalizers"), lambda api, node: _release(api, "Node", node))

    def fired() -> bool:
        scaler.step()
        return bool(spy.fired)

    wait_for(fired, "the termination to release the deleted Node", interval=0.2)
    assert spy.fired == [("Node", "finalizers")]
    assert not [line for line in w.lines if name in line], w.lines[-3:]   # no refused write, no failed pass
    with pytest.raises(NotFound):
        w.api.get("Node", name)   # both finalizers gone: deleted in that same write
