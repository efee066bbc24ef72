"""`kubegpu plan`, `kubegpu partitioner` and `kubegpu partition-agent`."""

from __future__ import annotations

import json
import logging
import socket
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from kubegpu.clock import RealClock
from kubegpu.errors import ConfigError, KubegpuError
from kubegpu.gpu.options import gpu_backend_option
from kubegpu.partitioner.planner import (
    DEFAULT_PLANNER,
    DEFAULT_TIME_LIMIT_S,
    NodeInput,
    Plan,
    check_planner,
    plan,
)
from kubegpu.partitioner.snapshot import load_state, optimality_line, plan_to_json, planner_inputs
from kubegpu.sharing.attribution import DEFAULT_POD_RESOURCES_SOCKET
from kubegpu.shutdown import stop_on_signals

log = logging.getLogger("kubegpu.partitioner")


def plan_command(
    state: Path = typer.Option(..., "--state", help="Cluster state file (YAML or JSON): nodes and pending pods."),
    output: str = typer.Option("table", "--output", "-o", help="json or table"),
    planner: str = typer.Option(DEFAULT_PLANNER, "--planner", help="exact (HiGHS, proven optimal) or greedy."),
    time_limit: float = typer.Option(DEFAULT_TIME_LIMIT_S, "--time-limit",
                                     help="Wall-clock budget for the whole plan (s); then the best plan found."),
) -> None:
    """Plan MIG/MPS layouts for a cluster state offline: which pods a re-cut would make schedulable."""
    if output not in ("json", "table"):
        raise ConfigError(f"--output: must be json or table, not {output!r}")
    check_planner(planner, time_limit, "--planner", "--time-limit")
    nodes, pods = planner_inputs(load_state(state), str(state))
    result = plan(nodes, pods, planner=planner, time_limit=time_limit)
    for node in nodes:  # reported, not fatal: the rest of the cluster is still planned
        for gpu in result.nodes[node.name].gpus:
            if gpu.error:
                typer.echo(f"warning: {state}: node {node.name} GPU {gpu.index}: {gpu.error}; left as it is", err=True)
    if output == "json":
        typer.echo(json.dumps(plan_to_json(result, nodes, pods), indent=2))
    else:
        _print_table(result, nodes)


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
    batch_window_timeout: float = typer.Option(60.0, "--batch-window-timeout",
                                               help="Seconds from a batch's first pod."),
    batch_window_idle: float = typer.Option(10.0, "--batch-window-idle", help="Seconds without a new pod."),
    interval: float = typer.Option(5.0, "--interval", help="Seconds between reconcile passes."),
    identity: str = typer.Option("", "--identity", help="Leader-election identity (default: host name)."),
    lease_namespace: str = typer.Option("kube-system", "--lease-namespace"),
    lease_duration: float = typer.Option(15.0, "--lease-duration", help="Seconds a leader holds the Lease."),
    once: bool = typer.Option(False, "--once", help="Run one reconcile pass and exit."),
    metrics_address: str = typer.Option("", "--metrics-address", help="HOST:PORT to serve kubegpu_partitioner_* on."),
    planner: str = typer.Option(DEFAULT_PLANNER, "--planner", help="exact (HiGHS, proven optimal) or greedy."),
    time_limit: float = typer.Option(DEFAULT_TIME_LIMIT_S, "--time-limit",
                                     help="Wall-clock budget for each plan (s)."),
) -> None:
    """Re-cut MIG/MPS GPUs on nodes labelled kubegpu.io/gpu-partitioning=mig|mps to fit pending pods."""
    from kubegpu.kube.informer import InformedCluster, quiet_http_logs
    from kubegpu.kube.leader import LeaderElector
    from kubegpu.kube.lightkube_cluster import LightkubeCluster
    from kubegpu.metrics import PartitionerMetrics, serve_metrics
    from kubegpu.partitioner.controller import LEASE_NAME, PartitionerController

    if min(batch_window_timeout, batch_window_idle) < 0:
        raise ConfigError("--batch-window-timeout, --batch-window-idle: must be >= 0 (0 plans on the first pass)")
    if interval <= 0 or lease_duration <= 0:
        raise ConfigError("--interval, --lease-duration: must be > 0")
    check_planner(planner, time_limit, "--planner", "--time-limit")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    quiet_http_logs()
    api = LightkubeCluster()
    cluster = InformedCluster(api, ("Node", "Pod"))  # listed once, then watched: a pass reads memory
    me = identity or socket.gethostname()
    metrics = PartitionerMetrics.create() if metrics_address else None
    if metrics_address:
        serve_metrics(metrics_address)
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


def partition_agent_command(
    node_name: str = typer.Option(..., "--node-name", envvar="NODE_NAME", help="The Node this agent runs on."),
    gpu_backend: str = gpu_backend_option(),
    mps_slices_file: Path | None = typer.Option(None, "--mps-slices-file", envvar="KUBEGPU_MPS_SLICES_FILE",
                                                help="MPS memory-slice file the device plugin reads."),
    pod_resources_socket: Path = typer.Option(
        Path(DEFAULT_POD_RESOURCES_SOCKET), "--pod-resources-kubelet-socket",
        help="The kubelet's PodResources socket: instances allocated to containers count as in use. "
             "When the socket does not exist, only instances with processes count."),
    interval: float = typer.Option(10.0, "--interval", help="Seconds between apply/report passes."),
    once: bool = typer.Option(False, "--once", help="Run one pass and exit."),
) -> None:
    """Apply the partitioner's desired MIG/MPS layout on this node and report its status."""
    from kubegpu.gpu.backend import open_backend
    from kubegpu.kube.lightkube_cluster import LightkubeCluster
    from kubegpu.partitioner.agent import PartitionAgent
    from kubegpu.sharing.attribution import PodResourcesClient

    if interval <= 0:
        raise ConfigError(f"--interval: must be > 0, got {interval}")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    backend = open_backend(gpu_backend)
    try:
        allocations = PodResourcesClient(pod_resources_socket).list if pod_resources_socket.exists() else None
        agent = PartitionAgent(LightkubeCluster(), backend, node_name, mps_slices_file, allocations)
        stop = stop_on_signals()  # SIGTERM: a layout being applied is applied completely, then the agent exits
        while not stop.is_set():
            try:
                report = agent.tick()
            except KubegpuError as exc:  # an API or driver hiccup: say so and try again next pass
                if once:
                    raise
                log.error("pass failed: %s", exc)
                report = None
            if report is not None:
                log.info("plan %s: created %s destroyed %s refused %s", agent.applied_plan, report.created,
                         report.destroyed, report.refused)
            if once:
                return
            stop.wait(interval)
    finally:
        backend.close()


def register(app: typer.Typer) -> None:
    app.command("plan")(plan_command)
    app.command("partitioner")(partitioner_command)
    app.command("partition-agent")(partition_agent_command)
