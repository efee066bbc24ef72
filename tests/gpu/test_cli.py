from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import typer
from typer.testing import CliRunner

from kubegpu.errors import KubegpuError
from kubegpu.gpu.cli import register
from kubegpu.gpu.simulated import SimulatedBackend

runner = CliRunner()


def _app() -> typer.Typer:
    app = typer.Typer()
    register(app)

    @app.callback()
    def root() -> None:
        """Keeps sim-node a sub-command group even when it is the only one."""

    return app


def test_create_inject_show(tmp_path: Path) -> None:
    app = _app()
    node = tmp_path / "node.json"
    created = runner.invoke(app, ["sim-node", "create", "--gpus", "4xH100-SXM5-80GB,4xL4", "--output-file", str(node),
                                  "--node-name", "gpu-node-1"])
    assert created.exit_code == 0, created.output
    assert "8 GPUs (4xH100-SXM5-80GB, 4xL4)" in created.output
    state = json.loads(node.read_text())
    assert state["node_name"] == "gpu-node-1"
    assert [g["model"] for g in state["gpus"]] == ["H100-SXM5-80GB"] * 4 + ["L4"] * 4

    injected = runner.invoke(app, ["sim-node", "inject-xid", str(node), "--gpu", "0", "--xid", "79"])
    assert injected.exit_code == 0, injected.output
    assert [(e.gpu_index, e.xid) for e in SimulatedBackend(node).xid_events(-1.0)] == [(0, 79)]

    loaded = runner.invoke(app, ["sim-node", "set-load", str(node), "--gpu", "5", "--util", "75",
                                 "--memory-mib", "900"])
    assert loaded.exit_code == 0, loaded.output
    reading = SimulatedBackend(node).sample(5)
    assert (reading.gpu_util, reading.memory_used_mib) == (75.0, 900)
    out_of_range = runner.invoke(app, ["sim-node", "set-load", str(node), "--gpu", "5", "--util", "130"])
    assert out_of_range.exit_code == 2  # typer's usage error: one line, no traceback

    backend = SimulatedBackend(node)
    backend.set_mig_mode(0, True)
    backend.create_mig_device(0, 9, 4)
    shown = runner.invoke(app, ["sim-node", "show", str(node)])
    assert shown.exit_code == 0, shown.output
    assert "gpu-node-1" in shown.output
    assert "3g.40gb" in shown.output and "4:4" in shown.output  # the MIG device and its placement
    assert "79" in shown.output  # the XID event
    assert shown.output.count("L4") >= 4


def test_errors_are_kubegpu_errors(tmp_path: Path) -> None:
    app = _app()
    bad_model = runner.invoke(app, ["sim-node", "create", "--gpus", "8xV100",
                                    "--output-file", str(tmp_path / "n.json")])
    assert isinstance(bad_model.exception, KubegpuError)
    assert "V100" in str(bad_model.exception) and "A100-SXM4-80GB" in str(bad_model.exception)
    missing = runner.invoke(app, ["sim-node", "show", str(tmp_path / "none.json")])
    assert isinstance(missing.exception, KubegpuError)
    SimulatedBackend.create(tmp_path / "n.json", gpus="1xL4")
    bad_gpu = runner.invoke(app, ["sim-node", "inject-xid", str(tmp_path / "n.json"), "--gpu", "3", "--xid", "79"])
    assert isinstance(bad_gpu.exception, KubegpuError)
    assert "no GPU 3" in str(bad_gpu.exception)


def _kubegpu() -> list[str]:
    script = shutil.which("kubegpu", path=str(Path(sys.executable).parent))
    return [script] if script else [sys.executable, "-c", "from kubegpu.cli import main; main()"]


