"""`kubegpu gpu-guard`: keep every pod on a shared GPU within its GPU-memory share (see docs/gpu-guard.md)."""

from __future__ import annotations

import logging
import signal
import socket
import threading
from collections.abc import Callable
from functools import partial
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING

import typer

from kubegpu.cliopts import duration_option, legacy_alias, log_level_option, metrics_address_option, oneshot_option
from kubegpu.errors import ConfigError
from kubegpu.gpu.options import gpu_backend_option
from kubegpu.guard.core import GuardAction, Policy
from kubegpu.sharing.attribution import DEFAULT_POD_RESOURCES_SOCKET

if TYPE_CHECKING:
    from kubegpu.gpu.backend import GpuDevice, MigDevice
    from kubegpu.sharing.shares import DeviceShare

log = logging.getLogger("kubegpu.guard")
SharesFor = Callable[["list[GpuDevice]", "list[MigDevice]"], "dict[str, DeviceShare]"]

DEFAULT_INTERVAL_S = 0.25
MIB = 1024 * 1024


def parse_reserve(text: str) -> int:
    """`--reserve`: a Kubernetes quantity of memory (`2Gi`, `512Mi`) → MiB; one error line otherwise."""
    from kubegpu.scheduling.quantity import parse_quantity

    try:
        amount = parse_quantity(text.strip())
    except ConfigError as exc:
        raise ConfigError(f"--reserve: {exc}") from None
    if amount < 0:
        raise ConfigError(f"--reserve: must not be negative, got {text!r}")
    return int(amount // MIB)


def register(app: typer.Typer) -> None:
    legacy_alias("gpu-guard", "--once", "--oneshot")

    @app.command("gpu-guard")
    def gpu_guard(
        gpu_backend: str = gpu_backend_option(),
        action: GuardAction = typer.Option(GuardAction.EVICT, "--action", envvar="KUBEGPU_GUARD_ACTION",
                                           help="What to do to a pod over its share: evict (default), kill-process "
                                                "(only the offending process) or warn (Event and metric only)."),
        grace: bool = typer.Option(False, "--grace/--no-grace", envvar="KUBEGPU_GUARD_GRACE",
                                   help="Let a pod exceed its share while the GPU's free memory stays above "
                                        "--reserve; act once it does not."),
        reserve: str = typer.Option("1Gi", "--reserve", envvar="KUBEGPU_GUARD_RESERVE",
                                    help="Free GPU memory to keep (a quantity such as 2Gi) before a pod over its "
                                         "share is acted on under --grace."),
        interval: float = duration_option(DEFAULT_INTERVAL_S, "--interval", minimum=0.01,
                                          help="Time between samples of the GPUs' processes."),
        node_name: str | None = typer.Option(None, "--node-name", envvar="NODE_NAME",
                                             help="This node (default: the simulated node's name, else the host "
                                                  "name)."),
        config: Path | None = typer.Option(None, "--config", "--config-file", envvar="CONFIG_FILE",
                                           help="The device plugin's NVIDIA config (v1), for exact shares (MPS "
                                                "limits); without it shares come from the kubelet's device IDs."),
        mps_slices_file: Path | None = typer.Option(None, "--mps-slices-file", envvar="KUBEGPU_MPS_SLICES_FILE",
                                                    help="MPS memory-slice file the partition agent writes."),
        share_record_file: Path | None = typer.Option(
            None, "--share-record-file", envvar="KUBEGPU_SHARE_RECORD_FILE",
            help="The device plugin's record of each device's share at allocation (its --share-record-file): "
                 "pods are judged by the share they were admitted under, and nothing is done while it switches "
                 "configs."),
        pod_resources_socket: Path = typer.Option(Path(DEFAULT_POD_RESOURCES_SOCKET), "--pod-resources-socket",
                                                  "--pod-resources-kubelet-socket",
                                                  envvar="KUBEGPU_POD_RESOURCES_SOCKET",
                                                  help="The kubelet's PodResources socket."),
        proc_root: Path = typer.Option(Path("/proc"), "--proc-root", envvar="KUBEGPU_PROC_ROOT",
                                       help="The host's /proc (mounted into the DaemonSet's pod)."),
        metrics_address: str | None = metrics_address_option(None),
        once: bool = oneshot_option("One round, print what was done, exit."),
        log_level: str = log_level_option(),
    ) -> None:
        """Watch each shared GPU's processes and act on a pod using more than its GPU-memory share before the
        driver fails a neighbour's allocation."""
        logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        from kubegpu.gpu.backend import open_backend
        from kubegpu.guard.agent import Guard
        from kubegpu.guard.procs import ProcReader
        from kubegpu.kube.eviction import evict_pod
        from kubegpu.kube.lightkube_cluster import LightkubeCluster
        from kubegpu.metrics import GuardMetrics, serve_metrics
        from kubegpu.sharing.attribution import PodResourcesClient

        policy = Policy(action=action, grace=grace, reserve_mib=parse_reserve(reserve))
        shares_for = _config_shares(config, mps_slices_file) if config is not None else None
        backend = open_backend(gpu_backend)
        node = node_name or getattr(backend, "node_name", None) or socket.gethostname()
        cluster = LightkubeCluster()
        metrics = GuardMetrics()
        if metrics_address:
            serve_metrics(metrics_address, metrics.registry)
        guard = Guard(backend, cluster, node, PodResourcesClient(pod_resources_socket), partial(evict_pod, cluster),
                      policy, metrics, ProcReader(proc_root), shares_for=shares_for, share_record=share_record_file)
        if once:
            result = guard.run_once()
            for usage in result.decision.usage:
                h = usage.holding
                typer.echo(f"{h.namespace}/{h.pod} gpu {h.entity[0]}: {usage.used_mib}/{h.share_mib} MiB")
            for done_action, outcome in result.done:
                typer.echo(f"{done_action.holding.namespace}/{done_action.holding.pod}: {outcome} "
                           f"({done_action.reason.value})")
            return
        stop = threading.Event()

        def on_signal(signum: int, frame: FrameType | None) -> None:
            stop.set()

        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)
        log.info("guarding node %s: action %s, grace %s, reserve %d MiB, every %.2f s", node, action.value,
                 grace, policy.reserve_mib, interval)
        while not stop.is_set():
            guard.run_once()
            stop.wait(interval)
        backend.close()


