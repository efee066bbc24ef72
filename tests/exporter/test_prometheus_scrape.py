"""A real Prometheus server (Debian's `prometheus`) scrapes the exporter and answers PromQL for both pods that share
one time-sliced GPU."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from kubegpu.exporter.attribution import PodResourcesClient
from kubegpu.exporter.counters import load_counters
from kubegpu.exporter.server import Exporter, serve
from kubegpu.gpu.simulated import SimulatedBackend
from tests.fakes.fake_podresources import FakePodResources


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PrometheusServer:
    """Debian's Prometheus, scraping one target every second, on a free loopback port."""

    def __init__(self, workdir: Path) -> None:
        binary = shutil.which("prometheus")
        assert binary, "the Debian package `prometheus` must be installed (scripts/test.sh installs it)"
        self.binary = binary
        self.workdir = workdir
        self.port = free_port()
        self.process: subprocess.Popen[bytes] | None = None

    def start(self, target_port: int) -> None:
        config = self.workdir / "prometheus.yml"
        config.write_text(
            "global:\n  scrape_interval: 1s\n  scrape_timeout: 900ms\n"
            "scrape_configs:\n  - job_name: kubegpu\n"
            f"    static_configs:\n      - targets: ['127.0.0.1:{target_port}']\n"
        )
        self.process = subprocess.Popen(
            [self.binary, f"--config.file={config}", f"--storage.tsdb.path={self.workdir / 'data'}",
             f"--web.listen-address=127.0.0.1:{self.port}"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )

    def stop(self) -> None:
        if self.process is not None:
            self.process.terminate()
            self.process.wait(timeout=10)


@pytest.fixture
def prometheus(tmp_path: Path) -> Iterator[PrometheusServer]:
    server = PrometheusServer(tmp_path)
    yield server
    server.stop()


def query(port: int, promql: str) -> list[dict]:
    url = f"http://127.0.0.1:{port}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return list(json.load(response)["data"]["result"])
    except OSError:
        return []


def test_prometheus_sees_one_series_per_pod_on_a_time_sliced_gpu(tmp_path: Path, prometheus: PrometheusServer) -> None:
    node = SimulatedBackend.create(tmp_path / "node.json", gpus="1xH100-SXM5-80GB")
    node.set_load(0, 70.0, 30000)
    uuid = node.devices()[0].uuid
    sock = tmp_path / "pod-resources.sock"
    pods = [("ml", "serve-a", "server", "nvidia.com/gpu.shared", [f"{uuid}::0"]),
            ("ml", "serve-b", "server", "nvidia.com/gpu.shared", [f"{uuid}::1"])]
    with FakePodResources(sock, pods):
        exporter = Exporter(node, load_counters(None), "node-a", PodResourcesClient(sock), 0.5)
        server = serve(exporter, "127.0.0.1", 0)
        worker = threading.Thread(target=exporter.run, daemon=True)
        worker.start()
        try:
            prometheus.start(server.server_port)
            promql = 'DCGM_FI_DEV_GPU_UTIL{job="kubegpu", namespace="ml"}'
            deadline = time.monotonic() + 40
            result: list[dict] = []
            while time.monotonic() < deadline and len(result) < 2:
                time.sleep(0.5)
                result = query(prometheus.port, promql)
        finally:
            exporter.stop()
            worker.join(timeout=5)
            server.shutdown()
            server.server_close()
    assert sorted(r["metric"]["pod"] for r in result) == ["serve-a", "serve-b"]
    assert {r["metric"]["vgpu"] for r in result} == {"0", "1"}
    assert {r["metric"]["UUID"] for r in result} == {uuid}
    assert all(float(r["value"][1]) == pytest.approx(70.0) for r in result)
