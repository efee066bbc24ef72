"""The MPS control daemon follows its (per-node) config: re-plans on a switch, stops for a config without MPS,
keeps running daemons through an invalid config, and leaves nothing under the MPS root when it stops."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import yaml

from kubegpu.config.deviceplugin import check_mps_against_gpus, effective_device_plugin_config
from kubegpu.deviceplugin.mpsdaemon import MpsDaemons
from kubegpu.gpu.simulated import SimulatedBackend
from kubegpu.sharing.mps_control import LIMITS_FILE


def mps(root: Path, replicas: int) -> dict[str, Any]:
    return {"version": "v1", "flags": {"mpsRoot": str(root)},
            "sharing": {"mps": {"resources": [{"name": "nvidia.com/gpu", "replicas": replicas}]}}}


def point(link: Path, target: Path) -> None:
    tmp = link.with_name(".tmp-link")
    os.symlink(target, tmp)
    os.replace(tmp, link)


def commands(root: Path) -> list[str]:
    [daemon] = json.loads((root / LIMITS_FILE).read_text())["daemons"]
    return list(daemon["commands"])


def wait_for(condition: Any, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.02)
    raise AssertionError("condition not met in time")


def test_daemons_follow_the_config_file(short_tmp: Path) -> None:
    backend = SimulatedBackend.create(short_tmp / "node.json", gpus="2xA100-SXM4-80GB")
    root = short_tmp / "mps"
    files = {"mps-2": mps(root, 2), "mps-4": mps(root, 4), "whole": {"version": "v1"},
             "bad": {"version": "v1", "flags": {"migStrategy": "sideways"}}}
    for name, data in files.items():
        (short_tmp / name).write_text(yaml.safe_dump(data))
    link = short_tmp / "config.yaml"
    point(link, short_tmp / "mps-2")

    def load() -> Any:
        config = effective_device_plugin_config(link, {}, {})
        check_mps_against_gpus(config, backend.devices(), str(link))
        return config

    daemons = MpsDaemons(backend, load, binary=None)
    assert daemons.apply() is True and daemons.apply() is False  # same plan twice: nothing restarts
    assert commands(root)[0] == "set_default_active_thread_percentage 50"
    stop, reload = threading.Event(), threading.Event()
    follower = threading.Thread(target=daemons.follow, args=(link, stop, reload), kwargs={"poll": 0.05})
    follower.start()
    try:
        point(link, short_tmp / "mps-4")
        wait_for(lambda: (root / LIMITS_FILE).exists() and
                 commands(root)[0] == "set_default_active_thread_percentage 25")
        point(link, short_tmp / "bad")  # invalid: logged, the running daemons stay
        time.sleep(0.3)
        assert commands(root)[0] == "set_default_active_thread_percentage 25"
        point(link, short_tmp / "whole")  # no MPS any more: daemons stop, the record goes
        wait_for(lambda: daemons.running is None and not (root / LIMITS_FILE).exists())
        point(link, short_tmp / "mps-2")
        wait_for(lambda: (root / LIMITS_FILE).exists())
    finally:
        stop.set()
        follower.join(5)
    assert not (root / LIMITS_FILE).exists()  # stopping takes the record with it


def test_cli_waits_for_an_mps_config_and_cleans_up_on_sigterm(short_tmp: Path) -> None:
    """The DaemonSet's command line: started on a node whose config has no MPS yet, it waits instead of failing."""
    SimulatedBackend.create(short_tmp / "node.json", gpus="2xA100-SXM4-80GB")
    root = short_tmp / "mps"
    (short_tmp / "whole").write_text("version: v1\n")
    (short_tmp / "mps").mkdir()
    (short_tmp / "mps-3").write_text(yaml.safe_dump(mps(root, 3)))
    link = short_tmp / "config.yaml"
    point(link, short_tmp / "whole")
    process = subprocess.Popen([sys.executable, "-m", "kubegpu", "mps-control-daemon", "--config-file", str(link),
                                "--gpu-backend", f"sim:{short_tmp / 'node.json'}"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        time.sleep(1.5)
        assert process.poll() is None
        point(link, short_tmp / "mps-3")
        wait_for(lambda: (root / LIMITS_FILE).exists(), timeout=10)
        assert commands(root)[0] == "set_default_active_thread_percentage 33"
        process.send_signal(signal.SIGTERM)
        assert process.wait(10) == 0
        assert not (root / LIMITS_FILE).exists()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
