"""`kubegpu device-plugin` and `kubegpu mps-control-daemon`.

Settings come from flags > NVIDIA's env vars > the config file (`kubegpu.config.effective_device_plugin_config`).
Bad input at start-up is one `error:` line and exit 1; SIGTERM removes our sockets and exits 0; SIGHUP reloads.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import threading
from pathlib import Path
from typing import Any

import typer

from kubegpu.cliopts import (
    cdi_root_option,
    checked_option,
    choice_option,
    duration_option,
    legacy_alias,
    log_level_option,
    metrics_address_option,
    oneshot_option,
)
from kubegpu.config.deviceplugin import DEVICE_LIST_STRATEGIES
from kubegpu.endpoints import parse_listen_address
from kubegpu.errors import KubegpuError
from kubegpu.gpu.options import gpu_backend_option

log = logging.getLogger("kubegpu.deviceplugin")
MIG_STRATEGIES = ("none", "single", "mixed")


def _device_list_strategy(value: str) -> str:
    for item in value.split(","):
        if item.strip() not in DEVICE_LIST_STRATEGIES:
            raise ValueError(f"{item.strip()!r} is not one of {', '.join(DEVICE_LIST_STRATEGIES)}")
    return value


_CONFIG = typer.Option(None, "--config", "--config-file", help="NVIDIA device-plugin config (v1).")
_MPS_ROOT = typer.Option(None, "--mps-root", help="Directory for the MPS daemons' pipe and log directories.")
_LOG_LEVEL = log_level_option()


def _flags(**given: Any) -> dict[str, object]:
    """Only the flags the user gave (None = not given), under NVIDIA's flag names."""
    return {name.replace("_", "-"): value for name, value in given.items() if value is not None}


