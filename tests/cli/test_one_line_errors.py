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
    assert result.exit_code == 1
    assert result.output.strip().splitlines() == [
        "error: unknown strategy 'bogus'; available: autoscaler, dynamic-mig, dynamic-mps, exclusive, mps, "
        "static-mig, time-slicing"
    ]
