from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from kubegpu.clock import VirtualClock
from kubegpu.errors import ConfigError, KubegpuError, NotFoundError
from kubegpu.gpu.backend import BackendUnavailable, GpuBackend, GpuBackendError, open_backend
from kubegpu.gpu.simulated import SimulatedBackend, parse_gpu_spec


def test_gpu_spec_parsing() -> None:
    assert [m.key for m in parse_gpu_spec("2xH100-SXM5-80GB,1xL4")] == ["H100-SXM5-80GB"] * 2 + ["L4"]
    assert [m.key for m in parse_gpu_spec("T4")] == ["T4"]
    with pytest.raises(NotFoundError, match=r"'V100'.*A100-SXM4-80GB"):
        parse_gpu_spec("8xV100")
    with pytest.raises(ConfigError, match="at least 1"):
        parse_gpu_spec("0xL4")
    with pytest.raises(ConfigError, match="names no GPUs"):
        parse_gpu_spec(" , ")


def test_uuids_are_deterministic_per_node_name() -> None:
    first = SimulatedBackend(None, gpus="2xL4", node_name="a").devices()
    again = SimulatedBackend(None, gpus="2xL4", node_name="a").devices()
    other = SimulatedBackend(None, gpus="2xL4", node_name="b").devices()
    assert [d.uuid for d in first] == [d.uuid for d in again]
    assert not {d.uuid for d in first} & {d.uuid for d in other}


def test_hopper_toggles_mig_at_once_and_non_mig_gpus_refuse() -> None:
    backend = SimulatedBackend(None, gpus="1xH100-SXM5-80GB,1xL4")
    assert backend.set_mig_mode(0, True) is False
    assert backend.devices()[0].mig_enabled
    assert backend.create_mig_device(0, 0, 0).multiprocessors == 132
    with pytest.raises(GpuBackendError, match="not MIG-capable"):
        backend.set_mig_mode(1, True)
    assert not backend.devices()[1].mig_capable


def test_reboot_applies_pending_modes_and_drops_mig_devices() -> None:
    backend = SimulatedBackend(None, gpus="2xA100-SXM4-80GB")
    backend.set_mig_mode(0, True)
    backend.reset_gpu(0)
    backend.create_mig_device(0, 0, 0)
    backend.set_mig_mode(1, True)
    backend.add_process(1, 7, 100)
    with pytest.raises(GpuBackendError, match="in use by process"):
        backend.reset_gpu(1)
    boot = backend.boot_id()
    backend.reboot()
    assert [d.mig_enabled for d in backend.devices()] == [True, True]
    assert backend.mig_devices(0) == []
    assert backend.processes(1) == []
    assert backend.boot_id() != boot  # what was recorded in the earlier boot is known to be stale


def test_boot_count_is_checked_and_optional(tmp_path: Path) -> None:
    path = tmp_path / "node.json"
    SimulatedBackend.create(path, gpus="1xL4").reboot()
    state = json.loads(path.read_text())
    assert state["boots"] == 1
    del state["sha256"], state["boots"]  # a hand-written file from before the field: first boot
    path.write_text(json.dumps(state))
    assert SimulatedBackend(path).boot_id().endswith("/boot-0")
    state["boots"] = "two"
    path.write_text(json.dumps(state))
    with pytest.raises(ConfigError, match=r"boots: must be an integer, got \"two\""):
        SimulatedBackend(path).boot_id()


def test_pending_disable_can_be_cancelled() -> None:
    backend = SimulatedBackend(None, gpus="1xA100-SXM4-40GB")
    assert backend.set_mig_mode(0, True) is True
    assert backend.set_mig_mode(0, False) is False  # back to the current mode: nothing pending
    assert not backend.devices()[0].mig_pending


