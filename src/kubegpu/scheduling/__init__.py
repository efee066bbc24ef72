"""kube-scheduler-equivalent fit and score, pure: used by the simulator, the partitioner and the autoscaler.

Typical hot-path use (parse the pod once, then ask many nodes)::

    need = pod_requirements(pod)
    node = select_node(need, infos, "most-allocated")   # or fits(need, info).ok per node
    if node is not None:
        node.add_pod(pod, need.requests)
"""

from __future__ import annotations

from kubegpu.scheduling.fit import (
    REASON_AFFINITY,
    REASON_NODE_NAME,
    REASON_TOO_MANY_PODS,
    REASON_UNSCHEDULABLE,
    UNSCHEDULABLE_TAINT,
    FitResult,
    NodeInfo,
    PodRequirements,
    fits,
    insufficient_resources,
    match_node_selector_terms,
    node_info,
    pod_requirements,
    tolerates,
)
from kubegpu.scheduling.pods import QUOTA_GATE, is_finished, is_scheduling_gated, pod_key
from kubegpu.scheduling.quantity import format_quantity, parse_quantities, parse_quantity
from kubegpu.scheduling.requests import container_requests, pod_requests
from kubegpu.scheduling.score import SCORERS, score_least_allocated, score_most_allocated, select_node

__all__ = [
    "QUOTA_GATE",
    "REASON_AFFINITY",
    "REASON_NODE_NAME",
    "REASON_TOO_MANY_PODS",
    "REASON_UNSCHEDULABLE",
    "SCORERS",
    "UNSCHEDULABLE_TAINT",
    "FitResult",
    "NodeInfo",
    "PodRequirements",
    "container_requests",
    "fits",
    "format_quantity",
    "insufficient_resources",
    "is_finished",
    "is_scheduling_gated",
    "match_node_selector_terms",
    "node_info",
    "parse_quantities",
    "parse_quantity",
    "pod_key",
    "pod_requests",
    "pod_requirements",
    "score_least_allocated",
    "score_most_allocated",
    "select_node",
    "tolerates",
]
