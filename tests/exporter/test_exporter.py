"""The exporter: counters CSV, pod attribution, DCGM-shaped series, HTTP serving and the CLI's bad-input paths."""

from __future__ import annotations

import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families
from typer.testing import CliRunner

from kubegpu.cli import app
from kubegpu.errors import ConfigError
from kubegpu.exporter.attribution import ContainerDevices, PodInfo, PodResourcesClient, attribute
from kubegpu.exporter.collector import build_families, read_node
from kubegpu.exporter.counters import load_counters, parse_counters
from kubegpu.exporter.server import Exporter, serve
from kubegpu.gpu.simulated import SimulatedBackend
from tests.fakes.fake_podresources import FakePodResources


def samples_of(families: list, name: str) -> list:
    return [s for f in families if f.name == name for s in f.samples]


@pytest.fixture
def mig_node(tmp_path: Path) -> SimulatedBackend:
    """One A100-80GB cut 1g.10gb@0 + 3g.40gb@4, and one whole H100."""
    backend = SimulatedBackend.create(tmp_path / "node.json", gpus="1xA100-SXM4-80GB,1xH100-SXM5-80GB")
    backend.set_mig_mode(0, True)
    backend.reset_gpu(0)
    backend.create_mig_device(0, 19, 0)
    backend.create_mig_device(0, 9, 4)
    return backend


def test_default_counters_are_dcgm_exporters_26_active_lines() -> None:
    counters = load_counters(None)
    assert len(counters.counters) == 26
    assert [c.field for c in counters.labels] == ["DCGM_FI_DRIVER_VERSION"]
    by_name = {c.field: c for c in counters.counters}
    assert by_name["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"].type == "counter"
    assert by_name["DCGM_FI_DEV_GPU_UTIL"].help == "GPU utilization (in %)."
    assert by_name["DCGM_FI_DEV_DEC_UTIL"].type == "gauge"  # the stray space before the comma is trimmed
    assert counters.warnings == ()


def test_malformed_record_names_the_line() -> None:
    text = "# comment\nDCGM_FI_DEV_GPU_UTIL, gauge, GPU utilization (in %).\nDCGM_FI_DEV_FB_USED, gauge\n"
    with pytest.raises(ConfigError, match=r"^my.csv:3: malformed CSV record: expected 3 fields"):
        parse_counters(text, "my.csv")


def test_unknown_type_is_an_error_and_unknown_field_is_skipped_with_a_warning() -> None:
    with pytest.raises(ConfigError, match=r"my.csv:1: unknown metric type 'gaug'"):
        parse_counters("DCGM_FI_DEV_GPU_UTIL, gaug, x\n", "my.csv")
    counters = parse_counters("DCGM_FI_DEV_GPU_UTIL, gauge, x\nDCGM_FI_DEV_NOT_A_FIELD, gauge, y\n", "my.csv")
    assert [c.field for c in counters.counters] == ["DCGM_FI_DEV_GPU_UTIL"]
    assert counters.warnings == ("my.csv: skipping line 2 (DCGM_FI_DEV_NOT_A_FIELD): metric not supported by kubegpu",)


def test_every_pod_on_a_shared_gpu_is_attributed(mig_node: SimulatedBackend) -> None:
    gpus = mig_node.devices()
    migs = mig_node.mig_devices(0)
    h100 = gpus[1].uuid
    three_g = next(m for m in migs if m.profile_id == 9)
    holders = attribute(
        [
            ContainerDevices("ml", "serve-a", "main", "nvidia.com/gpu.shared", (f"{h100}::0",)),
            ContainerDevices("ml", "serve-b", "main", "nvidia.com/gpu.shared", (f"{h100}::3",)),
            ContainerDevices("ml", "train", "main", "nvidia.com/mig-3g.40gb", (three_g.uuid,)),
            ContainerDevices("x", "other", "c", "example.com/fpga", ("fpga-0",)),
        ],
        gpus,
        migs,
    )
    assert holders[(1, None)] == [PodInfo("ml", "serve-a", "main", "0"), PodInfo("ml", "serve-b", "main", "3")]
    assert holders[(0, three_g.gi_id)] == [PodInfo("ml", "train", "main", None)]
    assert len(holders) == 2


