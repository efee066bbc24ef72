"""Every component metric kubegpu defines (the exporter's DCGM fields aside), and the one way to serve them.

In one place so names never drift between the code, the Grafana dashboard (`deploy/grafana/kubegpu-dashboard.json`)
and the docs: the partitioner's `kubegpu_partitioner_*`, the autoscaler's Karpenter names (`karpenter_*`, so existing
dashboards and alerts keep working) plus `kubegpu_autoscaler_decisions_total`, the device plugin's
`kubegpu_device_plugin_device_healthy`, and the operator's and validator's GPU Operator names (`gpu_operator_*`).
Each component builds its metrics on a registry it is handed (tests and the simulator use a fresh one, so many
instances run side by side; processes use the default) and serves it with `serve_metrics` behind the one
`--metrics-address` flag.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import cast

from aiohttp import web
from prometheus_client import REGISTRY, Counter, Gauge, Histogram, disable_created_metrics
from prometheus_client.aiohttp import make_aiohttp_handler
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector, CollectorRegistry

from kubegpu.endpoints import Handler, parse_listen_address, serve
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


# ---------------------------------------------------------------------------------------------- autoscaler

SCHEDULING_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)


class AutoscalerMetrics:
    """Karpenter's metric names, one registry per autoscaler: no process-global state."""

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


# ---------------------------------------------------------------------------------------------- device plugin

HEALTH_METRIC = "kubegpu_device_plugin_device_healthy"

HealthSource = Callable[[], Iterable[tuple[str, str, bool]]]


class DeviceHealthCollector(Collector):
    """Collects `(resource, device id, healthy)` triples from `source` on every scrape."""

    def __init__(self, source: HealthSource) -> None:
        self.source = source

    def collect(self) -> Iterator[Metric]:
        gauge = GaugeMetricFamily(
            HEALTH_METRIC,
            "1 if the device plugin advertises the device as Healthy, else 0",
            labels=["resource", "device"],
        )
        for resource, device, healthy in self.source():
            gauge.add_metric([resource, device], 1.0 if healthy else 0.0)
        yield gauge


def health_registry(source: HealthSource) -> CollectorRegistry:
    """A stand-alone registry for the device plugin's `--metrics-address` (the exporter can add the collector)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(DeviceHealthCollector(source))
    return registry


# ---------------------------------------------------------------------------------------------- operator


@dataclass(frozen=True)
class OperatorMetrics:
    """The GPU Operator's names (`gpu_operator_*`), so its dashboards and alerts keep working."""

    reconciliation_status: Gauge
    reconciliation_total: Counter
    reconciliation_failed_total: Counter
    last_success: Gauge
    has_nfd_labels: Gauge
    gpu_nodes: Gauge
    upgrades: Gauge

    @classmethod
    def create(cls, registry: CollectorRegistry) -> OperatorMetrics:
        return cls(
            reconciliation_status=Gauge("gpu_operator_reconciliation_status",
                                        "1 when the last reconciliation left the ClusterPolicy ready, 0 when "
                                        "not ready, -1 when it failed", registry=registry),
            reconciliation_total=Counter("gpu_operator_reconciliation", "Reconciliations run",
                                         registry=registry),
            reconciliation_failed_total=Counter("gpu_operator_reconciliation_failed", "Reconciliations that failed",
                                                registry=registry),
            last_success=Gauge("gpu_operator_reconciliation_last_success_ts_seconds",
                               "When the ClusterPolicy was last reconciled to ready", registry=registry),
            has_nfd_labels=Gauge("gpu_operator_reconciliation_has_nfd_labels",
                                 "1 when some node carries NFD's pci-10de label", registry=registry),
            gpu_nodes=Gauge("gpu_operator_gpu_nodes_total", "GPU nodes in the cluster", registry=registry),
            upgrades=Gauge("gpu_operator_nodes_upgrades", "GPU nodes by driver-upgrade phase "
                           "(in_progress, done, failed, pending)", ["phase"], registry=registry),
        )


