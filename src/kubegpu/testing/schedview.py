"""What the real kube-scheduler has seen: its cache's pod count, read from its own `/metrics`.

A pod bound by `spec.nodeName` reaches kube-scheduler's cache through its pod informer some time after the API
server stored it. A test that then asks the scheduler to place a pod *beside* it (scoring by what a node already
runs) depends on that, and the API server cannot tell it: only the scheduler's `scheduler_cache_size{type="pods"}`
gauge can (refreshed by the cache every second). `wait_scheduler_sees_bound_pods` waits, bounded, until the cache
holds at least every pod the API server shows bound and not finished — the condition such a test depends on.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from kubegpu.testing.drareal import scheduler_metrics

if TYPE_CHECKING:
    from kubegpu.kube.lightkube_cluster import LightkubeCluster
    from kubegpu.testing.controlplane import ControlPlane

CACHE_PODS = re.compile(r'^scheduler_cache_size\{[^}]*type="pods"[^}]*\}\s+([0-9.eE+-]+)\s*$', re.MULTILINE)
FINISHED = ("Succeeded", "Failed")


def scheduler_cache_pods(plane: ControlPlane) -> int | None:
    """The pods kube-scheduler's cache holds (bound or assumed), or None while the gauge is not published yet."""
    found = CACHE_PODS.search(scheduler_metrics(plane.directory, plane.ports["kube-scheduler"]))
    return int(float(found.group(1))) if found else None


def bound_pods(cluster: LightkubeCluster) -> int:
    """Pods the API server shows bound to a node and not finished: what the scheduler's cache must hold."""
    return sum(1 for pod in cluster.list("Pod") if _holds_node(pod))


def _holds_node(pod: dict[str, Any]) -> bool:
    bound = bool((pod.get("spec") or {}).get("nodeName"))
    return bound and (pod.get("status") or {}).get("phase") not in FINISHED


def wait_scheduler_sees_bound_pods(plane: ControlPlane, cluster: LightkubeCluster, timeout: float = 30.0) -> None:
    """Wait until kube-scheduler's cache holds every bound pod the API server has (WaitTimeout if it never does)."""
    from kubegpu.testing.session import wait_for

    def caught_up() -> bool:
        have = scheduler_cache_pods(plane)
        return have is not None and have >= bound_pods(cluster)

    wait_for(caught_up, "kube-scheduler's cache to hold every bound pod", timeout, interval=0.2)
