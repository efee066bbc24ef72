"""The exporter process: a collection loop and an HTTP server for `/metrics`, `/health` and `/`."""

from __future__ import annotations

import gzip
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from aiohttp import web
from prometheus_client import Gauge, disable_created_metrics
from prometheus_client.exposition import choose_encoder
from prometheus_client.registry import CollectorRegistry

from kubegpu.endpoints import Endpoint, Handler
from kubegpu.endpoints import serve as serve_endpoints
from kubegpu.exporter.collector import SnapshotCollector, build_families, read_node
from kubegpu.exporter.counters import CounterSet
from kubegpu.exporter.exposition import render_text
from kubegpu.gpu.backend import GpuBackend
from kubegpu.sharing.attribution import PodResourcesClient, attribute

log = logging.getLogger(__name__)


@dataclass
class ExporterMetrics:
    """The exporter's own health, under `kubegpu_exporter_`."""

    registry: CollectorRegistry
    collect_seconds: Gauge = field(init=False)
    last_collect: Gauge = field(init=False)
    attributed_pods: Gauge = field(init=False)

    def __post_init__(self) -> None:
        self.collect_seconds = Gauge(
            "kubegpu_exporter_collect_duration_seconds", "Time the last collection took.", registry=self.registry
        )
        self.last_collect = Gauge(
            "kubegpu_exporter_last_collect_timestamp_seconds",
            "When the last successful collection finished.",
            registry=self.registry,
        )
        self.attributed_pods = Gauge(
            "kubegpu_exporter_attributed_pods",
            "Pods holding a GPU or MIG instance on this node.",
            registry=self.registry,
        )


class Exporter:
    """Collects on its own interval; scrapes read the last snapshot."""

    def __init__(
        self,
        backend: GpuBackend,
        counters: CounterSet,
        hostname: str | None,
        pod_resources: PodResourcesClient | None,
        interval_s: float,
        registry: CollectorRegistry | None = None,
    ) -> None:
        self.backend = backend
        self.counters = counters
        self.hostname = hostname
        self.pod_resources = pod_resources
        self.interval_s = interval_s
        disable_created_metrics()  # dcgm-exporter's output has no `*_created` series
        self.registry = registry or CollectorRegistry(auto_describe=False)
        self.snapshot = SnapshotCollector()
        self.registry.register(self.snapshot)
        self.metrics = ExporterMetrics(self.registry)
        self.last_success: float | None = None
        self.generation = 0
        self._stop = threading.Event()

    def collect_once(self) -> None:
        started = time.monotonic()
        reading = read_node(self.backend)
        holders = self.pod_resources.list() if self.pod_resources is not None else None
        holders_map = None
        if holders is not None:
            gpus = [entity.device for entity in reading.entities if entity.mig is None]
            migs = [entity.mig for entity in reading.entities if entity.mig is not None]
            holders_map = attribute(holders, gpus, migs)
            self.metrics.attributed_pods.set(len({pod for pods in holders_map.values() for pod in pods}))
        self.snapshot.update(build_families(reading, self.counters, holders_map, self.hostname))
        self.last_success = time.time()
        self.metrics.collect_seconds.set(time.monotonic() - started)
        self.metrics.last_collect.set(self.last_success)
        self.generation += 1  # last, so the cached rendering is replaced only once every value is in

    def healthy(self) -> bool:
        return self.last_success is not None and time.time() - self.last_success < max(3 * self.interval_s, 10.0)

    def run(self) -> None:
        """Collect until `stop()`; a failed collection is logged and retried, never fatal."""
        while not self._stop.is_set():
            try:
                self.collect_once()
            except Exception as exc:  # one bad read must not stop the exporter
                log.warning("collection failed: %s", exc)
            self._stop.wait(self.interval_s)

    def stop(self) -> None:
        self._stop.set()


INDEX_PAGE = b"""<html><head><title>kubegpu exporter</title></head>
<body><h1>kubegpu exporter</h1><p><a href="/metrics">Metrics</a> &middot; <a href="/health">Health</a></p></body></html>
"""


def accepts_gzip(values: list[str]) -> bool:
    """Whether Accept-Encoding allows gzip: `gzip` or `*` listed without `q=0`."""
    for part in ",".join(values).split(","):
        coding, *params = (item.strip().lower() for item in part.split(";"))
        if coding in ("gzip", "*"):
            weights = [p.removeprefix("q=") for p in params if p.startswith("q=")]
            try:
                return not weights or float(weights[0]) > 0
            except ValueError:
                return False
    return False


def make_routes(exporter: Exporter) -> dict[str, Handler]:
    """`/metrics`, `/health` and `/`, as dcgm-exporter serves them."""
    rendered: dict[tuple[str, bool], tuple[int, bytes]] = {}

    def render(encoder: Callable[[CollectorRegistry], bytes], content_type: str, gzipped: bool) -> bytes:
        """Everything in the registry changes only when a collection finishes, so each format (and its gzip, which
        Prometheus asks for) is rendered once per collection and every scrape in between is served the same bytes."""
        generation = exporter.generation
        cached = rendered.get((content_type, gzipped))
        if cached is None or cached[0] != generation:
            if gzipped:
                body = gzip.compress(render(encoder, content_type, False), compresslevel=6, mtime=0)
            elif content_type.startswith("text/plain"):
                body = render_text(exporter.registry.collect())  # dcgm-exporter's label order and counter names
            else:
                body = encoder(exporter.registry)
            cached = rendered[(content_type, gzipped)] = (generation, body)
        return cached[1]

    async def metrics(request: web.BaseRequest) -> web.StreamResponse:
        encoder, content_type = choose_encoder(",".join(request.headers.getall("Accept", [])))
        gzipped = accepts_gzip(request.headers.getall("Accept-Encoding", []))
        headers = {"Content-Type": content_type, **({"Content-Encoding": "gzip"} if gzipped else {})}
        return web.Response(body=render(encoder, content_type, gzipped), headers=headers)

    async def health(request: web.BaseRequest) -> web.StreamResponse:
        if exporter.healthy():
            return web.Response(text="OK\n")
        return web.Response(status=503, text="no successful collection yet\n")

    async def index(request: web.BaseRequest) -> web.StreamResponse:
        return web.Response(body=INDEX_PAGE, content_type="text/html")

    return {"/metrics": metrics, "/health": health, "/": index}


def serve(exporter: Exporter, host: str, port: int) -> Endpoint:
    """Listen (port 0 picks a free one) and serve from a daemon thread; raises OSError when it cannot bind.

    kubegpu.endpoints keeps Prometheus served whatever other clients do: every connection on one event loop,
    header-read and idle timeouts, header size limits, a cap on open connections, GET/HEAD only.
    """
    return serve_endpoints(make_routes(exporter), host, port, name="exporter-http")
