"""Device health as a Prometheus gauge, read at scrape time from the running plugin.

`kubegpu_device_plugin_device_healthy{resource,device}` is 1 for Healthy, 0 for Unhealthy. The exporter can add
`DeviceHealthCollector` to its own registry; `health_registry` makes a stand-alone one for `--metrics-address`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

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
    registry = CollectorRegistry(auto_describe=False)
    registry.register(DeviceHealthCollector(source))
    return registry
