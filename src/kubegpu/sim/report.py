"""Presenting results: the rich table for the terminal and one self-contained HTML report with inlined plots."""

from __future__ import annotations

import base64
import html
import io
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.table import Table

from kubegpu.files import write_durable
from kubegpu.sim.units import format_duration

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from kubegpu.sim.metrics import StrategyResult
    from kubegpu.sim.runner import SimulationReport

PALETTE = ["#4C72B0", "#DD8452", "#55A868", "#C44E52", "#8172B3", "#937860", "#DA8BC3", "#8C8C8C"]

# column title, how to read it from a result, format, whether higher is better
COLUMNS: list[tuple[str, str, str, bool]] = [
    ("GPU alloc", "allocation_pct", "pct", True),
    ("Compute util", "compute_util_pct", "pct", True),
    ("Memory util", "memory_util_pct", "pct", True),
    ("Completed", "pods_completed", "int", True),
    ("OOM kills", "oom_kills", "int", False),
    ("  neighbours (within share)", "innocent_oom_kills", "int", False),
    ("Guard actions", "guard_actions", "int", False),
    ("  neighbours saved", "neighbours_saved", "int", True),
    ("Jobs failed", "jobs_failed", "int", False),
    ("Pending p50", "pending_p50_s", "dur", False),
    ("Pending p95", "pending_p95_s", "dur", False),
    ("Pending max", "pending_max_s", "dur", False),
    ("JCT p50", "jct_p50_s", "dur", False),
    ("JCT p95", "jct_p95_s", "dur", False),
    ("Cost", "cost", "money", False),
    ("$/useful GPU-h", "cost_per_useful_gpu_hour", "money", False),
]


def _format(value: float | None, kind: str) -> str:
    if value is None:
        return "—"
    if kind == "pct":
        return f"{value:.1f}%"
    if kind == "int":
        return f"{int(value):,}"
    if kind == "dur":
        return format_duration(value)
    return f"${value:,.2f}" if value < 100 else f"${value:,.0f}"


def _value(result: StrategyResult, attr: str) -> float | None:
    value = getattr(result, attr)
    return None if value is None else float(value)


def _best(results: Sequence[StrategyResult], attr: str, higher: bool) -> float | None:
    values = [float(v) for r in results if (v := getattr(r, attr)) is not None]
    if len(values) < 2 or len(set(values)) == 1:
        return None
    return max(values) if higher else min(values)


def _header(name: str) -> str:
    """Strategy names break after their colon and before an `@` so long ones (`static-mig:all-balanced@a100`)
    stay narrow."""
    return name.replace(":", ":\n", 1).replace("@", "\n@", 1)


def _column_width(name: str) -> int:
    return max(9, *(len(part) for part in _header(name).split("\n"))) + 3


def results_tables(report: SimulationReport, width: int = 200) -> list[Table]:
    """The comparison as tables that fit `width` columns: a column per strategy, a row per measure, the best value
    of each row in bold green; strategies that do not fit go on to the next table."""
    chunks: list[list[StrategyResult]] = [[]]
    used = 18
    for result in report.results:
        need = _column_width(result.strategy)
        if chunks[-1] and used + need > width:
            chunks.append([])
            used = 18
        chunks[-1].append(result)
        used += need
    return [_table(report, chunk, first=index == 0) for index, chunk in enumerate(chunks)]


def results_table(report: SimulationReport) -> Table:
    return results_tables(report, width=10_000)[0]


def _table(report: SimulationReport, results: Sequence[StrategyResult], first: bool) -> Table:
    scenario = report.scenario
    title = (f"{scenario.name}\n{report.gpus} GPUs · {format_duration(scenario.duration)} · "
             f"{len(report.jobs):,} jobs · seed {scenario.seed}") if first else None
    table = Table(title=title, header_style="bold cyan")
    table.add_column("", style="bold", no_wrap=True)
    for result in results:
        table.add_column(_header(result.strategy), justify="right", no_wrap=True)
    for title_text, attr, kind, higher in COLUMNS:
        best = _best(report.results, attr, higher)
        cells = []
        for result in results:
            value = _value(result, attr)
            text = _format(value, kind)
            cells.append(f"[bold green]{text}[/]" if best is not None and value == best else text)
        table.add_row(title_text, *cells)
    for team in report.scenario.teams:  # per team: what it got, how long it waited, how often it was reclaimed
        for title_text, attr, kind in (("GPU-h", "gpu_hours", "num"), ("wait p50", "pending_p50_s", "dur"),
                                       ("wait p95", "pending_p95_s", "dur"), ("reclaims", "reclaims", "int")):
            cells = []
            for result in results:
                stats = result.teams.get(team.name)
                value = float(getattr(stats, attr)) if stats is not None else 0.0
                cells.append(f"{value:,.1f}" if kind == "num" else _format(value, kind))
            table.add_row(f"{team.name} {title_text}", *cells)
    return table


