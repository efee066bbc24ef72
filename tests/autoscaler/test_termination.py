"""Termination driven by the API: deleting a NodeClaim starts it, the `kubegpu.io/termination` finalizer holds it
until the provider confirms the instance is gone, errors are retried with backoff and never finish a claim early,
and a replica that becomes leader finishes what another left (termination and a disruption's replacement)."""

from __future__ import annotations

from typing import Any

from kubegpu.autoscaler import labels as L
from kubegpu.autoscaler.controller import LEASE_NAME, Autoscaler, Options
from kubegpu.autoscaler.disruption import DISRUPTION_ANNOTATION
from kubegpu.autoscaler.provider import SimulatedProvider
from kubegpu.autoscaler.termination import REASON_ANNOTATION
from kubegpu.clock import VirtualClock
from kubegpu.errors import KubegpuError
from kubegpu.kube import ApiError, MemoryCluster
from kubegpu.kube.leader import LeaderElector
from tests.autoscaler.builders import Harness, instance_type, nodepool, pod

TYPES = [instance_type("cpu.4", 4, 16, 0.2), instance_type("cpu.8", 8, 32, 0.5)]


def launched(h: Harness, pods: int = 1, cpu: str = "3") -> list[dict[str, Any]]:
    h.add(nodepool("cpu"))
    for i in range(pods):
        h.add(pod(f"p{i}", cpu=cpu))
    h.run(40)
    claims = h.claims()
    assert claims and all(c["status"].get("nodeName") for c in claims)
    return claims


def test_every_nodeclaim_carries_the_finalizer_and_gets_a_generated_name() -> None:
    h = Harness(TYPES, registration_delay=5.0)
    claims = launched(h, pods=2)
    assert all(L.TERMINATION_FINALIZER in c["metadata"]["finalizers"] for c in claims)
    assert all(c["metadata"]["generateName"] == "cpu-" and c["metadata"]["name"].startswith("cpu-") for c in claims)


def test_a_user_deleting_a_nodeclaim_terminates_instance_and_node() -> None:
    h = Harness(TYPES, registration_delay=5.0)
    [claim] = launched(h)
    name, node = claim["metadata"]["name"], claim["status"]["nodeName"]
    h.cluster.delete("NodeClaim", name)   # as `kubectl delete nodeclaim` would
    assert h.cluster.get("NodeClaim", name)["metadata"]["deletionTimestamp"]  # held by the finalizer
    h.autoscaler.step()   # drain: the pod is evicted (deleted) first
    h.autoscaler.step()
    assert not any(c["metadata"]["name"] == name for c in h.claims())
    assert node not in {n["metadata"]["name"] for n in h.nodes()}
    assert claim["status"]["providerID"] not in h.provider.instances
    assert [t[1:] for t in h.autoscaler.termination.terminated] == [(name, "deleted")]


def test_a_node_deleted_directly_takes_its_nodeclaim_with_it() -> None:
    h = Harness(TYPES, registration_delay=5.0)
    [claim] = launched(h)
    h.cluster.delete("Node", claim["status"]["nodeName"])
    for _ in range(3):
        h.autoscaler.step()
    assert not h.claims() and not h.nodes() and not h.provider.instances


class Flaky:
    """The cluster, with the next `failures` calls of `method` on `kind` failing as an overloaded API server does."""

    def __init__(self, cluster: MemoryCluster, method: str, kind: str, failures: int) -> None:
        self.cluster, self.method, self.kind, self.failures = cluster, method, kind, failures

    def __getattr__(self, name: str) -> Any:
        real = getattr(self.cluster, name)
        if name != self.method:
            return real

        def maybe_fail(*args: Any, **kwargs: Any) -> Any:
            if args[0] == self.kind and self.failures > 0:
                self.failures -= 1
                raise ApiError(f"{name} {self.kind}: the server is currently unable to handle the request", 503)
            return real(*args, **kwargs)

        return maybe_fail


def test_a_transient_api_error_during_termination_is_retried_not_swallowed() -> None:
    clock = VirtualClock(1_000_000.0)
    store = MemoryCluster(clock)
    flaky = Flaky(store, "patch", "NodeClaim", 0)
    h = Harness(TYPES, registration_delay=5.0, cluster=flaky)
    [claim] = launched(h)
    name = claim["metadata"]["name"]
    store.delete("NodeClaim", name)
    flaky.failures = 2   # removing the finalizer fails twice
    h.autoscaler.step()
    h.autoscaler.step()
    assert L.TERMINATION_FINALIZER in store.get("NodeClaim", name)["metadata"]["finalizers"]  # not finished early
    assert any("termination" in line and "attempt 1" in line for line in h.lines), h.lines[-3:]
    h.run(10, bind=False)   # past the backoff: retried until it goes through
    assert not store.list("NodeClaim")
    assert any("attempt 2" in line for line in h.lines)


