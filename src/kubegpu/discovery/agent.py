"""The discovery agent's edges: read the node's facts, write labels to an NFD file or onto the Node, repeat.

The label set itself comes from `kubegpu.discovery.labels.compute_labels` (pure). This module holds the I/O around
it: reading the backend and the DMI machine name, the two sinks GFD supports (an NFD `features.d` file, written
atomically and removed on exit; or the Node's labels through the Cluster interface), and the sleep loop.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from kubegpu.discovery.labels import (
    checked_features_file,
    compute_labels,
    format_features_file,
    node_label_patch,
    parse_features_file,
)
from kubegpu.errors import ConfigError, KubegpuError
from kubegpu.files import CorruptStateError, read_text, write_durable
from kubegpu.sharing.charges import ChargeTable, node_gpu_memory, quantity_of_bytes
from kubegpu.sharing.devices import allocatable
from kubegpu.sharing.names import GPU_MEMORY_RESOURCE

if TYPE_CHECKING:
    from kubegpu.gpu.backend import GpuBackend
    from kubegpu.kube import Cluster

log = logging.getLogger("kubegpu.discovery")
FEATURE_FILE_LIMIT = 1024 * 1024  # NFD itself skips feature files over 64 KiB; ours are a few KiB


def read_machine_type(path: Path | str) -> str | None:
    """The DMI product name (`NVIDIA DGX A100`); None when unreadable, which GFD labels `unknown`."""
    try:
        return read_text(path, limit=4096).strip() or None
    except (OSError, ConfigError):
        return None


def discover_labels(backend: GpuBackend, config: object, machine: str | None, now: float | None) -> dict[str, str]:
    """Read the backend once and compute the full label set."""
    gpus = sorted(backend.devices(), key=lambda g: g.index)
    mig = {g.index: backend.mig_devices(g.index) for g in gpus if g.mig_enabled}
    return compute_labels(gpus, mig, config, backend.driver_version(), backend.cuda_driver_version(), machine, now)


def discover_gpu_memory(backend: GpuBackend, config: object,
                        mps_slices: Mapping[int, Sequence[int]] | None = None) -> int:
    """The node's `kubegpu.io/gpu-memory` capacity: what the GPU resources the device plugin advertises for this config
    (and the partition agent's MPS slices) are charged (`kubegpu.sharing.charges`), so the real scheduler's fit on
    the charge agrees with its fit on the GPU resources."""
    gpus = sorted(backend.devices(), key=lambda g: g.index)
    mig = {g.index: backend.mig_devices(g.index) for g in gpus if g.mig_enabled}
    advertised = allocatable(gpus, mig, config, mps_slices)
    product = gpus[0].product_name.replace(" ", "-") if gpus else None
    return node_gpu_memory(advertised, product, ChargeTable.from_device_plugin_config(config))


class NodeCapacityWriter:
    """`kubegpu.io/gpu-memory` in the Node's status capacity and allocatable — an extended resource no device plugin
    serves (a byte is not a device), written as Kubernetes documents for node-level extended resources. The kubelet
    keeps extended resources it does not manage; a change is written only when the value differs."""

    def __init__(self, cluster: Cluster, node_name: str) -> None:
        self.cluster = cluster
        self.node_name = node_name

    def write(self, gpu_memory: int) -> bool:
        value = quantity_of_bytes(gpu_memory)
        status = self.cluster.get("Node", self.node_name).get("status") or {}
        if all((status.get(part) or {}).get(GPU_MEMORY_RESOURCE) == value for part in ("capacity", "allocatable")):
            return False
        self.cluster.patch("Node", self.node_name, {"status": {"capacity": {GPU_MEMORY_RESOURCE: value},
                                                               "allocatable": {GPU_MEMORY_RESOURCE: value}}},
                           subresource="status")
        return True


class LabelSink(Protocol):
    def write(self, labels: dict[str, str]) -> None: ...

    def close(self) -> None: ...


class FeatureFileSink:
    """An NFD `features.d` file: replaced atomically (temp file + rename) so NFD never reads half a file.

    The temp file starts with a dot in the same directory: NFD skips hidden files, and a rename within one
    directory is atomic. The file starts with a checksum comment line: a pass that finds the file torn or changed
    logs one line and rewrites it from its fresh discovery; one that finds it whole and already holding these labels
    leaves it alone (NFD re-labels on every change it sees). `close` removes the file, so labels vanish when
    discovery stops, as GFD's do.
    """

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)

    def write(self, labels: dict[str, str]) -> None:
        text = checked_features_file(labels)
        if self._current() == text:
            return
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise KubegpuError(f"output file {self.path}: cannot write: {exc.strerror or exc}") from None
        try:  # the hidden temp (`.name.*.tmp`) is skipped by NFD; fsync + rename make the file whole or absent
            write_durable(self.path, text, mode=0o644)
        except KubegpuError as exc:
            raise KubegpuError(f"output file {exc}") from None

    def _current(self) -> str | None:
        """The file's text if it is whole; None when missing, unreadable or corrupt (logged: it is rewritten)."""
        try:
            text = read_text(self.path, limit=FEATURE_FILE_LIMIT)
            parse_features_file(text, str(self.path))
        except CorruptStateError as exc:
            log.warning("%s; rewriting it from this discovery pass", exc)
            return None
        except ConfigError:
            return None
        return text

    def close(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()


class StdoutSink:
    """`--output-file -`: the labels in the features-file format on standard output, for a look or a pipe."""

    def write(self, labels: dict[str, str]) -> None:
        sys.stdout.write(format_features_file(labels))
        sys.stdout.flush()

    def close(self) -> None:
        """Nothing to remove."""


class NodeLabelSink:
    """The Node's own labels: sets what changed, removes GFD labels that no longer apply, leaves the rest alone."""

    def __init__(self, cluster: Cluster, node_name: str) -> None:
        self.cluster = cluster
        self.node_name = node_name

    def write(self, labels: dict[str, str]) -> None:
        node = self.cluster.get("Node", self.node_name)
        current = (node.get("metadata") or {}).get("labels") or {}
        patch = node_label_patch(current, labels)
        if patch:
            self.cluster.patch("Node", self.node_name, {"metadata": {"labels": patch}})

    def close(self) -> None:
        """Labels stay on the Node when the agent stops: a restart should not make pods unschedulable."""


def run_discovery(
    read_labels: Callable[[], dict[str, str]],
    sink: LabelSink,
    stop: threading.Event,
    interval: float | None,
    oneshot: bool,
    on_error: Callable[[KubegpuError], None] | None = None,
    wake: threading.Event | None = None,
) -> int:
    """Label now, then every `interval` seconds (None: never again) until `stop`; returns the number of passes.

    The first pass fails loudly (a bad config or an unreachable backend should stop a fresh agent); after that a
    failed pass (an API server blip, a driver hiccup) goes to `on_error` and the next pass tries again, so labels
    already written are not withdrawn for a transient fault. A long-running agent closes its sink on the way out,
    whatever ends the loop (SIGTERM sets `stop`); a oneshot run leaves its labels in place, its whole point.
    `wake` (set with `stop`, on SIGHUP and when the config file changes) starts the next pass early, so a per-node
    config switch is labelled (`nvidia.com/mps.capable`, replicas) at once rather than a sleep interval later.
    """
    passes = 0
    try:
        while True:
            try:
                sink.write(read_labels())
                passes += 1
            except KubegpuError as exc:
                if passes == 0 or on_error is None:
                    raise
                on_error(exc)
            if oneshot or stop.is_set():
                return passes
            if wake is None:
                if stop.wait(interval):
                    return passes
                continue
            wake.wait(interval)
            wake.clear()
            if stop.is_set():
                return passes
    finally:
        if not oneshot:
            sink.close()