LEGEND = ("GPU alloc = allocated / provisioned GPU-hours · compute util = useful / provisioned GPU-hours · "
          "JCT = job completion time · best in green")


def headline(report: SimulationReport) -> str:
    """One line of takeaways under the table: which strategy wins on useful work, waiting and cost."""
    results = report.results
    if len(results) < 2:
        return ""
    useful = max(results, key=lambda r: r.compute_util_pct)
    waits = min(results, key=lambda r: (r.pending_p95_s, r.pending_max_s))
    cheap = min(results, key=lambda r: r.cost_per_useful_gpu_hour or float("inf"))
    safe = [r.strategy for r in results if r.oom_kills == 0 and r.jobs_failed == 0]
    parts = [
        f"most useful work: [bold]{useful.strategy}[/] ({useful.compute_util_pct:.1f}% compute)",
        f"shortest waits: [bold]{waits.strategy}[/] (p95 {format_duration(waits.pending_p95_s)})",
        f"cheapest useful GPU-hour: [bold]{cheap.strategy}[/] (${cheap.cost_per_useful_gpu_hour:,.2f})",
    ]
    if len(safe) < len(results):
        parts.append(f"no OOM kills or failed jobs: {', '.join(safe) or 'none'}")
    return " · ".join(parts)


# ------------------------------------------------------------------------------------------------------- HTML


def _png(figure: Figure) -> str:
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=110, bbox_inches="tight")
    return base64.b64encode(buffer.getvalue()).decode("ascii")


def _style(ax: Any) -> None:
    ax.spines[["top", "right"]].set_visible(False)
    ax.grid(axis="y", alpha=0.3)


def _hours(samples: Sequence[Any]) -> list[float]:
    return [s.t / 3600.0 for s in samples]


def _stacked_panels(results: Sequence[StrategyResult], height: float, titles: tuple[str, str],
                    ylabels: tuple[str, str]) -> tuple[Figure, Any, Any]:
    """Two time panels sharing the hour axis, one legend of strategies above them; the caller draws the lines."""
    from matplotlib.figure import Figure

    figure = Figure(figsize=(11, height), layout="constrained")
    top, bottom = figure.subplots(2, 1, sharex=True)
    for ax, title, ylabel in zip((top, bottom), titles, ylabels, strict=True):
        ax.set_title(title, loc="left", fontsize=11)
        ax.set_ylabel(ylabel)
    bottom.set_xlabel("simulated hour")
    return figure, top, bottom


def _finish_panels(figure: Figure, results: Sequence[StrategyResult], top: Any, bottom: Any) -> Figure:
    for ax in (top, bottom):
        _style(ax)
        ax.set_ylim(bottom=0)
    handles, labels = top.get_legend_handles_labels()
    figure.legend(handles, labels, loc="outside upper center", ncol=min(6, len(results)), frameon=False)
    return figure


def utilization_figure(results: Sequence[StrategyResult]) -> Figure:
    figure, top, bottom = _stacked_panels(
        results, 6.6,
        ("How much of the cluster is handed out…", "…and how much of it does work (solid: compute, dotted: memory)"),
        ("GPUs allocated (%)", "utilisation (%)"))
    for color, result in zip(PALETTE * 4, results, strict=False):
        hours = _hours(result.samples)
        top.plot(hours, [100 * s.allocation for s in result.samples], color=color, lw=2, label=result.strategy)
        bottom.plot(hours, [100 * s.compute for s in result.samples], color=color, lw=2, label=result.strategy)
        bottom.plot(hours, [100 * s.memory for s in result.samples], color=color, lw=1, ls=":", alpha=0.8)
    return _finish_panels(figure, results, top, bottom)


