"""Component metrics: served under kubegpu_ names, and a bad address is one line, not a traceback."""

from __future__ import annotations

import urllib.request

import pytest
from prometheus_client import CollectorRegistry

from kubegpu.errors import ConfigError
from kubegpu.metrics import PartitionerMetrics, serve_metrics


def test_component_metrics_are_served_without_created_series() -> None:
    registry = CollectorRegistry()
    partitioner = PartitionerMetrics.create(registry)
    partitioner.plans.labels(result="applied").inc(2)
    port = serve_metrics("127.0.0.1:0", registry)
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics").read().decode()
    assert 'kubegpu_partitioner_plans_total{result="applied"} 2.0' in body
    assert "_created" not in body


@pytest.mark.parametrize("address", ["nonsense", "host:port", ":70000"])
def test_bad_metrics_address_is_one_line(address: str) -> None:
    with pytest.raises(ConfigError, match=r"^--metrics-address: expected HOST:PORT"):
        serve_metrics(address, CollectorRegistry())
