"""kubegpu's own component metrics, under `kubegpu_`, in one place so names never drift between the code, the
Grafana dashboard (`deploy/grafana/kubegpu-dashboard.json`) and the docs.

The autoscaler keeps its own (Karpenter's `karpenter_*` names plus `kubegpu_autoscaler_decisions_total`) in
`kubegpu.autoscaler.metrics`. Each component builds its metrics on a registry it is handed (tests use a fresh one;
processes use the default), and serves them with `serve_metrics`.
"""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import REGISTRY, Counter, Gauge, disable_created_metrics, start_http_server
from prometheus_client.registry import CollectorRegistry

from kubegpu.errors import ConfigError

# DCGM-style output has no `*_created` series, and neither do we.
disable_created_metrics()


@dataclass(frozen=True)
class PartitionerMetrics:
    plans: Counter
    pods_made_schedulable: Counter
    plan_seconds: Gauge

    @classmethod
    def create(cls, registry: CollectorRegistry = REGISTRY) -> PartitionerMetrics:
        return cls(
            plans=Counter(
                "kubegpu_partitioner_plans",
                "Partitioning plans computed, by result (applied, nothing-to-do, failed).",
                ["result"],
                registry=registry,
            ),
            pods_made_schedulable=Counter(
                "kubegpu_partitioner_pods_made_schedulable",
                "Pending pods that a new layout made schedulable.",
                registry=registry,
            ),
            plan_seconds=Gauge(
                "kubegpu_partitioner_last_plan_duration_seconds", "Time the last plan took.", registry=registry
            ),
        )


def serve_metrics(address: str, registry: CollectorRegistry = REGISTRY) -> int:
    """Serve `/metrics` on HOST:PORT from a daemon thread; returns the bound port (PORT 0 picks a free one)."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit() or int(port) > 65535:
        raise ConfigError(f"--metrics-address: expected HOST:PORT such as ':8080', got {address!r}")
    try:
        server, _thread = start_http_server(int(port), addr=host or "0.0.0.0", registry=registry)
    except OSError as exc:
        raise ConfigError(f"--metrics-address: cannot listen on {address}: {exc.strerror or exc}") from None
    return int(server.server_port)
