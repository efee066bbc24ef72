"""`kubegpu place`: the placement controller (a secondary scheduler for pods with `schedulerName: kubegpu`)."""

from __future__ import annotations

import typer

from kubegpu.cliopts import duration_option
from kubegpu.errors import ConfigError


def place_command(
    policy: str = typer.Option("kubegpu", "--policy", help="Placement policy (kubegpu.scheduling.placement)."),
    scheduler_name: str = typer.Option("kubegpu", "--scheduler-name",
                                       help="Place the pods whose spec.schedulerName is this."),
    seed: int = typer.Option(0, "--seed", help="Seed of the policy's random choices (random, tie breaks)."),
    leader_elect: bool = typer.Option(True, "--leader-elect/--no-leader-elect",
                                      help="Act only while holding the kubegpu-place Lease."),
    namespace: str = typer.Option("kubegpu", "--namespace", help="Namespace of the leader Lease."),
    interval: float = duration_option(0.5, "--interval", positive=True, help="Time between passes."),
    lease_duration: float = duration_option(15.0, "--lease-duration", positive=True,
                                            help="How long a leader holds the Lease."),
) -> None:
    """Place GPU pods (a share of one GPU, or whole GPUs, through one DRA claim) on the node and GPU the placement
    policy picks; write the claim's allocation, then bind the pod."""
    import logging
    import os
    import socket

    from kubegpu.kube.informer import InformedCluster, quiet_http_logs
    from kubegpu.kube.lightkube_cluster import LightkubeCluster
    from kubegpu.placement.controller import KINDS, PlacementController, run
    from kubegpu.scheduling.placement import PolicyContext, make_policy
    from kubegpu.shutdown import stop_on_signals

    if not scheduler_name:
        raise ConfigError("--scheduler-name must not be empty")
    chosen = make_policy(policy, PolicyContext(seed=seed))
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    quiet_http_logs()
    cluster = InformedCluster(LightkubeCluster(), KINDS)  # listed once, then watched: a pass reads memory
    identity = os.environ.get("POD_NAME") or socket.gethostname()
    controller = PlacementController(cluster, chosen, scheduler_name=scheduler_name, identity=identity,
                                     leader_elect=leader_elect, lease_namespace=namespace,
                                     lease_duration=lease_duration)
    stop = stop_on_signals()
    run(controller, interval, stop.is_set)


def register(app: typer.Typer) -> None:
    app.command("place")(place_command)
