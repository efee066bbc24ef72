"""Where a feasible pod should go: kube-scheduler's LeastAllocated and MostAllocated scores.

Both score each resource 0..100 from what the node would have requested after placing the pod, and average them
with equal weights over cpu, memory and every extended resource the pod requests (``nvidia.com/gpu``,
``nvidia.com/mig-3g.40gb``, ...), so GPU pods spread (least) or pack (most) by their GPUs too.
Differences from kube-scheduler, on purpose: scores are floats rather than truncated integers (finer tie-breaks),
pods that request no cpu/memory count as zero (kube-scheduler substitutes 100m/200Mi), and ties go to the first
node in the order given (kube-scheduler picks at random) so simulations are reproducible.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from kubegpu.errors import ConfigError
from kubegpu.scheduling.fit import NodeInfo, PodRequirements, fits, pod_requirements

_NOT_SCORED = frozenset({"pods", "cpu", "memory", "ephemeral-storage"})
MAX_SCORE = 100.0


def score_least_allocated(pod: Mapping[str, Any] | PodRequirements, info: NodeInfo) -> float:
    """0..100: higher when more of the node stays free after placing the pod (spreads load)."""
    return _average(pod, info, _least)


def score_most_allocated(pod: Mapping[str, Any] | PodRequirements, info: NodeInfo) -> float:
    """0..100: higher when the node ends up fuller (packs pods, leaving whole nodes or GPUs free)."""
    return _average(pod, info, _most)


SCORERS: dict[str, Callable[[Mapping[str, Any] | PodRequirements, NodeInfo], float]] = {
    "least-allocated": score_least_allocated,
    "most-allocated": score_most_allocated,
}


def select_node(
    pod: Mapping[str, Any] | PodRequirements, infos: Iterable[NodeInfo], policy: str = "least-allocated"
) -> NodeInfo | None:
    """The best-scoring node the pod fits on (first one on ties), or None when it fits nowhere."""
    scorer = SCORERS.get(policy)
    if scorer is None:
        raise ConfigError(f"scoring policy {policy!r} is not one of {', '.join(sorted(SCORERS))}")
    need = pod if isinstance(pod, PodRequirements) else pod_requirements(pod)
    best: NodeInfo | None = None
    best_score = -1.0
    for info in infos:
        if not fits(need, info).ok:
            continue
        score = scorer(need, info)
        if score > best_score:
            best, best_score = info, score
    return best


def _average(
    pod: Mapping[str, Any] | PodRequirements, info: NodeInfo, per_resource: Callable[[float, float], float]
) -> float:
    requests = pod.requests if isinstance(pod, PodRequirements) else pod_requirements(pod).requests
    total = 0.0
    count = 0
    for name in _scored_resources(requests):
        requested = info.requested.get(name, 0.0) + requests.get(name, 0.0)
        total += per_resource(requested, info.allocatable.get(name, 0.0))
        count += 1
    return total / count


def _scored_resources(requests: Mapping[str, float]) -> list[str]:
    names = ["cpu", "memory"]
    names.extend(name for name, amount in requests.items() if name not in _NOT_SCORED and amount > 0)
    return names


def _least(requested: float, capacity: float) -> float:
    if capacity <= 0 or requested > capacity:
        return 0.0
    return (capacity - requested) * MAX_SCORE / capacity


def _most(requested: float, capacity: float) -> float:
    if capacity <= 0:
        return 0.0
    return min(requested, capacity) * MAX_SCORE / capacity