def test_a_provider_error_keeps_the_claim_until_the_instance_is_confirmed_gone() -> None:
    h = Harness(TYPES, registration_delay=5.0)
    [claim] = launched(h)
    name = claim["metadata"]["name"]
    real_delete, calls = h.provider.delete, []

    def failing(nodeclaim: dict[str, Any]) -> None:
        calls.append(nodeclaim["metadata"]["name"])
        if len(calls) <= 2:
            raise KubegpuError("TerminateInstances: RequestLimitExceeded")
        real_delete(nodeclaim)

    h.provider.delete = failing  # type: ignore[method-assign]
    h.autoscaler.termination.start(h.cluster.get("NodeClaim", name), "expired")
    h.run(3, bind=False)
    assert h.cluster.get("NodeClaim", name)["metadata"]["annotations"][REASON_ANNOTATION] == "expired"
    assert len(calls) == 2 and claim["status"]["providerID"] in h.provider.instances
    h.run(10, bind=False)
    assert not h.claims() and not h.provider.instances


def _replica(store: Any, provider: SimulatedProvider, clock: VirtualClock, identity: str,
             lines: list[str], **options: Any) -> Autoscaler:
    elector = LeaderElector(store, identity, LEASE_NAME, namespace="kube-system", lease_duration=15.0)
    return Autoscaler(store, provider, clock, Options(**options), log=lines.append, elector=elector)


def test_a_new_leader_finishes_a_termination_the_old_one_left() -> None:
    h = Harness(TYPES, registration_delay=5.0)
    [claim] = launched(h)
    h.add({"apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": "hold", "namespace":
           "default"}, "spec": {"minAvailable": 1, "selector": {"matchLabels": {}}}})
    lines: list[str] = []
    a = _replica(h.cluster, h.provider, h.clock, "a", lines)
    assert a.step()
    a.termination.start(h.cluster.get("NodeClaim", claim["metadata"]["name"]), "expired")
    for _ in range(3):
        h.clock.advance(1)
        a.step()
    assert h.claims() and any("drain waits" in line for line in lines)   # a dies here, mid-drain
    b = _replica(h.cluster, h.provider, h.clock, "b", lines)
    h.cluster.delete("PodDisruptionBudget", "hold", "default")
    assert not b.step()                 # a's lease is still valid
    h.clock.advance(16)
    for _ in range(4):
        h.clock.advance(1)
        b.step()
    assert not h.claims() and not h.nodes() and not h.provider.instances
    assert [t[2] for t in b.termination.terminated] == ["expired"]


def test_a_new_leader_finishes_a_disruption_replacement_the_old_one_started() -> None:
    h = Harness(TYPES, registration_delay=5.0, validation_delay=0.0)
    h.add(nodepool("cpu", disruption={"consolidationPolicy": "WhenEmptyOrUnderutilized", "consolidateAfter": "0s"}))
    h.add(pod("big", cpu="7"))
    h.run(40)
    [old] = h.claims()
    assert old["metadata"]["labels"][L.INSTANCE_TYPE_LABEL] == "cpu.8"
    h.cluster.delete("Pod", "big", "default")
    h.add_replicated(pod("small", cpu="3"))
    h.bind_pending()   # small lands on the 8-CPU node: a cheaper 4-CPU replacement now pays
    lines: list[str] = []
    a = _replica(h.cluster, h.provider, h.clock, "a", lines, validation_delay=0.0)
    for _ in range(10):
        h.clock.advance(1)
        a.step()
        if any(DISRUPTION_ANNOTATION in (c["metadata"].get("annotations") or {}) for c in h.claims()):
            break
    noted = h.cluster.get("NodeClaim", old["metadata"]["name"])["metadata"]["annotations"]
    assert DISRUPTION_ANNOTATION in noted, lines[-5:]   # a dies with the replacement launched, not initialized
    b = _replica(h.cluster, h.provider, h.clock, "b", lines, validation_delay=0.0)
    h.clock.advance(16)
    for _ in range(40):
        h.clock.advance(1)
        b.step()
        h.recreate_evicted()
        h.bind_pending()
    types = sorted(c["metadata"]["labels"][L.INSTANCE_TYPE_LABEL] for c in h.claims())
    assert types == ["cpu.4"], lines[-8:]
    assert old["metadata"]["name"] not in {c["metadata"]["name"] for c in h.claims()}
    assert h.cluster.get("Pod", "small", "default")["spec"].get("nodeName")