def test_load_drives_power_energy_and_mig_utilization() -> None:
    clock = VirtualClock(0.0)
    backend = SimulatedBackend(None, gpus="1xA100-SXM4-80GB", clock=clock)
    idle = backend.sample(0)
    backend.set_load(0, 100.0, 4096)
    busy = backend.sample(0)
    assert busy.power_w > idle.power_w and busy.temperature_c > idle.temperature_c
    assert busy.sm_clock_mhz > idle.sm_clock_mhz
    clock.advance(10.0)
    assert backend.sample(0).energy_mj == pytest.approx(busy.power_w * 10 * 1000, rel=1e-6)
    backend.set_load(0, 0.0, 0, power_w=50.0)
    clock.advance(2.0)
    assert backend.sample(0).energy_mj == pytest.approx(busy.power_w * 10 * 1000 + 50.0 * 2 * 1000, rel=1e-6)
    backend.set_mig_mode(0, True)
    backend.reset_gpu(0)
    seven = backend.create_mig_device(0, 0, 0)
    backend.set_load(0, 60.0, 1000, gi_id=seven.gi_id)
    assert backend.sample(0, seven.gi_id).graphics_engine_active == pytest.approx(0.6)
    assert backend.sample(0).gpu_util == pytest.approx(60.0)
    with pytest.raises(GpuBackendError, match=r"outside 0\.\.100"):
        backend.set_load(0, 150.0, 0)


def test_xid_log_is_bounded() -> None:
    backend = SimulatedBackend(None, gpus="1xL4")
    for _ in range(1005):
        backend.inject_xid(0, 31)
    assert len(backend.xid_events(-1.0)) == 1000


def test_file_state_is_shared_between_backends(tmp_path: Path) -> None:
    path = tmp_path / "node.json"
    writer = SimulatedBackend.create(path, gpus="2xA100-SXM4-80GB", node_name="n1")
    reader = SimulatedBackend(path)
    before = reader.generation()
    writer.set_mig_mode(0, True)
    writer.reset_gpu(0)
    made = writer.create_mig_device(0, 9, 0)
    assert reader.mig_devices(0)[0].uuid == made.uuid
    assert reader.generation() == before + 3
    assert reader.node_name == "n1"
    assert json.loads(path.read_text())["kind"] == "kubegpu-sim-node"


def test_a_refused_change_leaves_the_file_untouched(tmp_path: Path) -> None:
    path = tmp_path / "node.json"
    backend = SimulatedBackend.create(path, gpus="1xA100-SXM4-80GB")
    text = path.read_text()
    with pytest.raises(GpuBackendError):
        backend.create_mig_device(0, 9, 4)  # MIG not enabled
    assert path.read_text() == text


def test_bad_node_files_are_one_line_errors(tmp_path: Path) -> None:
    with pytest.raises(BackendUnavailable, match="not found; create it with"):
        SimulatedBackend(tmp_path / "missing.json")
    broken = tmp_path / "broken.json"
    broken.write_text("{not json")
    with pytest.raises(ConfigError, match=r"broken\.json:1:2: invalid JSON"):
        SimulatedBackend(broken).devices()
    wrong = tmp_path / "wrong.json"
    wrong.write_text(json.dumps({"kind": "something-else"}))
    with pytest.raises(ConfigError, match="not a kubegpu simulated node file"):
        SimulatedBackend(wrong).devices()
    bad_model = tmp_path / "model.json"
    state = SimulatedBackend(None, gpus="1xL4").snapshot()
    state["gpus"][0]["model"] = "V100"
    bad_model.write_text(json.dumps(state))
    with pytest.raises(ConfigError, match=r"gpus\[0\]\.model: unknown GPU model 'V100'"):
        SimulatedBackend(bad_model).devices()
    with pytest.raises(KubegpuError, match="needs gpus"):
        SimulatedBackend(None)


def _edited_node(tmp_path: Path, edit: str) -> Path:
    """A node file with one MIG device, one process and one XID event, then `edit` applied (`path=json` or `-path`)."""
    backend = SimulatedBackend(None, gpus="1xH100-SXM5-80GB")
    backend.set_mig_mode(0, True)
    device = backend.create_mig_device(0, 9, 4)
    backend.add_process(0, 4242, 100, gi_id=device.gi_id)
    backend.inject_xid(0, 79)
    state = backend.snapshot()
    where, _, value = edit.lstrip("-").partition("=")
    *parents, last = [int(part) if part.isdigit() else part for part in where.split(".")]
    holder = state
    for part in parents:
        holder = holder[part]
    if edit.startswith("-"):
        del holder[last]
    else:
        holder[last] = json.loads(value)
    path = tmp_path / "node.json"
    path.write_text(json.dumps(state))
    return path


