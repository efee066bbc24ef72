"""`kubegpu gpu-guard` on the command line: its flags, and bad input as one error line."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from kubegpu.cli import COMMAND_COMPONENTS, app, modules_for

runner = CliRunner()


def test_the_command_loads_only_its_own_component() -> None:
    assert COMMAND_COMPONENTS["gpu-guard"] == "kubegpu.guard.cli"
    assert modules_for(["gpu-guard", "--action", "warn"]) == ("kubegpu.guard.cli",)
    shown = runner.invoke(app, ["gpu-guard", "--help"], env={"COLUMNS": "250", "TERMINAL_WIDTH": "250"})
    assert shown.exit_code == 0
    for flag in ("--action", "--grace", "--reserve", "--interval", "--gpu-backend", "--pod-resources-socket",
                 "--proc-root", "--metrics-address", "--config-file"):
        assert flag in shown.output, flag


def test_bad_flags_are_one_line(tmp_path: Path) -> None:
    cases = [
        (["--action", "nuke"], 2, "--action"),
        (["--reserve", "lots"], 1, "--reserve"),
        (["--reserve", "-1Gi"], 1, "--reserve: must not be negative"),
        (["--gpu-backend", f"sim:{tmp_path / 'none.json'}"], 1, "not found"),
        (["--gpu-backend", "sim:x", "--config-file", str(tmp_path / "none.yaml")], 1, "none.yaml"),
    ]
    for args, code, words in cases:
        result = runner.invoke(app, ["gpu-guard", *args])
        assert result.exit_code == code, (args, result.output)
        lines = result.output.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: ") and words in lines[0], (args, result.output)
