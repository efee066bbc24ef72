"""`kubegpu discover`: GPU feature discovery with NVIDIA GFD's flags, env vars and config file."""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from kubegpu.cliopts import (
    OptionError,
    checked_option,
    choice_option,
    duration_option,
    legacy_alias,
    output_file_option,
)
from kubegpu.errors import ConfigError, KubegpuError
from kubegpu.gpu.options import gpu_backend_option
from kubegpu.gpu.xid import DEFAULT_QUIET_PERIOD_S

if TYPE_CHECKING:
    from kubegpu.config.deviceplugin import DevicePluginConfig

MIG_STRATEGIES = ("none", "single", "mixed")
DISCOVER_HELP = (
    "Label the node with every GPU feature discovery label (NVIDIA GFD names): to an NFD features.d file, "
    "or straight onto the Node with --kubernetes."
)


def sleep_interval_seconds(text: str) -> float | None:
    """`60s` → 60.0; `infinite` → None (label once, then wait for a signal), as GFD's --sleep-interval."""
    from kubegpu.config.deviceplugin import parse_go_duration

    if text.strip() == "infinite":
        return None
    try:
        seconds = parse_go_duration(text.strip())
    except ValueError as exc:
        raise ConfigError(f"flags.gfd.sleepInterval: {exc}") from None
    if seconds <= 0:
        raise ConfigError(f"flags.gfd.sleepInterval: must be positive, got {text!r}")
    return seconds


def _sleep_interval(text: str) -> str:
    """The flag's own check (the config file's value is checked where the config is read)."""
    try:
        sleep_interval_seconds(text)
    except ConfigError as exc:
        raise ValueError(str(exc).removeprefix("flags.gfd.sleepInterval: ")) from None
    return text


def register(app: typer.Typer) -> None:
    legacy_alias("discover", "-o", "--output-file")

    @app.command("discover", help=DISCOVER_HELP)
    def discover(
        gpu_backend: str = gpu_backend_option(),
        config_file: Path | None = typer.Option(None, "--config", "--config-file",
                                                help="Device plugin config (NVIDIA v1); env CONFIG_FILE."),
        mig_strategy: str | None = choice_option(None, MIG_STRATEGIES, "--mig-strategy",
                                                 help="MIG strategy: none, single or mixed; env MIG_STRATEGY."),
        oneshot: bool | None = typer.Option(None, "--oneshot/--no-oneshot", help="Label once and exit; GFD_ONESHOT."),
        no_timestamp: bool | None = typer.Option(None, "--no-timestamp/--timestamp",
                                                 help="Leave out nvidia.com/gfd.timestamp; GFD_NO_TIMESTAMP."),
        sleep_interval: str | None = checked_option(
            None, "--sleep-interval", check=_sleep_interval, metavar="DURATION",
            help="Time between passes: a Go duration (60s, 1m30s) or infinite; GFD_SLEEP_INTERVAL."),
        output_file: str | None = output_file_option(
            help="NFD features file ('-': standard output); GFD_OUTPUT_FILE."),
        machine_type_file: str | None = typer.Option(None, "--machine-type-file",
                                                     help="DMI product name file; GFD_MACHINE_TYPE_FILE."),
        node_name: str | None = typer.Option(None, "--node-name", envvar="NODE_NAME", help="This node's name."),
        kubernetes: bool = typer.Option(False, "--kubernetes", help="Patch the Node's labels instead of a file."),
        health_quiet_period: float = duration_option(
            DEFAULT_QUIET_PERIOD_S, "--health-quiet-period", envvar="KUBEGPU_HEALTH_QUIET_PERIOD",
            help="With --kubernetes: how long without a critical XID before AcceleratedHardwareReady is True again."),
    ) -> None:
        from kubegpu.config.deviceplugin import effective_device_plugin_config

        flags: dict[str, Any] = {
            "mig-strategy": mig_strategy, "oneshot": oneshot, "no-timestamp": no_timestamp,
            "sleep-interval": sleep_interval, "output-file": output_file, "machine-type-file": machine_type_file,
        }
        def load_config() -> DevicePluginConfig:
            return effective_device_plugin_config(config_file, os.environ, flags)

        config = load_config()
        interval = sleep_interval_seconds(config.flags.gfd.sleep_interval)
        if kubernetes and not node_name:
            raise OptionError("--kubernetes needs --node-name (or $NODE_NAME): the Node to label")
        watched = config_file or (Path(os.environ["CONFIG_FILE"]) if os.environ.get("CONFIG_FILE") else None)
        source = str(watched or "config")
        _run(gpu_backend, load_config, config, interval, node_name if kubernetes else None, source,
             health_quiet_period, watched)