@pytest.mark.parametrize(("edit", "message"), [
    ("-driver_version", "node.json: driver_version: must be a string, got null"),
    ("cuda_driver_version=\"12.4\"", "node.json: cuda_driver_version: must be a list, got \"12.4\""),
    ("cuda_driver_version=[12]", "node.json: cuda_driver_version: must be [major, minor], got [12]"),
    ("-gpus.0.uuid", "node.json: gpus[0].uuid: required field is missing"),
    ("gpus.0.mig_enabled=1", "node.json: gpus[0].mig_enabled: must be true or false, got 1"),
    ("gpus.0.load.gpu_util=true", "node.json: gpus[0].load.gpu_util: must be a number, got true"),
    ("gpus.0.load.power_w=\"hot\"", "node.json: gpus[0].load.power_w: must be a number or null, got \"hot\""),
    ("-gpus.0.mig_devices.0.start", "node.json: gpus[0].mig_devices[0].start: required field is missing"),
    ("gpus.0.mig_devices.0.load=[]", "node.json: gpus[0].mig_devices[0].load: must be an object, got []"),
    ("gpus.0.processes.0=7", "node.json: gpus[0].processes[0]: must be an object"),
    ("xid_events.0.xid=\"79\"", "node.json: xid_events[0].xid: must be an integer, got \"79\""),
    ("gpus.0.minor_number=\"0\"", "node.json: gpus[0].minor_number: must be an integer, got \"0\""),
    ("gpus.0.minor_number=-1", "node.json: gpus[0].minor_number: must not be negative, got -1"),
])
def test_a_hand_edited_node_file_names_the_field(tmp_path: Path, edit: str, message: str) -> None:
    path = _edited_node(tmp_path, edit)
    with pytest.raises(ConfigError) as caught:  # not a KeyError or TypeError from deep inside an operation
        SimulatedBackend(path).devices()
    assert str(caught.value) == f"{path.parent}/{message}"


def test_open_backend_specs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "node.json"
    SimulatedBackend.create(path, gpus="1xT4")
    backend = open_backend(f"sim:{path}")
    assert isinstance(backend, GpuBackend)
    assert backend.devices()[0].product_name == "Tesla T4"
    for bad in ["cuda", "sim:", "sim", "nvml:x", ""]:
        with pytest.raises(KubegpuError, match="unknown GPU backend"):
            open_backend(bad)
    from tests.fakes.fake_pynvml import FakeNvml

    monkeypatch.setitem(sys.modules, "pynvml", FakeNvml(library_present=False))
    with pytest.raises(BackendUnavailable, match=r"^NVML library not found: "):
        open_backend("nvml")


WRITER = textwrap.dedent("""
    import sys
    from kubegpu.gpu.simulated import SimulatedBackend
    backend = SimulatedBackend(sys.argv[1])
    base = int(sys.argv[2])
    for k in range(40):
        backend.add_process(k % 4, base + k, 10)
        backend.inject_xid(k % 4, 13)
""")


def test_two_processes_writing_at_once_do_not_corrupt_the_file(tmp_path: Path) -> None:
    path = tmp_path / "node.json"
    SimulatedBackend.create(path, gpus="4xA100-SXM4-80GB")
    writers = [subprocess.Popen([sys.executable, "-c", WRITER, str(path), str(base)]) for base in (1000, 2000)]
    assert [w.wait(timeout=60) for w in writers] == [0, 0]
    backend = SimulatedBackend(path)
    pids = sorted(p.pid for i in range(4) for p in backend.processes(i))
    assert pids == list(range(1000, 1040)) + list(range(2000, 2040))  # no lost update
    assert len(backend.xid_events(-1.0)) == 80
    assert backend.generation() == 160


# ---------------------------------------------------------------------------------------------- minor numbers


