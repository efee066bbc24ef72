"""`kubegpu trace`: replay a published cluster trace through a placement policy.

`kubegpu trace replay --format openb --nodes NODE_CSV --pods POD_CSV --policy POLICY --seed N [--inflation 1.3]`
runs the FGD paper's protocol on Alibaba's GPU trace and prints `{"policy", "seed", "totalGpus",
"allocatedPercent": [a_0 .. a_130], "skippedPods", "wallSeconds"}`; `kubegpu trace report RESULT.json...` draws
several such results (one per policy) into one HTML page.
"""

from __future__ import annotations

import json
from pathlib import Path

import typer

from kubegpu.cliopts import checked_option, choice_option, emit, output_option
from kubegpu.errors import ConfigError
from kubegpu.scheduling.placement import policy_names
from kubegpu.sim.report import write_trace_html
from kubegpu.sim.trace.reader import read_nodes, read_pods
from kubegpu.sim.trace.replay import LEVELS, ReplayResult, replay

trace_app = typer.Typer(help="Replay a published cluster trace (Alibaba's GPU trace) through a placement policy.",
                        no_args_is_help=True)

FORMATS = ("openb",)


def _inflation(value: float) -> float:
    if not 0 < value <= 10:
        raise ConfigError(f"must be in (0, 10], got {value}")
    return value


def _html_target(path: Path | None) -> None:
    if path is not None and not path.resolve().parent.is_dir():
        raise ConfigError(f"--html {path}: cannot write: directory {path.parent} does not exist")


@trace_app.command("replay")
def replay_command(
    trace_format: str = choice_option("openb", FORMATS, "--format",
                                      help="Trace format: openb (Alibaba cluster-trace-gpu-v2023 CSV)."),
    nodes: Path = typer.Option(..., "--nodes", metavar="NODE_CSV",
                               help="Node list: sn,cpu_milli,memory_mib,gpu,model (plain or .gz)."),
    pods: Path = typer.Option(..., "--pods", metavar="POD_CSV",
                              help="Pod list: name,cpu_milli,memory_mib,num_gpu,gpu_milli[,gpu_spec,...]."),
    policy: str = choice_option("kubegpu", policy_names(), "--policy",
                                help=f"Placement policy: {', '.join(policy_names())}."),
    seed: int = typer.Option(42, "--seed", help="Seed of the shuffle and of the inflation's draws."),
    inflation: float = checked_option(1.3, "--inflation", check=_inflation, metavar="RATIO",
                                      help="Tasks are drawn until the GPU requests reach RATIO x capacity."),
    output: str = output_option("json"),
    html_file: Path | None = typer.Option(None, "--html", metavar="PATH",
                                          help="Also write an HTML page with the allocation curve."),
) -> None:
    """Replay the trace with one policy: the FGD paper's protocol, allocation per arrived workload."""
    del trace_format  # one format so far
    _html_target(html_file)
    result = replay(read_nodes(nodes), read_pods(pods), policy, seed, inflation)
    if html_file is not None:
        write_trace_html(html_file, f"{pods.name} · seed {seed} · inflation {inflation:g}",
                         {result.policy: result.allocated_percent}, [_row(result)])
    emit(result.to_json(), output)


def _row(result: ReplayResult) -> tuple[str, float, float, int, float]:
    curve = result.allocated_percent
    return result.policy, curve[100], curve[min(130, len(curve) - 1)], result.skipped_pods, result.wall_seconds


def _load(path: Path) -> ReplayResult:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{path}: cannot read a replay result: {exc}") from None
    try:
        curve = [float(v) for v in data["allocatedPercent"]]
        if len(curve) != LEVELS:
            raise ValueError(f"allocatedPercent has {len(curve)} values, expected {LEVELS}")
        return ReplayResult(str(data["policy"]), int(data["seed"]), int(data["totalGpus"]), curve,
                            int(data["skippedPods"]), 0, float(data["wallSeconds"]))
    except (KeyError, TypeError, ValueError) as exc:
        raise ConfigError(f"{path}: not a `kubegpu trace replay -o json` result: {exc}") from None


@trace_app.command("report")
def report_command(
    results: list[Path] = typer.Argument(..., metavar="RESULT_JSON...",
                                         help="Outputs of `kubegpu trace replay -o json`, one per policy."),
    html_file: Path = typer.Option(..., "--html", metavar="PATH", help="Write the HTML page here."),
    title: str = typer.Option("trace replay", "--title", help="The page's subtitle (trace variant, seeds)."),
) -> None:
    """Draw several replay results into one page: allocation against arrived workload per policy (the FGD
    paper's Fig. 9 shape) and their figures at 100 % and 130 % arrived. Results of one policy over several seeds
    are averaged."""
    _html_target(html_file)
    by_policy: dict[str, list[ReplayResult]] = {}
    for path in results:
        loaded = _load(path)
        by_policy.setdefault(loaded.policy, []).append(loaded)
    curves: dict[str, list[float]] = {}
    rows = []
    for name, runs in by_policy.items():
        mean = [sum(r.allocated_percent[i] for r in runs) / len(runs) for i in range(LEVELS)]
        curves[name] = mean
        rows.append((name, mean[100], mean[130], round(sum(r.skipped_pods for r in runs) / len(runs)),
                     sum(r.wall_seconds for r in runs) / len(runs)))
    write_trace_html(html_file, title, curves, rows)
    typer.echo(f"wrote {html_file}")


def register(app: typer.Typer) -> None:
    app.add_typer(trace_app, name="trace")
