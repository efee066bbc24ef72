"""`kubegpu simulate` end to end: the table, --json, --report, overrides and one-line errors."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from kubegpu.cli import app, main

TINY = {
    "name": "tiny cli",
    "cluster": {"nodeGroups": [{"name": "a100", "count": 1, "gpuModel": "A100-SXM4-80GB", "gpusPerNode": 2,
                                "pricePerHour": 8.0}]},
    "workload": {"classes": [
        {"name": "infer", "arrivalsPerHour": 6, "memoryGiB": [12, 18], "compute": [0.2, 0.4], "runtime": ["10m", "1h"]},
        {"name": "ci", "arrivalsPerHour": 12, "memoryGiB": [1, 4], "compute": 0.2, "runtime": "5m"},
    ]},
    "strategies": ["exclusive", "time-slicing:2", "static-mig:all-balanced"],
    "duration": "3h",
    "sampleInterval": "10m",
}


@pytest.fixture
def scenario_file(tmp_path: Path) -> Path:
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(TINY))
    return path


def run_main(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    """Through `kubegpu.cli.main`, which turns a KubegpuError into `error: ...` and exit status 1."""
    old = sys.argv
    sys.argv = ["kubegpu", *args]
    try:
        with pytest.raises(SystemExit) as exit_info:
            main()
    finally:
        sys.argv = old
    return int(exit_info.value.code or 0), capsys.readouterr().err


def test_simulate_prints_a_table_and_writes_json_and_report(scenario_file: Path, tmp_path: Path) -> None:
    out_json, out_html = tmp_path / "r.json", tmp_path / "r.html"
    result = CliRunner().invoke(app, ["simulate", "--scenario", str(scenario_file), "--json", str(out_json),
                                      "--report", str(out_html)], terminal_width=160)
    assert result.exit_code == 0, result.output
    for text in ("tiny cli", "exclusive", "time-slicing:", "static-mig:", "all-balanced", "GPU alloc",
                 "Pending p95", "$/useful GPU-h", "most useful work:", "shortest waits:"):
        assert text in result.output
    data = json.loads(out_json.read_text())
    assert [s["strategy"] for s in data["strategies"]] == TINY["strategies"]
    first = data["strategies"][0]
    for key in ("allocation_pct", "compute_util_pct", "memory_util_pct", "pods_completed", "oom_kills",
                "pending_p50_s", "pending_p95_s", "pending_max_s", "jct_p50_s", "jct_p95_s", "cost",
                "cost_per_useful_gpu_hour", "samples", "classes"):
        assert key in first
    assert first["cost"] == pytest.approx(8.0 * 3)
    assert len(first["samples"]) == 3 * 6 + 1
    costs = [sample["cost"] for sample in first["samples"]]
    assert costs[0] == 0 and costs == sorted(costs) and costs[-1] == pytest.approx(first["cost"])
    assert {sample["nodes"] for sample in first["samples"]} == {1}  # the tiny cluster: one fixed node
    page = out_html.read_text()
    assert page.startswith("<!DOCTYPE html>")
    assert page.count("data:image/png;base64,") == 5
    assert "Cluster size and cost" in page
    assert "<script" not in page and "http" not in page.split("<main>")[1].split("docs/simulator.md")[0]


def test_overrides_pick_strategies_seed_and_duration(scenario_file: Path, tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    result = CliRunner().invoke(app, ["simulate", "--scenario", str(scenario_file), "--strategies",
                                      "time-slicing:3", "--seed", "9", "--duration", "1", "--json", str(out)])
    assert result.exit_code == 0, result.output
    data = json.loads(out.read_text())
    assert data["seed"] == 9 and data["durationHours"] == 1.0
    assert [s["strategy"] for s in data["strategies"]] == ["time-slicing:3"]


def test_default_scenario_runs_end_to_end(tmp_path: Path) -> None:
    out = tmp_path / "d.json"
    result = CliRunner().invoke(app, ["simulate", "--duration", "2", "--json", str(out)], terminal_width=200)
    assert result.exit_code == 0, result.output
    data = json.loads(out.read_text())
    assert data["gpus"] == 64
    assert {"exclusive", "time-slicing:4", "static-mig:all-balanced"} <= {s["strategy"] for s in data["strategies"]}
    assert all(s["pods_completed"] > 0 for s in data["strategies"])


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--strategies", "magic"], "error: --strategies: unknown strategy 'magic'"),
        (["--duration", "-1"], "Invalid value for '--duration': must be more than 0"),
        (["--duration", "soon"], "Invalid value for '--duration': expected a duration such as 500ms"),
        (["--strategies", ","], "error: --strategies: give at least one strategy"),
        (["--strategies", "static-mig:all-balanced@h100"],
         "error: --strategies: strategy static-mig:all-balanced@h100: no node group 'h100' in the scenario; its node "
         "groups: a100"),
        (["--strategies", "exclusive,static-mig:all-nope"],
         "error: --strategies: strategy static-mig:all-nope: no mig-parted config 'all-nope' for A100-SXM4-80GB"),
    ],
)
def test_bad_arguments_are_one_line_errors(
    args: list[str], message: str, scenario_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, err = run_main(["simulate", "--scenario", str(scenario_file), *args], capsys)
    assert code == 2
    assert err.startswith("error: ") and message in err
    assert err.count("\n") == 1


def test_a_bad_layout_is_refused_before_any_strategy_runs(scenario_file: Path) -> None:
    result = CliRunner().invoke(app, ["simulate", "--scenario", str(scenario_file),
                                      "--strategies", "exclusive,static-mig:all-nope"], terminal_width=200)
    assert result.exit_code == 2
    assert "no mig-parted config 'all-nope'" in result.stderr
    assert "exclusive" not in result.stdout  # no progress bar, no table: nothing ran


def test_bad_scenario_file_is_a_one_line_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = yaml.safe_load(yaml.safe_dump(TINY))
    bad["cluster"]["nodeGroups"][0]["gpuModel"] = "X"
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(bad))
    code, err = run_main(["simulate", "--scenario", str(path)], capsys)
    assert code == 1
    assert err == "error: bad.yaml: cluster.nodeGroups[0].gpuModel: unknown GPU model 'X'\n"


def test_unwritable_report_path_is_a_one_line_error(scenario_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, err = run_main(["simulate", "--scenario", str(scenario_file), "--duration", "0.5",
                          "--json", "/nonexistent-dir/r.json"], capsys)
    assert code == 1
    assert err == ("error: --json-file /nonexistent-dir/r.json: cannot write: directory /nonexistent-dir does not "
                   "exist\n")  # --json: the older spelling, still accepted


def test_validate_config_knows_scenario_files(scenario_file: Path, tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    code, _ = run_main(["validate-config", str(scenario_file)], capsys)
    assert code == 0
    bad = yaml.safe_load(scenario_file.read_text())
    bad["duration"] = "soon"
    broken = tmp_path / "broken.yaml"
    broken.write_text(yaml.safe_dump(bad))
    code, err = run_main(["validate-config", str(broken)], capsys)
    assert code == 1
    assert err.startswith(f"error: {broken}: duration: expected a duration")


@pytest.mark.parametrize("command", ["validate-config", "simulate"])
@pytest.mark.parametrize(("strategy", "message"), [
    ("static-mig:all-nope", "strategies[1]: strategy static-mig:all-nope: no mig-parted config 'all-nope'"),
    ("time-slicing:1", "strategies[1]: strategy time-slicing:1: replicas must be a whole number from 2 to 48"),
    ("static-mig:all-balanced@h100", "strategies[1]: strategy static-mig:all-balanced@h100: no node group 'h100'"),
])
def test_a_bad_strategy_in_a_scenario_file_names_the_entry(
    command: str, strategy: str, message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump({**TINY, "strategies": ["exclusive", strategy]}))
    args = [command, str(path)] if command == "validate-config" else [command, "--scenario", str(path)]
    code, err = run_main(args, capsys)
    assert code == 1
    assert err.startswith(f"error: {path}: {message}")
    assert err.count("\n") == 1


def test_shipped_trace_example_runs(tmp_path: Path) -> None:
    from importlib import resources

    example = Path(str(resources.files("kubegpu.sim").joinpath("scenarios/trace-example.yaml")))
    out = tmp_path / "t.json"
    result = CliRunner().invoke(app, ["simulate", "--scenario", str(example), "--json", str(out)])
    assert result.exit_code == 0, result.output
    data = json.loads(out.read_text())
    assert data["jobs"] == 14
    assert all(s["jobs_arrived"] == 14 for s in data["strategies"])