def _run(
    backend_spec: str,
    load_config: Callable[[], DevicePluginConfig],
    config: DevicePluginConfig,
    interval: float | None,
    node_name: str | None,
    source: str = "config",
    health_quiet_period: float = DEFAULT_QUIET_PERIOD_S,
    watched: Path | None = None,
) -> None:
    """The agent: where the labels go and when come from the first config; each pass re-reads the file, so an
    edited config (sharing, MIG strategy) is labelled without a restart: at once when `watched` (the config file,
    or what its symlink points at) changes or on SIGHUP, else at the next pass.
    On a Node (--kubernetes) each pass also brings the `AcceleratedHardwareReady` condition up to date."""
    from kubegpu.clock import RealClock
    from kubegpu.config.deviceplugin import check_mps_against_gpus
    from kubegpu.discovery.agent import (
        FeatureFileSink,
        LabelSink,
        NodeCapacityWriter,
        NodeLabelSink,
        StdoutSink,
        discover_gpu_memory,
        discover_labels,
        read_machine_type,
        run_discovery,
    )
    from kubegpu.discovery.health import CONDITION_TYPE as CONDITION
    from kubegpu.discovery.health import NodeConditionReporter
    from kubegpu.gpu.backend import open_backend
    from kubegpu.sharing.mps import read_slices
    from kubegpu.sharing.names import GPU_MEMORY_RESOURCE

    gfd = config.flags.gfd
    backend = open_backend(backend_spec)
    clock = RealClock()
    sink: LabelSink
    reporter: NodeConditionReporter | None = None
    capacity: NodeCapacityWriter | None = None
    if node_name:
        from kubegpu.kube.lightkube_cluster import LightkubeCluster

        cluster = LightkubeCluster()
        sink = NodeLabelSink(cluster, node_name)
        capacity = NodeCapacityWriter(cluster, node_name)
        reporter = NodeConditionReporter(cluster, node_name, backend, clock, health_quiet_period)
        target = f"node {node_name}"
    elif gfd.output_file == "-":
        sink, target = StdoutSink(), "standard output"
    else:
        sink = FeatureFileSink(gfd.output_file)
        target = gfd.output_file
    stop, wake = threading.Event(), threading.Event()

    def finish(*_: object) -> None:
        stop.set()
        wake.set()

    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, finish)
    signal.signal(signal.SIGHUP, lambda *_: wake.set())  # config-manager's "reload": a pass now
    if watched is not None:  # a per-node config switch or a ConfigMap edit: a pass now, not a sleep interval later
        threading.Thread(target=_watch_file, args=(watched, wake, stop), daemon=True).start()
    first = [config]

    def read_labels() -> dict[str, str]:
        current = first.pop() if first else load_config()
        check_mps_against_gpus(current, backend.devices(), source)  # GFD refuses MPS with MIG, as the plugin does
        machine = read_machine_type(gfd.machine_type_file)
        labels = discover_labels(backend, current, machine, None if gfd.no_timestamp else clock.now())
        if capacity is not None:
            try:  # as the condition: labels first, a missing grant or a bad slices file must not stop them
                slices_file = os.environ.get("KUBEGPU_MPS_SLICES_FILE")
                slices = read_slices(Path(slices_file)) if slices_file else None
                capacity.write(discover_gpu_memory(backend, current, slices))
            except KubegpuError as exc:
                typer.echo(f"warning: {GPU_MEMORY_RESOURCE} capacity not updated: {exc}", err=True)
        if reporter is not None:
            try:  # labels matter more than the condition: a missing nodes/status grant must not stop labelling
                reporter.report()
            except KubegpuError as exc:
                typer.echo(f"warning: {CONDITION} condition not updated: {exc}", err=True)
        return labels

    try:
        passes = run_discovery(read_labels, sink, stop, interval, gfd.oneshot,
                               on_error=lambda exc: typer.echo(f"warning: labelling pass failed: {exc}", err=True),
                               wake=wake)
    finally:
        backend.close()
    typer.echo(f"discover: {passes} labelling pass(es) written to {target}", err=True)


def _watch_file(path: Path, wake: threading.Event, stop: threading.Event, poll: float = 0.5) -> None:
    from kubegpu.files import file_identity

    seen = file_identity(path)
    while not stop.wait(poll):
        current = file_identity(path)
        if current != seen:
            seen = current
            wake.set()
