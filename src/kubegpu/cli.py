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


class _OneLineErrors(TyperGroup):
    """Bad input anywhere ends as one `error:` line and exit status 1 — in the real command and under CliRunner."""

    def invoke(self, ctx: Any) -> Any:  # typer vendors click; its Context type is private
        try:
            return super().invoke(ctx)
        except KubegpuError as exc:
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(1) from None


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
