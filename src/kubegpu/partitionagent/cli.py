"""`kubegpu partition-agent`: the node agent that applies the partitioner's desired MIG/MPS layout on its node.

It is registered here, beside the agent, so the command loads only node-agent code (never the partitioner's planner
or controller) — as every other node agent's command does.
"""

from __future__ import annotations

import logging
from pathlib import Path

import typer

from kubegpu.cliopts import duration_option, legacy_alias, oneshot_option
from kubegpu.errors import KubegpuError
from kubegpu.gpu.options import gpu_backend_option
from kubegpu.sharing.attribution import DEFAULT_POD_RESOURCES_SOCKET
from kubegpu.shutdown import stop_on_signals

log = logging.getLogger("kubegpu.partitionagent")


def partition_agent_command(
    node_name: str = typer.Option(..., "--node-name", envvar="NODE_NAME", help="The Node this agent runs on."),
    gpu_backend: str = gpu_backend_option(),
    mps_slices_file: Path | None = typer.Option(None, "--mps-slices-file", envvar="KUBEGPU_MPS_SLICES_FILE",
                                                help="MPS memory-slice file the device plugin reads."),
    pod_resources_socket: Path = typer.Option(
        Path(DEFAULT_POD_RESOURCES_SOCKET), "--pod-resources-kubelet-socket",
        help="The kubelet's PodResources socket: instances allocated to containers count as in use. "
             "When the socket does not exist, only instances with processes count."),
    interval: float = duration_option(10.0, "--interval", positive=True, help="Time between apply/report passes."),
    once: bool = oneshot_option(),
) -> None:
    """Apply the partitioner's desired MIG/MPS layout on this node and report its status."""
    from kubegpu.gpu.backend import open_backend
    from kubegpu.kube.lightkube_cluster import LightkubeCluster
    from kubegpu.partitionagent.agent import PartitionAgent
    from kubegpu.sharing.attribution import PodResourcesClient

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
    app.command("partition-agent")(partition_agent_command)
    legacy_alias("partition-agent", "--once", "--oneshot")
