"""The real CLI as a subprocess: start-up errors, SIGHUP reload, SIGTERM cleanup, no-GPU waiting, MPS daemon."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from kubegpu.gpu.simulated import SimulatedBackend

pytestmark = pytest.mark.integration

CLI = [sys.executable, "-c", "from kubegpu.cli import main; main()"]


def time_slicing(replicas: int) -> dict[str, Any]:
    resources = [{"name": "nvidia.com/gpu", "replicas": replicas}]
    return {"version": "v1", "sharing": {"timeSlicing": {"resources": resources}}}


def run_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=20, env=env)


def test_malformed_config_at_start_exits_1_with_one_line(short_tmp: Path) -> None:
    SimulatedBackend.create(short_tmp / "node.json", gpus="2xA100-SXM4-80GB")
    config = short_tmp / "bad.yaml"
    config.write_text(yaml.safe_dump({"version": "v1", "sharing": {"timeSlicing": {"resources": [
        {"name": "nvidia.com/gpu", "replicas": "many"}]}}}))
    result = run_cli("device-plugin", "--config", str(config), "--gpu-backend", f"sim:{short_tmp / 'node.json'}",
                     "--kubelet-socket", str(short_tmp / "kubelet.sock"))
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and str(config) in lines[0]
    assert "replicas" in lines[0] and "Traceback" not in result.stderr


def test_missing_kubelet_directory_names_the_kubelet_socket(short_tmp: Path) -> None:
    SimulatedBackend.create(short_tmp / "node.json", gpus="1xL4")
    socket = short_tmp / "absent" / "kubelet.sock"
    node = f"sim:{short_tmp / 'node.json'}"
    result = run_cli("device-plugin", "--gpu-backend", node, "--kubelet-socket", str(socket))
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 1 and len(lines) == 1
    assert lines[0].startswith("error: --kubelet-socket") and str(socket.parent) in lines[0]


def test_a_relative_device_plugin_dir_serves(short_tmp: Path) -> None:
    """gRPC reads `unix://plugins/x.sock` as a host name; a relative directory must still work."""
    import time

    SimulatedBackend.create(short_tmp / "node.json", gpus="1xL4")
    (short_tmp / "plugins").mkdir()
    plugin = subprocess.Popen([*CLI, "device-plugin", "--gpu-backend", "sim:node.json", "--kubelet-socket", "",
                               "--device-plugin-dir", "plugins"], cwd=short_tmp, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and not (short_tmp / "plugins" / "nvidia-gpu.sock").exists():
            assert plugin.poll() is None, plugin.stderr.read() if plugin.stderr else ""
            time.sleep(0.1)
        assert (short_tmp / "plugins" / "nvidia-gpu.sock").exists()
        plugin.send_signal(signal.SIGTERM)
        assert plugin.wait(timeout=10) == 0
        assert not (short_tmp / "plugins" / "nvidia-gpu.sock").exists()
    finally:
        plugin.kill()


def test_fail_on_init_error_without_gpus(short_tmp: Path) -> None:
    missing = f"sim:{short_tmp / 'absent.json'}"
    result = run_cli("device-plugin", "--gpu-backend", missing, "--kubelet-socket", "",
                     "--device-plugin-dir", str(short_tmp))
    assert result.returncode == 1 and result.stderr.strip().startswith("error:") and "absent.json" in result.stderr
    waiting = subprocess.Popen([*CLI, "device-plugin", "--gpu-backend", missing, "--kubelet-socket", "",
                                "--device-plugin-dir", str(short_tmp), "--no-fail-on-init-error"],
                               stderr=subprocess.PIPE, text=True)
    try:
        assert waiting.stderr is not None
        line = waiting.stderr.readline()
        assert "failOnInitError is false" in line and "absent.json" in line
        assert waiting.poll() is None  # still waiting
        waiting.send_signal(signal.SIGTERM)
        assert waiting.wait(timeout=10) == 0
    finally:
        waiting.kill()


async def test_sighup_reload_and_sigterm_cleanup(short_tmp: Path, kubelet: Any) -> None:
    SimulatedBackend.create(short_tmp / "node.json", gpus="4xA100-SXM4-80GB")
    config = short_tmp / "config.yaml"
    config.write_text(yaml.safe_dump(time_slicing(2)))
    process = await asyncio.create_subprocess_exec(
        *CLI, "device-plugin", "--config", str(config), "--gpu-backend", f"sim:{short_tmp / 'node.json'}",
        "--kubelet-socket", str(kubelet.socket), "--relist-interval", "0.1", "--cdi-dir", str(short_tmp / "cdi"),
        stderr=asyncio.subprocess.DEVNULL,
    )
    try:
        await kubelet.wait_for_devices("nvidia.com/gpu", 8, healthy=8, timeout=15)
        assert (short_tmp / "nvidia-gpu.sock").exists()
        # same size and mtime: only SIGHUP can make the plugin notice the new replica count
        before = config.stat()
        config.write_text(yaml.safe_dump(time_slicing(4)))
        os.utime(config, ns=(before.st_atime_ns, before.st_mtime_ns))
        process.send_signal(signal.SIGHUP)
        await kubelet.wait_for_devices("nvidia.com/gpu", 16, healthy=16, timeout=10)
        assert len(kubelet.registrations) == 1  # the server kept running; its stream got the new list
        process.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(process.wait(), 10) == 0
        assert not (short_tmp / "nvidia-gpu.sock").exists()
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()


def test_mps_control_daemon_records_limits_on_sim(short_tmp: Path) -> None:
    SimulatedBackend.create(short_tmp / "node.json", gpus="2xA100-SXM4-80GB")
    config = short_tmp / "mps.yaml"
    config.write_text(yaml.safe_dump({"version": "v1", "flags": {"mpsRoot": str(short_tmp / "mps")},
                                      "sharing": {"mps": {"resources": [{"name": "nvidia.com/gpu", "replicas": 3}]}}}))
    result = run_cli("mps-control-daemon", "--config", str(config), "--gpu-backend",
                     f"sim:{short_tmp / 'node.json'}", "--oneshot")
    assert result.returncode == 0, result.stderr
    recorded = json.loads((short_tmp / "mps" / "kubegpu-mps-limits.json").read_text())
    [daemon] = recorded["daemons"]
    assert daemon["resource"] == "nvidia.com/gpu"
    assert daemon["pipeDirectory"] == f"{short_tmp}/mps/nvidia.com/gpu/pipe"
    assert daemon["commands"] == [
        "set_default_active_thread_percentage 33",
        "set_default_device_pinned_mem_limit 0 27306M",
        "set_default_device_pinned_mem_limit 1 27306M",
    ]
    assert run_cli("mps-control-daemon", "--gpu-backend", f"sim:{short_tmp / 'node.json'}",
                   "--oneshot").returncode == 1


def test_mps_control_daemon_refuses_what_the_plugin_refuses(short_tmp: Path) -> None:
    node = SimulatedBackend.create(short_tmp / "node.json", gpus="2xH100-SXM5-80GB")
    node.set_mig_mode(1, True)  # Hopper: takes effect without a reset
    assert node.devices()[1].mig_enabled
    config = short_tmp / "mps.yaml"
    config.write_text(yaml.safe_dump({"version": "v1", "flags": {"mpsRoot": str(short_tmp / "mps")},
                                      "sharing": {"mps": {"resources": [{"name": "nvidia.com/gpu", "replicas": 3}]}}}))
    result = run_cli("mps-control-daemon", "--config", str(config), "--gpu-backend",
                     f"sim:{short_tmp / 'node.json'}", "--oneshot")
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 1 and len(lines) == 1, result.stderr
    assert lines[0].startswith(f"error: {config}: sharing.mps:") and "GPU 1 has MIG enabled" in lines[0]
    assert not (short_tmp / "mps" / "kubegpu-mps-limits.json").exists()