def pending_figure(results: Sequence[StrategyResult]) -> Figure:
    from matplotlib.figure import Figure

    figure = Figure(figsize=(11, 3.4))
    ax = figure.subplots()
    for color, result in zip(PALETTE * 4, results, strict=False):
        ax.fill_between(_hours(result.samples), [s.pending for s in result.samples], color=color, alpha=0.15)
        ax.plot(_hours(result.samples), [s.pending for s in result.samples], color=color, lw=2,
                label=result.strategy)
    ax.set_title("Pods waiting for a GPU", loc="left", fontsize=11)
    ax.set_xlabel("simulated hour")
    ax.set_ylabel("pending pods")
    ax.set_ylim(bottom=0)
    _style(ax)
    ax.legend(frameon=False, ncol=min(4, len(results)))
    return figure


def capacity_figure(results: Sequence[StrategyResult]) -> Figure:
    """Nodes and money over the day: flat for a fixed cluster, the autoscaler's launches and consolidations."""
    figure, top, bottom = _stacked_panels(results, 5.2, ("Nodes in the cluster", "Money spent so far"),
                                          ("nodes", "dollars"))
    for color, result in zip(PALETTE * 4, results, strict=False):
        hours = _hours(result.samples)
        top.step(hours, [s.nodes for s in result.samples], where="post", color=color, lw=2, label=result.strategy)
        bottom.plot(hours, [s.cost for s in result.samples], color=color, lw=2, label=result.strategy)
    return _finish_panels(figure, results, top, bottom)


def bars_figure(results: Sequence[StrategyResult]) -> Figure:
    from matplotlib.figure import Figure

    panels = [
        ("Compute utilisation (%)", "compute_util_pct", "{:.0f}%"),
        ("Pending time p95", "pending_p95_s", None),
        ("OOM kills", "oom_kills", "{:.0f}"),
        ("Cost per useful GPU-hour ($)", "cost_per_useful_gpu_hour", "${:.2f}"),
    ]
    figure = Figure(figsize=(11, 3.6))
    axes = figure.subplots(1, len(panels))
    names = [r.strategy for r in results]
    colors = (PALETTE * 4)[: len(results)]
    for ax, (title, attr, fmt) in zip(axes, panels, strict=True):
        values = [float(v) for r in results if (v := getattr(r, attr)) is not None]
        plotted = [v / 60 for v in values] if fmt is None else values
        bars = ax.barh(names, plotted, color=colors)
        ax.invert_yaxis()
        ax.set_title(title, fontsize=10, loc="left")
        labels = [format_duration(v) for v in values] if fmt is None else [fmt.format(v) for v in values]
        ax.bar_label(bars, labels=labels, padding=3, fontsize=9)
        ax.spines[["top", "right"]].set_visible(False)
        ax.set_xticks([])
        ax.margins(x=0.35)
        if ax is not axes[0]:
            ax.set_yticklabels([])
    figure.tight_layout()
    return figure


def classes_figure(results: Sequence[StrategyResult]) -> Figure:
    """Completed share per job class and strategy: who actually got served."""
    from matplotlib.figure import Figure

    classes = sorted({name for r in results for name in r.classes})
    figure = Figure(figsize=(11, 3.6))
    ax = figure.subplots()
    width = 0.8 / max(1, len(results))
    for k, (color, result) in enumerate(zip(PALETTE * 4, results, strict=False)):
        shares = []
        for name in classes:
            stats = result.classes.get(name)
            shares.append(100.0 * stats.completed / stats.arrived if stats and stats.arrived else 0.0)
        ax.bar([i + k * width for i in range(len(classes))], shares, width, color=color, label=result.strategy)
    ax.set_xticks([i + width * (len(results) - 1) / 2 for i in range(len(classes))], classes)
    ax.set_ylabel("jobs completed (%)")
    ax.set_ylim(0, 105)
    ax.set_title("Jobs completed within the simulated period, by class", loc="left", fontsize=11)
    _style(ax)
    ax.legend(frameon=False, ncol=min(6, len(results)), fontsize=9, loc="upper center", bbox_to_anchor=(0.5, -0.14))
    return figure