def test_real_subprocess_round_trip(tmp_path: Path) -> None:
    node = tmp_path / "node.json"
    # --out: the older spelling README and scripts use, still accepted (a hidden alias of --output-file)
    ok = subprocess.run([*_kubegpu(), "sim-node", "create", "--gpus", "8xA100-SXM4-80GB", "--out", str(node)],
                        capture_output=True, text=True, timeout=60)
    assert ok.returncode == 0, ok.stderr
    assert len(SimulatedBackend(node).devices()) == 8
    bad = subprocess.run([*_kubegpu(), "sim-node", "create", "--gpus", "2xA200", "--output-file", str(node)],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 1
    assert bad.stderr.strip().startswith("error: unknown GPU model 'A200'; known: A100-SXM4-40GB")
    assert len(bad.stderr.strip().splitlines()) == 1  # one line, no traceback
    assert len(SimulatedBackend(node).devices()) == 8  # the existing node file is left alone


def test_create_into_a_directory_or_unwritable_place_is_one_line(tmp_path: Path) -> None:
    app = _app()
    into_dir = runner.invoke(app, ["sim-node", "create", "--gpus", "1xL4", "--output-file", str(tmp_path)])
    assert isinstance(into_dir.exception, KubegpuError)
    assert "is a directory" in str(into_dir.exception)
    blocker = tmp_path / "plain-file"
    blocker.write_text("")
    under_file = runner.invoke(app, ["sim-node", "create", "--gpus", "1xL4",
                                     "--output-file", str(blocker / "node.json")])
    assert isinstance(under_file.exception, KubegpuError)  # an OSError, not a traceback or a 30 s lock wait
    assert f"cannot write simulated node file {blocker / 'node.json'}" in str(under_file.exception)


def test_node_name_must_be_a_kubernetes_node_name(tmp_path: Path) -> None:
    app = _app()
    for bad in ("", "GPU_Node", "-node"):
        result = runner.invoke(app, ["sim-node", "create", "--gpus", "1xL4", "--output-file", str(tmp_path / "n.json"),
                                     "--node-name", bad])
        assert isinstance(result.exception, KubegpuError)
        assert str(result.exception).startswith(f"--node-name {bad!r}: must be a Kubernetes node name")
        assert not (tmp_path / "n.json").exists()


# ---------------------------------------------------------------------------------------------- add/remove-process


def _one_error_line(output: str, *words: str) -> str:
    lines = output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), output
    for word in words:
        assert word in lines[0], (word, lines[0])
    return lines[0]


def _layout(node: Path) -> list[tuple[int, int, int]]:
    return [(m.gi_id, m.profile_id, m.start) for m in SimulatedBackend(node).mig_devices(0)]


def test_an_instance_in_use_from_the_shell_stops_mig_parted(tmp_path: Path) -> None:
    from kubegpu.cli import app  # every component: the sim-node and mig-parted commands together, as a user runs them

    node = tmp_path / "node.json"
    backend = SimulatedBackend.create(node, gpus="1xA100-SXM4-80GB")
    mig_parted = ["mig-parted", "apply", "--gpu-backend", f"sim:{node}", "-c"]
    assert runner.invoke(app, [*mig_parted, "all-balanced"]).exit_code == 0
    big = next(m for m in backend.mig_devices(0) if m.profile_name == "3g.40gb")
    added = runner.invoke(app, ["sim-node", "add-process", str(node), "--gpu", "0", "--pid", "4242",
                                "--memory-mib", "1000", "--gi", str(big.gi_id), "--name", "train.py"])
    assert added.exit_code == 0, added.output
    assert f"process 4242 (train.py) runs on GPU 0 GI {big.gi_id} holding 1000 MiB" in added.output
    assert [(p.pid, p.gi_id, p.used_memory_mib) for p in backend.processes(0)] == [(4242, big.gi_id, 1000)]
    shown = runner.invoke(app, ["sim-node", "show", str(node)])
    assert "Processes" in shown.output and "train.py" in shown.output
    before = _layout(node)

    refused = runner.invoke(app, [*mig_parted, "all-1g.10gb"])
    assert refused.exit_code == 1
    _one_error_line(refused.output, "GPU 0: MIG device 3g.40gb", "pid 4242 (train.py)", "--force")
    assert _layout(node) == before
    # --force passes mig-parted's own check, but the driver still will not destroy an instance a process runs in
    # (NVML answers IN_USE): the sim says so in one line and the in-use instance stays
    forced = runner.invoke(app, [*mig_parted, "all-1g.10gb", "--force"])
    assert forced.exit_code == 1
    _one_error_line(forced.output, f"GPU instance {big.gi_id}", "in use by process(es) 4242")
    assert (big.gi_id, big.profile_id, big.start) in _layout(node)

    removed = runner.invoke(app, ["sim-node", "remove-process", str(node), "--gpu", "0", "--pid", "4242"])
    assert removed.exit_code == 0, removed.output
    assert backend.processes(0) == []
    applied = runner.invoke(app, [*mig_parted, "all-1g.10gb"])
    assert applied.exit_code == 0, applied.output
    assert sorted(m.profile_name for m in backend.mig_devices(0)) == ["1g.10gb"] * 7


