"""The quota controller: charges pods' ResourceClaims (charge holders, `kubegpu.quota.holders`) and lifts their
`kubegpu.io/gpu-memory` gates; reads ElasticQuotas, GPU pods and nodes, lifts `kubegpu.io/quota` gates, evicts
borrowed pods when a team under its `min` needs its guarantee back, and records each team's `status.used`.

Driven by `tick(now)` on a `Cluster`, like the partitioner and the autoscaler, so the same code runs against a real
API server (`kubegpu quota controller`), the in-memory store in tests, and the simulator; one replica acts, the others
wait on the `kubegpu-quota` Lease. The decision itself is `kubegpu.quota.elastic.decide` (pure).

Pods, Nodes, ElasticQuotas and the DRA objects a claim's charge reads are read through informers
(`kubegpu.kube.informer`): listed once, then watched, so an idle controller sends no LIST however short its
interval. The watch cache can lag a write by another client: a lift refused for a stale resourceVersion (409) reads
the pod again from the API server, never from the cache. While the watches have been broken too long to trust the
cache, the controller skips its passes (`cache_trusted`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from kubegpu.errors import KubegpuError
from kubegpu.kube import Cluster, record_event
from kubegpu.kube.cluster import parse_timestamp
from kubegpu.kube.errors import Conflict, NotFound
from kubegpu.kube.eviction import evict_pod
from kubegpu.kube.informer import InformedCluster, cache_trusted
from kubegpu.kube.leader import LeaderElector
from kubegpu.quota.api import KIND, parse_elastic_quota
from kubegpu.quota.elastic import RESOURCES, Decision, QuotaPod, TeamQuota, decide
from kubegpu.quota.holders import DRA_KINDS, ClaimCharger, ClaimPass, is_holder
from kubegpu.scheduling import QUOTA_GATE, is_finished, parse_quantity, pod_requests
from kubegpu.sharing.charges import ChargeTable, node_gpus_bytes, quantity_of_bytes
from kubegpu.sharing.names import GPU_MEMORY_RESOURCE, GPU_RESOURCE

log = logging.getLogger("kubegpu.quota")
COMPONENT = "kubegpu-quota"
LEASE_NAME = "kubegpu-quota"
INFORMED_KINDS = ("Pod", "Node", KIND, *DRA_KINDS)


def has_quota_gate(pod: Mapping[str, Any]) -> bool:
    return any(g.get("name") == QUOTA_GATE for g in (pod.get("spec") or {}).get("schedulingGates") or ())


def quota_pod(pod: Mapping[str, Any]) -> QuotaPod | None:
    """The decision's view of a pod; None for a pod that asks for no GPU memory or is finished."""
    if is_finished(pod):
        return None
    try:
        requests = pod_requests(pod)
    except KubegpuError:
        return None
    amounts = {name: requests[name] for name in RESOURCES if requests.get(name)}
    if not amounts.get(GPU_MEMORY_RESOURCE):
        return None
    meta = pod.get("metadata") or {}
    # a charge holder holds its claim's GPUs for the team: admitted and in place (it never binds, by design)
    return QuotaPod(namespace=str(meta.get("namespace") or "default"), name=str(meta.get("name", "")),
                    amounts=amounts, created=parse_timestamp(meta.get("creationTimestamp")) or 0.0,
                    gated=has_quota_gate(pod), bound=bool((pod.get("spec") or {}).get("nodeName")) or is_holder(pod),
                    terminating=bool(meta.get("deletionTimestamp")))


def team_quota(obj: Mapping[str, Any]) -> TeamQuota:
    spec = parse_elastic_quota(obj)
    meta = obj.get("metadata") or {}

    def amounts(values: Mapping[str, str]) -> dict[str, float]:
        return {name: parse_quantity(value) for name, value in values.items()}

    return TeamQuota(str(meta.get("namespace") or "default"), amounts(spec.min),
                     amounts(spec.max) if spec.max is not None else None)


def cluster_capacity(nodes: list[dict[str, Any]]) -> float:
    """What the GPUs of the cluster's schedulable nodes hold, by their GFD labels (`node_gpus_bytes`; the
    `kubegpu.io/gpu-memory` they advertise leaves room for the largest charge per GPU, more than pinned pods use)."""
    return float(sum(node_gpus_bytes((node.get("metadata") or {}).get("labels") or {}) for node in nodes
                     if not (node.get("spec") or {}).get("unschedulable")))


@dataclass
class TickResult:
    acted: bool = False
    lifted: int = 0
    evicted: int = 0
    decision: Decision | None = None
    claims: ClaimPass | None = None


