"""The in-memory store answers `pods/eviction` as the API server does (a PodDisruptionBudget computed like the
disruption controller's, spent one eviction at a time, 429 when it allows no more), and `kubegpu.kube.eviction` is
the one call every caller uses for it."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from kubegpu.errors import KubegpuError
from kubegpu.kube import KINDS, ApiError, MemoryCluster, ResourceKind
from kubegpu.kube.eviction import delete_past_grace, disruptions_allowed, evict, evict_pod
from kubegpu.kube.informer import InformedCluster


def _pod(name: str, app: str = "web", ready: bool | None = None, phase: str = "Running",
         owner: dict[str, Any] | None = None) -> dict[str, Any]:
    status: dict[str, Any] = {"phase": phase}
    if ready is not None:
        status["conditions"] = [{"type": "Ready", "status": "True" if ready else "False"}]
    meta: dict[str, Any] = {"name": name, "namespace": "default", "labels": {"app": app}}
    if owner is not None:
        meta["ownerReferences"] = [{**owner, "controller": True}]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": {"nodeName": "n"}, "status": status}


def _pdb(name: str = "web", app: str = "web", **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
            "metadata": {"name": name, "namespace": "default"},
            "spec": {"selector": {"matchLabels": {"app": app}}, **spec}}


def _names(cluster: MemoryCluster) -> list[str]:
    return [p["metadata"]["name"] for p in cluster.list("Pod")]


def test_an_eviction_the_budget_forbids_is_429_and_leaves_the_pod() -> None:
    cluster = MemoryCluster()
    cluster.create(_pdb(minAvailable=2))
    for name in ("a", "b", "c"):
        cluster.create(_pod(name))
    assert evict(cluster, "default", "a") is None
    why = evict(cluster, "default", "b")
    assert why is not None and "disruption budget web needs 2 healthy pods and has 2" in why
    assert _names(cluster) == ["b", "c"]
    with pytest.raises(ApiError) as refused:
        cluster.evict("default", "c")
    assert refused.value.code == 429
    assert evict(cluster, "default", "gone") is None   # already gone counts as evicted


def test_an_evicted_pod_still_counts_until_a_replacement_exists() -> None:
    """maxUnavailable 1 over four pods: the evicted pod's slot stays unavailable (a ReplicaSet's scale would keep it)
    until a newer pod takes it, so the next eviction waits for the replacement, not just for the pod to go."""
    cluster = MemoryCluster()
    cluster.create(_pdb(maxUnavailable=1))
    for name in ("a", "b", "c", "d"):
        cluster.create(_pod(name))
    assert evict_pod(cluster, "default", "a")
    assert not evict_pod(cluster, "default", "b")
    cluster.create(_pod("a2", ready=False))             # the replacement, not Ready yet
    assert not evict_pod(cluster, "default", "b")
    cluster.patch("Pod", "a2", {"status": {"conditions": [{"type": "Ready", "status": "True"}]}},
                  subresource="status")
    assert evict_pod(cluster, "default", "b")


def test_the_expected_count_comes_from_the_controller_the_store_holds(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(KINDS, "ReplicaSet", ResourceKind("ReplicaSet", "apps", "v1", "replicasets", True, True))
    cluster = MemoryCluster()
    rs = cluster.create({"apiVersion": "apps/v1", "kind": "ReplicaSet", "metadata": {"name": "web"},
                         "spec": {"replicas": 4}})
    owner = {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web", "uid": rs["metadata"]["uid"]}
    cluster.create(_pdb(maxUnavailable=1))
    for name in ("a", "b", "c"):   # one of the four replicas is missing already: nothing more may go
        cluster.create(_pod(name, owner=owner))
    assert not evict_pod(cluster, "default", "a")
    assert disruptions_allowed(_pdb(maxUnavailable=1), cluster.list("Pod"), expected=4) == 0
    assert disruptions_allowed(_pdb(maxUnavailable=1), cluster.list("Pod")) == 1   # without the scale: 3 pods


def test_unready_finished_and_pending_pods_and_a_second_budget() -> None:
    cluster = MemoryCluster()
    cluster.create(_pdb(minAvailable=1))
    cluster.create(_pod("ready", ready=True))
    cluster.create(_pod("unready", ready=False))
    cluster.create(_pod("done", phase="Succeeded"))
    cluster.create(_pod("pending", phase="Pending"))
    assert not evict_pod(cluster, "default", "ready")   # the only healthy one
    assert evict_pod(cluster, "default", "unready")     # IfHealthyBudget: the budget is met without it
    assert evict_pod(cluster, "default", "done") and evict_pod(cluster, "default", "pending")
    cluster.create(_pdb("also", minAvailable=0))
    with pytest.raises(KubegpuError, match="more than one PodDisruptionBudget"):
        evict(cluster, "default", "ready")


def test_concurrent_evictions_spend_the_budget_exactly_once_each() -> None:
    cluster = MemoryCluster()
    cluster.create(_pdb(maxUnavailable=2))
    names = [f"p{i}" for i in range(12)]
    for name in names:
        cluster.create(_pod(name))
    results: dict[str, bool] = {}
    start = threading.Barrier(len(names))

    def one(name: str) -> None:
        start.wait()
        results[name] = evict_pod(cluster, "default", name)

    threads = [threading.Thread(target=one, args=(name,)) for name in names]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sum(results.values()) == 2 and len(cluster.list("Pod")) == 10


def test_evictions_go_to_the_store_behind_an_informer_and_past_grace_deletes() -> None:
    store = MemoryCluster()
    store.create(_pdb(minAvailable=1))
    store.create(_pod("only"))
    informed = InformedCluster(store, ("Pod",))
    assert evict(informed, "default", "only") is not None   # the budget holds, through the cache too
    delete_past_grace(informed, "default", "only")           # the one bypass
    delete_past_grace(informed, "default", "only")           # gone already: fine
    assert store.list("Pod") == []