# ---------------------------------------------------------------------------------------------- validator


@dataclass(frozen=True)
class NodeReadiness:
    """What the validator's barrier files say about one node: each component's validation, and two counts."""

    components: tuple[tuple[str, bool], ...]  # (component, validated) in the validator's order
    plugin_devices: float
    pci_devices: float


class ReadinessCollector(Collector):
    """The GPU Operator's node-status-exporter gauges, read at each scrape from `source` (the barrier files), so they
    can never disagree with what the operands' init containers see."""

    def __init__(self, node: str, source: Callable[[], NodeReadiness]) -> None:
        self.node = node
        self.source = source

    def collect(self) -> Iterator[Metric]:
        reading = self.source()
        for component, ready in reading.components:
            gauge = GaugeMetricFamily(f"gpu_operator_node_{component}_ready",
                                      f"1 when this node's {component} validation passed (its barrier file exists)",
                                      labels=["node"])
            gauge.add_metric([self.node], 1.0 if ready else 0.0)
            yield gauge
        devices = GaugeMetricFamily("gpu_operator_node_device_plugin_devices_total",
                                    "GPU devices the device plugin advertised when it was validated", labels=["node"])
        devices.add_metric([self.node], reading.plugin_devices)
        yield devices
        count = GaugeMetricFamily("gpu_operator_nvidia_pci_devices_total",
                                  "GPUs the driver reported when it was validated", labels=["node"])
        count.add_metric([self.node], reading.pci_devices)
        yield count


def readiness_registry(node: str, source: Callable[[], NodeReadiness]) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(ReadinessCollector(node, source))
    return registry


# ---------------------------------------------------------------------------------------------- gpu-guard


@dataclass(frozen=True)
class GuardReading:
    """One guard round, as its gauges show it: (namespace, pod, gpu, gpu_instance, share bytes, used bytes) per pod
    and shared GPU; (gpu, gpu_instance, processes, bytes) unattributed; (namespace, pod, gpu, pid) MPS clients without
    their limit."""

    pods: tuple[tuple[str, str, str, str, float, float], ...] = ()
    unattributed: tuple[tuple[str, str, float, float], ...] = ()
    mps_limit_missing: tuple[tuple[str, str, str, str], ...] = ()