@dataclass
class QuotaController:
    cluster: Cluster
    identity: str = "kubegpu-quota"
    leader_elect: bool = True
    lease_namespace: str = "kubegpu"
    lease_duration: float = 15.0
    workers: int = 8
    table: ChargeTable | None = None   # what claims are charged against (default: the table ConfigMap's)
    elector: LeaderElector | None = field(default=None, init=False)
    api: Cluster = field(init=False)   # the API server itself: the Lease, and fresh reads after a 409
    _bad: set[str] = field(default_factory=set, init=False)
    charger: ClaimCharger = field(init=False)

    def __post_init__(self) -> None:
        if isinstance(self.cluster, InformedCluster):
            self.api = self.cluster.store
        else:
            self.api = self.cluster
            # the controller never modifies what it reads (it builds patches), so the cache hands out its objects
            self.cluster = InformedCluster(self.cluster, INFORMED_KINDS, copy=False)
        self.charger = ClaimCharger(self.cluster, self.api, self.table, COMPONENT, self.lease_namespace)
        if self.leader_elect:
            self.elector = LeaderElector(self.api, self.identity, LEASE_NAME, self.lease_namespace,
                                         lease_duration=self.lease_duration)

    def close(self) -> None:
        """Stop the informers' watches (the process exits anyway; tests building many controllers call it)."""
        if isinstance(self.cluster, InformedCluster):
            self.cluster.stop()

    def tick(self, now: float) -> TickResult:
        if self.elector is not None and not self.elector.try_acquire(now):
            return TickResult()
        if not cache_trusted(self.cluster):
            return TickResult()  # the watches are broken: no decision on a view that may be minutes old
        claims = self.charger.tick(self.cluster.list("Pod"))
        quota_objects = self.cluster.list(KIND)
        quotas = []
        for obj in quota_objects:
            try:
                quotas.append(team_quota(obj))
            except KubegpuError as exc:  # one bad quota is reported on itself; the other teams go on
                key = f"{obj['metadata'].get('namespace')}/{obj['metadata'].get('name')}"
                if key not in self._bad:
                    self._bad.add(key)
                    record_event(self.cluster, obj, "InvalidElasticQuota", str(exc), component=COMPONENT)
        pods = self.cluster.list("Pod")
        by_key = {f"{(p.get('metadata') or {}).get('namespace')}/{(p.get('metadata') or {}).get('name')}": p
                  for p in pods}
        views = [view for view in map(quota_pod, pods) if view is not None]
        decision = decide(quotas, views, cluster_capacity(self.cluster.list("Node")))
        lifted = self._lift([by_key[p.key] for p in decision.lift])
        evicted = 0
        for eviction in decision.evict:
            if evict_pod(self.api, eviction.pod.namespace, eviction.pod.name):  # the Eviction API: PDBs hold
                evicted += 1
                record_event(self.cluster, by_key[eviction.pod.key], "QuotaReclaimed", eviction.reason,
                             component=COMPONENT)
        self._write_status(quota_objects, decision)
        return TickResult(True, lifted, evicted, decision, claims)

    def _lift(self, pods: list[dict[str, Any]]) -> int:
        def lift(pod: dict[str, Any]) -> None:
            meta = pod["metadata"]
            remaining = [g for g in pod["spec"].get("schedulingGates") or () if g.get("name") != QUOTA_GATE]
            self.cluster.patch("Pod", meta["name"], {"metadata": {"resourceVersion": meta.get("resourceVersion")},
                                                     "spec": {"schedulingGates": remaining or None}},
                               namespace=meta.get("namespace"))

        def one(pod: dict[str, Any]) -> bool:
            try:
                lift(pod)
            except NotFound:
                return False
            except Conflict:
                # Changed since the list — usually kube-scheduler's SchedulingGated status, which leaves the decision
                # as it was: read it again and lift from the fresh copy (its other gates as they are now).
                meta = pod["metadata"]
                try:
                    lift(self.api.get("Pod", meta["name"], meta.get("namespace")))
                except (NotFound, Conflict):  # gone, or changing still: the next pass sees it afresh
                    return False
            return True

        if len(pods) <= 1 or self.workers <= 1:
            return sum(one(p) for p in pods)
        with ThreadPoolExecutor(self.workers) as pool:
            return sum(pool.map(one, pods))

    def _write_status(self, quota_objects: list[dict[str, Any]], decision: Decision) -> None:
        for obj in quota_objects:
            meta = obj.get("metadata") or {}
            used = decision.used.get(str(meta.get("namespace")), {})
            wanted = {GPU_MEMORY_RESOURCE: quantity_of_bytes(int(used.get(GPU_MEMORY_RESOURCE, 0.0))) or "0"}
            if GPU_RESOURCE in used:
                wanted[GPU_RESOURCE] = str(int(used[GPU_RESOURCE]))
            if (obj.get("status") or {}).get("used") == wanted:
                continue
            try:
                self.cluster.patch(KIND, meta["name"], {"status": {"used": wanted}}, namespace=meta.get("namespace"),
                                   subresource="status")
            except (NotFound, Conflict):
                continue


def run(controller: QuotaController, interval: float, stop: Callable[[], bool],
        now: Callable[[], float] = time.time) -> None:
    """The `kubegpu quota controller` loop: one pass every `interval` seconds until `stop()`."""
    while not stop():
        started = now()
        try:
            result = controller.tick(started)
            if result.lifted or result.evicted:
                log.info("quota: lifted %d gate(s), evicted %d borrowed pod(s)", result.lifted, result.evicted)
            if result.claims and (result.claims.charged or result.claims.lifted):
                log.info("quota: %d claim charge(s) held, %d claim pod(s) let through", result.claims.charged,
                         result.claims.lifted)
        except KubegpuError as exc:
            log.warning("quota pass failed: %s", exc)
        time.sleep(max(0.0, interval - (now() - started)))