def _cards(report: SimulationReport) -> str:
    cards = []
    for color, result in zip(PALETTE * 4, report.results, strict=False):
        cards.append(
            f'<div class="card" style="border-top:4px solid {color}"><h3>{html.escape(result.strategy)}</h3>'
            f'<div class="big">{result.compute_util_pct:.1f}%</div><div class="sub">compute utilisation</div>'
            f"<ul><li><b>{result.allocation_pct:.1f}%</b> of GPU-hours allocated</li>"
            f"<li><b>{format_duration(result.pending_p95_s)}</b> p95 wait for a GPU</li>"
            f"<li><b>{result.oom_kills}</b> OOM kills, <b>{result.jobs_failed}</b> jobs given up</li>"
            f"<li><b>{result.innocent_oom_kills}</b> neighbours within their share OOM-killed"
            f"{'' if result.neighbours_saved is None else f', <b>{result.neighbours_saved}</b> saved by the guard'}"
            "</li>"
            f"<li><b>${result.cost_per_useful_gpu_hour:,.2f}</b> per useful GPU-hour</li></ul></div>"
        )
    return "".join(cards)


def _html_table(report: SimulationReport) -> str:
    head = "".join(f"<th>{html.escape(title)}</th>" for title, _, _, _ in COLUMNS)
    rows = []
    for result in report.results:
        cells = []
        for _, attr, kind, higher in COLUMNS:
            value = _value(result, attr)
            best = _best(report.results, attr, higher)
            css = ' class="best"' if best is not None and value == best else ""
            cells.append(f"<td{css}>{html.escape(_format(value, kind))}</td>")
        rows.append(f"<tr><th>{html.escape(result.strategy)}</th>{''.join(cells)}</tr>")
    return f"<table><tr><th>Strategy</th>{head}</tr>{''.join(rows)}</table>"


_CSS = """
body{font-family:-apple-system,Segoe UI,Helvetica,Arial,sans-serif;margin:0;background:#f6f7f9;color:#222}
main{max-width:1180px;margin:0 auto;padding:28px}
h1{margin:0 0 4px;font-size:26px} .lead{color:#555;margin:0 0 22px}
.cards{display:flex;gap:14px;flex-wrap:wrap;margin-bottom:24px}
.card{background:#fff;border-radius:8px;padding:14px 18px;flex:1;min-width:220px;box-shadow:0 1px 3px #0002}
.card h3{margin:0 0 6px;font-size:15px} .big{font-size:32px;font-weight:700} .sub{color:#666;font-size:12px}
.card ul{padding-left:18px;margin:10px 0 0;font-size:13px;line-height:1.6}
section{background:#fff;border-radius:8px;padding:16px 18px;margin-bottom:18px;box-shadow:0 1px 3px #0002}
section h2{font-size:17px;margin:0 0 10px} img{width:100%}
table{border-collapse:collapse;font-size:13px;width:100%} td,th{padding:6px 8px;border-bottom:1px solid #eee;
text-align:right} tr th:first-child{text-align:left} td.best{color:#1a7f37;font-weight:700}
.note{color:#666;font-size:12px}
"""


def render_html(report: SimulationReport) -> str:
    """The report page: headline cards, the table, then the plots (PNG, base64-inlined: one file to share)."""
    scenario = report.scenario
    results = report.results
    images = [
        ("Utilisation over time", utilization_figure(results)),
        ("Waiting", pending_figure(results)),
        ("Cluster size and cost", capacity_figure(results)),
        ("Side by side", bars_figure(results)),
        ("Who got served", classes_figure(results)),
    ]
    sections = "".join(
        f'<section><h2>{html.escape(title)}</h2><img alt="{html.escape(title)}" '
        f'src="data:image/png;base64,{_png(figure)}"></section>'
        for title, figure in images
    )
    groups = ", ".join(f"{g.count}× {g.gpus_per_node}x {g.gpu_model} (${g.price_per_hour}/h)"
                       for g in scenario.cluster.node_groups)
    return (
        "<!DOCTYPE html><html><head><meta charset='utf-8'>"
        f"<title>kubegpu simulate — {html.escape(scenario.name)}</title><style>{_CSS}</style></head><body><main>"
        f"<h1>GPU sharing strategies compared</h1><p class='lead'>{html.escape(scenario.name)} · "
        f"{html.escape(groups)} · {len(report.jobs):,} jobs over {format_duration(scenario.duration)} · "
        f"seed {scenario.seed}</p><div class='cards'>{_cards(report)}</div>"
        f"<section><h2>All numbers</h2>{_html_table(report)}<p class='note'>Compute utilisation counts useful "
        "work: the GPU-time a dedicated GPU would have been busy for each pod's progress. Pending time is per "
        "pod, from queued to bound (pods still waiting at the end count up to the end).</p></section>"
        f"{sections}<p class='note'>Generated by kubegpu simulate. Performance model and its calibration: "
        "docs/simulator.md.</p></main></body></html>"
    )


