"""`kubegpu simulate`: compare GPU-sharing strategies on a simulated cluster, in seconds."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import typer
from rich.console import Console
from rich.progress import BarColumn, Progress, TaskProgressColumn, TextColumn, TimeElapsedColumn

from kubegpu.cliopts import OptionError, duration_option, legacy_alias
from kubegpu.errors import ConfigError, KubegpuError
from kubegpu.files import write_durable
from kubegpu.sim.report import LEGEND, headline, results_tables, write_html
from kubegpu.sim.runner import check_strategies, run_scenario, strategy_names
from kubegpu.sim.scenario import Scenario, default_scenario, load_scenario


def _scenario(path: Path | None, seed: int | None, duration_hours: float | None) -> Scenario:
    scenario = default_scenario() if path is None else load_scenario(path)
    changes: dict[str, object] = {}
    if seed is not None:
        changes["seed"] = seed
    if duration_hours is not None:
        changes["duration"] = duration_hours * 3600.0
    return scenario.model_copy(update=changes) if changes else scenario


def _strategies(text: str | None) -> list[str] | None:
    if text is None:
        return None
    names = [name.strip() for name in text.split(",") if name.strip()]
    if not names:
        raise OptionError("--strategies: give at least one strategy, e.g. exclusive,time-slicing:4")
    return names


def simulate(
    scenario_file: Path | None = typer.Option(None, "--scenario", help="Scenario YAML (default: the shipped one)."),
    strategies: str | None = typer.Option(
        None, "--strategies",
        help="Comma-separated: exclusive, time-slicing:N, mps:N, static-mig:CONFIG\\[@GROUP], and plug-ins.",
    ),
    seed: int | None = typer.Option(None, "--seed", help="Random seed for the workload (overrides the scenario)."),
    duration: float | None = duration_option(None, "--duration", unit="h", positive=True,
                                             help="Simulated time (overrides the scenario)."),
    report: Path | None = typer.Option(None, "--report-file", metavar="PATH",
                                       help="Write a self-contained HTML report to this file."),
    json_path: Path | None = typer.Option(None, "--json-file", metavar="PATH",
                                          help="Write every number (and time series) as JSON to this file."),
) -> None:
    """Simulate a day of GPU work under each sharing strategy and compare utilisation, waiting and cost."""
    console = Console()
    for flag, path in (("--json-file", json_path), ("--report-file", report)):
        if path is not None and not path.resolve().parent.is_dir():
            raise KubegpuError(f"{flag} {path}: cannot write: directory {path.parent} does not exist")
    scenario = _scenario(scenario_file, seed, duration)
    override = _strategies(strategies)
    if override is None and scenario_file is not None:
        check_strategies(scenario, scenario.strategies, str(scenario_file))  # name the file's bad entry
    names = strategy_names(scenario, override)
    try:
        check_strategies(scenario, names)  # a bad strategy is one error line before any progress bar is drawn
    except ConfigError as exc:
        if override is None:
            raise
        raise OptionError(f"--strategies: {exc}") from None
    with Progress(
        TextColumn("[bold]{task.description:<28}"), BarColumn(), TaskProgressColumn(), TimeElapsedColumn(),
        console=console, transient=False,
    ) as progress:
        tasks = {name: progress.add_task(name, total=scenario.duration, start=False) for name in names}
        order = iter(names)

        def tracker(strategy_name: str) -> Callable[[float], None]:
            task = tasks.get(strategy_name)
            if task is None:  # a strategy that names itself differently (time-slicing → time-slicing:4)
                task = tasks[next(order)]
            else:
                next(order, None)
            progress.start_task(task)
            return lambda simulated: progress.update(task, completed=simulated)

        result = run_scenario(scenario, names, tracker)
    for table in results_tables(result, console.width):
        console.print(table)
    console.print(f"[dim]{LEGEND}[/]")
    summary = headline(result)
    if summary:
        console.print(summary)
    if json_path is not None:
        _write(json_path, json.dumps(result.to_dict(), indent=2, sort_keys=True) + "\n")
        console.print(f"[dim]wrote {json_path}[/]")
    if report is not None:
        write_html(result, report)
        console.print(f"[dim]wrote {report}[/]")


def _write(path: Path, text: str) -> None:
    write_durable(path, text)  # atomic: a kill mid-write leaves the old file, never an empty one


def register(app: typer.Typer) -> None:
    app.command("simulate")(simulate)
    legacy_alias("simulate", "--report", "--report-file")
    legacy_alias("simulate", "--json", "--json-file")
    try:
        from kubegpu.sim.validate import register_scenario_validator
    except ImportError:  # pragma: no cover - the config registry is optional
        return
    register_scenario_validator()
