"""`update_lists`: kubegpu's entries of a shared list (taints, finalizers) are added and removed without dropping
anyone else's, whether our copy was stale before the write or someone wrote between our read and our write."""

from __future__ import annotations

from typing import Any

from kubegpu.kube import MemoryCluster
from kubegpu.kube.patching import ListEdit, taint_identity, update_lists

OURS = {"key": "kubegpu.io/disrupted", "effect": "NoSchedule"}
THEIRS = {"key": "node.kubernetes.io/unreachable", "effect": "NoExecute"}
TAINTS = ("spec", "taints")


class Interleaved:
    """The store, where another writer's change lands right after our first read (between our GET and PATCH)."""

    def __init__(self, cluster: MemoryCluster, change: dict[str, Any]) -> None:
        self.cluster, self.change, self.patches = cluster, change, 0

    def get(self, kind: str, name: str, namespace: str | None = None) -> dict[str, Any]:
        found = self.cluster.get(kind, name, namespace)
        if self.change:
            self.cluster.patch(kind, name, self.change, namespace, patch_type="strategic")
            self.change = {}
        return found

    def patch(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        self.patches += 1
        return self.cluster.patch(*args, **kwargs)


def _node(cluster: MemoryCluster) -> dict[str, Any]:
    return cluster.create({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n", "finalizers": ["a/b"]},
                           "spec": {"taints": [{"key": "x", "value": "1", "effect": "NoSchedule"}]}})


def test_a_stale_copy_meets_409_and_the_edit_is_redone_on_the_fresh_object() -> None:
    cluster = MemoryCluster()
    seen = _node(cluster)
    cluster.patch("Node", "n", {"spec": {"taints": [*seen["spec"]["taints"], THEIRS]}})   # after our cache's copy
    update_lists(cluster, "Node", "n", [ListEdit(TAINTS, add=(OURS,), identity=taint_identity)], seen=seen)
    assert cluster.get("Node", "n")["spec"]["taints"] == [{"key": "x", "value": "1", "effect": "NoSchedule"},
                                                          THEIRS, OURS]


def test_a_write_between_our_read_and_our_write_survives() -> None:
    cluster = MemoryCluster()
    _node(cluster)
    racing = Interleaved(cluster, {"metadata": {"finalizers": ["their/finalizer"]}})
    update_lists(racing, "Node", "n", [ListEdit(("metadata", "finalizers"), add=("kubegpu.io/termination",),
                                                remove=("a/b",))])
    assert cluster.get("Node", "n")["metadata"]["finalizers"] == ["their/finalizer", "kubegpu.io/termination"]
    assert racing.patches == 2   # the first write was refused (409), the second made from the new object


def test_nothing_is_sent_when_the_list_is_already_as_asked_and_emptied_lists_are_removed() -> None:
    cluster = MemoryCluster()
    seen = _node(cluster)
    racing = Interleaved(cluster, {})
    edit = ListEdit(TAINTS, add=({"key": "x", "value": "other", "effect": "NoSchedule"},), identity=taint_identity)
    assert update_lists(racing, "Node", "n", [edit], seen=seen) is None and racing.patches == 0
    written = update_lists(cluster, "Node", "n", [ListEdit(("metadata", "finalizers"), remove=("a/b",))],
                           also={"metadata": {"labels": {"mine": "1"}}})
    assert written is not None and "finalizers" not in written["metadata"]
    assert written["metadata"]["labels"] == {"mine": "1"}