def test_series_carry_dcgm_labels_and_mig_instances_get_utilization(mig_node: SimulatedBackend) -> None:
    three_g = next(m for m in mig_node.mig_devices(0) if m.profile_id == 9)
    mig_node.set_load(0, 60.0, 20000, gi_id=three_g.gi_id)
    families = build_families(read_node(mig_node), load_counters(None), None, "node-a")
    util = samples_of(families, "DCGM_FI_DEV_GPU_UTIL")
    mig_series = [s for s in util if s.labels.get("GPU_I_ID") == str(three_g.gi_id)]
    assert len(mig_series) == 1
    labels = mig_series[0].labels
    dcgm_order = ["gpu", "UUID", "pci_bus_id", "device", "modelName", "GPU_I_PROFILE", "GPU_I_ID", "Hostname"]
    assert list(labels)[:8] == dcgm_order
    assert labels["GPU_I_PROFILE"] == "3g.40gb" and labels["device"] == "nvidia0" and labels["Hostname"] == "node-a"
    assert labels["DCGM_FI_DRIVER_VERSION"] == mig_node.driver_version()
    assert mig_series[0].value == pytest.approx(60.0)
    used = [s for s in samples_of(families, "DCGM_FI_DEV_FB_USED") if s.labels.get("GPU_I_ID") == str(three_g.gi_id)]
    assert used[0].value == 20000
    # one series per GPU plus one per MIG instance
    assert len(util) == 2 + 2


def test_scrape_serves_the_snapshot_with_dcgm_counter_headers(mig_node: SimulatedBackend, tmp_path: Path) -> None:
    exporter = Exporter(mig_node, load_counters(None), "node-a", PodResourcesClient(tmp_path / "missing.sock"), 30.0)
    server = serve(exporter, "127.0.0.1", 0)
    try:
        base = f"http://127.0.0.1:{server.server_port}"
        with pytest.raises(urllib.error.HTTPError):
            urllib.request.urlopen(f"{base}/health")  # no collection yet
        exporter.collect_once()
        assert urllib.request.urlopen(f"{base}/health").status == 200
        body = urllib.request.urlopen(f"{base}/metrics").read().decode()
        assert "# TYPE DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION counter\n" in body
        assert "_created" not in body and "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION_total" not in body
        names = {f.name for f in text_string_to_metric_families(body)}
        assert "DCGM_FI_DEV_GPU_UTIL" in names and "kubegpu_exporter_collect_duration_seconds" in names
        assert 'pod="' not in body  # the pod-resources socket is missing: unattributed, never a failed scrape
        mig_node.set_load(1, 33.0, 1000)  # a new collection replaces the cached rendering
        exporter.collect_once()
        body = urllib.request.urlopen(f"{base}/metrics").read().decode()
        util = next(f for f in text_string_to_metric_families(body) if f.name == "DCGM_FI_DEV_GPU_UTIL")
        assert [s.value for s in util.samples if s.labels["gpu"] == "1"] == [33.0]
        request = urllib.request.Request(f"{base}/metrics", headers={"Accept": "application/openmetrics-text"})
        assert urllib.request.urlopen(request).read().decode().rstrip().endswith("# EOF")
    finally:
        server.shutdown()
        server.server_close()


def test_pod_resources_over_a_real_socket(mig_node: SimulatedBackend, tmp_path: Path) -> None:
    h100 = mig_node.devices()[1].uuid
    sock = tmp_path / "kubelet.sock"
    with FakePodResources(sock, [("ml", "a", "c", "nvidia.com/gpu.shared", [f"{h100}::1"])]) as fake:
        exporter = Exporter(mig_node, load_counters(None), None, PodResourcesClient(sock), 30.0)
        exporter.collect_once()
        assert fake.calls == 1
    util = next(s for s in exporter.snapshot.collect() if s.name == "DCGM_FI_DEV_GPU_UTIL").samples
    attributed = [s.labels for s in util if "pod" in s.labels]
    assert attributed == [{**attributed[0], "pod": "a", "namespace": "ml", "container": "c", "vgpu": "1"}]
    assert all("Hostname" not in s.labels for s in util)


def test_cli_rejects_bad_input_in_one_line(tmp_path: Path) -> None:
    node = tmp_path / "node.json"
    SimulatedBackend.create(node, gpus="1xL4")
    bad_csv = tmp_path / "counters.csv"
    bad_csv.write_text("DCGM_FI_DEV_GPU_UTIL, gauge, ok\nDCGM_FI_DEV_FB_USED gauge used\n")
    runner = CliRunner()
    cases = [
        (["--collectors", str(bad_csv)], f"{bad_csv}:2: malformed CSV record"),
        (["--address", "nonsense"], "--address: expected HOST:PORT"),
        (["--collect-interval", "0"], "--collect-interval: must be a positive number"),
    ]
    for extra, message in cases:
        result = runner.invoke(app, ["exporter", "--gpu-backend", f"sim:{node}", *extra])
        assert result.exit_code == 1, result.output
        lines = result.output.strip().splitlines()
        assert len(lines) == 1 and message in lines[0] and "Traceback" not in result.output
