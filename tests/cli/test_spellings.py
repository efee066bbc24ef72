"""Older spellings still run (hidden aliases), and the formats `-o` gained print what they say."""

from __future__ import annotations

import json
from pathlib import Path

import yaml
from typer.testing import CliRunner

from kubegpu.cli import app
from kubegpu.gpu.simulated import SimulatedBackend

runner = CliRunner()
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _ok(*args: str) -> str:
    result = runner.invoke(app, list(args))
    assert result.exit_code == 0, (args, result.output)
    return result.stdout


def test_plan_prints_json_and_the_same_as_yaml() -> None:
    as_json = json.loads(_ok("plan", "--state", str(EXAMPLES / "plan-state.yaml"), "-o", "json", "--planner",
                             "greedy"))
    as_yaml = yaml.safe_load(_ok("plan", "--state", str(EXAMPLES / "plan-state.yaml"), "--output", "yaml",
                                 "--planner", "greedy"))
    assert as_json == as_yaml and as_json["nodes"]


def test_sim_node_old_out_and_new_output_file_and_show_formats(tmp_path: Path) -> None:
    _ok("sim-node", "create", "--gpus", "1xL4", "--out", str(tmp_path / "old.json"), "--node-name", "old")
    _ok("sim-node", "create", "--gpus", "1xL4", "--output-file", str(tmp_path / "new.json"), "--node-name", "new")
    assert SimulatedBackend(tmp_path / "old.json").devices() and SimulatedBackend(tmp_path / "new.json").devices()
    shown = json.loads(_ok("sim-node", "show", str(tmp_path / "new.json"), "-o", "json"))
    assert shown["node_name"] == "new"
    assert yaml.safe_load(_ok("sim-node", "show", str(tmp_path / "new.json"), "-o", "yaml")) == shown


def test_mig_parted_export_old_dash_o_file_and_new_output_file(tmp_path: Path) -> None:
    node = tmp_path / "node.json"
    SimulatedBackend.create(node, gpus="1xA100-SXM4-80GB")
    backend = f"sim:{node}"
    _ok("mig-parted", "export", "--gpu-backend", backend, "-o", str(tmp_path / "a.yaml"))
    _ok("mig-parted", "export", "--gpu-backend", backend, "--output", str(tmp_path / "b.yaml"))
    _ok("mig-parted", "export", "--gpu-backend", backend, "--output-file", str(tmp_path / "c.yaml"))
    texts = {(tmp_path / name).read_text() for name in ("a.yaml", "b.yaml", "c.yaml")}
    assert len(texts) == 1 and "mig-configs" in texts.pop()


def test_operator_crds_old_dash_o_directory(tmp_path: Path) -> None:
    runner.invoke(app, ["operator", "crds", "-o", str(tmp_path / "old")], catch_exceptions=False)
    _ok("operator", "crds", "--output-dir", str(tmp_path / "new"))
    old = sorted(p.name for p in (tmp_path / "old").iterdir())
    assert old and old == sorted(p.name for p in (tmp_path / "new").iterdir())


def test_discover_old_dash_o_and_gfd_output_file(tmp_path: Path) -> None:
    node = tmp_path / "node.json"
    SimulatedBackend.create(node, gpus="1xL4")
    for flag, name in (("-o", "old"), ("--output-file", "new")):
        _ok("discover", "--gpu-backend", f"sim:{node}", "--oneshot", "--no-timestamp", flag, str(tmp_path / name),
            "--machine-type-file", str(tmp_path / "none"))
    assert (tmp_path / "old").read_text() == (tmp_path / "new").read_text() != ""
