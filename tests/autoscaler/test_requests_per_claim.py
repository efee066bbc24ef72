"""The API requests one NodeClaim costs from creation to an initialized Node (kubegpu buys more, smaller
nodes than Karpenter, so each claim's requests are what the API server pays for the cheaper plan).

Karpenter's kwok path per claim: create the NodeClaim, its launch (labels, status), the Node's create, registration
(the Node's labels, taints and finalizer; the claim's status) and initialization (the Node's label; the claim's
status). The kwok provider's Node exists once its instance is launched, so registration happens in the same pass
and the claim's Launched and Registered conditions go in one status write. Its simulated kubelet and device plugin
add one Node status write: the GPUs once registered, with Ready after a registration delay (with none, the Node is
created Ready). Nothing is read back from the API server: the provider reads Nodes through the autoscaler's
informers. Holding the node for the pod it was bought for costs one more Node write: the reservation taint
lifted once that pod is bound (and the pod's toleration and nomination, a write each)."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from kubegpu.autoscaler import labels as L
from kubegpu.autoscaler.objects import is_true
from kubegpu.kube.memory import MemoryCluster
from tests.autoscaler.builders import Harness, instance_type, nodepool, pod

A100 = "A100-SXM4-80GB"
TYPES = [instance_type("a100.x1", 8, 64, 4.0, gpus=1, model=A100)]


class CountingCluster(MemoryCluster):
    """The in-memory API server, counting the requests made to it (what the informers' cache serves is not one)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.requests: Counter[tuple[str, str, str]] = Counter()

    def get(self, kind: str, name: str, namespace: str | None = None) -> dict[str, Any]:
        self.requests["get", kind, ""] += 1
        return super().get(kind, name, namespace)

    def create(self, obj: dict[str, Any]) -> dict[str, Any]:
        self.requests["create", str(obj.get("kind")), ""] += 1
        return super().create(obj)

    def patch(self, kind: str, name: str, patch: Any, namespace: str | None = None, patch_type: str = "merge",
              subresource: str | None = None) -> dict[str, Any]:
        self.requests["patch", kind, subresource or ""] += 1
        return super().patch(kind, name, patch, namespace, patch_type, subresource)


def _bring_up(delay: float) -> tuple[Harness, Counter[tuple[str, str, str]]]:
    cluster = CountingCluster()
    h = Harness(TYPES, registration_delay=delay, cluster=cluster, validation_delay=0.0)
    cluster.clock = h.clock   # the objects' timestamps on the harness's virtual clock
    h.add(nodepool("gpu"))
    h.add(pod("train", limits={"nvidia.com/gpu": 1}))
    h.run(12)
    return h, Counter({k: v for k, v in cluster.requests.items() if k[1] in ("NodeClaim", "Node")})


@pytest.mark.parametrize("delay", [0.0, 0.5])
def test_a_nodeclaim_comes_up_in_about_karpenters_writes_and_no_reads(delay: float) -> None:
    h, requests = _bring_up(delay)
    [claim] = h.claims()
    assert all(is_true(claim, c) for c in ("Launched", "Registered", "Initialized", "Ready"))
    [node] = h.nodes()
    assert node["metadata"]["labels"][L.INITIALIZED_LABEL] == "true"
    assert [p["spec"].get("nodeName") for p in h.cluster.list("Pod")] == [node["metadata"]["name"]]
    assert requests == {
        ("create", "NodeClaim", ""): 1,
        ("patch", "NodeClaim", ""): 1,          # the launched instance's labels
        ("patch", "NodeClaim", "status"): 2,    # Launched and Registered (with what blocks Initialized); Initialized
        ("create", "Node", ""): 1,              # the kwok provider's instance
        ("patch", "Node", ""): 3,               # registration (labels, taints, finalizer); the initialized label;
                                                # the reservation taint lifted once the pod it was bought for is bound
        ("patch", "Node", "status"): 1,         # the GPUs, once registered (and Ready, after a delay)
    }
