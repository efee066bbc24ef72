"""The exporter: counters CSV, pod attribution, DCGM-shaped series, HTTP serving and the CLI's bad-input paths."""

from __future__ import annotations

import gzip
import re
import socket
import urllib.request
from pathlib import Path

import grpc
import pytest
from prometheus_client.parser import text_string_to_metric_families
from typer.testing import CliRunner

from kubegpu.cli import app
from kubegpu.endpoints import parse_listen_address
from kubegpu.errors import ConfigError
from kubegpu.exporter.collector import build_families, read_node
from kubegpu.exporter.counters import load_counters, parse_counters
from kubegpu.exporter.exposition import render_text
from kubegpu.exporter.server import Exporter, serve
from kubegpu.gpu.simulated import SimulatedBackend
from kubegpu.sharing.attribution import ContainerDevices, EntityKey, PodInfo, PodResourcesClient, attribute
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
    with pytest.raises(ConfigError, match=r"^my.csv:3: malformed CSV record on line 3: expected 3 fields"):
        parse_counters(text, "my.csv")


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        ('DCGM_FI_DEV_GPU_UTIL, gauge, "unterminated', "unexpected end of data"),
        ('DCGM_FI_DEV_GPU_UTIL, gauge, "a"b', "',' expected after '\"'"),
        (", gauge, no field name", "the field name is empty"),
    ],
)
def test_bad_quoting_and_empty_field_names_are_malformed_records(line: str, reason: str) -> None:
    with pytest.raises(ConfigError, match=rf"^my.csv:2: malformed CSV record on line 2: {re.escape(reason)}$"):
        parse_counters(f"DCGM_FI_DEV_GPU_UTIL, gauge, ok\n{line}\n", "my.csv")


def test_text_exposition_writes_labels_in_dcgm_order(mig_node: SimulatedBackend) -> None:
    h100 = mig_node.devices()[1]
    holders: dict[EntityKey, list[PodInfo]] = {(1, None): [PodInfo("ml", 'we"ird', "main", "0")]}
    families = build_families(read_node(mig_node), load_counters(None), holders, "node-a")
    lines = render_text(families).decode().splitlines()
    series = next(line for line in lines if line.startswith('DCGM_FI_DEV_GPU_UTIL{gpu="1"'))
    driver = mig_node.driver_version()
    assert series.startswith(
        f'DCGM_FI_DEV_GPU_UTIL{{gpu="1",UUID="{h100.uuid}",pci_bus_id="{h100.pci_bus_id}",device="nvidia1",'
        f'modelName="{h100.product_name}",Hostname="node-a",DCGM_FI_DRIVER_VERSION="{driver}",'
        'pod="we\\"ird",namespace="ml",container="main",vgpu="0"} '
    )
    mig_line = next(line for line in lines if line.startswith("DCGM_FI_DEV_FB_USED{") and "GPU_I_ID" in line)
    assert re.search(r'modelName="[^"]+",GPU_I_PROFILE="[^"]+",GPU_I_ID="\d+",Hostname="node-a",', mig_line)
    assert "# TYPE DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION counter" in lines
    parsed = {f.name: f for f in text_string_to_metric_families("\n".join(lines) + "\n")}
    assert parsed["DCGM_FI_DEV_GPU_UTIL"].type == "gauge"


def test_unknown_type_is_an_error_and_unknown_field_is_skipped_with_a_warning() -> None:
    with pytest.raises(ConfigError, match=r"^my.csv:1: unknown metric type 'gaug' for DCGM_FI_DEV_GPU_UTIL on line 1;"):
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