def write_html(report: SimulationReport, path: str | Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    target = Path(path)
    write_durable(target, render_html(report))  # atomic and durable


# ------------------------------------------------------------------------------------------- trace replay (FGD)


def allocation_curve_figure(curves: Mapping[str, Sequence[float]]) -> Figure:
    """GPU allocation against arrived workload, one line per policy (the shape of the FGD paper's Fig. 9): x is the
    arrived GPU request as % of capacity (0..len-1), y the % of the cluster's GPUs allocated then."""
    from matplotlib.figure import Figure

    figure = Figure(figsize=(11, 4.6), layout="constrained")
    ax = figure.subplots()
    ideal = max((len(c) for c in curves.values()), default=0)
    ax.plot(range(ideal), [min(i, 100) for i in range(ideal)], color="#bbb", lw=1, ls="--", label="ideal")
    for color, (policy, curve) in zip(PALETTE * 4, curves.items(), strict=False):
        ax.plot(range(len(curve)), curve, color=color, lw=2, label=policy)
    ax.set_xlabel("arrived workload (% of the cluster's GPUs requested)")
    ax.set_ylabel("GPUs allocated (%)")
    low = min((min(c[60:] or c) for c in curves.values()), default=0.0)
    ax.set_xlim(60, max(ideal - 1, 61))
    ax.set_ylim(max(0.0, low - 2), 101)
    _style(ax)
    ax.legend(loc="lower right", frameon=False)
    return figure


def render_trace_html(title: str, curves: Mapping[str, Sequence[float]],
                      rows: Sequence[tuple[str, float, float, int, float]]) -> str:
    """A trace replay's page: per policy (name, % at 100 % arrived, % at 130 %, skipped pods, wall seconds) and
    the allocation curves."""
    head = "<tr><th>Policy</th><th>GPUs allocated at 100 % arrived</th><th>at 130 %</th><th>Skipped pods</th>" \
           "<th>Wall time</th></tr>"
    best = max((r[1] for r in rows), default=None)
    mark = ' class="best"'
    body = "".join(
        f"<tr><th>{html.escape(name)}</th><td{mark if at100 == best else ''}>{at100:.2f} %</td>"
        f"<td>{at130:.2f} %</td><td>{skipped:,}</td><td>{wall:.1f} s</td></tr>"
        for name, at100, at130, skipped, wall in rows)
    image = _png(allocation_curve_figure(curves))
    return (
        "<!DOCTYPE html><html><head><meta charset='utf-8'>"
        f"<title>kubegpu trace replay — {html.escape(title)}</title><style>{_CSS}</style></head><body><main>"
        f"<h1>GPU allocation on a replayed trace</h1><p class='lead'>{html.escape(title)}</p>"
        f"<section><h2>Policies</h2><table>{head}{body}</table><p class='note'>Tasks arrive once and never "
        "leave; each is placed at once or skipped. Allocation counts sharing tasks by their thousandths of a GPU."
        "</p></section><section><h2>Allocation as the workload arrives</h2>"
        f"<img alt='allocation curves' src='data:image/png;base64,{image}'></section>"
        "<p class='note'>Generated by kubegpu trace. Protocol: docs/benchmarks.md.</p></main></body></html>"
    )


def write_trace_html(path: str | Path, title: str, curves: Mapping[str, Sequence[float]],
                     rows: Sequence[tuple[str, float, float, int, float]]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    write_durable(Path(path), render_trace_html(title, curves, rows))
