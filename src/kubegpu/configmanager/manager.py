"""Follow this Node's config label and keep `dst` a symlink to the selected file of the ConfigMap directory.

A symlink (not a copy) so an edit of the ConfigMap reaches the operand too: the kubelet swaps the ConfigMap volume's
`..data` link, and whoever reads `dst` sees the new file. Operands notice either change by watching `dst`'s target
(its inode changes in both cases). A label naming a config that does not exist is logged in one line and the running
config stays: nothing already running is torn down by a typo.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kubegpu.configmanager.select import DEFAULT_LABEL, EMPTY, Selection, available_configs, select_config
from kubegpu.errors import ConfigError, KubegpuError
from kubegpu.kube.cluster import Cluster

log = logging.getLogger("kubegpu.configmanager")

EMPTY_TARGET = os.devnull  # the "no config" file: an empty file is a config of defaults (as NVIDIA's)


def list_configs(srcdir: Path) -> list[str]:
    try:
        entries = [entry.name for entry in os.scandir(srcdir) if not entry.is_dir()]
    except OSError as exc:
        raise ConfigError(f"{srcdir}: cannot list the configs: {exc.strerror or exc}") from None
    return available_configs(entries)


def link_config(srcdir: Path, name: str, dst: Path) -> bool:
    """Point `dst` at `srcdir/name` (or the empty config) atomically; False when it already does."""
    target = EMPTY_TARGET if name == EMPTY else str(srcdir / name)
    try:
        if os.readlink(dst) == target:
            return False
    except OSError:
        pass  # absent, or a regular file: replaced below
    temp = dst.with_name(f".{dst.name}.{os.getpid()}.tmp")
    try:
        dst.parent.mkdir(parents=True, exist_ok=True)
        temp.unlink(missing_ok=True)
        os.symlink(target, temp)
        os.replace(temp, dst)  # readers see the old link or the new one, never none
    except OSError as exc:
        temp.unlink(missing_ok=True)
        raise KubegpuError(f"{dst}: cannot link the selected config {target}: {exc.strerror or exc}") from None
    return True


@dataclass(frozen=True)
class Settings:
    node_name: str
    srcdir: Path
    dst: Path
    label: str = DEFAULT_LABEL
    default: str = ""
    fallbacks: Sequence[str] = ()


class ConfigManager:
    """One node's selection, re-done on every watch event of its Node (idempotent: no change, no new link)."""

    def __init__(self, cluster: Cluster, settings: Settings) -> None:
        self.cluster = cluster
        self.settings = settings
        self.current: Selection | None = None
        self._last_error: str | None = None

    def select(self, node: dict[str, Any]) -> Selection:
        s = self.settings
        value = ((node.get("metadata") or {}).get("labels") or {}).get(s.label)
        return select_config(value, list_configs(s.srcdir), s.default, s.fallbacks, s.label)

    def sync(self, node: dict[str, Any]) -> bool:
        """Link what the Node selects; True when the link changed. Raises ConfigError for a selection that
        does not exist (the caller decides: fail the init container, or log and keep the running config)."""
        selection = self.select(node)
        changed = link_config(self.settings.srcdir, selection.name, self.settings.dst)
        if changed or self.current is None:
            log.info("config %s (%s) -> %s", selection.name or "<none>", selection.why, self.settings.dst)
        self.current = selection
        self._last_error = None
        return changed

    def once(self) -> Selection:
        """`--oneshot` (the init container): select and link once; a bad selection raises."""
        self.sync(self.cluster.get("Node", self.settings.node_name))
        assert self.current is not None
        return self.current

    def run(self, stop: threading.Event, watch_timeout: float = 60.0, retry_after: float = 5.0,
            on_error: Callable[[KubegpuError], None] | None = None) -> None:
        """Sync now and on every change of this Node until `stop`. A watch (re)start begins with the Node's
        current state, so a change made while the API was unreachable is not missed."""
        while not stop.is_set():
            try:
                self._keep(self.cluster.get("Node", self.settings.node_name))
                for event in self.cluster.watch("Node", field_selector=f"metadata.name={self.settings.node_name}",
                                                timeout=watch_timeout):
                    if stop.is_set():
                        return
                    if event.type != "DELETED":
                        self._keep(event.object)
            except KubegpuError as exc:
                if on_error is None:
                    raise
                on_error(exc)
                stop.wait(retry_after)

    def _keep(self, node: dict[str, Any]) -> None:
        """Sync, but a bad selection only logs (once per distinct problem) and leaves the current link alone."""
        try:
            self.sync(node)
        except ConfigError as exc:
            if str(exc) != self._last_error:
                kept = self.current.name if self.current else "none"
                log.error("%s; keeping the current config (%s)", exc, kept or "<none>")
            self._last_error = str(exc)