def test_index_ids_name_a_mig_device_by_its_position_like_the_device_plugin(mig_node: SimulatedBackend) -> None:
    migs = mig_node.mig_devices(0)
    assert [m.gi_id for m in migs] != list(range(len(migs)))  # positions and GI ids differ on this node
    containers = [ContainerDevices("ml", f"p{i}", "c", "nvidia.com/mig-x", (f"0:{i}",)) for i in range(len(migs))]
    holders = attribute(containers, mig_node.devices(), migs)
    assert {key: [p.pod for p in pods] for key, pods in holders.items()} == {
        (0, mig.gi_id): [f"p{i}"] for i, mig in enumerate(migs)
    }


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
    engine = samples_of(families, "DCGM_FI_PROF_GR_ENGINE_ACTIVE")
    assert [s.value for s in engine if s.labels.get("GPU_I_ID") == str(three_g.gi_id)] == [pytest.approx(0.6)]
    used = [s for s in samples_of(families, "DCGM_FI_DEV_FB_USED") if s.labels.get("GPU_I_ID") == str(three_g.gi_id)]
    assert used[0].value == 20000
    # one series per GPU plus one per MIG instance
    assert len(util) == 2 + 2


def test_scrape_serves_the_snapshot_with_dcgm_counter_headers(mig_node: SimulatedBackend, tmp_path: Path) -> None:
    exporter = Exporter(mig_node, load_counters(None), "node-a", PodResourcesClient(tmp_path / "missing.sock"), 30.0)
    server = serve(exporter, "127.0.0.1", 0)
    try:
        base = f"http://127.0.0.1:{server.port}"
        with pytest.raises(urllib.error.HTTPError):
            urllib.request.urlopen(f"{base}/health")  # no collection yet
        exporter.collect_once()
        assert urllib.request.urlopen(f"{base}/health").status == 200
        body = urllib.request.urlopen(f"{base}/metrics").read().decode()
        assert "# TYPE DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION counter\n" in body
        assert "_created" not in body and "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION_total" not in body
        assert '\nDCGM_FI_DEV_GPU_UTIL{gpu="1",UUID="' in body  # dcgm-exporter's label order on the wire
        names = {f.name for f in text_string_to_metric_families(body)}
        assert "DCGM_FI_DEV_GPU_UTIL" in names and "kubegpu_exporter_collect_duration_seconds" in names
        assert 'pod="' not in body  # the pod-resources socket is missing: unattributed, never a failed scrape
        mig_node.set_load(1, 33.0, 1000)
        body = urllib.request.urlopen(f"{base}/metrics").read().decode()
        util = next(f for f in text_string_to_metric_families(body) if f.name == "DCGM_FI_DEV_GPU_UTIL")
        assert [s.value for s in util.samples if s.labels["gpu"] == "1"] == [0.0]  # scrapes read the last snapshot
        exporter.collect_once()  # a new collection replaces the cached rendering
        body = urllib.request.urlopen(f"{base}/metrics").read().decode()
        util = next(f for f in text_string_to_metric_families(body) if f.name == "DCGM_FI_DEV_GPU_UTIL")
        assert [s.value for s in util.samples if s.labels["gpu"] == "1"] == [33.0]
        request = urllib.request.Request(f"{base}/metrics", headers={"Accept": "application/openmetrics-text"})
        assert urllib.request.urlopen(request).read().decode().rstrip().endswith("# EOF")
        # Prometheus asks for gzip: the same bytes compressed (once per collection); q=0 refuses it
        zipped = urllib.request.urlopen(urllib.request.Request(f"{base}/metrics", headers={
            "Accept-Encoding": "gzip, deflate"}))
        assert zipped.headers["Content-Encoding"] == "gzip"
        assert gzip.decompress(zipped.read()).decode() == body
        refused = urllib.request.urlopen(urllib.request.Request(f"{base}/metrics", headers={
            "Accept-Encoding": "identity, gzip;q=0"}))
        assert refused.headers["Content-Encoding"] is None and refused.read().decode() == body
    finally:
        server.close()


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


