"""Outputs are replaced atomically: a failure while writing leaves the old file whole (issue #18, in-place writes).

Before the durable writer, `mig-parted export -o`, `generate-config -o` and `simulate --json` truncated the target
first, so a failure (or a kill) mid-write left an empty file — an empty MIG config that could then be applied.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kubegpu.cli import app
from kubegpu.deviceplugin.mps import MpsControl
from kubegpu.gpu.simulated import SimulatedBackend


def _failing_fsync(fd: int) -> None:
    raise OSError(28, "No space left on device")


@pytest.mark.parametrize("command", [["mig-parted", "export"], ["mig-parted", "generate-config"]])
def test_mig_parted_output_survives_a_failed_write(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                   command: list[str]) -> None:
    node = tmp_path / "node.json"
    SimulatedBackend.create(node, gpus="1xA100-SXM4-80GB")
    target = tmp_path / "config.yaml"
    target.write_text("version: v1\nmig-configs: {previous: []}\n")
    monkeypatch.setattr(os, "fsync", _failing_fsync)
    result = CliRunner().invoke(app, [*command, "--gpu-backend", f"sim:{node}", "-o", str(target)])
    assert result.exit_code == 1
    assert "No space left on device" in result.output and result.output.count("\n") == 1
    assert target.read_text() == "version: v1\nmig-configs: {previous: []}\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.yaml", "node.json", "node.json.lock"]


def test_mig_parted_export_writes_the_file(tmp_path: Path) -> None:
    node = tmp_path / "node.json"
    SimulatedBackend.create(node, gpus="1xA100-SXM4-80GB")
    target = tmp_path / "config.yaml"
    result = CliRunner().invoke(app, ["mig-parted", "export", "--gpu-backend", f"sim:{node}", "-o", str(target)])
    assert result.exit_code == 0, result.output
    assert "mig-configs" in target.read_text()


def test_simulate_json_survives_a_failed_write(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "result.json"
    target.write_text('{"previous": true}\n')
    monkeypatch.setattr(os, "fsync", _failing_fsync)
    result = CliRunner().invoke(app, ["simulate", "--duration", "2", "--json", str(target)], terminal_width=200)
    assert result.exit_code == 1 and "No space left on device" in result.output
    assert target.read_text() == '{"previous": true}\n'
    assert [p.name for p in tmp_path.iterdir()] == ["result.json"]


def test_mps_limits_writers_do_not_share_a_temp_file(tmp_path: Path) -> None:
    """Two writers used to race on one fixed `limits.tmp`: one renamed the other's file away mid-write."""
    control = MpsControl(tmp_path, None)
    errors: list[BaseException] = []

    def write() -> None:
        for _ in range(100):
            try:
                control.record([])
            except BaseException as exc:
                errors.append(exc)

    threads = [threading.Thread(target=write) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert [p.name for p in tmp_path.iterdir()] == ["kubegpu-mps-limits.json"]