def test_force_goes_through_a_whole_gpu_process_on_hopper(tmp_path: Path) -> None:
    from kubegpu.cli import app

    node = tmp_path / "node.json"
    backend = SimulatedBackend.create(node, gpus="1xH100-SXM5-80GB")
    added = runner.invoke(app, ["sim-node", "add-process", str(node), "--gpu", "0", "--pid", "7",
                                "--memory-mib", "500"])
    assert added.exit_code == 0, added.output
    assert "process 7 (python) runs on GPU 0 holding 500 MiB" in added.output
    mig_parted = ["mig-parted", "apply", "--gpu-backend", f"sim:{node}", "-c", "all-balanced"]
    refused = runner.invoke(app, mig_parted)
    assert refused.exit_code == 1
    _one_error_line(refused.output, "pid 7 (python) is using the GPU; not changing its MIG mode (use --force)")
    assert not backend.devices()[0].mig_enabled
    forced = runner.invoke(app, [*mig_parted, "--force"])
    assert forced.exit_code == 0, forced.output
    assert backend.devices()[0].mig_enabled and backend.mig_devices(0)


def test_bad_gpu_gi_and_pid_are_one_line(tmp_path: Path) -> None:
    from kubegpu.cli import app

    node = tmp_path / "node.json"
    backend = SimulatedBackend.create(node, gpus="2xA100-SXM4-80GB")
    backend.set_mig_mode(1, True)
    backend.reset_gpu(1)
    gi = backend.create_mig_device(1, 19, 0).gi_id
    add = ["sim-node", "add-process", str(node), "--memory-mib", "100"]
    text = node.read_text()
    cases = [
        ([*add, "--gpu", "5", "--pid", "1"], "no GPU 5"),
        ([*add, "--gpu", "0", "--pid", "1", "--gi", "3"], "has no GPU instance 3"),
        ([*add, "--gpu", "1", "--pid", "1"], f"has MIG enabled, so a process runs in a GPU instance; name one of "
                                             f"GPU instances {gi}"),
        ([*add, "--gpu", "0", "--pid", "-4"], "pid -4: must be a positive process id"),
        (["sim-node", "add-process", str(node), "--gpu", "0", "--pid", "1", "--memory-mib", "90000"],
         "pid 1: 90000 MiB does not fit on GPU 0"),
        (["sim-node", "remove-process", str(node), "--gpu", "0", "--pid", "4242"], "no process 4242 on GPU 0"),
        (["sim-node", "remove-process", str(tmp_path / "none.json"), "--gpu", "0", "--pid", "1"], "not found"),
    ]
    for args, words in cases:
        result = runner.invoke(app, args)
        assert result.exit_code == 1, (args, result.output)
        _one_error_line(result.output, words)
    assert node.read_text() == text  # nothing refused was written


def test_reboot_clears_instances_and_processes_and_changes_the_boot(tmp_path: Path) -> None:
    node = tmp_path / "node.json"
    backend = SimulatedBackend.create(node, gpus="1xH100-SXM5-80GB", node_name="gpu-a")
    backend.set_mig_mode(0, True)
    made = backend.create_mig_device(0, 19, 0)
    backend.add_process(0, 7, 100, gi_id=made.gi_id)
    boot = backend.boot_id()
    result = runner.invoke(_app(), ["sim-node", "reboot", str(node)])
    assert result.exit_code == 0, result.output
    assert result.output == f"node gpu-a rebooted (boot {backend.boot_id()})\n" and backend.boot_id() != boot
    assert backend.mig_devices(0) == [] and backend.processes(0) == []
    assert backend.devices()[0].mig_enabled  # the mode itself persists
    missing = runner.invoke(_app(), ["sim-node", "reboot", str(tmp_path / "none.json")])
    assert missing.exit_code != 0 and isinstance(missing.exception, KubegpuError)


def test_set_process_memory_plays_a_leak(tmp_path: Path) -> None:
    from kubegpu.cli import app

    node = tmp_path / "node.json"
    backend = SimulatedBackend.create(node, gpus="2xA100-SXM4-80GB")
    backend.add_process(1, 31337, 1000, name="leaky.py")
    backend.add_process(1, 7, 40000)
    grown = runner.invoke(app, ["sim-node", "set-process-memory", str(node), "--pid", "31337", "--memory-mib", "30000"])
    assert grown.exit_code == 0, grown.output
    assert "process 31337 on GPU 1 now holds 30000 MiB" in grown.output
    assert [(p.pid, p.used_memory_mib, p.name) for p in backend.processes(1)] == [(7, 40000, "python"),
                                                                                  (31337, 30000, "leaky.py")]
    assert backend.sample(1).memory_free_mib == 81920 - 70000
    text = node.read_text()
    for args, words in [
        (["--pid", "31337", "--memory-mib", "50000"], "pid 31337: 50000 MiB does not fit on GPU 1"),
        (["--pid", "99", "--memory-mib", "10"], "no process 99 on node sim-node (running: 7, 31337)"),
    ]:
        result = runner.invoke(app, ["sim-node", "set-process-memory", str(node), *args])
        assert result.exit_code == 1, result.output
        _one_error_line(result.output, words)
    assert node.read_text() == text
