"""`kubegpu operator cleanup`: what `helm uninstall` runs first (the chart's pre-delete hook), so an uninstall leaves
no kubegpu object or node state behind — the GPU Operator's most reported leftover is its node labels.

Order matters: the ClusterPolicies go first, so the operator stops labelling and garbage collection removes every
operand; once their pods are gone (each removes its node state as it stops: the validator its barrier files, the
device plugin its sockets, the MPS daemon its record) the labels the stack wrote are taken off every Node, with
feature discovery's `AcceleratedHardwareReady` condition. Labels
that belong to the user stay: `nvidia.com/device-plugin.config`, `nvidia.com/mig.config`,
`nvidia.com/gpu.deploy.operands`. `cleanup_patch` is pure; `cleanup` is the adapter over the Cluster interface.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kubegpu.discovery.health import CONDITION_TYPE as HARDWARE_CONDITION
from kubegpu.discovery.labels import is_owned_label
from kubegpu.kube.cluster import Cluster
from kubegpu.operator import mighandoff, upgrade
from kubegpu.operator.components import DEPLOY_LABEL_PREFIX, OPERANDS
from kubegpu.operator.nodelabels import GPU_PRESENT
from kubegpu.operator.render import MANAGED_BY_LABEL, MANAGER

OURS_ANNOTATIONS = (upgrade.SINCE_ANNOTATION, upgrade.CORDONED_ANNOTATION, mighandoff.SINCE_ANNOTATION)
STACK_LABELS = (GPU_PRESENT, upgrade.STATE_LABEL, mighandoff.STATE_LABEL)


def cleanup_patch(labels: dict[str, str], annotations: dict[str, str]) -> tuple[dict[str, None], dict[str, None]]:
    """(labels, annotations) to remove from one Node: the operator's deploy labels, `gpu.present`, the upgrade and
    MIG-change states, and every label feature discovery owns."""
    deploy = {op.deploy_label for op in OPERANDS if op.kind == "DaemonSet"}
    remove = [key for key in labels
              if key in deploy or key in STACK_LABELS or is_owned_label(key)]
    assert DEPLOY_LABEL_PREFIX + "operands" not in remove  # the user's switch for the whole stack stays
    return {key: None for key in sorted(remove)}, {key: None for key in OURS_ANNOTATIONS if key in annotations}


@dataclass
class CleanupResult:
    policies: list[str] = field(default_factory=list)
    nodes: dict[str, list[str]] = field(default_factory=dict)  # node → labels and annotations removed
    waited_s: float = 0.0


def cleanup(cluster: Cluster, namespace: str, timeout: float = 120.0,
            sleep: Callable[[float], None] = time.sleep, now: Callable[[], float] = time.monotonic) -> CleanupResult:
    """Delete every ClusterPolicy, wait for the operands' pods in `namespace` to stop, then clean every Node."""
    result = CleanupResult()
    for policy in cluster.list("ClusterPolicy"):
        name = policy["metadata"]["name"]
        cluster.delete("ClusterPolicy", name)
        result.policies.append(name)
    started = now()
    selector = f"{MANAGED_BY_LABEL}={MANAGER}"
    while cluster.list("Pod", namespace, label_selector=selector) and now() - started < timeout:
        sleep(1.0)
    result.waited_s = now() - started
    for node in cluster.list("Node"):
        meta: dict[str, Any] = node.get("metadata") or {}
        labels, annotations = cleanup_patch(dict(meta.get("labels") or {}), dict(meta.get("annotations") or {}))
        removed = [*labels, *annotations]
        if labels or annotations:
            cluster.patch("Node", meta["name"], {"metadata": {"labels": labels, "annotations": annotations}})
        conditions = (node.get("status") or {}).get("conditions") or []
        for index in reversed([i for i, c in enumerate(conditions) if c.get("type") == HARDWARE_CONDITION]):
            cluster.patch("Node", meta["name"], [  # the test guards against a list that changed meanwhile
                {"op": "test", "path": f"/status/conditions/{index}/type", "value": HARDWARE_CONDITION},
                {"op": "remove", "path": f"/status/conditions/{index}"}], patch_type="json", subresource="status")
            removed.append(f"condition {HARDWARE_CONDITION}")
        if removed:
            result.nodes[meta["name"]] = removed
    return result
