"""`kubegpu validate-config`: check NVIDIA-compatible config files before a component ever reads them."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console
from rich.markup import escape

from kubegpu.config import ValidationOptions, load_yaml_file, validate_document
from kubegpu.errors import KubegpuError


def validate_files(files: list[Path], gpu_models: list[str]) -> list[tuple[Path, str | None, str]]:
    """(file, kind or None, summary or error line) for each file; kinds are detected per file."""
    options = ValidationOptions(gpu_models=tuple(gpu_models))
    results: list[tuple[Path, str | None, str]] = []
    for file in files:
        try:
            kind, summary = validate_document(load_yaml_file(file), str(file), options)
        except KubegpuError as exc:
            results.append((file, None, exc.message))
        else:
            results.append((file, kind, summary))
    return results


def _check_models(gpu_models: list[str]) -> None:
    """Resolve --gpu-model values once, so an unknown one is a single error rather than one per file."""
    from kubegpu.gpu.catalog import get_model

    for key in gpu_models:
        try:
            get_model(key)
        except KubegpuError as exc:
            raise KubegpuError(f"--gpu-model: {exc.message}") from None


def register(app: typer.Typer) -> None:
    @app.command("validate-config")
    def validate_config(
        files: list[Path] = typer.Argument(
            ..., metavar="FILE", help="Config files (YAML or JSON); the kind of each is detected."
        ),
        gpu_model: list[str] = typer.Option(
            [], "--gpu-model", metavar="KEY",
            help="For mig-parted files: check layouts against this GPU model (repeatable; catalog key, NVML product "
                 "name or PCI id). Default: every MIG model in the catalog an entry's device-filter selects.",
        ),
    ) -> None:
        """Validate device-plugin (NVIDIA `version: v1`) and mig-parted config files.

        Prints `FILE: valid <kind>` per good file; a bad one gets one line naming file, field path and problem.

        Exits 1 if any file is invalid.
        """
        out, err = Console(highlight=False, soft_wrap=True), Console(stderr=True, highlight=False, soft_wrap=True)
        try:
            _check_models(gpu_model)
        except KubegpuError as exc:
            err.print(f"error: {escape(exc.message)}")
            raise typer.Exit(1) from None
        failed = False
        for file, kind, text in validate_files(files, gpu_model):
            if kind is None:
                failed = True
                err.print(f"error: {escape(text)}")
            else:
                detail = f" ({text})" if text else ""
                out.print(f"{escape(str(file))}: valid {escape(kind)}{escape(detail)}")
        if failed:
            raise typer.Exit(1)