class Recording:
    """The store, with every Pod delete and eviction written down (what reaches the API, in order)."""

    def __init__(self, cluster: MemoryCluster) -> None:
        self.cluster, self.calls = cluster, []   # type: list[tuple[str, str]]

    def __getattr__(self, name: str) -> Any:
        return getattr(self.cluster, name)

    def delete(self, kind: str, name: str, namespace: str | None = None) -> None:
        if kind == "Pod":
            self.calls.append(("delete", name))
        self.cluster.delete(kind, name, namespace)

    def evict(self, namespace: str, name: str) -> None:
        self.calls.append(("evict", name))
        self.cluster.evict(namespace, name)


def _recorded(**options: Any) -> tuple[Harness, MemoryCluster, Recording]:
    store = MemoryCluster()
    recording = Recording(store)
    h = Harness(TYPES, registration_delay=5.0, cluster=recording, **options)
    store.clock = h.clock   # deletionTimestamps on the harness's time
    return h, store, recording


def _spread(h: Harness, count: int, pdb: dict[str, Any] | None = None, **pod_meta: Any) -> list[dict[str, Any]]:
    """`count` pods labelled app=w, one per node (3 of a node's 4 CPUs), under `pdb` (maxUnavailable 1)."""
    h.add(nodepool("cpu"))
    h.add(pdb or {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
                  "metadata": {"name": "w", "namespace": "default"},
                  "spec": {"maxUnavailable": 1, "selector": {"matchLabels": {"app": "w"}}}})
    for i in range(count):
        h.add(pod(f"w{i}", cpu="3", metadata={"labels": {"app": "w"}, **pod_meta}))
    h.run(40)
    claims = h.claims()
    assert len(claims) == count and all(c["status"].get("nodeName") for c in claims)
    return claims


def test_claims_draining_at_once_take_no_more_than_the_budget_allows() -> None:
    """Four claims drain in parallel (16 workers) under one budget of maxUnavailable 1: a per-claim count of what
    was spent would let each take its pod in the same pass; the Eviction API lets exactly one go."""
    h, store, recording = _recorded(parallelism=16)
    claims = _spread(h, 4)
    for claim in claims:
        store.delete("NodeClaim", claim["metadata"]["name"])
    h.autoscaler.step()
    assert len(store.list("Pod")) == 3
    assert [c for c in recording.calls if c[0] == "delete"] == []   # never a delete: evictions only
    assert sum(1 for c in recording.calls if c[0] == "evict") == 4   # each pod asked for; the server let one go
    assert any("drain waits" in line and "pdb w:" in line for line in h.lines)
    assert not h.autoscaler.termination._failures   # a 429 is a wait, not a failed termination


def test_a_refused_eviction_backs_off_per_pod_and_the_drain_finishes_as_the_budget_frees() -> None:
    h, store, recording = _recorded(parallelism=16)
    claims = _spread(h, 2)
    for claim in claims:
        h.replicated[f"w{claims.index(claim)}"] = pod(f"w{claims.index(claim)}", cpu="3",
                                                      metadata={"labels": {"app": "w"}})
        store.delete("NodeClaim", claim["metadata"]["name"])
    h.autoscaler.step()            # one pod evicted, the other refused
    [left] = [p["metadata"]["name"] for p in store.list("Pod")]
    assert sorted(name for _, name in recording.calls) == ["w0", "w1"]
    recording.calls.clear()
    h.autoscaler.step()            # no time passed: the refused pod waits out its own backoff, nothing is sent
    assert recording.calls == []
    h.clock.advance(0.6)
    h.autoscaler.step()            # refused again (the evicted pod has no replacement yet): the backoff doubles
    assert recording.calls == [("evict", left)]
    h.clock.advance(0.6)
    h.autoscaler.step()
    assert recording.calls == [("evict", left)]   # 1 s now, not 0.5 s
    h.run(60)                      # the ReplicaSet's replacement runs on a new node: the budget frees, the drain ends
    assert {c["metadata"]["name"] for c in claims}.isdisjoint(c["metadata"]["name"] for c in h.claims())
    assert all(kind == "evict" for kind, _ in recording.calls)   # and never a delete
    assert not h.autoscaler.termination._failures


