"""The shipped Grafana dashboard: dcgm-exporter's eight panels, and every metric it queries is one kubegpu emits."""

from __future__ import annotations

import json
import re
from pathlib import Path

from prometheus_client import CollectorRegistry

from kubegpu.exporter.counters import load_counters
from kubegpu.metrics import AutoscalerMetrics, GuardMetrics, GuardReading, PartitionerMetrics, health_registry

DASHBOARD = Path(__file__).resolve().parents[2] / "deploy" / "grafana" / "kubegpu-dashboard.json"

DCGM_PANELS = {
    "GPU Temperature": "DCGM_FI_DEV_GPU_TEMP",
    "GPU Avg. Temp": "DCGM_FI_DEV_GPU_TEMP",
    "GPU Power Usage": "DCGM_FI_DEV_POWER_USAGE",
    "GPU Power Total": "DCGM_FI_DEV_POWER_USAGE",
    "GPU SM Clocks": "DCGM_FI_DEV_SM_CLOCK",
    "GPU Utilization": "DCGM_FI_DEV_GPU_UTIL",
    "GPU Framebuffer Mem Used": "DCGM_FI_DEV_FB_USED",
    "Tensor Core Utilization": "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
}


def panel_exprs() -> dict[str, list[str]]:
    panels = json.loads(DASHBOARD.read_text())["panels"]
    return {p["title"]: [t["expr"] for t in p.get("targets", [])] for p in panels}


def emitted_names() -> set[str]:
    """Series names the exporter's default counters and the components' own metrics produce."""
    names = {c.field for c in load_counters(None).series}
    partitioner_registry = CollectorRegistry()
    partitioner = PartitionerMetrics.create(partitioner_registry)
    partitioner.plans.labels(result="applied").inc()
    autoscaler = AutoscalerMetrics(CollectorRegistry())
    autoscaler.decisions.labels(decision="launch").inc()
    guard = GuardMetrics()
    guard.actions.labels(action="evict", reason="over-share").inc()
    guard.set_reading(GuardReading(pods=(("ml", "a", "0", "", 1.0, 1.0),), unattributed=(("0", "", 1.0, 1.0),)))
    for registry in (partitioner_registry, autoscaler.registry, guard.registry,
                     health_registry(lambda: [("r", "d", False)])):
        names |= {s.name for family in registry.collect() for s in family.samples}
    return names


def test_dashboard_has_dcgm_exporters_eight_panels_plus_sharing_and_partitioning() -> None:
    exprs = panel_exprs()
    for title, metric in DCGM_PANELS.items():
        assert any(metric in expr for expr in exprs[title]), title
    assert "Pods sharing each GPU" in exprs and "MIG instances by profile" in exprs
    assert "Partitioner plans" in exprs and "Autoscaler decisions" in exprs
    assert "GPU memory guard actions" in exprs


def test_every_metric_the_dashboard_queries_is_emitted() -> None:
    emitted = emitted_names()
    queried = {
        name
        for exprs in panel_exprs().values()
        for expr in exprs
        for name in re.findall(r"\b(?:DCGM_FI_\w+|kubegpu_\w+)", expr)
    }
    assert queried and queried <= emitted, sorted(queried - emitted)
