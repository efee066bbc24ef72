"""`kubegpu exporter`: dcgm-exporter's flags and environment variables, so a DaemonSet spec carries over."""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
from pathlib import Path
from types import FrameType

import typer

from kubegpu.cliopts import checked_option, duration_option
from kubegpu.endpoints import parse_listen_address
from kubegpu.errors import ConfigError
from kubegpu.exporter.counters import load_counters
from kubegpu.exporter.server import Exporter, serve
from kubegpu.gpu.backend import open_backend
from kubegpu.gpu.options import gpu_backend_option
from kubegpu.sharing.attribution import DEFAULT_POD_RESOURCES_SOCKET, PodResourcesClient

log = logging.getLogger("kubegpu.exporter")


def _address(address: str) -> str:
    parse_listen_address(address, "--address")
    return address


def exporter_command(
    gpu_backend: str = gpu_backend_option(),
    address: str = checked_option(":9400", "--address", "-a", check=_address, envvar="DCGM_EXPORTER_LISTEN",
                                  metavar="HOST:PORT", help="HOST:PORT to serve."),
    collectors: Path | None = typer.Option(
        None, "--collectors", "-f", envvar="DCGM_EXPORTER_COLLECTORS", help="Counters CSV (default: built-in set)."
    ),
    collect_interval: float = duration_option(
        30000, "--collect-interval", "-c", unit="ms", positive=True, envvar="DCGM_EXPORTER_INTERVAL",
        help="Collection interval."),
    kubernetes: bool = typer.Option(
        False, "--kubernetes", "-k", envvar="DCGM_EXPORTER_KUBERNETES", help="Attribute metrics to pods."
    ),
    pod_resources_socket: Path = typer.Option(
        Path(DEFAULT_POD_RESOURCES_SOCKET),
        "--pod-resources-kubelet-socket",
        envvar="DCGM_POD_RESOURCES_KUBELET_SOCKET",
        help="The kubelet's PodResources socket.",
    ),
    no_hostname: bool = typer.Option(
        False, "--no-hostname", "-n", envvar="DCGM_EXPORTER_NO_HOSTNAME", help="Leave out the Hostname label."
    ),
) -> None:
    """Serve DCGM-compatible GPU metrics, every pod on a shared GPU attributed."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    host, port = parse_listen_address(address, "--address")
    counters = load_counters(collectors)
    for warning in counters.warnings:
        log.warning(warning)
    backend = open_backend(gpu_backend)
    hostname = None if no_hostname else os.environ.get("NODE_NAME") or socket.gethostname()
    pod_resources = PodResourcesClient(pod_resources_socket) if kubernetes else None
    exporter = Exporter(backend, counters, hostname, pod_resources, collect_interval / 1000.0)
    exporter.collect_once()  # a GPU backend that cannot be read at start is bad input: one line, exit 1
    try:
        server = serve(exporter, host, port)
    except OSError as exc:
        raise ConfigError(f"--address: cannot listen on {address}: {exc.strerror or exc}") from None
    shown_host = f"[{host}]" if ":" in host else host
    log.info("serving metrics on http://%s:%d/metrics", shown_host, server.port)

    def stop(signum: int, frame: FrameType | None) -> None:
        exporter.stop()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    worker = threading.Thread(target=exporter.run, name="exporter-collect", daemon=True)
    worker.start()
    worker.join()
    server.close()
    backend.close()


def register(app: typer.Typer) -> None:
    app.command("exporter")(exporter_command)
