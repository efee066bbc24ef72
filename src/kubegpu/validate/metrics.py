"""Per-node readiness from the barrier files, for the gauges `kubegpu.metrics.ReadinessCollector` serves (the GPU
Operator's node-status-exporter names), read at each scrape."""

from __future__ import annotations

from pathlib import Path

from prometheus_client.registry import CollectorRegistry

from kubegpu.metrics import NodeReadiness
from kubegpu.metrics import readiness_registry as _registry
from kubegpu.validate.checks import COMPONENTS, barrier_path, read_barrier


def node_readiness(directory: Path) -> NodeReadiness:
    """What the barrier files in `directory` say now."""
    plugin = read_barrier(directory, "plugin") or {}
    driver = read_barrier(directory, "driver") or {}
    return NodeReadiness(
        components=tuple((component, barrier_path(directory, component).exists()) for component in COMPONENTS),
        plugin_devices=float(plugin.get("DEVICE_PLUGIN_DEVICES", "0") or 0),
        pci_devices=float(driver.get("GPU_COUNT", "0") or 0),
    )


def readiness_registry(directory: Path, node: str) -> CollectorRegistry:
    return _registry(node, lambda: node_readiness(directory))
