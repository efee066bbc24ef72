"""`kubegpu validate`: barrier files on a simulated node, their removal on stop, and the readiness gauges."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from prometheus_client import generate_latest
from typer.testing import CliRunner

from kubegpu.cli import app
from kubegpu.gpu.simulated import SimulatedBackend
from kubegpu.validate.checks import DRIVER_KEYS, Result, check_plugin, read_barrier, run_with_retries
from kubegpu.validate.metrics import readiness_registry

runner = CliRunner()


@pytest.fixture
def node(tmp_path: Path) -> Path:
    path = tmp_path / "node.json"
    result = runner.invoke(app, ["sim-node", "create", "--gpus", "2xA100-SXM4-80GB", "--out", str(path)])
    assert result.exit_code == 0, result.stderr
    return path


def validate(component: str, node: Path, out: Path, *extra: str) -> tuple[int, str]:
    result = runner.invoke(app, ["validate", component, "--gpu-backend", f"sim:{node}", "--output-dir", str(out),
                                 *extra])
    return result.exit_code, result.stdout + result.stderr


def test_driver_toolkit_cuda_write_their_barriers_in_order(node: Path, tmp_path: Path) -> None:
    out = tmp_path / "validations"
    code, text = validate("toolkit", node, out)
    assert code == 1 and "driver-ready" in text and not (out / "toolkit-ready").exists()
    code, text = validate("driver", node, out)
    assert code == 0, text
    values = read_barrier(out, "driver")
    assert values is not None and set(DRIVER_KEYS) <= set(values)
    assert values["IS_HOST_DRIVER"] == "true" and values["GPU_COUNT"] == "2"
    assert validate("toolkit", node, out)[0] == 0 and (out / "toolkit-ready").exists()
    assert validate("cuda", node, out)[0] == 0 and (out / "cuda-ready").exists()


def test_mig_enabled_without_devices_fails_then_passes(node: Path, tmp_path: Path) -> None:
    out = tmp_path / "v"
    assert validate("mig", node, out)[0] == 0  # MIG off everywhere: nothing to check
    backend = SimulatedBackend(node)
    if backend.set_mig_mode(0, True):  # Ampere: the mode change waits for a reset
        code, text = validate("mig", node, out)
        assert code == 1 and "reset" in text
        backend.reset_gpu(0)
    code, text = validate("mig", node, out)
    assert code == 1 and "no MIG device" in text and not (out / "mig-ready").exists()
    backend.create_mig_device(0, 0, 0)  # 7g.80gb at slice 0
    assert validate("mig", node, out)[0] == 0 and (out / "mig-ready").exists()


def test_a_failing_rerun_removes_the_stale_barrier(node: Path, tmp_path: Path) -> None:
    out = tmp_path / "v"
    assert validate("mig", node, out)[0] == 0
    SimulatedBackend(node).set_mig_mode(1, True)
    assert validate("mig", node, out)[0] == 1
    assert not (out / "mig-ready").exists()


def test_plugin_reads_node_capacity(tmp_path: Path) -> None:
    node_file = tmp_path / "node.yaml"
    node_file.write_text("kind: Node\nmetadata: {name: n}\nstatus: {capacity: {cpu: '8', nvidia.com/gpu: '0'}}\n")
    out = tmp_path / "v"
    result = runner.invoke(app, ["validate", "plugin", "--node-file", str(node_file), "--output-dir", str(out),
                                 "--attempts", "2", "--interval", "0"])
    assert result.exit_code == 1 and "not advertised" in result.stderr
    node_file.write_text("kind: Node\nmetadata: {name: n}\nstatus: {capacity: {nvidia.com/mig-1g.10gb: '7'}}\n")
    result = runner.invoke(app, ["validate", "plugin", "--node-file", str(node_file), "--output-dir", str(out)])
    assert result.exit_code == 0 and read_barrier(out, "plugin") == {"DEVICE_PLUGIN_DEVICES": "7"}
    assert not check_plugin({"status": {"capacity": {"nvidia.com/gpu": "4"}}}, "mixed").ok


def test_retries_until_it_passes() -> None:
    answers = iter([Result(False, "no"), Result(False, "no"), Result(True, "yes")])
    sleeps: list[float] = []
    assert run_with_retries(lambda: next(answers), 5, sleeps.append, 5.0).ok and sleeps == [5.0, 5.0]
    assert not run_with_retries(lambda: Result(False, "never"), 3, sleeps.append, 1.0).ok


def test_readiness_gauges_follow_the_files(node: Path, tmp_path: Path) -> None:
    out = tmp_path / "v"
    registry = readiness_registry(out, "gpu-1")
    assert 'gpu_operator_node_driver_ready{node="gpu-1"} 0.0' in generate_latest(registry).decode()
    validate("driver", node, out)
    text = generate_latest(registry).decode()
    assert 'gpu_operator_node_driver_ready{node="gpu-1"} 1.0' in text
    assert 'gpu_operator_node_toolkit_ready{node="gpu-1"} 0.0' in text
    assert 'gpu_operator_nvidia_pci_devices_total{node="gpu-1"} 2.0' in text


def test_hold_removes_every_barrier_on_stop(node: Path, tmp_path: Path) -> None:
    out = tmp_path / "v"
    for component in ("driver", "toolkit"):
        assert validate(component, node, out)[0] == 0
    (out / "keep.txt").write_text("not a barrier")
    proc = subprocess.Popen([sys.executable, "-m", "kubegpu", "validate", "hold", "--output-dir", str(out)],
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and "successful" in proc.stdout.readline()
        time.sleep(0.2)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0
    finally:
        proc.kill()
    assert sorted(p.name for p in out.iterdir()) == ["keep.txt"]