def _config_shares(config: Path, mps_slices_file: Path | None) -> SharesFor:
    """Device shares from the device plugin's own config and MPS slices: the exact source (MPS limits included).
    The config is read again whenever the file changes (the config manager re-points it on a switch), so devices
    with no share record are judged by the config the node runs now. A bad config is an error at start; later it
    fails the round (nothing is done on a config that cannot be read)."""
    from kubegpu.config.deviceplugin_models import parse_device_plugin_config
    from kubegpu.files import file_identity, load_yaml_file
    from kubegpu.sharing.devices import devices_by_resource
    from kubegpu.sharing.mps import read_slices
    from kubegpu.sharing.shares import shares_from_inventory

    def load() -> object:
        raw = load_yaml_file(config)
        parse_device_plugin_config(raw, str(config))
        return raw

    loaded: list[tuple[object, object]] = [(file_identity(config), load())]

    def shares_for(gpus: list[GpuDevice], migs: list[MigDevice]) -> dict[str, DeviceShare]:
        identity = file_identity(config)
        if identity != loaded[0][0]:
            loaded[0] = (identity, load())
        by_gpu: dict[int, list[MigDevice]] = {}
        for mig in migs:
            by_gpu.setdefault(mig.gpu_index, []).append(mig)
        slices = read_slices(mps_slices_file) if mps_slices_file is not None else None
        return shares_from_inventory(devices_by_resource(gpus, by_gpu, loaded[0][1], slices))

    return shares_for
