"""`kubegpu validate driver|toolkit|cuda|plugin|mig` (the validator DaemonSet's init containers), `validate hold`
(its main container: removes the barriers on stop) and `validate metrics` (the node-status exporter)."""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import typer

from kubegpu.cliopts import OptionError, checked_option, choice_option, duration_option, output_dir_option
from kubegpu.errors import KubegpuError
from kubegpu.gpu.options import gpu_backend_option

validate_app = typer.Typer(
    help="Validate this node's GPU stack and write the barrier files the operands wait on (/run/nvidia/validations).",
    no_args_is_help=True,
)

_BACKEND = gpu_backend_option()
_DIR = output_dir_option(Path("/run/nvidia/validations"), envvar="VALIDATIONS_DIR",
                         help="Directory where the barrier files go.")
_WAIT = typer.Option(False, "--wait/--no-wait", envvar="WITH_WAIT", help="Retry until it passes (or --attempts).")
_ATTEMPTS = typer.Option(60, "--attempts", min=1, help="Tries with --wait.")
_INTERVAL = duration_option(5.0, "--interval", help="Time between tries.")


def _address(address: str) -> str:
    from kubegpu.endpoints import parse_listen_address

    parse_listen_address(address, "--address")
    return address


def _run(component: str, check: Callable[[], Any], directory: Path, wait: bool, attempts: int,
         interval: float) -> None:
    from kubegpu.validate.checks import remove_barrier, run_with_retries, write_barrier

    remove_barrier(directory, component)  # a stale success must not outlive a failing re-run
    result = run_with_retries(check, attempts if wait else 1, time.sleep, interval)
    if not result.ok:
        raise KubegpuError(f"{component} validation failed: {result.message}")
    path = write_barrier(directory, component, result)
    typer.echo(f"{component} validation passed: {result.message} ({path})")


def _backend_check(spec: str, fn: Callable[[Any], Any]) -> Callable[[], Any]:
    from kubegpu.gpu.backend import open_backend

    def check() -> Any:
        backend = open_backend(spec)
        try:
            return fn(backend)
        finally:
            backend.close()

    return check


@validate_app.command("driver", help="The driver answers; writes driver-ready with KEY=value lines.")
def driver(gpu_backend: str = _BACKEND, output_dir: Path = _DIR, wait: bool = _WAIT, attempts: int = _ATTEMPTS,
           interval: float = _INTERVAL) -> None:
    from kubegpu.validate.checks import check_driver, environment

    env = environment()
    _run("driver", _backend_check(gpu_backend, lambda b: check_driver(b, env)), output_dir, wait, attempts, interval)


@validate_app.command("toolkit", help="GPUs are visible in a runtime-injected container; writes toolkit-ready.")
def toolkit(gpu_backend: str = _BACKEND, output_dir: Path = _DIR, wait: bool = _WAIT, attempts: int = _ATTEMPTS,
            interval: float = _INTERVAL) -> None:
    from kubegpu.validate.checks import check_toolkit

    _run("toolkit", _backend_check(gpu_backend, lambda b: check_toolkit(b, output_dir)), output_dir, wait,
         attempts, interval)


@validate_app.command("cuda", help="A CUDA workload runs on every GPU; writes cuda-ready.")
def cuda(gpu_backend: str = _BACKEND, output_dir: Path = _DIR, wait: bool = _WAIT, attempts: int = _ATTEMPTS,
         interval: float = _INTERVAL) -> None:
    from kubegpu.validate.checks import check_cuda

    _run("cuda", _backend_check(gpu_backend, check_cuda), output_dir, wait, attempts, interval)


@validate_app.command("mig", help="Every MIG-mode GPU has MIG devices; writes mig-ready.")
def mig(gpu_backend: str = _BACKEND, output_dir: Path = _DIR, wait: bool = _WAIT, attempts: int = _ATTEMPTS,
        interval: float = _INTERVAL) -> None:
    from kubegpu.validate.checks import check_mig

    _run("mig", _backend_check(gpu_backend, check_mig), output_dir, wait, attempts, interval)


@validate_app.command("plugin", help="The Node advertises nvidia.com/gpu or nvidia.com/mig-*; writes plugin-ready.")
def plugin(
    gpu_backend: str = _BACKEND, output_dir: Path = _DIR,
    wait: bool = typer.Option(True, "--wait/--no-wait", help="Retry until it passes (or --attempts)."),
    attempts: int = typer.Option(30, "--attempts", min=1, help="Tries with --wait."), interval: float = _INTERVAL,
    node_name: str | None = typer.Option(None, "--node-name", envvar="NODE_NAME", help="This node's name."),
    node_file: Path | None = typer.Option(None, "--node-file", help="Read the Node from a YAML/JSON file instead."),
    mig_strategy: str = choice_option("single", ("none", "single", "mixed"), "--mig-strategy", envvar="MIG_STRATEGY",
                                      help="MIG strategy the device plugin runs with: none, single or mixed."),
) -> None:
    from kubegpu.validate.checks import check_plugin

    del gpu_backend  # accepted for symmetry: the plugin check reads the Node, not the GPUs
    if node_file is None and not node_name:
        raise OptionError("--node-name: validate plugin needs --node-name (or $NODE_NAME) or --node-file")

    def read_node() -> dict[str, Any]:
        if node_file is not None:
            from kubegpu.files import load_yaml_file

            data = load_yaml_file(node_file)
            if not isinstance(data, dict):
                raise KubegpuError(f"{node_file}: not a Node")
            return data
        from kubegpu.kube.lightkube_cluster import LightkubeCluster

        return LightkubeCluster().get("Node", str(node_name))

    _run("plugin", lambda: check_plugin(read_node(), mig_strategy), output_dir, wait, attempts, interval)


def _wait_for_stop() -> None:
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    stop.wait()


@validate_app.command("hold", help="Stay up while validated; on stop remove every *-ready barrier file.")
def hold(output_dir: Path = _DIR) -> None:
    from kubegpu.validate.checks import remove_all

    typer.echo("all validations are successful")
    _wait_for_stop()
    removed = remove_all(output_dir)
    typer.echo(f"stopped: removed {', '.join(removed) or 'nothing'}")


@validate_app.command("metrics", help="Serve per-node readiness gauges read from the barrier files.")
def metrics(
    output_dir: Path = _DIR,
    address: str = checked_option(":8000", "--address", check=_address, metavar="HOST:PORT",
                                  help="HOST:PORT to serve /metrics on."),
    node_name: str = typer.Option("", "--node-name", envvar="NODE_NAME", help="This node's name (a metric label)."),
) -> None:
    from kubegpu.metrics import serve_metrics
    from kubegpu.validate.metrics import readiness_registry

    port = serve_metrics(address, readiness_registry(output_dir, node_name))
    typer.echo(f"serving readiness gauges on :{port}/metrics")
    _wait_for_stop()


def register(app: typer.Typer) -> None:
    app.add_typer(validate_app, name="validate")
