"""Shared builders for the autoscaler tests: NodePools, pods, instance types and a small cluster harness.

The harness plays kube-scheduler (binding pending pods with `kubegpu.scheduling`) next to the real autoscaler, on a
virtual clock, so tests can walk pods through provisioning, binding, completion and consolidation.
"""

from __future__ import annotations

from typing import Any

from kubegpu.autoscaler.api import NodePool, parse_nodepool
from kubegpu.autoscaler.controller import Autoscaler, Options
from kubegpu.autoscaler.instancetypes import InstanceType, Offering
from kubegpu.autoscaler.provider import SimulatedProvider
from kubegpu.clock import VirtualClock
from kubegpu.kube import MemoryCluster
from kubegpu.scheduling import fits, node_info

GIB = 2.0**30


def nodepool(name: str = "default", requirements: list[dict[str, Any]] | None = None, **spec: Any) -> dict[str, Any]:
    template_spec = {"requirements": requirements or []}
    for key in ("taints", "startupTaints", "expireAfter", "terminationGracePeriod"):
        if key in spec:
            template_spec[key] = spec.pop(key)
    metadata = {k: spec.pop(k) for k in ("labels", "annotations") if k in spec}
    return {"apiVersion": "kubegpu.io/v1", "kind": "NodePool", "metadata": {"name": name},
            "spec": {"template": {"metadata": metadata, "spec": template_spec}, **spec}}


def pool(name: str = "default", requirements: list[dict[str, Any]] | None = None, **spec: Any) -> NodePool:
    return parse_nodepool(nodepool(name, requirements, **spec))


def pod(name: str, cpu: str = "1", memory: str = "1Gi", namespace: str = "default", **extra: Any) -> dict[str, Any]:
    limits = extra.pop("limits", None)
    resources: dict[str, Any] = {"requests": {"cpu": cpu, "memory": memory}}
    if limits:
        resources["limits"] = limits
    spec: dict[str, Any] = {"containers": [{"name": "main", "image": "x", "resources": resources}]}
    spec.update(extra.pop("spec", {}))
    meta: dict[str, Any] = {"name": name, "namespace": namespace, "uid": f"uid-{name}"}
    meta.update(extra.pop("metadata", {}))
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec, "status": {"phase": "Pending"}}


def instance_type(name: str, cpu: float, memory_gib: float, price: float, gpus: int = 0, model: str | None = None,
                  zones: tuple[str, ...] = ("zone-a",), spot: float | None = None, pods: float = 110.0,
                  arch: str = "amd64") -> InstanceType:
    capacity = {"cpu": cpu, "memory": memory_gib * GIB, "pods": pods}
    if gpus:
        capacity["nvidia.com/gpu"] = float(gpus)
    offerings = [Offering(z, "on-demand", price) for z in zones]
    if spot is not None:
        offerings += [Offering(z, "spot", spot) for z in zones]
    return InstanceType(name, arch, ("linux",), capacity, tuple(offerings), gpu_model=model)


class Harness:
    """MemoryCluster + SimulatedProvider + Autoscaler on a VirtualClock, and a binder standing in for kube-scheduler."""

    def __init__(self, types: list[InstanceType], registration_delay: float = 20.0, cluster: Any = None,
                 **options: Any) -> None:
        self.clock = VirtualClock(1_000_000.0)
        self.cluster = cluster if cluster is not None else MemoryCluster(self.clock)
        self.provider = SimulatedProvider(self.cluster, types, self.clock, registration_delay)
        self.lines: list[str] = []
        opts = {"validation_delay": 15.0, **options}
        self.autoscaler = Autoscaler(self.cluster, self.provider, self.clock, Options(**opts), log=self.lines.append)
        # what the test writes goes through the autoscaler's informers (written through to their cache), so a pass
        # right after sees it even where the cache is fed by a watch over HTTP
        self.writer = self.autoscaler.cluster
        self.replicated: dict[str, dict[str, Any]] = {}   # pods a ReplicaSet would recreate when evicted
        self._generation = 0

    def add_replicated(self, obj: dict[str, Any]) -> dict[str, Any]:
        self.replicated[obj["metadata"]["name"]] = obj
        return self.add(obj)

    def recreate_evicted(self) -> None:
        """A ReplicaSet's part: an evicted (deleted, unfinished) pod comes back pending with a new uid."""
        present = {p["metadata"]["name"] for p in self.cluster.list("Pod")}
        for name, template in self.replicated.items():
            if name not in present:
                self._generation += 1
                fresh = {**template, "metadata": {**template["metadata"], "uid": f"{name}-{self._generation}"},
                         "spec": {k: v for k, v in template["spec"].items() if k != "nodeName"},
                         "status": {"phase": "Pending"}}
                self.cluster.create(fresh)

    def add(self, obj: dict[str, Any]) -> dict[str, Any]:
        return self.writer.create(obj)

    def bind_pending(self) -> int:
        """kube-scheduler's part: bind each pending pod to the first node it fits (ready, untainted for it)."""
        nodes = self.cluster.list("Node")
        pods = self.cluster.list("Pod")
        infos = []
        for node in nodes:
            ready = any(c.get("type") == "Ready" and c.get("status") == "True"
                        for c in (node.get("status") or {}).get("conditions") or [])
            if ready:
                infos.append(node_info(node, [p for p in pods if p["spec"].get("nodeName") == node["metadata"]["name"]
                                              and p["status"].get("phase") not in ("Succeeded", "Failed")]))
        bound = 0
        for p in pods:
            if p["spec"].get("nodeName") or p["status"].get("phase") != "Pending":
                continue
            for info in infos:
                if fits(p, info).ok:
                    info.add_pod(p)
                    self.writer.patch("Pod", p["metadata"]["name"], {"spec": {"nodeName": info.name}},
                                      namespace=p["metadata"]["namespace"])
                    self.writer.patch("Pod", p["metadata"]["name"], {"status": {"phase": "Running"}},
                                      namespace=p["metadata"]["namespace"], subresource="status")
                    bound += 1
                    break
        return bound

    def run(self, seconds: float, step: float = 1.0, bind: bool = True) -> None:
        end = self.clock.now() + seconds
        while self.clock.now() < end:
            self.clock.advance(step)
            self.autoscaler.step()
            self.recreate_evicted()
            if bind:
                self.bind_pending()

    def claims(self) -> list[dict[str, Any]]:
        return self.cluster.list("NodeClaim")

    def nodes(self) -> list[dict[str, Any]]:
        return self.cluster.list("Node")

    def finish(self, name: str, namespace: str = "default") -> None:
        self.replicated.pop(name, None)
        self.cluster.patch("Pod", name, {"status": {"phase": "Succeeded"}}, namespace=namespace,
                           subresource="status")

