"""The operator's reads through informers (`LightkubeOperatorApi.inform`): every read of a pass from the cache, so
an idle operator sends no LIST; its own objects only (the owner label); a kind the server starts serving later
(prometheus-operator installed after the operator) informed from then on; no pass while a cache is stale."""

from __future__ import annotations

from typing import Any

from kubegpu.clock import VirtualClock
from kubegpu.kube import MemoryCluster
from kubegpu.operator import controller
from kubegpu.operator.controller import (
    KARPENTER_NODEPOOL,
    NODEPOOL_KINDS,
    OWNED_KINDS,
    LightkubeOperatorApi,
    register_owned_kinds,
)
from kubegpu.operator.render import OWNER_LABEL
from tests.operator.fakeapi import FakeApi

NS = "gpu-operator"


class Response:
    def __init__(self, status_code: int, body: dict[str, Any]) -> None:
        self.status_code, self.body = status_code, body

    def json(self) -> dict[str, Any]:
        return self.body


class Discovery:
    """The API server's discovery documents, as the GETs of lightkube's httpx client answer them."""

    def __init__(self, hidden: set[str], hidden_versions: set[str] | None = None) -> None:
        self.hidden = hidden
        self.hidden_versions = hidden_versions or set()   # group versions not served at all (404)
        self.gets = 0

    def get(self, path: str) -> Response:
        self.gets += 1
        version = path.removeprefix("/api/").removeprefix("/apis/")
        if version in self.hidden_versions:
            return Response(404, {})
        kinds = [*((v, k, p) for v, k, p, _ in OWNED_KINDS), *((v, k, p) for v, k, p, _ in NODEPOOL_KINDS)]
        resources = [{"name": plural, "kind": kind} for api_version, kind, plural in kinds
                     if api_version == version and kind not in self.hidden]
        return Response(200, {"resources": [*resources, *({"name": f"{r['name']}/status", "kind": r["kind"]}
                                                          for r in resources)]})


class Client:
    def __init__(self, http: Discovery) -> None:
        self._client = type("Generic", (), {"_client": http})()


def owned(kind: str, api_version: str, name: str, namespace: str | None, policy: str | None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "labels": {OWNER_LABEL: policy} if policy else {}}
    if namespace:
        meta["namespace"] = namespace
    return {"apiVersion": api_version, "kind": kind, "metadata": meta}


def counting_store() -> tuple[MemoryCluster, list[str]]:
    """An in-memory cluster that records the kind of every LIST it serves, with the operator's kinds registered."""
    register_owned_kinds()
    store = MemoryCluster(VirtualClock(0))
    lists: list[str] = []
    original = store.list_with_version

    def counting(kind: str, *args: Any, **kwargs: Any) -> tuple[list[dict[str, Any]], str]:
        lists.append(kind)
        return original(kind, *args, **kwargs)

    store.list_with_version = counting  # type: ignore[method-assign]
    return store, lists


def test_an_idle_operator_reads_every_pass_from_informers_and_only_its_own_objects() -> None:
    store, lists = counting_store()
    store.create({"apiVersion": "kubegpu.io/v1", "kind": "ClusterPolicy", "metadata": {"name": "p"}, "spec": {}})
    store.create({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1"}})
    store.create({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "w", "namespace": "team"},
                  "spec": {"nodeName": "n1"}})
    store.create(owned("DaemonSet", "apps/v1", "kubegpu-device-plugin", NS, "p"))
    store.create(owned("DaemonSet", "apps/v1", "elsewhere", "other", "p"))   # another namespace
    store.create(owned("ConfigMap", "v1", "kubegpu-config", NS, "p"))
    store.create(owned("ConfigMap", "v1", "not-ours", NS, None))             # no owner label
    store.create(owned("ConfigMap", "v1", "other-policy", NS, "q"))
    store.create(owned("ClusterRole", "rbac.authorization.k8s.io/v1", "kubegpu-device-plugin", None, "p"))
    http = Discovery(hidden={"ServiceMonitor"})
    api = LightkubeOperatorApi(client=Client(http))
    api.inform(store)
    at_start = sorted(lists)
    assert "ServiceMonitor" not in at_start and "ConfigMap" in at_start
    for _ in range(3):  # what a pass reads, pass after pass
        assert [p["metadata"]["name"] for p in api.list_policies()] == ["p"]
        assert [n["metadata"]["name"] for n in api.list_nodes()] == ["n1"]
        assert [p["metadata"]["name"] for p in api.list_pods(node="n1")] == ["w"]
        assert sorted((o["kind"], o["metadata"]["name"]) for o in api.list_owned("p", NS)) == [
            ("ClusterRole", "kubegpu-device-plugin"), ("ConfigMap", "kubegpu-config"),
            ("DaemonSet", "kubegpu-device-plugin")]
    assert sorted(lists) == at_start  # no LIST after the informers' first
    assert api.trusted()

    http.hidden = set()  # prometheus-operator installed: its kind is informed from now on
    store.create(owned("ServiceMonitor", "monitoring.coreos.com/v1", "kubegpu-exporter", NS, "p"))
    assert ("ServiceMonitor", "kubegpu-exporter") in {(o["kind"], o["metadata"]["name"])
                                                      for o in api.list_owned("p", NS)}
    gets = http.gets
    api.list_owned("p", NS)
    assert http.gets == gets  # served now: no more discovery


def test_no_pass_runs_while_the_cache_is_stale() -> None:
    api = FakeApi()
    api.add_policy("p", {}, "2026-01-01T00:00:00Z")
    stale = [True]
    api.trusted = lambda: not stale[0]  # type: ignore[attr-defined]
    scheduler = controller.Scheduler(api, NS)
    assert scheduler.run("p", force=True) is None and "status" not in api.policies["p"]
    stale[0] = False
    assert scheduler.run("p", force=True) is not None and "status" in api.policies["p"]


def test_nodepools_are_informed_from_the_first_pass_that_asks_and_karpenters_once_it_is_served() -> None:
    store, lists = counting_store()
    store.create({"apiVersion": "kubegpu.io/v1", "kind": "NodePool", "metadata": {"name": "h200"}, "spec": {}})
    http = Discovery(hidden=set(), hidden_versions={"karpenter.sh/v1"})   # no Karpenter installed
    api = LightkubeOperatorApi(client=Client(http))
    api.inform(store)
    assert "NodePool" not in lists   # read only by passes with quotas
    for _ in range(3):
        assert [(p["apiVersion"], p["metadata"]["name"]) for p in api.list_nodepools()] == [("kubegpu.io/v1", "h200")]
    assert lists.count("NodePool") == 1 and KARPENTER_NODEPOOL not in lists   # informed once; Karpenter's not served

    http.hidden_versions = set()   # Karpenter installed: its NodePools join from the next pass on
    # the in-memory store knows Karpenter's kind by the name kubegpu.kube gives it; the API server by NodePool
    store.create({"apiVersion": "karpenter.sh/v1", "kind": KARPENTER_NODEPOOL, "metadata": {"name": "l4"}, "spec": {}})
    expected = [("kubegpu.io/v1", "NodePool", "h200"), ("karpenter.sh/v1", "NodePool", "l4")]
    assert [(p["apiVersion"], p["kind"], p["metadata"]["name"]) for p in api.list_nodepools()] == expected
    gets, listed = http.gets, len(lists)
    api.list_nodepools()
    assert http.gets == gets and len(lists) == listed   # both informed now: no discovery, no LIST
    assert api.trusted()
