"""The one command-line contract every `kubegpu` command follows, as the option helpers that build it.

- `-o/--output` is the output FORMAT and nothing else: `json`, `yaml` and, where a table makes sense, `table`
  (`output_option`, printed by `emit`). Files and directories an option writes get long names: `--output-file`,
  `--output-dir` (`output_file_option`, `output_dir_option`).
- Durations are Go-style (`500ms`, `60s`, `2m`, `1h30m`); a bare number keeps the option's old unit (seconds,
  milliseconds or hours), so existing command lines and manifests keep working (`duration_option`).
- A bad value of any option exits 2 with one line naming the option: the helpers check at parse time and raise
  click's BadParameter; a check that can only run in the command body raises `OptionError`.
- One name for each repeated flag (`--oneshot`, `--cdi-root`, `--batch-max-duration` / `--batch-idle-duration`);
  an older spelling stays accepted as a hidden alias registered with `legacy_alias`, which `kubegpu.cli` rewrites
  before parsing, so help shows one name and old command lines still run.
- Help text: a sentence starting with a capital letter and ending with a full stop.

`tests/cli/test_contract.py` walks every command and checks all of this, so a new command is held to it as soon as
it registers.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import typer
import yaml

from kubegpu.clock import parse_go_duration
from kubegpu.errors import ConfigError

FORMATS = ("json", "yaml", "table")
UNIT_SECONDS = {"ms": 1e-3, "s": 1.0, "h": 3600.0}
_UNIT_WORDS = {"ms": "milliseconds", "s": "seconds", "h": "hours"}


class OptionError(ConfigError):
    """A command-line option's value is bad in a way only the command body can tell; the CLI exits 2 (usage), as
    for a value the parser refuses. The message starts with the option's name."""


# --- -o/--output: the output format ---------------------------------------------------------------------------------

def output_option(default: str, formats: Sequence[str] = ("json", "yaml"), help: str | None = None) -> Any:
    """`-o/--output FORMAT`; `formats` always holds json and yaml, plus `table` where a table makes sense."""
    if not {"json", "yaml"} <= set(formats) or not set(formats) <= set(FORMATS) or default not in formats:
        raise ValueError(f"output formats must include json and yaml, within {FORMATS}; got {formats}")
    allowed = tuple(formats)

    def check(value: str) -> str:
        if value not in allowed:
            raise typer.BadParameter(f"{value!r} is not one of {', '.join(allowed)}", param_hint="-o/--output")
        return value

    check.output_formats = allowed  # type: ignore[attr-defined]  # read by the contract test
    return typer.Option(default, "-o", "--output", callback=check, metavar="FORMAT",
                        help=help or f"Output format: {' | '.join(allowed)}.")


def emit(data: Any, output: str, table: Callable[[], None] | None = None, documents: bool = False) -> None:
    """Print `data` as `output` says: JSON (indented), YAML (a multi-document stream when `documents`), or the
    command's own table."""
    if output == "table" and table is not None:
        table()
    elif output == "yaml":
        if documents:
            typer.echo(yaml.safe_dump_all(list(data), sort_keys=False), nl=False)
        else:
            typer.echo(yaml.safe_dump(data, sort_keys=False), nl=False)
    else:
        typer.echo(json.dumps(data, indent=2))


def output_file_option(default: Path | str | None = None, help: str = "Write the output to this file.",
                       envvar: str | None = None, required: bool = False) -> Any:
    """`--output-file PATH` (string-typed where `-` means standard output)."""
    return typer.Option(... if required else default, "--output-file", envvar=envvar, help=help, metavar="PATH")


def output_dir_option(default: Path | None = None, help: str = "Write the output files to this directory.",
                      envvar: str | None = None) -> Any:
    """`--output-dir DIR`."""
    return typer.Option(default, "--output-dir", envvar=envvar, help=help, metavar="DIR")


# --- durations ------------------------------------------------------------------------------------------------------

class Duration:
    """Parses a duration flag: Go-style (`500ms`, `2m`, `1h30m`) or a bare number in the option's old `unit`; the
    value handed to the command is a float in that unit, so command bodies keep their arithmetic."""

    def __init__(self, unit: str = "s", minimum: float | None = 0.0, positive: bool = False) -> None:
        if unit not in UNIT_SECONDS:
            raise ValueError(f"unit must be one of {sorted(UNIT_SECONDS)}")
        self.unit = unit
        self.minimum = minimum
        self.positive = positive

    def __call__(self, value: Any) -> float:
        if isinstance(value, bool):
            raise typer.BadParameter(f"expected a duration such as 500ms, 60s or 2m, got {value!r}")
        if isinstance(value, int | float):
            number = float(value)
        else:
            text = str(value).strip()
            try:
                number = float(text)
            except ValueError:
                try:
                    number = parse_go_duration(text) / UNIT_SECONDS[self.unit]
                except ValueError:
                    raise typer.BadParameter(f"expected a duration such as 500ms, 60s, 2m or 1h30m (a bare number "
                                             f"is {_UNIT_WORDS[self.unit]}), got {text!r}") from None
        if not math.isfinite(number):
            raise typer.BadParameter(f"expected a finite duration, got {value!r}")
        if self.positive and number <= 0:
            raise typer.BadParameter(f"must be more than 0, got {value!r}")
        if self.minimum is not None and number < self.minimum:
            raise typer.BadParameter(f"must be at least {self.minimum:g} {_UNIT_WORDS[self.unit]}, got {value!r}")
        return number


