"""`kubegpu mig-parted apply|assert|export|generate-config` and the `kubegpu mig-manager` node agent.

Flag and env-var names follow nvidia-mig-parted (`-f/--config-file`, `-c/--selected-config`, `MIG_PARTED_*`) and the
GPU Operator's MIG manager (`CONFIG_FILE`, `WITH_REBOOT`, `DEFAULT_GPU_CLIENTS_NAMESPACE`, `HOST_ROOT_MOUNT`).
"""

from __future__ import annotations

import subprocess
import threading
from pathlib import Path
from typing import TYPE_CHECKING

import typer
import yaml

from kubegpu.cliopts import OptionError, legacy_alias, oneshot_option, output_file_option
from kubegpu.errors import ConfigError, KubegpuError
from kubegpu.files import parse_yaml_text, write_durable
from kubegpu.gpu.options import gpu_backend_option

if TYPE_CHECKING:
    from kubegpu.config.migparted import MigPartedConfig
    from kubegpu.gpu.backend import GpuBackend
    from kubegpu.gpu.catalog import GpuModel
    from kubegpu.kube import Cluster
    from kubegpu.sharing.migapply import NodeState

CONFIG_FILE_HELP = "A mig-parted config (version v1); without it, the default config generated from this node's GPUs."

parted_app = typer.Typer(
    name="mig-parted",
    help="Declarative MIG layouts in nvidia-mig-parted's format, applied placement-aware and non-destructively.",
    no_args_is_help=True,
)


def load_config(path: Path | None, state: NodeState) -> MigPartedConfig:
    """The named file, or mig-parted's default config names generated from the GPUs present (as mig-manager does)."""
    from kubegpu.config.migparted import default_mig_parted_config, load_mig_parted_config

    if path is not None:
        return load_mig_parted_config(path)
    return default_mig_parted_config(node_models(state))


def node_models(state: NodeState) -> list[GpuModel]:
    """The catalog models of the node's GPUs (GPUs the catalog does not know have no known MIG geometry)."""
    from kubegpu.gpu.catalog import find_model

    found = (find_model(g.model_key or g.product_name) for g in state.gpus)
    return [m for m in found if m is not None]


def _open(spec: str) -> GpuBackend:
    from kubegpu.gpu.backend import open_backend

    return open_backend(spec)


@parted_app.command("apply", help="Make the GPUs carry the selected config; keeps instances already in it.")
def apply_command(
    config_file: Path | None = typer.Option(None, "-f", "--config-file", envvar="MIG_PARTED_CONFIG_FILE",
                                            help=CONFIG_FILE_HELP),
    selected: str = typer.Option(..., "-c", "--selected-config", envvar="MIG_PARTED_SELECTED_CONFIG",
                                 help="Config name, e.g. all-balanced."),
    gpu_backend: str = gpu_backend_option(),
    force: bool = typer.Option(False, "--force", help="Destroy MIG devices even while processes use them."),
    skip_reset: bool = typer.Option(False, "--skip-reset", envvar="MIG_PARTED_SKIP_RESET",
                                    help="Do not reset GPUs whose MIG mode change is pending."),
) -> None:
    from kubegpu.sharing.migapply import assert_mismatches, execute, plan_apply, read_state

    backend = _open(gpu_backend)
    try:
        state = read_state(backend)
        config = load_config(config_file, state)
        if not assert_mismatches(config, selected, state):
            typer.echo(f"config {selected!r} is already applied")
            return
        plan = plan_apply(config, selected, state, force=force)
        outcome = execute(plan, backend, reset=not skip_reset)
    finally:
        backend.close()
    if outcome.pending_reset:
        raise KubegpuError(
            f"config {selected!r}: MIG mode change on GPUs {outcome.pending_reset} is pending a GPU reset; "
            "reset or reboot, then apply again"
        )
    typer.echo(f"config {selected!r} applied (GPUs changed: {outcome.changed})")


@parted_app.command("assert", help="Exit 0 if the GPUs carry the selected config, else 1, with one line saying why.")
def assert_command(
    config_file: Path | None = typer.Option(None, "-f", "--config-file", envvar="MIG_PARTED_CONFIG_FILE",
                                            help=CONFIG_FILE_HELP),
    selected: str = typer.Option(..., "-c", "--selected-config", envvar="MIG_PARTED_SELECTED_CONFIG",
                                 help="Config name to check, e.g. all-balanced."),
    gpu_backend: str = gpu_backend_option(),
) -> None:
    from kubegpu.sharing.migapply import assert_mismatches, read_state

    backend = _open(gpu_backend)
    try:
        state = read_state(backend)
        problems = assert_mismatches(load_config(config_file, state), selected, state)
    finally:
        backend.close()
    if problems:
        typer.echo(f"config {selected!r} is not applied: {'; '.join(problems)}", err=True)
        raise typer.Exit(1)
    typer.echo(f"config {selected!r} is applied")


@parted_app.command("export", help="Print the current MIG layout as a mig-parted config.")
def export_command(
    gpu_backend: str = gpu_backend_option(),
    config_name: str = typer.Option("current", "--config-name", help="Name of the exported config."),
    output: Path | None = output_file_option(help="Write to this file instead of standard output."),
) -> None:
    from kubegpu.sharing.migapply import export_config, read_state

    backend = _open(gpu_backend)
    try:
        document = export_config(read_state(backend), config_name)
    finally:
        backend.close()
    _emit(yaml.safe_dump(document, sort_keys=False), output)


