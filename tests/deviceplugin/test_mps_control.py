"""The MPS control-daemon adapter (`kubegpu.sharing.mps_control`, re-exported by `kubegpu.deviceplugin.mps`)
against a fake `nvidia-cuda-mps-control`: one daemon per resource in its own directories, its limits sent on
stdin, `quit` to stop, idempotent stops, no unconfigured daemon left behind, record-only without the binary."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from kubegpu.deviceplugin.mps import MpsControl, find_mps_control
from kubegpu.errors import KubegpuError
from kubegpu.sharing.mps import GpuLimits, MpsPlan
from tests.fakes import fake_mps_control


def plan(root: Path, resource: str, threads: int = 50) -> MpsPlan:
    base = root / "mps" / resource
    return MpsPlan(resource, f"{base}/pipe", f"{base}/log",
                   (GpuLimits(0, "GPU-0", 2, 20480, threads), GpuLimits(1, "GPU-1", 2, 20480, threads)))


@pytest.fixture
def control(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> MpsControl:
    binary, _ = fake_mps_control.install(tmp_path / "bin")
    monkeypatch.setenv("PATH", f"{binary.parent}:/usr/bin:/bin")
    assert find_mps_control() == str(binary)
    return MpsControl(tmp_path / "mps", find_mps_control())


def test_daemons_per_resource_get_their_dirs_and_limits(control: MpsControl, tmp_path: Path) -> None:
    plans = [plan(tmp_path, "nvidia.com/gpu"), plan(tmp_path, "nvidia.com/gpu-20gb", threads=25)]
    assert control.start(plans)
    calls = fake_mps_control.invocations(tmp_path / "bin" / "mps-invocations.jsonl")
    assert [(c["args"] or c["stdin"], c["pipe"], c["log"]) for c in calls] == [
        (step, p.pipe_dir, p.log_dir) for p in plans
        for step in (["-d"], *p.commands)
    ]
    assert plans[1].commands[0] == "set_default_active_thread_percentage 25"
    assert all(fake_mps_control.running(p.pipe_dir) for p in plans) and (tmp_path / "mps" / ".ready").exists()
    control.stop(plans)
    control.stop(plans)  # already stopped: logged, not raised
    assert not any(fake_mps_control.running(p.pipe_dir) for p in plans)
    assert not (tmp_path / "mps" / ".ready").exists()


def test_a_daemon_refusing_its_limits_is_stopped_again(control: MpsControl, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_MPS_FAIL", "set_default_device_pinned_mem_limit 1")
    daemon = plan(tmp_path, "nvidia.com/gpu")
    with pytest.raises(KubegpuError, match=r"set_default_device_pinned_mem_limit 1 20480M.*injected failure"):
        control.start_daemon(daemon)
    assert not fake_mps_control.running(daemon.pipe_dir)
    assert fake_mps_control.invocations(tmp_path / "bin" / "mps-invocations.jsonl")[-1]["stdin"] == "quit"


def test_without_the_binary_nothing_runs_and_the_limits_are_recorded(tmp_path: Path) -> None:
    control = MpsControl(tmp_path / "mps", None)
    daemon = plan(tmp_path, "nvidia.com/gpu")
    assert not control.start([daemon]) and not control.start_daemon(daemon)
    control.stop([daemon])
    assert not Path(daemon.pipe_dir).exists()
    recorded = control.record([daemon])
    assert recorded == tmp_path / "mps" / "kubegpu-mps-limits.json"
    assert '"set_default_device_pinned_mem_limit 1 20480M"' in recorded.read_text()


def test_start_neither_waits_on_a_lingering_daemon_nor_starts_a_second(control: MpsControl, tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_MPS_LINGER", "1")
    daemon = plan(tmp_path, "nvidia.com/gpu")
    started = time.monotonic()
    assert control.start_daemon(daemon)
    assert time.monotonic() - started < 2.5  # not held until the daemon's child lets go of its output
    with pytest.raises(KubegpuError, match=r"-d for nvidia\.com/gpu failed: An instance of this daemon is already"):
        control.start_daemon(daemon)