def duration_option(default: float | None, *names: str, unit: str = "s", minimum: float | None = 0.0,
                    positive: bool = False, help: str, envvar: str | None = None, hidden: bool = False) -> Any:
    """A duration flag (see `Duration`); `help` says what it is, the unit note is added here."""
    suffix = f" Go duration (500ms, 60s, 2m) or {_UNIT_WORDS[unit]}."
    return typer.Option(default, *names, parser=Duration(unit, minimum, positive), envvar=envvar, hidden=hidden,
                        metavar="DURATION", help=help.rstrip() + suffix)


# --- choices and checked values ---------------------------------------------------------------------------------------

def choice_option(default: Any, choices: Sequence[str], *names: str, help: str, envvar: str | None = None,
                  hidden: bool = False) -> Any:
    """A string flag that takes one of `choices`; anything else exits 2 naming the flag (None: not given)."""
    allowed = tuple(choices)

    def check(value: str | None) -> str | None:
        if value is not None and value not in allowed:
            raise typer.BadParameter(f"{value!r} is not one of {', '.join(allowed)}")
        return value

    check.choices = allowed  # type: ignore[attr-defined]
    return typer.Option(default, *names, callback=check, envvar=envvar, hidden=hidden, help=help)


def checked_option(default: Any, *names: str, check: Callable[[Any], Any], help: str, envvar: str | None = None,
                   hidden: bool = False, metavar: str | None = None) -> Any:
    """A flag whose value `check` validates at parse time (a ConfigError or ValueError from it exits 2 naming the
    flag); `check` returns the value to use."""

    def callback(value: Any) -> Any:
        if value is None:
            return value
        try:
            return check(value)
        except (ConfigError, ValueError) as exc:
            message = str(exc)
            for name in names:  # the flag is named by click already
                message = message.removeprefix(f"{name}: ")
            raise typer.BadParameter(message) from None

    return typer.Option(default, *names, callback=callback, envvar=envvar, hidden=hidden, help=help, metavar=metavar)


def metrics_address_option(default: str | None, help: str = "HOST:PORT to serve /metrics on (empty: off).",
                           envvar: str | None = None) -> Any:
    """`--metrics-address HOST:PORT`, checked when parsed (empty: off)."""

    def check(value: str) -> str:
        if value:
            # imported here: kubegpu.endpoints brings in aiohttp, a quarter of a second every command (`kubegpu
            # plan` included) would pay for an option most never use
            from kubegpu.endpoints import parse_listen_address

            parse_listen_address(value, "--metrics-address")
        return value

    return checked_option(default, "--metrics-address", check=check, help=help, envvar=envvar, metavar="HOST:PORT")


def cdi_root_option(default: Path = Path("/var/run/cdi"), envvar: str | None = None,
                    help: str = "Directory where CDI specs are written.") -> Any:
    """`--cdi-root DIR`, the NVIDIA DRA driver's spelling (`--cdi-dir` is a hidden alias where a command had it)."""
    return typer.Option(default, "--cdi-root", envvar=envvar, help=help, metavar="DIR")


def _log_level(value: str) -> str:
    if value.upper() not in ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"):
        raise ValueError(f"{value!r} is not one of debug, info, warning, error, critical")
    return value


def log_level_option(default: str = "info") -> Any:
    """`--log-level`: debug, info, warning, error or critical (any case)."""
    return checked_option(default, "--log-level", check=_log_level, metavar="LEVEL",
                          help="Log level: debug, info, warning, error or critical.")


def oneshot_option(help: str = "Run one pass and exit.") -> Any:
    """`--oneshot`, GFD's and NVIDIA's spelling (`--once` is a hidden alias where a command had it)."""
    return typer.Option(False, "--oneshot", help=help)


# --- hidden aliases for older spellings ------------------------------------------------------------------------------

_ALIASES: dict[str, dict[str, str]] = {}


def legacy_alias(command: str, old: str, new: str) -> None:
    """Accept `old` (e.g. `--once`, `-o`) as `new` on `command` ("partitioner", "mig-parted export"), unshown."""
    _ALIASES.setdefault(command, {})[old] = new


def legacy_aliases() -> Mapping[str, Mapping[str, str]]:
    return _ALIASES


def rewrite_legacy(command: str, args: Sequence[str]) -> list[str]:
    """`args` of `command` with each older spelling replaced by the current one (`--old=v`, `-oVALUE` too); stops
    at `--`, after which everything is a positional argument."""
    aliases = _ALIASES.get(command)
    if not aliases:
        return list(args)
    out: list[str] = []
    for index, arg in enumerate(args):
        if arg == "--":
            return out + list(args[index:])
        name, eq, value = arg.partition("=")
        if name in aliases and arg.startswith("-"):
            out.append(aliases[name] + eq + value)
            continue
        short = next((old for old in aliases if len(old) == 2 and old[0] == "-" and old[1] != "-"
                      and arg.startswith(old) and not arg.startswith("--") and len(arg) > 2), None)
        if short is not None:
            out.extend([aliases[short], arg[2:]])
            continue
        out.append(arg)
    return out