@parted_app.command("generate-config", help="Print mig-parted's default config names for this node's GPUs.")
def generate_config_command(
    gpu_backend: str = gpu_backend_option(),
    output: Path | None = output_file_option(help="Write to this file instead of standard output."),
) -> None:
    from kubegpu.sharing.migapply import read_state

    backend = _open(gpu_backend)
    try:
        state = read_state(backend)
    finally:
        backend.close()
    _emit(load_config(None, state).to_yaml(), output)


def _emit(text: str, output: Path | None) -> None:
    if output is None:
        typer.echo(text, nl=False)
        return
    write_durable(output, text)  # atomic: a kill never leaves an empty config that could then be applied


# --------------------------------------------------------------------------------------------- mig-manager


def config_map_reference(reference: str) -> tuple[str, str]:
    """`NAMESPACE/NAME` split in two; checked at start-up too, so a typo is one line and not a failed node."""
    namespace, _, name = reference.partition("/")
    if not namespace or not name or "/" in name:
        raise ConfigError(f"--config-map: expected NAMESPACE/NAME, got {reference!r}")
    return namespace, name


def config_map_loader(cluster: Cluster, reference: str) -> MigPartedConfig:
    """The mig-parted config in ConfigMap `NS/NAME` (key `config.yaml`, or its only key), read on every apply."""
    from kubegpu.config.migparted import parse_mig_parted_config

    namespace, name = config_map_reference(reference)
    data = (cluster.get("ConfigMap", name, namespace).get("data") or {})
    key = "config.yaml" if "config.yaml" in data else (next(iter(data)) if len(data) == 1 else None)
    if key is None:
        raise ConfigError(f"ConfigMap {reference}: expected a 'config.yaml' key, found {sorted(data)}")
    source = f"ConfigMap {reference} key {key}"
    if not isinstance(data[key], str):
        raise ConfigError(f"{source}: must be a string")
    parsed = parse_yaml_text(data[key], source)
    return parse_mig_parted_config(parsed, source)


def register(app: typer.Typer) -> None:
    app.add_typer(parted_app, name="mig-parted")
    for command in ("mig-parted export", "mig-parted generate-config"):
        legacy_alias(command, "-o", "--output-file")
        legacy_alias(command, "--output", "--output-file")

    @app.command("mig-manager", help="Node agent: apply the layout named by this Node's nvidia.com/mig.config label.")
    def mig_manager(
        node_name: str = typer.Option(..., "--node-name", envvar="NODE_NAME", help="This node's name."),
        gpu_backend: str = gpu_backend_option(),
        config_file: Path | None = typer.Option(None, "--config-file", envvar="CONFIG_FILE", help=CONFIG_FILE_HELP),
        config_map: str | None = typer.Option(None, "--config-map", help="Read the config from ConfigMap NS/NAME."),
        with_reboot: bool = typer.Option(False, "--with-reboot", envvar="WITH_REBOOT",
                                         help="Reboot the node when a MIG mode change needs a GPU reset."),
        gpu_clients_namespace: str | None = typer.Option(
            None, "--gpu-clients-namespace", envvar="DEFAULT_GPU_CLIENTS_NAMESPACE",
            help="Namespace of the paused operands' pods, to wait for them to stop."),
        host_root: str = typer.Option("/host", "--host-root", envvar="HOST_ROOT_MOUNT",
                                      help="Host root for the reboot (chroot HOST_ROOT reboot)."),
        oneshot: bool = oneshot_option("Reconcile once and exit."),
    ) -> None:
        import signal

        from kubegpu.clock import RealClock
        from kubegpu.kube.lightkube_cluster import LightkubeCluster
        from kubegpu.migmanager.manager import STATE_FAILED, MigManager
        from kubegpu.sharing.migapply import read_state

        if config_file is not None and config_map is not None:
            raise OptionError("--config-file and --config-map: give one, not both")
        if config_map is not None:
            config_map_reference(config_map)
        backend = _open(gpu_backend)
        cluster = LightkubeCluster()

        def loader() -> MigPartedConfig:
            if config_map is not None:
                return config_map_loader(cluster, config_map)
            return load_config(config_file, read_state(backend))

        def reboot() -> None:
            subprocess.run(["chroot", host_root, "reboot"], check=False)

        stop = threading.Event()
        manager = MigManager(
            cluster, backend, node_name, loader, RealClock(), with_reboot=with_reboot, reboot=reboot,
            gpu_clients_namespace=gpu_clients_namespace, sleep=stop.wait,
        )
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
        try:
            if oneshot:
                result = manager.reconcile()
                if result.state == STATE_FAILED:  # the state label and Event say so too; a script needs the status
                    raise KubegpuError(f"mig-manager: {result.state}: {result.message}")
                typer.echo(f"mig-manager: {result.state or 'no config selected'}: {result.message}", err=True)
            else:
                manager.run(stop, on_error=lambda exc: typer.echo(f"warning: {exc}; retrying", err=True))
        finally:
            backend.close()
