"""Karpenter's metric names (namespace `karpenter_`), so existing dashboards and alerts keep working.

One `AutoscalerMetrics` per autoscaler, each with its own registry: no process-global state, so tests and the
simulator can run many autoscalers side by side. `kubegpu autoscaler --metrics-port` serves the registry.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

SCHEDULING_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)


class AutoscalerMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry(auto_describe=True)
        r = self.registry
        self.nodeclaims_created = Counter(
            "karpenter_nodeclaims_created_total", "NodeClaims created.", ["reason", "nodepool",
                                                                          "min_values_relaxed"], registry=r)
        self.nodeclaims_terminated = Counter(
            "karpenter_nodeclaims_terminated_total", "NodeClaims terminated.", ["nodepool", "capacity_type", "zone"],
            registry=r)
        self.nodeclaims_disrupted = Counter(
            "karpenter_nodeclaims_disrupted_total", "NodeClaims disrupted.", ["reason", "nodepool", "capacity_type"],
            registry=r)
        self.nodes_created = Counter("karpenter_nodes_created_total", "Nodes created.", ["nodepool", "zone"],
                                     registry=r)
        self.nodes_terminated = Counter("karpenter_nodes_terminated_total", "Nodes terminated.",
                                        ["nodepool", "zone"], registry=r)
        self.scheduling_duration = Histogram(
            "karpenter_scheduler_scheduling_duration_seconds", "Duration of a provisioning scheduling pass.",
            ["controller"], buckets=SCHEDULING_BUCKETS, registry=r)
        self.unschedulable_pods = Gauge("karpenter_scheduler_unschedulable_pods_count",
                                        "Pods the last pass could not place.", ["controller"], registry=r)
        self.allowed_disruptions = Gauge("karpenter_nodepools_allowed_disruptions",
                                         "Nodes a NodePool may disrupt now, per reason.", ["nodepool", "reason"],
                                         registry=r)
        # kubegpu's own view, shared with the Grafana dashboard: one counter for every decision the autoscaler takes
        self.decisions = Counter("kubegpu_autoscaler_decisions",
                                 "Autoscaler decisions, by kind (launch, or the disruption reason: empty, "
                                 "underutilized, drifted, expired).", ["decision"], registry=r)
