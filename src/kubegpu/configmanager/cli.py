"""`kubegpu config-manager`: NVIDIA config-manager's flags and environment variables, so the GPU Operator's pod
specs carry over (ONESHOT, NODE_NAME, NODE_LABEL, CONFIG_FILE_SRCDIR, CONFIG_FILE_DST, DEFAULT_CONFIG,
FALLBACK_STRATEGIES). Its SEND_SIGNAL/SIGNAL/PROCESS_TO_SIGNAL are not needed: our operands watch the file."""

from __future__ import annotations

import logging
import signal
import threading
from pathlib import Path

import typer

from kubegpu.cliopts import log_level_option
from kubegpu.configmanager.select import DEFAULT_LABEL


def register(app: typer.Typer) -> None:
    @app.command("config-manager", help="Link the config this Node's label selects to a file an operand reads; "
                                        "keep following the label (NVIDIA config-manager).")
    def config_manager(
        node_name: str = typer.Option(..., "--node-name", envvar="NODE_NAME", help="This node's name."),
        node_label: str = typer.Option(DEFAULT_LABEL, "--node-label", envvar="NODE_LABEL",
                                       help="The label whose value names a config."),
        srcdir: Path = typer.Option(..., "--config-file-srcdir", envvar="CONFIG_FILE_SRCDIR",
                                    help="Directory of configs (a mounted ConfigMap: one file per key)."),
        dst: Path = typer.Option(..., "--config-file-dst", envvar="CONFIG_FILE_DST",
                                 help="The path the operand reads; made a symlink to the selected config."),
        default: str = typer.Option("", "--default-config", envvar="DEFAULT_CONFIG",
                                    help="Config used when the node has no label."),
        fallbacks: str = typer.Option("", "--fallback-strategies", envvar="FALLBACK_STRATEGIES",
                                      help="Without label and default: named,single,empty (in order)."),
        oneshot: bool = typer.Option(False, "--oneshot/--no-oneshot", envvar="ONESHOT",
                                     help="Select once and exit (the init container)."),
        log_level: str = log_level_option(),
    ) -> None:
        from kubegpu.configmanager.manager import ConfigManager, Settings
        from kubegpu.configmanager.select import parse_fallbacks
        from kubegpu.kube.lightkube_cluster import LightkubeCluster

        logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        settings = Settings(node_name, srcdir, dst, node_label, default, parse_fallbacks(fallbacks))
        manager = ConfigManager(LightkubeCluster(), settings)
        if oneshot:
            selection = manager.once()
            typer.echo(f"config-manager: {selection.name or '<none>'} ({selection.why}) -> {dst}", err=True)
            return
        # nothing to clean up (the link stays for the operand): SIGTERM ends a blocked watch at once
        signal.signal(signal.SIGTERM, _exit)
        manager.run(threading.Event(), on_error=lambda exc: typer.echo(f"warning: {exc}; retrying", err=True))


def _exit(*_: object) -> None:
    raise SystemExit(0)
