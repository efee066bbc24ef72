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


def test_config_shares_follow_a_config_switch(tmp_path: Path) -> None:
    """Devices with no share record are judged by the config the node runs now: the config manager re-points the
    link, and the next round reads the new file."""
    import yaml

    from kubegpu.gpu.simulated import SimulatedBackend
    from kubegpu.guard.cli import _config_shares

    backend = SimulatedBackend.create(tmp_path / "node.json", gpus="1xA100-SXM4-80GB")
    for replicas in (2, 4):
        (tmp_path / f"ts-{replicas}").write_text(yaml.safe_dump({"version": "v1", "sharing": {"timeSlicing": {
            "resources": [{"name": "nvidia.com/gpu", "replicas": replicas}]}}}))
    link = tmp_path / "config.yaml"
    link.symlink_to(tmp_path / "ts-2")
    shares_for = _config_shares(link, None)
    assert {s.share_mib for s in shares_for(backend.devices(), []).values()} == {40960}
    link.unlink()
    link.symlink_to(tmp_path / "ts-4")
    assert {s.share_mib for s in shares_for(backend.devices(), []).values()} == {20480}
