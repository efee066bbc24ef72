"""`kubegpu plan` and `kubegpu partitioner` (the partition agent, a node agent, has its own command module:
`kubegpu.partitionagent.cli`)."""

from __future__ import annotations

import gc
import logging
import socket
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from kubegpu.cliopts import (
    FORMATS,
    choice_option,
    duration_option,
    emit,
    legacy_alias,
    metrics_address_option,
    oneshot_option,
    output_option,
)
from kubegpu.clock import RealClock
from kubegpu.errors import KubegpuError
from kubegpu.partitioner.planner import (
    DEFAULT_PLANNER,
    DEFAULT_TIME_LIMIT_S,
    PLANNERS,
    NodeInput,
    Plan,
    check_planner,
    plan,
)
from kubegpu.partitioner.snapshot import load_state, optimality_line, plan_to_json, planner_inputs
from kubegpu.shutdown import stop_on_signals

log = logging.getLogger("kubegpu.partitioner")
_PLANNER = choice_option(DEFAULT_PLANNER, PLANNERS, "--planner",
                         help="Planner: exact (HiGHS, proven optimal) or greedy.")


def plan_command(
    state: Path = typer.Option(..., "--state", help="Cluster state file (YAML or JSON): nodes and pending pods."),
    output: str = output_option("table", FORMATS),
    planner: str = _PLANNER,
    time_limit: float = duration_option(DEFAULT_TIME_LIMIT_S, "--time-limit", positive=True,
                                        help="Wall-clock budget for the whole plan; then the best plan found."),
) -> None:
    """Plan MIG/MPS layouts for a cluster state offline: which pods a re-cut would make schedulable."""
    check_planner(planner, time_limit, "--planner", "--time-limit")
    # One short-lived run that frees what it drops by reference counting: the cyclic collector only re-walked the
    # growing heap (a fleet's state file is millions of objects), a third of the time spent reading one.
    collecting = gc.isenabled()
    gc.disable()
    try:
        nodes, pods = planner_inputs(load_state(state), str(state))
        result = plan(nodes, pods, planner=planner, time_limit=time_limit)
        for node in nodes:  # reported, not fatal: the rest of the cluster is still planned
            for gpu in result.nodes[node.name].gpus:
                if gpu.error:
                    typer.echo(f"warning: {state}: node {node.name} GPU {gpu.index}: {gpu.error}; left as it is",
                               err=True)
        emit(plan_to_json(result, nodes, pods), output, table=lambda: _print_table(result, nodes))
    finally:
        if collecting:
            gc.enable()


def _print_table(result: Plan, nodes: list[NodeInput]) -> None:
    console = Console()
    table = Table(title="New layouts")
    for column in ("node", "gpu", "model", "layout", "created", "destroyed", "note"):
        table.add_column(column)
    doc = plan_to_json(result, nodes)
    for node in doc["nodes"]:
        for gpu in node["gpus"]:
            layout = gpu.get("layout") or ",".join(i["profile"] for i in gpu["instances"]) or "-"
            table.add_row(node["name"], str(gpu["index"]), gpu["model"], layout, str(gpu["created"]),
                          str(gpu["destroyed"]), gpu.get("error", ""))
    console.print(table)
    pods = Table(title="Pods")
    pods.add_column("pod")
    pods.add_column("result")
    for key, where in result.assignments.items():
        pods.add_row(key, f"schedulable on {where}")
    for key, reason in result.unschedulable.items():
        pods.add_row(key, f"unschedulable: {reason}")
    console.print(pods)
    console.print(optimality_line(result))


def partitioner_command(
    batch_window_timeout: float = duration_option(60.0, "--batch-max-duration",
                                                  help="Longest a batch of pending pods stays open, from its first pod"
                                                       " (0: plan on the first pass)."),
    batch_window_idle: float = duration_option(10.0, "--batch-idle-duration",
                                               help="A batch closes this long after its last new pod."),
    interval: float = duration_option(5.0, "--interval", positive=True, help="Time between reconcile passes."),
    identity: str = typer.Option("", "--identity", help="Leader-election identity (default: host name)."),
    lease_namespace: str = typer.Option("kube-system", "--lease-namespace", help="Namespace of the leader Lease."),
    lease_duration: float = duration_option(15.0, "--lease-duration", positive=True,
                                            help="How long a leader holds the Lease."),
    once: bool = oneshot_option("Run one reconcile pass and exit."),
    metrics_address: str = metrics_address_option("", "HOST:PORT to serve kubegpu_partitioner_* on (empty: off)."),
    planner: str = _PLANNER,
    time_limit: float = duration_option(DEFAULT_TIME_LIMIT_S, "--time-limit", positive=True,
                                        help="Wall-clock budget for each plan."),
) -> None:
    """Re-cut MIG/MPS GPUs on nodes labelled kubegpu.io/gpu-partitioning=mig|mps to fit pending pods."""
    from prometheus_client import REGISTRY

    from kubegpu.kube.informer import InformedCluster, quiet_http_logs
    from kubegpu.kube.leader import LeaderElector
    from kubegpu.kube.lightkube_cluster import LightkubeCluster
    from kubegpu.metrics import PartitionerMetrics, serve_metrics
    from kubegpu.partitioner.controller import LEASE_NAME, PartitionerController

    check_planner(planner, time_limit, "--planner", "--time-limit")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    quiet_http_logs()
    api = LightkubeCluster()
    cluster = InformedCluster(api, ("Node", "Pod"))  # listed once, then watched: a pass reads memory
    me = identity or socket.gethostname()
    metrics = PartitionerMetrics.create() if metrics_address else None
    if metrics_address:
        cluster.register_metrics(REGISTRY, "partitioner")  # kubegpu_informer_synced; /readyz 503 while stale
        serve_metrics(metrics_address, ready=cluster.trusted)
    controller = PartitionerController(
        cluster, identity=me, batch_timeout=batch_window_timeout, batch_idle=batch_window_idle,
        elector=LeaderElector(api, me, LEASE_NAME, namespace=lease_namespace, lease_duration=lease_duration),
        metrics=metrics, planner=planner, time_limit=time_limit,
    )
    clock = RealClock()
    stop = stop_on_signals()  # SIGTERM: finish the pass in progress, then exit 0
    while not stop.is_set():
        try:
            controller.tick(clock.now())
        except KubegpuError as exc:  # an API hiccup: say so and try again next pass
            if once:
                raise
            log.error("reconcile failed: %s", exc)
        if once:
            return
        stop.wait(interval)


def register(app: typer.Typer) -> None:
    app.command("plan")(plan_command)
    app.command("partitioner")(partitioner_command)
    legacy_alias("partitioner", "--batch-window-timeout", "--batch-max-duration")
    legacy_alias("partitioner", "--batch-window-idle", "--batch-idle-duration")
    legacy_alias("partitioner", "--once", "--oneshot")
