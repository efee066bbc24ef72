"""`kubegpu exporter` as a real process, with every flag the issue names: it serves attributed metrics, warns once
about a counter it cannot collect, and stops cleanly on SIGTERM."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from kubegpu.gpu.simulated import SimulatedBackend
from tests.fakes.fake_podresources import FakePodResources


def wait_for_port(process: subprocess.Popen[str], seen: list[str]) -> int:
    """The port comes from the exporter's own start-up line (it listens on port 0); earlier lines go to `seen`."""
    assert process.stderr is not None
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        line = process.stderr.readline()
        found = re.search(r"serving metrics on http://127\.0\.0\.1:(\d+)/metrics", line)
        if found:
            return int(found.group(1))
        seen.append(line)
        assert line or process.poll() is None, "the exporter exited before serving"
    raise AssertionError("the exporter did not start serving")


def test_exporter_command_end_to_end(tmp_path: Path) -> None:
    node_file = tmp_path / "node.json"
    node = SimulatedBackend.create(node_file, gpus="1xL4")
    node.set_load(0, 55.0, 1000)
    uuid = node.devices()[0].uuid
    counters = tmp_path / "counters.csv"
    counters.write_text(
        "# mine\nDCGM_FI_DEV_GPU_UTIL, gauge, GPU utilization (in %).\nDCGM_FI_DEV_NOT_A_FIELD, gauge, nope\n"
        "DCGM_FI_DRIVER_VERSION, label, Driver Version\n"
    )
    sock = tmp_path / "kubelet.sock"
    pods = [("ml", "a", "c", "nvidia.com/gpu.shared", [f"{uuid}::0"]),
            ("ml", "b", "c", "nvidia.com/gpu.shared", [f"{uuid}::1"])]
    command = [sys.executable, "-m", "kubegpu", "exporter", "--gpu-backend", f"sim:{node_file}",
               "--address", "127.0.0.1:0", "--collectors", str(counters), "--collect-interval", "200",
               "--kubernetes", "--pod-resources-kubelet-socket", str(sock), "--no-hostname"]
    with FakePodResources(sock, pods):
        startup: list[str] = []
        process = subprocess.Popen(command, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
        try:
            port = wait_for_port(process, startup)
            body = ""
            deadline = time.monotonic() + 10
            while 'pod="b"' not in body and time.monotonic() < deadline:
                time.sleep(0.1)
                body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics").read().decode()
        finally:
            process.send_signal(signal.SIGTERM)
            _, stderr = process.communicate(timeout=10)
    util = next(f for f in text_string_to_metric_families(body) if f.name == "DCGM_FI_DEV_GPU_UTIL")
    assert sorted((s.labels["pod"], s.labels["vgpu"], s.value) for s in util.samples) == [("a", "0", 55.0),
                                                                                          ("b", "1", 55.0)]
    assert all("Hostname" not in s.labels and "DCGM_FI_DRIVER_VERSION" in s.labels for s in util.samples)
    assert {f.name for f in text_string_to_metric_families(body) if f.name.startswith("DCGM_")} == {
        "DCGM_FI_DEV_GPU_UTIL"
    }
    warnings = [line for line in startup if "WARNING" in line]
    assert len(warnings) == 1 and f"{counters}: skipping line 3 (DCGM_FI_DEV_NOT_A_FIELD)" in warnings[0]
    assert process.returncode == 0 and "Traceback" not in stderr