class GuardMetrics:
    """The GPU-memory guard's view (`kubegpu_gpu_guard_*`): each pod's share and use on each shared GPU, what it did
    and why, what it could not attribute, and MPS clients running without their limit. The per-pod gauges are built
    from the last round's reading at scrape time (a pod that left has no series, and a round on a node of 500 pods
    does not pay for 1,000 label lookups)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry(auto_describe=True)
        r = self.registry
        self.actions = Counter("kubegpu_gpu_guard_actions",
                               "Guard actions taken, by kind (evict, kill-process, warn) and reason (over-share, "
                               "reserve-exhausted, pdb-protected).", ["action", "reason"], registry=r)
        self.rounds = Counter("kubegpu_gpu_guard_rounds", "Sampling rounds, by result (ok, failed).", ["result"],
                              registry=r)
        self.reading = GuardReading()
        r.register(_GuardReadingCollector(self))

    def set_reading(self, reading: GuardReading) -> None:
        self.reading = reading  # one reference swap: a scrape sees one whole round


class _GuardReadingCollector(Collector):
    def __init__(self, metrics: GuardMetrics) -> None:
        self.metrics = metrics

    def collect(self) -> Iterator[Metric]:
        reading = self.metrics.reading
        pod_labels = ["namespace", "pod", "gpu", "gpu_instance"]
        share = GaugeMetricFamily("kubegpu_gpu_guard_pod_share_bytes",
                                  "GPU memory a pod may use on a shared GPU: its sharing config's share, or its "
                                  "kubegpu.io/gpu-memory-limit annotation where smaller.", labels=pod_labels)
        used = GaugeMetricFamily("kubegpu_gpu_guard_pod_used_bytes", "GPU memory the pod's processes hold on that GPU.",
                                 labels=pod_labels)
        for namespace, pod, gpu, instance, share_bytes, used_bytes in reading.pods:
            share.add_metric([namespace, pod, gpu, instance], share_bytes)
            used.add_metric([namespace, pod, gpu, instance], used_bytes)
        processes = GaugeMetricFamily("kubegpu_gpu_guard_unattributed_processes",
                                      "GPU processes no pod holding the GPU could be found for (never acted on).",
                                      labels=["gpu", "gpu_instance"])
        held = GaugeMetricFamily("kubegpu_gpu_guard_unattributed_bytes", "GPU memory those processes hold.",
                                 labels=["gpu", "gpu_instance"])
        for gpu, instance, count, count_bytes in reading.unattributed:
            processes.add_metric([gpu, instance], count)
            held.add_metric([gpu, instance], count_bytes)
        missing = GaugeMetricFamily("kubegpu_gpu_guard_mps_limit_missing",
                                    "1 for an MPS client process running without the pinned-memory limit its pod's "
                                    "slice should give it (a misconfiguration, not a leak).",
                                    labels=["namespace", "pod", "gpu", "pid"])
        for labels in reading.mps_limit_missing:
            missing.add_metric(list(labels), 1.0)
        yield from (share, used, processes, held, missing)


# ---------------------------------------------------------------------------------------------- informers

INFORMER_SYNCED = "kubegpu_informer_synced"


class InformerCollector(Collector):
    """`kubegpu_informer_synced{component,kind}`: 1 while a controller's cache of a kind is synced and its watch
    healthy, 0 before the first list and while the watch has been broken longer than the informer's bound (the
    controller skips its passes meanwhile). Read from `source` on every scrape."""

    def __init__(self, component: str, source: Callable[[], Iterable[tuple[str, bool]]]) -> None:
        self.component, self.source = component, source

    def collect(self) -> Iterator[Metric]:
        gauge = GaugeMetricFamily(INFORMER_SYNCED, "1 while the controller's cache of the kind is synced and its "
                                  "watch healthy; 0 while stale (the controller does not act on it)",
                                  labels=["component", "kind"])
        for kind, usable in self.source():
            gauge.add_metric([self.component, kind], 1.0 if usable else 0.0)
        yield gauge


# ---------------------------------------------------------------------------------------------- serving

def serve_metrics(address: str, registry: CollectorRegistry = REGISTRY, flag: str = "--metrics-address",
                  ready: Callable[[], bool] | None = None) -> int:
    """Serve `/metrics` on HOST:PORT from a daemon thread; returns the bound port (PORT 0 picks a free one).
    With `ready`, `/readyz` answers 200 while it is true and 503 while not (a controller whose cache is stale), for
    a readinessProbe.

    `:PORT` listens on every interface, as NVIDIA's `:9400` does, so Prometheus can scrape the pod IP. The server
    is kubegpu.endpoints' bounded one (timeouts, header limits, a connection cap, GET/HEAD only); prometheus_client's
    own aiohttp handler renders (content negotiation, `name[]` filtering, gzip when asked), on every path as its
    WSGI app did.
    """
    host, port = parse_listen_address(address, flag)
    # typed for web.Request, uses only what the low-level server's BaseRequest has (query, headers)
    handler = cast(Handler, make_aiohttp_handler(registry))
    routes: dict[str, Handler] = {"/metrics": handler}
    if ready is not None:
        check = ready

        async def readyz(_request: web.BaseRequest) -> web.StreamResponse:
            ok = check()
            return web.Response(status=200 if ok else 503, text="ok\n" if ok else "stale: not acting\n")

        routes["/readyz"] = readyz
    try:
        endpoint = serve(routes, host, port, name="metrics-http", default=handler)
    except OSError as exc:
        raise ConfigError(f"{flag}: cannot listen on {address}: {exc.strerror or exc}") from None
    return endpoint.port
