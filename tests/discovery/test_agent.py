"""The discovery agent's edges: the atomic NFD file, the loop and its exit, the CLI and SIGTERM."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kubegpu.cli import app
from kubegpu.discovery.agent import FeatureFileSink, read_machine_type, run_discovery
from kubegpu.discovery.cli import sleep_interval_seconds
from kubegpu.discovery.labels import checked_features_file, parse_features_file
from kubegpu.errors import ConfigError, KubegpuError
from kubegpu.gpu.simulated import SimulatedBackend

from .conftest import read_golden


def test_feature_file_is_replaced_whole_and_leaves_no_temp_files(tmp_features: Path) -> None:
    sink = FeatureFileSink(tmp_features)
    sink.write({"nvidia.com/gpu.count": "8", "nvidia.com/gpu.product": "A"})
    sink.write({"nvidia.com/gpu.count": "4"})
    assert tmp_features.read_text() == checked_features_file({"nvidia.com/gpu.count": "4"})
    assert tmp_features.read_text().endswith("\nnvidia.com/gpu.count=4\n")
    assert os.listdir(tmp_features.parent) == ["gfd"]
    sink.close()
    assert not tmp_features.exists()
    sink.close()  # closing twice is harmless


def test_unwritable_output_is_one_line_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(KubegpuError, match="cannot write"):
        FeatureFileSink(blocker / "features.d" / "gfd").write({"a": "b"})


def test_loop_relabels_until_stopped_then_removes_the_file(tmp_features: Path) -> None:
    stop = threading.Event()
    passes: list[int] = []

    def read_labels() -> dict[str, str]:
        passes.append(len(passes))
        if len(passes) == 3:
            stop.set()  # as the SIGTERM handler does
        return {"nvidia.com/gfd.timestamp": str(len(passes))}

    assert run_discovery(read_labels, FeatureFileSink(tmp_features), stop, interval=0.0, oneshot=False) == 3
    assert not tmp_features.exists()


def test_oneshot_writes_once_and_keeps_the_file(tmp_features: Path) -> None:
    stop = threading.Event()
    assert run_discovery(lambda: {"k": "v"}, FeatureFileSink(tmp_features), stop, interval=60.0, oneshot=True) == 1
    assert parse_features_file(tmp_features.read_text(), "gfd") == {"k": "v"}


def test_machine_type_file(tmp_path: Path) -> None:
    (tmp_path / "product_name").write_text("NVIDIA DGX H100\n")
    assert read_machine_type(tmp_path / "product_name") == "NVIDIA DGX H100"
    assert read_machine_type(tmp_path / "missing") is None


def test_sleep_interval_parsing() -> None:
    assert sleep_interval_seconds("60s") == 60.0
    assert sleep_interval_seconds("1m30s") == 90.0
    assert sleep_interval_seconds("infinite") is None
    with pytest.raises(ConfigError, match=r"flags\.gfd\.sleepInterval"):
        sleep_interval_seconds("soon")


def _node_file(tmp_path: Path, gpus: str) -> Path:
    path = tmp_path / "node.json"
    SimulatedBackend.create(path, gpus)
    return path


def test_cli_oneshot_writes_the_labels_of_the_file_node(tmp_path: Path) -> None:
    node = _node_file(tmp_path, "4xL4")
    out = tmp_path / "gfd"
    config = tmp_path / "config.yaml"
    config.write_text("version: v1\nflags:\n  gfd:\n    noTimestamp: true\n")
    result = CliRunner().invoke(app, ["discover", "--gpu-backend", f"sim:{node}", "--config", str(config),
                                      "--oneshot", "--output-file", str(out),
                                      "--machine-type-file", str(tmp_path / "none")])
    assert result.exit_code == 0, result.output
    written = parse_features_file(out.read_text(), str(out))
    expected = read_golden("l4-no-mig.labels")
    del expected["nvidia.com/gfd.timestamp"]
    assert written == expected


def test_cli_output_file_dash_prints_the_labels(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    node = _node_file(tmp_path, "4xL4")
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, ["discover", "--gpu-backend", f"sim:{node}", "--oneshot", "--no-timestamp",
                                      "--output-file", "-", "--machine-type-file", str(tmp_path / "none")])
    assert result.exit_code == 0, result.output
    printed = dict(line.split("=", 1) for line in result.stdout.splitlines() if "=" in line)
    expected = read_golden("l4-no-mig.labels")
    del expected["nvidia.com/gfd.timestamp"]
    assert printed == expected
    assert not (tmp_path / "-").exists()


def test_cli_flag_overrides_config_file_and_bad_values_are_one_line(tmp_path: Path) -> None:
    node = _node_file(tmp_path, "1xA100-SXM4-80GB")
    out = tmp_path / "gfd"
    config = tmp_path / "config.yaml"
    config.write_text("version: v1\nflags:\n  migStrategy: single\n")
    result = CliRunner().invoke(app, ["discover", "--gpu-backend", f"sim:{node}", "--config", str(config),
                                      "--mig-strategy", "mixed", "--oneshot", "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert "nvidia.com/mig.strategy=mixed" in out.read_text()
    bad = CliRunner().invoke(app, ["discover", "--gpu-backend", f"sim:{node}", "--mig-strategy", "both",
                                   "--oneshot", "-o", str(out)])
    assert bad.exit_code == 2
    assert_one_error_line(bad.output, "--mig-strategy")


def assert_one_error_line(output: str, *names: str) -> None:
    lines = output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), output
    for name in names:
        assert name in lines[0]


def _wait_for(condition: Callable[[], bool], process: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 20
    while not condition() and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert condition(), process.stderr.read().decode() if process.stderr and process.poll() is not None else "timeout"


def test_edited_config_is_relabelled_in_place_and_sigterm_removes_the_file(tmp_path: Path) -> None:
    node = _node_file(tmp_path, "2xL4")
    out = tmp_path / "gfd"
    config = tmp_path / "config.yaml"
    config.write_text("version: v1\n")
    process = subprocess.Popen(
        [sys.executable, "-c", "from kubegpu.cli import main; main()", "discover", "--gpu-backend", f"sim:{node}",
         "--config", str(config), "--sleep-interval", "100ms", "--output-file", str(out)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )
    try:
        _wait_for(out.exists, process)
        assert "nvidia.com/gpu.count=2" in out.read_text()
        config.write_text("version: v1\nsharing:\n  timeSlicing:\n    resources:\n"
                          "    - name: nvidia.com/gpu\n      replicas: 3\n")
        process.send_signal(signal.SIGHUP)  # config-manager's reload signal must not stop the agent
        _wait_for(lambda: "nvidia.com/gpu.replicas=3" in out.read_text(), process)
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=20) == 0
    finally:
        if process.poll() is None:
            process.kill()
    assert not out.exists()


def test_cli_bad_backend_exits_1_with_one_line(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-c", "from kubegpu.cli import main; main()", "discover", "--gpu-backend", "sim:" +
         str(tmp_path / "missing.json"), "--oneshot", "-o", str(tmp_path / "gfd")],
        capture_output=True, text=True, timeout=60,
    )
    assert result.returncode == 1
    assert result.stderr.count("\n") == 1 and result.stderr.startswith("error: ")
    assert "missing.json" in result.stderr


def test_cli_mps_on_a_mig_enabled_node_is_refused_with_one_line(tmp_path: Path) -> None:
    node = SimulatedBackend.create(tmp_path / "node.json", "1xH100-SXM5-80GB,1xL4")
    node.set_mig_mode(0, True)  # Hopper: no reset needed
    config = tmp_path / "mps.yaml"
    config.write_text("version: v1\nflags: {mpsRoot: /run/nvidia/mps}\n"
                      "sharing: {mps: {resources: [{name: nvidia.com/gpu, replicas: 2}]}}\n")
    out = tmp_path / "gfd"
    result = subprocess.run(
        [sys.executable, "-c", "from kubegpu.cli import main; main()", "discover", "--gpu-backend",
         f"sim:{tmp_path / 'node.json'}", "--config", str(config), "--oneshot", "-o", str(out)],
        capture_output=True, text=True, timeout=60,
    )
    assert result.returncode == 1 and result.stderr.count("\n") == 1, result.stderr
    assert result.stderr.startswith(f"error: {config}: sharing.mps:") and "MIG" in result.stderr
    assert not out.exists()  # no -SHARED / mps labels for replicas the plugin will never advertise


def test_node_sink_patches_only_what_changed_and_never_foreign_labels() -> None:
    from kubegpu.clock import VirtualClock
    from kubegpu.discovery.agent import NodeLabelSink, discover_labels
    from kubegpu.kube import MemoryCluster

    from .conftest import NOW, plugin_config, sim_node

    cluster = MemoryCluster(VirtualClock())
    foreign = {"nvidia.com/mig.config": "all-balanced", "nvidia.com/mig.config.state": "success",
               "nvidia.com/gpu.deploy.device-plugin": "paused-for-mig-change", "nvidia.com/gpu.present": "true",
               "kubernetes.io/hostname": "n1"}
    stale = {"nvidia.com/mig-1g.10gb.count": "16", "nvidia.com/mig.strategy": "mixed"}
    cluster.create({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1", "labels": {**foreign, **stale}}})
    labels = discover_labels(sim_node("2xH100-SXM5-80GB"), plugin_config({}), None, NOW)
    sink = NodeLabelSink(cluster, "n1")
    sink.write(labels)
    assert cluster.get("Node", "n1")["metadata"]["labels"] == {**foreign, **labels}
    version = cluster.resource_version
    sink.write(labels)  # nothing changed: no write at all
    assert cluster.resource_version == version
    sink.close()
    assert cluster.get("Node", "n1")["metadata"]["labels"] == {**foreign, **labels}


def test_a_failed_later_pass_is_reported_and_retried_but_a_failed_first_pass_stops(tmp_features: Path) -> None:
    stop = threading.Event()
    calls: list[int] = []
    errors: list[str] = []

    def flaky() -> dict[str, str]:
        calls.append(1)
        if len(calls) == 2:
            raise KubegpuError("API server unavailable")
        if len(calls) == 3:
            stop.set()
        return {"pass": str(len(calls))}

    sink = FeatureFileSink(tmp_features)
    assert run_discovery(flaky, sink, stop, 0.0, False, on_error=lambda e: errors.append(str(e))) == 2
    assert errors == ["API server unavailable"]

    def broken() -> dict[str, str]:
        raise KubegpuError("bad config")

    with pytest.raises(KubegpuError, match="bad config"):
        run_discovery(broken, sink, threading.Event(), 0.0, False, on_error=errors.append)  # type: ignore[arg-type]


def test_a_config_switch_is_labelled_at_once_not_a_sleep_interval_later(tmp_path: Path) -> None:
    """Per-node configs: the config-manager re-points the config link; with a 1 h sleep interval the agent still
    relabels within a second (`nvidia.com/mps.capable` gates the MPS daemon's DaemonSet)."""
    node = _node_file(tmp_path, "2xL4")
    out = tmp_path / "gfd"
    (tmp_path / "whole").write_text("version: v1\n")
    (tmp_path / "mps").write_text("version: v1\nflags: {mpsRoot: /run/nvidia/mps}\nsharing:\n  mps:\n    resources:\n"
                                  "    - name: nvidia.com/gpu\n      replicas: 2\n")
    config = tmp_path / "config.yaml"
    os.symlink(tmp_path / "whole", config)
    process = subprocess.Popen(
        [sys.executable, "-c", "from kubegpu.cli import main; main()", "discover", "--gpu-backend", f"sim:{node}",
         "--config", str(config), "--sleep-interval", "1h", "--output-file", str(out)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )
    try:
        _wait_for(out.exists, process)
        assert "nvidia.com/mps.capable=false" in out.read_text()
        os.symlink(tmp_path / "mps", tmp_path / "next")
        os.replace(tmp_path / "next", config)
        started = time.monotonic()
        _wait_for(lambda: "nvidia.com/mps.capable=true" in out.read_text(), process)
        assert time.monotonic() - started < 5
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=20) == 0
    finally:
        if process.poll() is None:
            process.kill()
