"""The `kubegpu` command: one sub-command per component.

Each component owns `kubegpu/<component>/cli.py` with a `register(app)` function, so components add their
commands without editing this file's logic, and a bad input anywhere ends as one `error:` line.
"""

from __future__ import annotations

import importlib
import sys
from typing import Any

import typer
from typer.core import TyperGroup

from kubegpu.errors import KubegpuError

COMPONENT_CLIS = (
    "kubegpu.sim.cli",
    "kubegpu.gpu.cli",
    "kubegpu.config.cli",
    "kubegpu.deviceplugin.cli",
    "kubegpu.discovery.cli",
    "kubegpu.migmanager.cli",
    "kubegpu.partitioner.cli",
    "kubegpu.autoscaler.cli",
    "kubegpu.exporter.cli",
)

# click's base error class (typer vendors click, so it is reached through a public subclass rather than imported)
_ClickException: type[Exception] = next(c for c in typer.BadParameter.__mro__ if c.__name__ == "ClickException")


class _OneLineErrors(TyperGroup):
    """Bad input anywhere ends as one `error:` line — exit status 1 for bad files and values, 2 for a malformed
    command line (a wrong flag or value type) — in the real command and under CliRunner alike."""

    def invoke(self, ctx: Any) -> Any:  # typer vendors click; its Context type is private
        try:
            return super().invoke(ctx)
        except KubegpuError as exc:
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(1) from None
        except _ClickException as exc:
            command = getattr(getattr(exc, "ctx", None), "command_path", None) or "kubegpu"
            message = " ".join(exc.format_message().split())  # type: ignore[attr-defined]
            typer.echo(f"error: {command}: {message} (see '{command} --help')", err=True)
            raise typer.Exit(getattr(exc, "exit_code", 2)) from None


app = typer.Typer(
    cls=_OneLineErrors,
    name="kubegpu",
    help="Shareable, fully used GPUs in Kubernetes — and a simulator that shows what sharing does.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)


def _register_components() -> None:
    for module_name in COMPONENT_CLIS:
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:  # pragma: no cover - only while a component is being written
            if exc.name and module_name.startswith(exc.name):
                continue
            raise
        module.register(app)


_register_components()


def main() -> None:
    try:
        app()
    except KubegpuError as exc:
        typer.echo(f"error: {exc}", err=True)
        sys.exit(1)
