"""Every way to get the command line wrong ends in one `error:` line naming the command and the thing at fault."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from kubegpu.cli import app


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["simulate", "--seed", "abc"], "error: kubegpu simulate: Invalid value for '--seed'"),
        (["sim-node", "create", "--bogus"], "error: kubegpu sim-node create: No such option: --bogus"),
        (["nosuch"], "error: kubegpu: No such command 'nosuch'"),
        (["plan"], "error: kubegpu plan: Missing option '--state'"),
    ],
)
def test_malformed_command_lines_are_one_line_with_status_2(args: list[str], expected: str) -> None:
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(expected), result.output


def test_unknown_strategy_fails_before_any_simulation_runs() -> None:
    result = CliRunner().invoke(app, ["simulate", "--strategies", "exclusive,bogus"])
    assert result.exit_code == 2  # a bad value of --strategies: the CLI contract's usage error
    assert result.output.strip().splitlines() == [
        "error: --strategies: unknown strategy 'bogus'; available: autoscaler, dra, dra-dynamic-mig, dra-shared, "
        "dynamic-mig, dynamic-mps, exclusive, mps, static-mig, time-slicing"
    ]


def test_a_node_agent_command_loads_only_its_own_component() -> None:
    """The exporter and device plugin run on every GPU node: they must not carry the simulator or numpy."""
    import subprocess
    import sys

    from kubegpu.cli import COMPONENT_CLIS, modules_for

    assert modules_for(["exporter", "--address", ":9400"]) == ("kubegpu.exporter.cli",)
    assert modules_for(["mig-parted", "apply", "-f", "x"]) == ("kubegpu.migmanager.cli",)
    assert modules_for(["--help"]) == COMPONENT_CLIS
    assert modules_for(["validate-config", "nodepool.yaml"]) == COMPONENT_CLIS  # every component's file kinds
    probe = ("import sys; sys.argv = ['kubegpu', 'exporter', '--help']\n"
             "from kubegpu.cli import main\n"
             "try:\n    main()\nexcept SystemExit:\n    pass\n"
             "print(sorted(m for m in ('kubegpu.sim', 'numpy', 'kubegpu.autoscaler') if m in sys.modules))")
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert "Serve DCGM-compatible GPU metrics" in result.stdout
    assert result.stdout.strip().splitlines()[-1] == "[]"
