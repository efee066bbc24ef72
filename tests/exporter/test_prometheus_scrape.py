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

from kubegpu.exporter.counters import load_counters
from kubegpu.exporter.server import Exporter, serve
from kubegpu.gpu.simulated import SimulatedBackend
from kubegpu.sharing.attribution import PodResourcesClient
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


DASHBOARD = Path(__file__).resolve().parents[2] / "deploy" / "grafana" / "kubegpu-dashboard.json"


def dashboard_expr(title: str) -> str:
    """A panel's PromQL from the shipped dashboard, with every template variable matching everything."""
    panel = next(p for p in json.loads(DASHBOARD.read_text())["panels"] if p["title"] == title)
    return str(panel["targets"][0]["expr"]).replace("$instance", ".*").replace("$gpu", ".*")


def wait_for(port: int, promql: str, count: int) -> list[dict]:
    deadline = time.monotonic() + 40
    result: list[dict] = []
    while time.monotonic() < deadline and len(result) < count:
        time.sleep(0.5)
        result = query(port, promql)
    return result


def test_prometheus_sees_one_series_per_pod_on_a_time_sliced_gpu(tmp_path: Path, prometheus: PrometheusServer) -> None:
    node = SimulatedBackend.create(tmp_path / "node.json", gpus="1xH100-SXM5-80GB,1xA100-SXM4-80GB")
    node.set_load(0, 70.0, 30000)
    node.set_mig_mode(1, True)
    node.reset_gpu(1)
    shared_mig = node.create_mig_device(1, 19, 0)
    node.create_mig_device(1, 19, 1)
    uuid = node.devices()[0].uuid
    sock = tmp_path / "pod-resources.sock"
    pods = [("ml", "serve-a", "server", "nvidia.com/gpu.shared", [f"{uuid}::0"]),
            ("ml", "serve-b", "server", "nvidia.com/gpu.shared", [f"{uuid}::1"]),
            ("mig", "small-a", "c", "nvidia.com/mig-1g.10gb", [f"{shared_mig.uuid}::0"]),
            ("mig", "small-b", "c", "nvidia.com/mig-1g.10gb", [f"{shared_mig.uuid}::1"])]
    with FakePodResources(sock, pods):
        exporter = Exporter(node, load_counters(None), "node-a", PodResourcesClient(sock), 0.5)
        server = serve(exporter, "127.0.0.1", 0)
        worker = threading.Thread(target=exporter.run, daemon=True)
        worker.start()
        try:
            prometheus.start(server.port)
            result = wait_for(prometheus.port, 'DCGM_FI_DEV_GPU_UTIL{job="kubegpu", namespace="ml"}', 2)
            energy = query(prometheus.port, 'DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{namespace="ml"}')
            sharing = query(prometheus.port, dashboard_expr("Pods sharing each GPU"))
            mig_profiles = query(prometheus.port, dashboard_expr("MIG instances by profile"))
        finally:
            exporter.stop()
            worker.join(timeout=5)
            server.close()
    assert sorted(r["metric"]["pod"] for r in result) == ["serve-a", "serve-b"]
    assert {r["metric"]["vgpu"] for r in result} == {"0", "1"}
    assert {r["metric"]["UUID"] for r in result} == {uuid}
    assert all(float(r["value"][1]) == pytest.approx(70.0) for r in result)
    # a counter keeps its bare DCGM name through a real scrape
    assert sorted(r["metric"]["pod"] for r in energy) == ["serve-a", "serve-b"]
    # the dashboard's sharing panels: two pods on each GPU; two 1g instances, not one series per pod
    assert {r["metric"]["gpu"]: r["value"][1] for r in sharing} == {"0": "2", "1": "2"}
    assert [(r["metric"]["GPU_I_PROFILE"], r["value"][1]) for r in mig_profiles] == [("1g.10gb", "2")]
