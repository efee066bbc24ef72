"""What one reconciliation pass means for the operator's metrics (defined, with every other metric, in
`kubegpu.metrics`): ready/notReady/failed, GPU nodes, and nodes per driver-upgrade phase."""

from __future__ import annotations

from kubegpu.metrics import OperatorMetrics
from kubegpu.operator import upgrade
from kubegpu.operator.passes import PassResult


def observe_pass(metrics: OperatorMetrics, result: PassResult, now: float) -> None:
    """Feed one reconciliation pass into the operator's metrics (`kubegpu.metrics.OperatorMetrics`)."""
    status = result.status
    if status.state == "ignored":
        return  # an ignored policy says nothing about the cluster
    metrics.reconciliation_total.inc()
    if status.reason == "ReconcileFailed":
        metrics.reconciliation_failed_total.inc()
        metrics.reconciliation_status.set(-1)
    else:
        metrics.reconciliation_status.set(1 if status.state == "ready" else 0)
    if status.state == "ready":
        metrics.last_success.set(now)
    metrics.gpu_nodes.set(result.gpu_nodes)
    metrics.has_nfd_labels.set(1 if result.nfd_labelled else 0)
    phases = {"in_progress": 0, "done": 0, "failed": 0, "pending": 0}
    for state in result.upgrade_states:
        if state in upgrade.IN_PROGRESS:
            phases["in_progress"] += 1
        elif state == upgrade.DONE:
            phases["done"] += 1
        elif state == upgrade.FAILED:
            phases["failed"] += 1
        elif state == upgrade.REQUIRED:
            phases["pending"] += 1
    for phase, count in phases.items():
        metrics.upgrades.labels(phase).set(count)
