"""An in-memory OperatorApi for whole-pass tests: objects, nodes, pods, and PDB-honouring evictions.

It models only what the operator's decisions depend on; server semantics (SSA field ownership, RBAC, schema
defaults) are for the real control plane.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

from kubegpu.operator.reconcile import Key, key_of
from kubegpu.operator.render import OWNER_LABEL


@dataclass
class Pdb:
    namespace: str
    labels: dict[str, str]
    min_available: int


@dataclass
class FakeApi:
    policies: dict[str, dict[str, Any]] = field(default_factory=dict)
    objects: dict[Key, dict[str, Any]] = field(default_factory=dict)
    nodes: dict[str, dict[str, Any]] = field(default_factory=dict)
    pods: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    pdbs: list[Pdb] = field(default_factory=list)
    nodepools: list[dict[str, Any]] = field(default_factory=list)   # kubegpu's and Karpenter's, apiVersion set
    applied: list[Key] = field(default_factory=list)
    deleted: list[Key] = field(default_factory=list)
    evictions_refused: int = 0
    clock: int = 0

    # ---------------------------------------------------------------- policies
    def add_policy(self, name: str, spec: dict[str, Any], created: str) -> None:
        self.policies[name] = {"apiVersion": "kubegpu.io/v1", "kind": "ClusterPolicy",
                               "metadata": {"name": name, "uid": f"uid-{name}", "creationTimestamp": created},
                               "spec": spec}

    def list_policies(self) -> list[dict[str, Any]]:
        return [copy.deepcopy(p) for p in self.policies.values()]

    def patch_policy_status(self, name: str, status: dict[str, Any]) -> None:
        self.policies[name]["status"] = copy.deepcopy(status)

    # ---------------------------------------------------------------- owned objects
    def apply(self, obj: dict[str, Any]) -> dict[str, Any]:
        key = key_of(obj)
        live = copy.deepcopy(obj)
        old = self.objects.get(key)
        generation = 1
        if old is not None:
            live["status"] = old.get("status", {})
            generation = old["metadata"].get("generation", 1) + (old.get("spec") != obj.get("spec"))
        live["metadata"]["generation"] = generation
        self.objects[key] = live
        self.applied.append(key)
        return copy.deepcopy(live)

    def list_owned(self, policy: str, namespace: str) -> list[dict[str, Any]]:
        return [copy.deepcopy(o) for o in self.objects.values()
                if o["metadata"].get("labels", {}).get(OWNER_LABEL) == policy]

    def delete(self, key: Key) -> None:
        self.objects.pop(key, None)
        self.deleted.append(key)

    def set_workloads_ready(self, ready: bool = True) -> None:
        """Play the controllers: every DaemonSet/Deployment rolled out (or one pod unavailable)."""
        for obj in self.objects.values():
            generation = obj["metadata"]["generation"]
            if obj["kind"] == "DaemonSet":
                obj["status"] = {"desiredNumberScheduled": 2, "numberAvailable": 2 if ready else 1,
                                 "numberUnavailable": 0 if ready else 1, "updatedNumberScheduled": 2,
                                 "observedGeneration": generation}
            elif obj["kind"] == "Deployment":
                obj["status"] = {"availableReplicas": 1 if ready else 0, "observedGeneration": generation}

    def kinds(self) -> list[tuple[str, str]]:
        return [(k[1], k[3]) for k in self.objects]

    # ---------------------------------------------------------------- nodes and pods
    def add_node(self, name: str, labels: dict[str, str]) -> None:
        self.nodes[name] = {"apiVersion": "v1", "kind": "Node",
                            "metadata": {"name": name, "labels": dict(labels), "annotations": {}}, "spec": {}}

    def list_nodes(self) -> list[dict[str, Any]]:
        return [copy.deepcopy(n) for n in self.nodes.values()]

    def list_nodepools(self) -> list[dict[str, Any]]:
        return copy.deepcopy(self.nodepools)

    def patch_node(self, name: str, labels: dict[str, str | None], annotations: dict[str, str | None]) -> None:
        meta = self.nodes[name]["metadata"]
        for target, patch in ((meta["labels"], labels), (meta["annotations"], annotations)):
            for key, value in patch.items():
                if value is None:
                    target.pop(key, None)
                else:
                    target[key] = value

    def set_unschedulable(self, name: str, value: bool) -> None:
        self.nodes[name]["spec"]["unschedulable"] = value

    def add_pod(self, namespace: str, name: str, node: str, labels: dict[str, str] | None = None,
                gpu: bool = False, owner: str | None = None, annotations: dict[str, str] | None = None) -> None:
        self.clock += 1
        container: dict[str, Any] = {"name": "c"}
        if gpu:
            container["resources"] = {"limits": {"nvidia.com/gpu": "1"}}
        self.pods[(namespace, name)] = {
            "metadata": {"name": name, "namespace": namespace, "labels": dict(labels or {}),
                         "annotations": dict(annotations or {}),
                         "creationTimestamp": f"2026-01-01T00:{self.clock // 60:02d}:{self.clock % 60:02d}Z",
                         "ownerReferences": [{"kind": owner, "name": "x"}] if owner else []},
            "spec": {"nodeName": node, "containers": [container]},
            "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]},
        }

    def list_pods(self, node: str | None = None, namespace: str | None = None,
                  labels: dict[str, str] | None = None) -> list[dict[str, Any]]:
        out = []
        for pod in self.pods.values():
            if node is not None and pod["spec"]["nodeName"] != node:
                continue
            if namespace is not None and pod["metadata"]["namespace"] != namespace:
                continue
            if labels and any(pod["metadata"]["labels"].get(k) != v for k, v in labels.items()):
                continue
            out.append(copy.deepcopy(pod))
        return out

    def _covered(self, pdb: Pdb, pod: dict[str, Any]) -> bool:
        return pod["metadata"]["namespace"] == pdb.namespace and \
            all(pod["metadata"]["labels"].get(k) == v for k, v in pdb.labels.items())

    def evict(self, namespace: str, name: str) -> bool:
        pod = self.pods.get((namespace, name))
        if pod is None:
            return True
        for pdb in self.pdbs:
            if self._covered(pdb, pod):
                healthy = sum(1 for p in self.pods.values() if self._covered(pdb, p))
                if healthy - 1 < pdb.min_available:
                    self.evictions_refused += 1
                    return False
        del self.pods[(namespace, name)]
        return True

    def delete_pod(self, namespace: str, name: str) -> None:
        self.pods.pop((namespace, name), None)