def _setup_logging(level: str) -> None:
    logging.basicConfig(level=level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")


def _kubelet_paths(kubelet_socket: str | None, plugin_dir: Path | None) -> tuple[Path | None, Path]:
    from kubegpu.deviceplugin.manager import DEFAULT_KUBELET_SOCKET

    if kubelet_socket is None:
        kubelet_socket = os.environ.get("KUBELET_SOCKET", str(DEFAULT_KUBELET_SOCKET))
    raw = kubelet_socket
    # absolute, because gRPC reads `unix://relative/x.sock` as a host name
    socket = Path(raw.removeprefix("unix://")).absolute() if raw else None
    directory = (plugin_dir or (socket.parent if socket is not None else DEFAULT_KUBELET_SOCKET.parent)).absolute()
    if not directory.is_dir():
        # name the setting the directory came from: our sockets go next to the kubelet's unless told otherwise
        given = f"--kubelet-socket {raw!r}: its directory" if socket and not plugin_dir else "--device-plugin-dir"
        raise KubegpuError(f"{given} {directory}: not a directory")
    return socket, directory


async def _wait_forever(reason: str) -> None:
    """`failOnInitError: false` on a node without GPUs: log once, then idle until SIGTERM."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    log.warning("%s; failOnInitError is false, so waiting without serving any device", reason)
    await stop.wait()


async def _serve(options: dict[str, Any]) -> None:
    from kubegpu.config.deviceplugin import check_mps_against_gpus, effective_device_plugin_config
    from kubegpu.deviceplugin.health import policy_from_env
    from kubegpu.deviceplugin.manager import DevicePluginManager, PluginSettings
    from kubegpu.gpu.backend import BackendUnavailable, open_backend

    flags, env, config_file = options["flags"], dict(os.environ), options["config"]
    config = effective_device_plugin_config(config_file, env, flags)  # malformed → ConfigError → exit 1
    try:
        backend = open_backend(options["gpu_backend"])
        gpus = backend.devices()
        if not gpus:
            raise BackendUnavailable("no GPUs found on this node")
    except BackendUnavailable as exc:
        if config.flags.fail_on_init_error:
            raise
        await _wait_forever(str(exc))
        return
    policy, warnings = policy_from_env(env, options["health_quiet_period"])
    for warning in warnings:
        log.warning("%s", warning)
    watched = config_file or (Path(env["CONFIG_FILE"]) if env.get("CONFIG_FILE") else None)
    settings = PluginSettings(
        plugin_dir=options["plugin_dir"],
        kubelet_socket=options["kubelet_socket"],
        cdi_dir=options["cdi_dir"],
        relist_interval_s=options["relist_interval"],
        health_interval_s=min(1.0, max(0.1, options["health_quiet_period"] / 4)),
        config_file=watched,
        mps_slices_file=options["mps_slices_file"],
        share_record_file=options["share_record_file"],
        control_devices=options["control_devices"],
    )
    source = str(watched or "device plugin settings")

    def load_config() -> object:
        """The merged config, checked against the GPUs (MPS limits, no MPS with MIG) — at start and on reload."""
        merged = effective_device_plugin_config(config_file, dict(os.environ), flags)
        check_mps_against_gpus(merged, backend.devices(), source)
        return merged

    manager = DevicePluginManager(backend, load_config, settings, policy)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGQUIT):
        loop.add_signal_handler(sig, stop.set)
    loop.add_signal_handler(signal.SIGHUP, manager.request_reload)  # handled once the run loop is up
    metrics = options["metrics_address"] or None
    if metrics is not None:
        parse_listen_address(metrics, "--metrics-address")  # a bad address fails before any socket is made
    try:
        await manager.start()
    except BaseException:
        await manager.stop()  # never leave half of our sockets behind
        raise
    if metrics is not None:
        from kubegpu.metrics import health_registry, serve_metrics

        try:
            serve_metrics(metrics, health_registry(manager.health_snapshot))
        except KubegpuError:
            await manager.stop()
            raise
    log.info("serving %s", ", ".join(f"{r}={len(d)}" for r, d in manager.listing.items()) or "no devices")
    await manager.run(stop)
    log.info("stopped; sockets removed")


def _control_devices(gpu_backend: str, dev_root: str) -> tuple[str, ...]:
    """On real hardware pass only the control nodes that exist; a simulated node pretends all do."""
    from kubegpu.deviceplugin.allocate import CONTROL_DEVICES

    if gpu_backend.startswith("sim:"):
        return CONTROL_DEVICES
    root = dev_root.rstrip("/")
    return tuple(p for p in CONTROL_DEVICES if Path(f"{root}{p}").exists())


def register(app: typer.Typer) -> None:
    legacy_alias("device-plugin", "--cdi-dir", "--cdi-root")

    @app.command("device-plugin")
    def device_plugin(
        config: Path | None = _CONFIG,
        gpu_backend: str = gpu_backend_option(),
        kubelet_socket: str | None = typer.Option(
            None, "--kubelet-socket",
            help="The kubelet's registration socket ('' = do not register); env KUBELET_SOCKET."
        ),
        device_plugin_dir: Path | None = typer.Option(None, "--device-plugin-dir",
                                                      help="Directory where our sockets go."),
        mig_strategy: str | None = choice_option(None, MIG_STRATEGIES, "--mig-strategy",
                                                 help="MIG strategy: none, single or mixed."),
        fail_on_init_error: bool | None = typer.Option(None, "--fail-on-init-error/--no-fail-on-init-error",
                                                       help="Exit when no GPU can be served at start."),
        pass_device_specs: bool | None = typer.Option(None, "--pass-device-specs/--no-pass-device-specs",
                                                      help="Pass the GPUs' device nodes in Allocate responses."),
        device_list_strategy: str | None = checked_option(
            None, "--device-list-strategy", check=_device_list_strategy,
            help="Comma list of envvar, volume-mounts, cdi-annotations, cdi-cri."),
        device_id_strategy: str | None = choice_option(None, ("uuid", "index"), "--device-id-strategy",
                                                       help="Device IDs: uuid or index."),
        mps_root: str | None = _MPS_ROOT,
        relist_interval: float = duration_option(2.0, "--relist-interval", minimum=0.05,
                                                 help="Time between re-lists of the GPUs."),
        mps_slices_file: Path | None = typer.Option(None, "--mps-slices-file", envvar="KUBEGPU_MPS_SLICES_FILE",
                                                    help="MPS memory-slice file the partition agent writes."),
        share_record_file: Path | None = typer.Option(
            None, "--share-record-file", envvar="KUBEGPU_SHARE_RECORD_FILE",
            help="Record each device ID's GPU-memory share at Allocate, and config hand-overs, here (the GPU "
                 "guard's --share-record-file): a running pod keeps the share it was admitted under."),
        cdi_dir: Path = cdi_root_option(envvar="KUBEGPU_CDI_DIR",
                                        help="Directory for CDI specs (written only with a cdi-* list strategy)."),
        health_quiet_period: float = duration_option(
            300.0, "--health-quiet-period", envvar="KUBEGPU_HEALTH_QUIET_PERIOD",
            help="How long without a critical XID before an unhealthy GPU may recover."),
        metrics_address: str | None = metrics_address_option(None),
        node_name: str | None = typer.Option(None, "--node-name", envvar="NODE_NAME", help="This node's name."),
        log_level: str = _LOG_LEVEL,
    ) -> None:
        """Serve GPUs to the kubelet (device-plugin API v1beta1), NVIDIA-compatible."""
        _setup_logging(log_level)
        socket, directory = _kubelet_paths(kubelet_socket, device_plugin_dir)
        flags = _flags(
            mig_strategy=mig_strategy,
            fail_on_init_error=fail_on_init_error,
            pass_device_specs=pass_device_specs,
            device_list_strategy=device_list_strategy,
            device_id_strategy=device_id_strategy,
            mps_root=mps_root,
        )
        dev_root = os.environ.get("NVIDIA_DEV_ROOT") or os.environ.get("NVIDIA_DRIVER_ROOT") or "/"
        options = {
            "flags": flags,
            "config": config,
            "gpu_backend": gpu_backend,
            "kubelet_socket": socket,
            "plugin_dir": directory,
            "cdi_dir": cdi_dir,
            "relist_interval": relist_interval,
            "mps_slices_file": mps_slices_file,
            "share_record_file": share_record_file,
            "health_quiet_period": health_quiet_period,
            "metrics_address": metrics_address,
            "node_name": node_name,
            "control_devices": _control_devices(gpu_backend, dev_root),
        }
        asyncio.run(_serve(options))

    @app.command("mps-control-daemon")
    def mps_control_daemon(
        config: Path | None = _CONFIG,
        gpu_backend: str = gpu_backend_option(),
        mps_root: str | None = _MPS_ROOT,
        oneshot: bool = oneshot_option("Configure, record and exit instead of waiting."),
        log_level: str = _LOG_LEVEL,
    ) -> None:
        """Start and configure nvidia-cuda-mps-control per MPS resource (records the limits on a sim node); without
        --oneshot, follow the config file (a per-node config switch) until SIGTERM."""
        from kubegpu.config.deviceplugin import check_mps_against_gpus, effective_device_plugin_config
        from kubegpu.deviceplugin.mps import find_mps_control
        from kubegpu.deviceplugin.mpsdaemon import MpsDaemons
        from kubegpu.gpu.backend import open_backend

        _setup_logging(log_level)
        flags = _flags(mps_root=mps_root)
        source = str(config or os.environ.get("CONFIG_FILE") or "config")

        def load_config() -> Any:
            # the plugin refuses this config on these GPUs (MPS with MIG, too many clients): start no daemon for it
            settings = effective_device_plugin_config(config, dict(os.environ), flags)
            check_mps_against_gpus(settings, backend.devices(), source)
            return settings

        stop, reload = threading.Event(), threading.Event()
        if not oneshot:  # before any daemon starts: a SIGTERM from then on stops them and removes the record
            signal.signal(signal.SIGTERM, lambda *_: stop.set())
            signal.signal(signal.SIGINT, lambda *_: stop.set())
            signal.signal(signal.SIGHUP, lambda *_: reload.set())  # NVIDIA config-manager's nudge: re-read now
        backend = open_backend(gpu_backend)
        daemons = MpsDaemons(backend, load_config, None if gpu_backend.startswith("sim:") else find_mps_control())
        watched = config or (Path(os.environ["CONFIG_FILE"]) if os.environ.get("CONFIG_FILE") else None)
        root, plans = daemons.desired()
        if not plans and (oneshot or watched is None):
            raise KubegpuError(f"{source}: sharing.mps: no MPS-shared resources configured")
        daemons.apply()
        if plans:
            typer.echo(f"MPS limits for {len(plans)} resource(s) recorded in {root / 'kubegpu-mps-limits.json'}")
        if oneshot:
            return
        if watched is None:  # settings from flags only: nothing to follow
            stop.wait()
            daemons.stop()
            return
        daemons.follow(watched, stop, reload)