def test_dra_allocated_gpus_and_mig_devices_are_attributed_with_their_claim(
    mig_node: SimulatedBackend, tmp_path: Path
) -> None:
    a100, h100 = mig_node.devices()
    three_g = next(m for m in mig_node.mig_devices(0) if m.profile_id == 9)
    claims = [
        ("ml", "train", "main", "train-gpu", "gpu.nvidia.com", [f"gpu-{h100.device_minor}"]),
        ("ml", "infer", "main", "slice", "gpu.nvidia.com",
         [f"gpu-{a100.device_minor}-mig-3g40gb-{three_g.profile_id}-{three_g.start}"]),
        ("ml", "other", "main", "fpga", "fpga.example.com", [f"gpu-{h100.device_minor}"]),  # not our driver
        ("ml", "gone", "main", "stale", "gpu.nvidia.com", [f"gpu-{a100.device_minor}-mig-1g10gb-19-6"]),  # no such GI
    ]
    sock = tmp_path / "kubelet.sock"
    with FakePodResources(sock, [], claims=claims):
        exporter = Exporter(mig_node, load_counters(None), None, PodResourcesClient(sock), 30.0)
        exporter.collect_once()
    util = next(s for s in exporter.snapshot.collect() if s.name == "DCGM_FI_DEV_GPU_UTIL").samples
    attributed = {(s.labels["gpu"], s.labels.get("GPU_I_ID")): (s.labels["pod"], s.labels["claim"])
                  for s in util if "pod" in s.labels}
    assert attributed == {("1", None): ("train", "train-gpu"), ("0", str(three_g.gi_id)): ("infer", "slice")}


def test_a_failing_kubelet_leaves_series_unattributed(mig_node: SimulatedBackend, tmp_path: Path) -> None:
    h100 = mig_node.devices()[1].uuid
    failing = tmp_path / "failing.sock"
    stale = tmp_path / "stale.sock"
    with socket.socket(socket.AF_UNIX) as dead:
        dead.bind(str(stale))  # a socket file nobody listens on, as a crashed kubelet leaves behind
        pods = [("ml", "a", "c", "nvidia.com/gpu", [h100])]
        with FakePodResources(failing, pods, error=grpc.StatusCode.UNAVAILABLE) as fake:
            for path in (failing, stale):
                exporter = Exporter(mig_node, load_counters(None), None, PodResourcesClient(path, 0.5), 30.0)
                exporter.collect_once()
                util = next(f for f in exporter.snapshot.collect() if f.name == "DCGM_FI_DEV_GPU_UTIL")
                assert len(util.samples) == 4 and all("pod" not in s.labels for s in util.samples), path
            assert fake.calls == 1


def test_cli_rejects_bad_input_in_one_line(tmp_path: Path) -> None:
    node = tmp_path / "node.json"
    SimulatedBackend.create(node, gpus="1xL4")
    bad_csv = tmp_path / "counters.csv"
    bad_csv.write_text("DCGM_FI_DEV_GPU_UTIL, gauge, ok\nDCGM_FI_DEV_FB_USED gauge used\n")
    broken_node = tmp_path / "broken.json"
    broken_node.write_text("{not json")
    runner = CliRunner()
    cases = [  # bad files exit 1, bad flag values 2 (the CLI contract)
        (["--collectors", str(bad_csv)], f"{bad_csv}:2: malformed CSV record on line 2", 1),
        (["--gpu-backend", f"sim:{broken_node}"], f"{broken_node}:1:2: invalid JSON", 1),
        (["--address", "[::1]:x"], "'--address' / '-a' (env var: 'DCGM_EXPORTER_LISTEN'): expected HOST:PORT", 2),
        (["--address", "nonsense"], "'--address' / '-a' (env var: 'DCGM_EXPORTER_LISTEN'): expected HOST:PORT", 2),
        (["--collect-interval", "0"], "'--collect-interval' / '-c' (env var: 'DCGM_EXPORTER_INTERVAL'): must be", 2),
    ]
    for extra, message, status in cases:
        result = runner.invoke(app, ["exporter", "--gpu-backend", f"sim:{node}", *extra])
        assert result.exit_code == status, result.output
        lines = result.output.strip().splitlines()
        assert len(lines) == 1 and message in lines[0] and "Traceback" not in result.output


@pytest.mark.parametrize(
    ("address", "expected"),
    [(":9400", ("0.0.0.0", 9400)), ("127.0.0.1:0", ("127.0.0.1", 0)), ("[::]:9400", ("::", 9400))],
)
def test_listen_addresses_like_dcgm_exporters(address: str, expected: tuple[str, int]) -> None:
    assert parse_listen_address(address, "--address") == expected

