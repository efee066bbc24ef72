"""The `kubegpu` command: one sub-command per component.

Each component owns `kubegpu/<component>/cli.py` with a `register(app)` function, so components add their
commands without editing this file's logic, and a bad input anywhere ends as one `error:` line.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Iterable, Sequence
from typing import Any

import typer
from typer.core import TyperGroup

from kubegpu.cliopts import OptionError, rewrite_legacy
from kubegpu.errors import KubegpuError

COMPONENT_CLIS = (
    "kubegpu.sim.cli",
    "kubegpu.gpu.cli",
    "kubegpu.config.cli",
    "kubegpu.deviceplugin.cli",
    "kubegpu.discovery.cli",
    "kubegpu.migmanager.cli",
    "kubegpu.partitioner.cli",
    "kubegpu.partitionagent.cli",
    "kubegpu.autoscaler.cli",
    "kubegpu.exporter.cli",
    "kubegpu.operator.cli",
    "kubegpu.validate.cli",
    "kubegpu.dra.cli",
    "kubegpu.quota.cli",
    "kubegpu.guard.cli",
    "kubegpu.configmanager.cli",
    "kubegpu.placement.cli",
    "kubegpu.sim.trace.cli",
)

# click's base error class (typer vendors click, so it is reached through a public subclass rather than imported)
_ClickException: type[Exception] = next(c for c in typer.BadParameter.__mro__ if c.__name__ == "ClickException")


class _OneLineErrors(TyperGroup):
    """Bad input anywhere ends as one `error:` line — exit status 1 for bad files and what they hold, 2 for a
    malformed command line (a wrong flag, or a bad value of any option) — in the real command and under CliRunner
    alike. The contract every command's options follow is `kubegpu.cliopts`."""

    def resolve_command(self, ctx: Any, args: list[str]) -> Any:
        """Older spellings of a command's flags (hidden aliases, `kubegpu.cliopts.legacy_alias`) become the current
        ones before the command parses them."""
        name, command, rest = super().resolve_command(ctx, args)
        path = name or ""
        if command is not None and hasattr(command, "commands"):  # a group: the first word is its sub-command
            sub = next((arg for arg in rest if not arg.startswith("-")), None)
            path = f"{name} {sub}" if sub else path
        return name, command, rewrite_legacy(path, rest)

    def invoke(self, ctx: Any) -> Any:  # typer vendors click; its Context type is private
        try:
            return super().invoke(ctx)
        except KubegpuError as exc:
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(2 if isinstance(exc, OptionError) else 1) from None
        except _ClickException as exc:
            command = getattr(getattr(exc, "ctx", None), "command_path", None) or "kubegpu"
            message = " ".join(exc.format_message().split())  # type: ignore[attr-defined]
            typer.echo(f"error: {command}: {message} (see '{command} --help')", err=True)
            raise typer.Exit(getattr(exc, "exit_code", 2)) from None


COMMAND_COMPONENTS = {
    "simulate": "kubegpu.sim.cli",
    "sim-node": "kubegpu.gpu.cli",
    "device-plugin": "kubegpu.deviceplugin.cli",
    "mps-control-daemon": "kubegpu.deviceplugin.cli",
    "config-manager": "kubegpu.configmanager.cli",
    "discover": "kubegpu.discovery.cli",
    "mig-parted": "kubegpu.migmanager.cli",
    "mig-manager": "kubegpu.migmanager.cli",
    "plan": "kubegpu.partitioner.cli",
    "partitioner": "kubegpu.partitioner.cli",
    "partition-agent": "kubegpu.partitionagent.cli",
    "provision": "kubegpu.autoscaler.cli",
    "autoscaler": "kubegpu.autoscaler.cli",
    "exporter": "kubegpu.exporter.cli",
    "operator": "kubegpu.operator.cli",
    "validate": "kubegpu.validate.cli",
    "dra": "kubegpu.dra.cli",
    "dra-driver": "kubegpu.dra.cli",
    "quota": "kubegpu.quota.cli",
    "gpu-guard": "kubegpu.guard.cli",
    "place": "kubegpu.placement.cli",
    "trace": "kubegpu.sim.trace.cli",
}
"""Which component owns each command. `validate-config` is not here: every component registers its file kinds, so it
needs them all."""


def _root() -> None:
    """Shareable, fully used GPUs in Kubernetes — and a simulator that shows what sharing does."""


def build_app(modules: Iterable[str] = COMPONENT_CLIS) -> typer.Typer:
    application = typer.Typer(
        cls=_OneLineErrors,
        name="kubegpu",
        help="Shareable, fully used GPUs in Kubernetes — and a simulator that shows what sharing does.",
        no_args_is_help=True,
        pretty_exceptions_enable=False,
        add_completion=False,
    )
    # a callback keeps this a group even with one component loaded (typer runs a lone command without its name)
    application.callback()(_root)
    for module_name in modules:
        importlib.import_module(module_name).register(application)
    return application


def modules_for(argv: Sequence[str]) -> tuple[str, ...]:
    """A node agent imports only its own component: the exporter and device plugin stay small in memory (no
    simulator, no numpy), and start faster. Anything else — help, validate-config, a typo — gets every component."""
    command = next((arg for arg in argv if not arg.startswith("-")), None)
    module = COMMAND_COMPONENTS.get(command or "")
    return (module,) if module is not None else COMPONENT_CLIS


_full_app: typer.Typer | None = None


def __getattr__(name: str) -> Any:
    """`kubegpu.cli.app`, every component registered, built on first use (tests and `--help` use it)."""
    global _full_app
    if name == "app":
        if _full_app is None:
            _full_app = build_app()
        return _full_app
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def main() -> None:
    try:
        build_app(modules_for(sys.argv[1:]))()
    except KubegpuError as exc:
        typer.echo(f"error: {exc}", err=True)
        sys.exit(2 if isinstance(exc, OptionError) else 1)
