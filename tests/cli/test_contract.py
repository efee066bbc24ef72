"""The CLI contract (`kubegpu.cliopts`), checked on every command the `kubegpu` app registers.

The walk is over the built app, so a command added later is checked as soon as it registers: `-o/--output` is an
output format and nothing else; files and directories written get long names; duration flags take Go-style values;
a bad value of any option exits 2 with one line naming it, without a traceback; help text has one style; older
spellings are hidden aliases of options that exist.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

import kubegpu.cli as kcli
from kubegpu.cliopts import FORMATS, Duration, legacy_aliases, rewrite_legacy

runner = CliRunner()
GO_DURATIONS = ("500ms", "60s", "2m", "1h30m")
# option names that read like a duration: every one of them must take Go-style values
DURATION_WORDS = re.compile(r"interval|duration|period|delay|timeout|time-limit")
# short flags kept because the upstream tool spells them so (dcgm-exporter, nvidia-mig-parted, GFD)
UPSTREAM_SHORT = {"exporter": {"-a", "-f", "-c", "-k", "-n"}, "mig-parted apply": {"-f", "-c"},
                  "mig-parted assert": {"-f", "-c"}, "operator render": {"-n"}, "operator": {"-n"},
                  "quota explain": {"-f"}}  # kubectl's -f for the object read


def _commands() -> Iterator[tuple[str, Any]]:
    """(path, command) for every command and every group that has options of its own."""
    def walk(command: Any, path: str) -> Iterator[tuple[str, Any]]:
        if path and any(p.param_type_name == "option" and not p.name.endswith("completion") for p in command.params):
            yield path, command
        for name, sub in sorted(getattr(command, "commands", {}).items()):
            yield from walk(sub, f"{path} {name}".strip())

    yield from walk(typer.main.get_command(kcli.app), "")


COMMANDS = dict(_commands())


def _options(command: Any) -> list[Any]:
    return [p for p in command.params if p.param_type_name == "option" and not p.hidden]


def _info(param: Any) -> Any:
    return param.type_descriptor.parameter_info


def test_the_walk_sees_every_command() -> None:
    assert {"plan", "provision", "dra allocate", "autoscaler", "partitioner", "discover", "sim-node create",
            "mig-parted export", "operator render", "exporter", "validate driver"} <= set(COMMANDS)


@pytest.mark.parametrize("path", sorted(COMMANDS))
def test_dash_o_and_output_are_an_output_format(path: str) -> None:
    for param in _options(COMMANDS[path]):
        names = set(param.opts) | set(param.secondary_opts)
        if names & {"-o", "--output"}:
            formats = getattr(_info(param).callback, "output_formats", None)
            assert formats is not None, f"{path} {param.opts}: -o/--output must be cliopts.output_option"
            assert {"json", "yaml"} <= set(formats) <= set(FORMATS)
            assert set(param.opts) == {"-o", "--output"}, f"{path}: -o and --output are one option"


@pytest.mark.parametrize("path", sorted(COMMANDS))
def test_files_and_directories_written_have_long_names(path: str) -> None:
    for param in _options(COMMANDS[path]):
        shorts = {name for name in param.opts if not name.startswith("--")}
        longs = [name for name in param.opts if name.startswith("--")]
        assert longs, f"{path} {param.opts}: every option has a long name"
        if param.bare_type() == "Path" or any(re.search(r"-(file|dir|root|path)$", n) for n in longs):
            assert shorts <= UPSTREAM_SHORT.get(path, set()), f"{path} {param.opts}: a file/dir option is long-only"
        for name in longs:
            if re.match(r"--out(put)?($|-)", name):
                assert name in ("--output", "--output-file", "--output-dir"), f"{path} {name}: --output-file/-dir"


@pytest.mark.parametrize("path", sorted(COMMANDS))
def test_durations_take_go_style_values(path: str) -> None:
    for param in _options(COMMANDS[path]):
        longs = [name for name in param.opts if name.startswith("--")]
        parser = _info(param).parser
        callback = _info(param).callback
        if isinstance(parser, Duration):
            for value in GO_DURATIONS:
                seconds = parser(value) * {"ms": 1e-3, "s": 1.0, "h": 3600.0}[parser.unit]
                assert seconds > 0, (path, param.opts, value)
            assert parser("90") == 90.0  # the old bare-number form in the option's old unit
        elif any(DURATION_WORDS.search(name) for name in longs) and param.bare_type() != "bool":
            assert callback is not None, f"{path} {param.opts}: looks like a duration, use cliopts.duration_option"
            for value in GO_DURATIONS:
                callback(value)  # raises BadParameter when it does not take Go durations


def _bad_values(param: Any) -> list[str]:
    """Values the option must refuse, by what kind of option it is; [] when any string is fine."""
    info = _info(param)
    kind = param.bare_type()
    if isinstance(info.parser, Duration):
        return ["soon", "-5s"]
    if getattr(info.callback, "output_formats", None) or getattr(info.callback, "choices", None):
        return ["no-such-choice"]
    if kind in ("int", "float"):
        return ["many"]
    if param.opts == ["--gpu-backend"] or "--metrics-address" in param.opts or "--address" in param.opts:
        return ["nowhere"]
    return []


CASES = [(path, param.opts[0], value) for path, command in sorted(COMMANDS.items())
         for param in _options(command) if param.bare_type() != "bool" for value in _bad_values(param)]


@pytest.mark.parametrize(("path", "flag", "value"), CASES, ids=[f"{p}:{f}={v}" for p, f, v in CASES])
def test_a_bad_value_exits_2_with_one_line_naming_the_option(path: str, flag: str, value: str) -> None:
    words = path.split()
    args = [*words, flag, value] if words[0] != "operator" or len(words) > 1 else [*words, flag, value, "crds"]
    result = runner.invoke(kcli.app, args)
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert result.exit_code == 2, (args, result.output)
    assert len(lines) == 1 and lines[0].startswith("error: "), (args, result.output)
    assert "Traceback" not in result.output
    param = next(p for p in COMMANDS[path].params if flag in p.opts)
    assert any(name in lines[0] for name in param.opts), (args, lines[0])


@pytest.mark.parametrize("command", ["plan", "provision", "dra allocate"])
def test_a_bad_output_format_names_dash_o_output(command: str) -> None:
    result = runner.invoke(kcli.app, [*command.split(), "-o", "xml"])
    assert result.exit_code == 2
    [line] = [line for line in result.output.splitlines() if line.strip()]
    assert "-o/--output" in line and "'xml'" in line, line


@pytest.mark.parametrize("path", sorted(COMMANDS))
def test_help_text_has_one_style(path: str) -> None:
    for param in _options(COMMANDS[path]):
        text = (param.help or "").strip()
        assert text, f"{path} {param.opts}: every option says what it is"
        assert text[0].isupper() or text[0] in "'-`$" or text.startswith(("kwok", "nvml")) or \
            text.split()[0].isupper(), f"{path} {param.opts}: help starts with a capital: {text!r}"
        assert text.endswith((".", ".)")), f"{path} {param.opts}: help ends with a full stop: {text!r}"


def test_every_hidden_alias_names_an_option_that_exists() -> None:
    aliases = legacy_aliases()
    assert aliases, "the older spellings are registered"
    for path, table in aliases.items():
        command = COMMANDS.get(path) or typer.main.get_command(kcli.app).commands[path]
        names = {name for p in command.params for name in (*p.opts, *p.secondary_opts)}
        for old, new in table.items():
            assert new in names, f"{path}: alias {old} -> {new}, which the command does not have"
            assert old not in names or old in {n for p in command.params if p.hidden for n in p.opts}, \
                f"{path}: {old} is both an alias and a visible option"


def test_rewriting_keeps_values_and_stops_at_double_dash() -> None:
    assert rewrite_legacy("partitioner", ["--once", "--batch-window-idle=0", "--batch-window-timeout", "5"]) == [
        "--oneshot", "--batch-idle-duration=0", "--batch-max-duration", "5"]
    assert rewrite_legacy("discover", ["-o/tmp/x", "-o", "-", "--", "-o"]) == [
        "--output-file", "/tmp/x", "--output-file", "-", "--", "-o"]
    assert rewrite_legacy("plan", ["-o", "json"]) == ["-o", "json"]