def test_minor_numbers_default_to_the_index_and_edited_ones_are_reported(tmp_path: Path) -> None:
    path = tmp_path / "node.json"
    backend = SimulatedBackend.create(path, gpus="4xA100-SXM4-80GB")
    assert [(d.index, d.minor_number) for d in backend.devices()] == [(0, 0), (1, 1), (2, 2), (3, 3)]
    state = json.loads(path.read_text())
    del state["sha256"]  # a hand edit drops the checksum (docs: kubegpu.gpu.simstate); a stale one reads as corrupt
    for gpu, minor in zip(state["gpus"], (2, 3, 0, 1), strict=True):
        gpu["minor_number"] = minor  # a host that probes the second PCI switch first
    path.write_text(json.dumps(state))
    assert [(d.index, d.device_minor) for d in SimulatedBackend(path).devices()] == [(0, 2), (1, 3), (2, 0), (3, 1)]


def test_a_node_file_written_before_minor_numbers_still_loads(tmp_path: Path) -> None:
    path = tmp_path / "old.json"
    state = SimulatedBackend(None, gpus="2xL4").snapshot()
    for gpu in state["gpus"]:
        del gpu["minor_number"]
    path.write_text(json.dumps(state))
    backend = SimulatedBackend(path)
    assert [(d.minor_number, d.device_minor) for d in backend.devices()] == [(0, 0), (1, 1)]
    backend.set_load(1, 50.0, 100)  # and it can still be changed
    assert backend.sample(1).gpu_util == 50.0


def test_two_gpus_with_one_minor_number_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "node.json"
    state = SimulatedBackend(None, gpus="3xL4").snapshot()
    state["gpus"][2]["minor_number"] = 0
    path.write_text(json.dumps(state))
    with pytest.raises(ConfigError) as caught:
        SimulatedBackend(path).devices()
    assert str(caught.value) == f"{path}: gpus[2].minor_number: 0 is already GPU 0's minor number"


# ---------------------------------------------------------------------------------------------- processes


def test_processes_are_checked_like_the_driver_would() -> None:
    backend = SimulatedBackend(None, gpus="1xA100-SXM4-80GB,1xH100-SXM5-80GB")
    backend.set_mig_mode(1, True)
    device = backend.create_mig_device(1, 19, 0)  # 1g.12gb on H100-80GB
    with pytest.raises(GpuBackendError, match="pid 0: must be a positive process id"):
        backend.add_process(0, 0, 10)
    with pytest.raises(GpuBackendError, match="used memory -5 MiB must not be negative"):
        backend.add_process(0, 7, -5)
    with pytest.raises(GpuBackendError, match=f"has MIG enabled, so a process runs in a GPU instance; name one of "
                                              f"GPU instances {device.gi_id}$"):
        backend.add_process(1, 7, 10)
    with pytest.raises(GpuBackendError, match="has no GPU instance 9"):
        backend.add_process(1, 7, 10, gi_id=9)
    with pytest.raises(GpuBackendError, match=r"pid 7: 81921 MiB does not fit on GPU 0 .*: 81920 of 81920 MiB free$"):
        backend.add_process(0, 7, 81921)
    backend.add_process(1, 7, device.memory_mib - 100, gi_id=device.gi_id)
    with pytest.raises(GpuBackendError, match=f"pid 8: 101 MiB does not fit on GPU instance {device.gi_id} on GPU 1 "
                                              f".*: 100 of {device.memory_mib} MiB free"):
        backend.add_process(1, 8, 101, gi_id=device.gi_id)
    backend.add_process(1, 7, 1000, gi_id=device.gi_id, name="train")  # the same pid replaces its entry
    assert [(p.pid, p.gi_id, p.used_memory_mib, p.name) for p in backend.processes(1)] == [
        (7, device.gi_id, 1000, "train")]
    assert backend.processes(0) == []  # nothing refused above was recorded


def test_removing_an_unknown_process_is_an_error() -> None:
    backend = SimulatedBackend(None, gpus="1xL4")
    backend.add_process(0, 11, 10)
    with pytest.raises(GpuBackendError, match=r"no process 12 on GPU 0 \(NVIDIA L4\) \(running: 11\)"):
        backend.remove_process(0, 12)
    backend.remove_process(0, 11)
    assert backend.processes(0) == []
    with pytest.raises(GpuBackendError, match="running: none"):
        backend.remove_process(0, 11)