def test_the_drain_does_not_modify_the_snapshot() -> None:
    h = Harness(TYPES, registration_delay=5.0, parallelism=16)
    claims = _spread(h, 3)
    snapshot = h.autoscaler.state.snapshot()
    pods_before = [p["metadata"]["name"] for p in snapshot.pods]
    for claim in claims:
        h.cluster.delete("NodeClaim", claim["metadata"]["name"])
    snapshot = h.autoscaler.state.snapshot()
    pods = list(snapshot.pods)
    h.autoscaler.termination.reconcile(snapshot)
    assert snapshot.pods == pods and [p["metadata"]["name"] for p in pods] == pods_before
    assert len(h.cluster.list("Pod")) == 2   # the API server's budget let one go


def test_do_not_disrupt_holds_the_drain_until_the_termination_grace_period_then_the_pod_is_deleted() -> None:
    h, store, recording = _recorded()
    h.add(nodepool("cpu", terminationGracePeriod="2m"))
    h.add(pod("keep", cpu="3", metadata={"annotations": {"karpenter.sh/do-not-disrupt": "true"}}))
    h.run(40)
    [claim] = h.claims()
    store.delete("NodeClaim", claim["metadata"]["name"])
    h.run(100, bind=False)
    assert [p["metadata"]["name"] for p in store.list("Pod")] == ["keep"]
    assert recording.calls == []    # neither evicted nor deleted while within the grace period
    assert any("drain waits: pod default/keep: annotated do-not-disrupt" in line for line in h.lines)
    h.run(30, bind=False)
    assert recording.calls == [("delete", "keep")]   # past terminationGracePeriod: the one bypass
    assert not h.claims() and not h.nodes()


def test_past_the_grace_period_a_pdb_no_longer_holds_the_drain() -> None:
    h, store, recording = _recorded()
    h.add(nodepool("cpu", terminationGracePeriod="1m"))
    h.add({"apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": "all", "namespace":
           "default"}, "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "db"}}}})
    h.add(pod("db", cpu="3", metadata={"labels": {"app": "db"}}))
    h.run(40)
    [claim] = h.claims()
    store.delete("NodeClaim", claim["metadata"]["name"])
    h.run(50, bind=False)
    assert [p["metadata"]["name"] for p in store.list("Pod")] == ["db"]
    assert {kind for kind, _ in recording.calls} == {"evict"}   # asked, refused, asked again: never deleted
    h.run(20, bind=False)
    assert recording.calls[-1] == ("delete", "db") and not h.claims()


def test_a_claim_deleted_before_its_node_name_was_recorded_still_drains_and_deletes_its_node() -> None:
    h = Harness(TYPES, registration_delay=5.0)
    [claim] = launched(h)
    name, node = claim["metadata"]["name"], claim["status"]["nodeName"]
    # as a claim whose Node registered by its kubelet's own name before the lifecycle wrote `status.nodeName`
    h.cluster.patch("NodeClaim", name, {"status": {"nodeName": None}}, subresource="status")
    h.cluster.delete("NodeClaim", name)
    h.autoscaler.step()   # found by its providerID: cordoned and drained before the instance goes
    assert h.cluster.list("Pod") == []
    kept = h.cluster.get("Node", node)
    assert not kept["metadata"].get("deletionTimestamp") and L.DISRUPTED_TAINT["key"] in \
        [t["key"] for t in kept["spec"]["taints"]]
    h.autoscaler.step()
    assert not h.claims() and not h.nodes() and not h.provider.instances


def test_an_instance_whose_launch_was_never_recorded_is_found_and_terminated() -> None:
    h = Harness(TYPES, registration_delay=5.0)
    h.add(nodepool("cpu"))
    h.add(pod("p0", cpu="3"))
    for _ in range(10):
        if h.claims():
            break
        h.run(1, bind=False)
    [claim] = h.claims()
    assert not claim.get("status", {}).get("providerID")
    h.provider.create(claim)   # the leader launched it and died before recording the providerID
    [node] = h.nodes()
    h.autoscaler.close()
    h.cluster.delete("Pod", "p0")
    h.cluster.delete("NodeClaim", claim["metadata"]["name"])   # deleted before any replica launched it again
    provider = SimulatedProvider(h.cluster, TYPES, h.clock, registration_delay=5.0)   # a new leader: no memory
    scaler = Autoscaler(h.cluster, provider, h.clock, Options(validation_delay=15.0), log=h.lines.append)
    try:
        for _ in range(3):
            scaler.step()
            h.clock.advance(1)
        assert not h.claims() and not h.nodes() and not provider.instances
        assert any(f"found instance {node['spec']['providerID']}" in line for line in h.lines)
    finally:
        scaler.close()
