"""`kubegpu place`: a bad policy is one error line naming the choices, before any cluster is contacted."""

from __future__ import annotations

from typer.testing import CliRunner

from kubegpu.cli import build_app


def test_unknown_policy_is_one_line_naming_the_choices() -> None:
    result = CliRunner().invoke(build_app(("kubegpu.placement.cli",)), ["place", "--policy", "nope"])
    assert result.exit_code == 1
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and "placement policy 'nope' is not one of" in lines[0] and "kubegpu" in lines[0]
