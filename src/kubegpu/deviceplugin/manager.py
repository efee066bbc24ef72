"""The device plugin's lifecycle: serve every resource, register, follow the kubelet, the GPUs and the config.

* One `ResourceServer` per resource; `apply` keeps servers of unchanged resources running (their ListAndWatch
  streams just get a new list), starts servers for new resources and stops removed ones.
* The kubelet socket is polled every 100 ms; when it is re-created (kubelet restart, which also deletes our
  sockets) every server is restarted on a fresh socket and registered again.
* The backend is re-listed every `relist_interval` (MIG devices made by the MIG manager, MPS slices file).
* XID events feed a `HealthTracker`; a failing GPU marks all its IDs Unhealthy and recovers after a quiet period.
* `reload()` (SIGHUP or the config file changing) re-reads the config; an invalid one is logged in one line and
  the running config is kept.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubegpu.clock import Clock, RealClock
from kubegpu.deviceplugin.allocate import CONTROL_DEVICES, AllocateOptions
from kubegpu.deviceplugin.health import HealthPolicy, HealthTracker
from kubegpu.deviceplugin.preferred import PairScore, link_pair_score, numa_pair_score
from kubegpu.deviceplugin.server import ResourceServer, ServingState, register, socket_name, unhealthy_ids
from kubegpu.errors import ConfigError, KubegpuError
from kubegpu.files import file_identity
from kubegpu.gpu import standins
from kubegpu.gpu.backend import responds
from kubegpu.sharing.allocations import ShareRecorder
from kubegpu.sharing.cdi import cdi_spec, ensure_stand_ins, write_cdi_spec
from kubegpu.sharing.devices import (
    AnnotatedDevice,
    config_dict,
    devices_by_resource,
    sharing_spec,
)
from kubegpu.sharing.mps import read_slices
from kubegpu.sharing.shares import device_share, recorded_share

log = logging.getLogger("kubegpu.deviceplugin")

DEFAULT_PLUGIN_DIR = Path("/var/lib/kubelet/device-plugins")
DEFAULT_KUBELET_SOCKET = DEFAULT_PLUGIN_DIR / "kubelet.sock"
KUBELET_POLL_S = 0.1
OPTIONAL_FEATURE_ENVS = (
    ("gdsEnabled", "NVIDIA_GDS"),
    ("mofedEnabled", "NVIDIA_MOFED"),
    ("gdrcopyEnabled", "NVIDIA_GDRCOPY"),
)


@dataclass(frozen=True)
class PluginSettings:
    """Run-time settings that are not part of NVIDIA's config file (CLI-only flags)."""

    plugin_dir: Path = DEFAULT_PLUGIN_DIR
    kubelet_socket: Path | None = DEFAULT_KUBELET_SOCKET  # None: serve without registering (tests, debugging)
    cdi_dir: Path | None = None
    relist_interval_s: float = 2.0
    health_interval_s: float = 1.0
    config_file: Path | None = None  # watched for changes
    mps_slices_file: Path | None = None
    share_record_file: Path | None = None  # each device ID's share at Allocate, and config hand-overs (the guard)
    control_devices: tuple[str, ...] = CONTROL_DEVICES


def allocate_options(config: Mapping[str, Any], control_devices: Sequence[str] = CONTROL_DEVICES,
                     stand_ins: str | None = None) -> AllocateOptions:
    """The Allocate-relevant part of the merged config, in NVIDIA's shape; ``stand_ins``: a simulated node's
    stand-in device directory (`kubegpu.gpu.standins`), which device specs then name as host paths."""
    flags = config.get("flags") or {}
    plugin = flags.get("plugin") or {}
    strategies = plugin.get("deviceListStrategy") or ["envvar"]
    if isinstance(strategies, str):
        strategies = [strategies]
    extra: dict[str, str] = {}
    for key, env in OPTIONAL_FEATURE_ENVS:
        if flags.get(key):
            extra[env] = "enabled"
    channels = (config.get("imex") or {}).get("channelIDs") or []
    if channels:
        extra["NVIDIA_IMEX_CHANNELS"] = ",".join(str(c) for c in channels)
    return AllocateOptions(
        device_list_strategies=tuple(strategies),
        pass_device_specs=bool(plugin.get("passDeviceSpecs", False)),
        dev_root=str(flags.get("nvidiaDevRoot") or flags.get("nvidiaDriverRoot") or "/"),
        control_devices=tuple(control_devices),
        stand_ins=stand_ins,
        mps_root=str(flags.get("mpsRoot") or "/run/nvidia/mps"),
        cdi_annotation_prefix=str(plugin.get("cdiAnnotationPrefix") or "cdi.k8s.io/"),
        fail_requests_greater_than_one=sharing_spec(config).fail_requests_greater_than_one,
        extra_envs=extra,
    )


def topology_pair_score(backend: Any) -> PairScore:
    """NVLink-aware scoring when the backend can report links (optional `nvlink_topology()` →
    {(gpu i, gpu j): link count}); otherwise same-NUMA vs cross-NUMA, which every backend knows."""
    topology = getattr(backend, "nvlink_topology", None)
    if callable(topology):
        try:
            return link_pair_score(dict(topology()))
        except KubegpuError as exc:
            log.warning("no NVLink topology (%s); scoring GPUs by NUMA node", exc)
    return numa_pair_score


@dataclass
class _Snapshot:
    """What was last read from the backend, so a relist only pushes a change."""

    gpus: list[Any] = field(default_factory=list)
    mig: dict[int, list[Any]] = field(default_factory=dict)
    slices: dict[int, list[int]] = field(default_factory=dict)


class DevicePluginManager:
    """Owns the per-resource servers and keeps them in step with GPUs, health, config and the kubelet."""

    def __init__(
        self,
        backend: Any,
        load_config: Callable[[], object],
        settings: PluginSettings,
        health: HealthPolicy,
        clock: Clock | None = None,
        pair_score: PairScore | None = None,
    ) -> None:
        self.backend = backend
        self.load_config = load_config
        self.settings = settings
        self.clock = clock or RealClock()
        self.tracker = HealthTracker(health)
        self.pair_score = pair_score or topology_pair_score(backend)
        stand_in_dir = standins.for_backend(backend)
        self.stand_ins = str(stand_in_dir) if stand_in_dir is not None else None
        self.config: dict[str, Any] = {}
        self.servers: dict[str, ResourceServer] = {}
        self.listing: dict[str, list[AnnotatedDevice]] = {}
        self.registrations = 0
        self._snapshot = _Snapshot()
        self._xid_since = 0.0
        self._lock = asyncio.Lock()
        self._reload_requested = asyncio.Event()
        self._unregistered: set[str] = set()
        self._registering: set[str] = set()  # a Register in flight
        self._relist_stamp: object = None
        self._xid_stamp: object = None
        self._slices_error: str | None = None
        self._config_seen: object = None  # the config file's identity when it was last read
        self.recorder = ShareRecorder(settings.share_record_file) if settings.share_record_file else None

    # ------------------------------------------------------------------------------------------- state

    def health_snapshot(self) -> list[tuple[str, str, bool]]:
        """(resource, device id, healthy) for every advertised ID: what the metric shows."""
        bad = self.tracker.unhealthy
        return [(r, d.id, d.gpu_index not in bad) for r, devices in self.listing.items() for d in devices]

    def _read_backend(self) -> _Snapshot:
        gpus = self.backend.devices()
        mig = {g.index: self.backend.mig_devices(g.index) for g in gpus if g.mig_enabled}
        slices = self._snapshot.slices
        if self.settings.mps_slices_file is not None:
            try:
                slices = read_slices(self.settings.mps_slices_file)
                self._slices_error = None
            except ConfigError as exc:  # torn or foreign (CorruptStateError) included: the partition agent rewrites it
                if str(exc) != self._slices_error:  # one line per problem, not one per re-list
                    log.error("%s (keeping the previous slices)", exc)
                self._slices_error = str(exc)
        return _Snapshot(gpus, mig, slices)

    def _compute(self, config: Mapping[str, Any], snapshot: _Snapshot) -> dict[str, list[AnnotatedDevice]]:
        """The accounting for this node; a config that does not fit it is reported against the config file."""
        try:
            return devices_by_resource(snapshot.gpus, snapshot.mig, config, snapshot.slices)
        except ConfigError as exc:
            source = self.settings.config_file
            if source is None or str(exc).startswith(str(source)):
                raise
            raise ConfigError(f"{source}: {exc}") from None

    def _state(self, devices: list[AnnotatedDevice]) -> ServingState:
        plugin = (self.config.get("flags") or {}).get("plugin") or {}
        return ServingState(
            devices=devices,
            unhealthy=unhealthy_ids(devices, self.tracker.unhealthy),
            options=allocate_options(self.config, self.settings.control_devices, self.stand_ins),
            policy=str(plugin.get("sharedDevicesAllocationPolicy") or "distributed"),
            pair_score=self.pair_score,
            record=self._record_allocation if self.recorder is not None else None,
        )

    def _record_allocation(self, devices: list[AnnotatedDevice]) -> None:
        assert self.recorder is not None
        self.recorder.allocated((d.id, recorded_share(device_share(d))) for d in devices)

    def _handover(self, started: bool) -> None:
        """Mark a config application's start or end for the guard; a failed write is logged (recorded shares do
        not depend on it, only pods allocated before recording began do)."""
        if self.recorder is None:
            return
        try:
            if started:
                self.recorder.handover_started()
            else:
                self.recorder.handover_finished()
        except KubegpuError as exc:
            log.error("cannot record the config hand-over: %s", exc)

    # ------------------------------------------------------------------------------------------- serving

    async def start(self) -> None:
        """Read config and GPUs, serve every resource and register it. Bad config raises (exit 1 at start-up)."""
        self._config_seen = self._config_stamp()
        self.config = config_dict(self.load_config())
        self._snapshot = await asyncio.to_thread(self._read_backend)
        self._xid_since = self.clock.now()
        listing = self._compute(self.config, self._snapshot)
        self._handover(True)
        await self._apply(listing)
        self._handover(False)

    async def _apply(self, listing: dict[str, list[AnnotatedDevice]]) -> None:
        async with self._lock:
            self.listing = listing
            for resource in [r for r in self.servers if r not in listing]:
                log.info("resource %s is no longer advertised; stopping its server", resource)
                await self.servers.pop(resource).stop()
            fresh: list[str] = []
            for resource, devices in listing.items():
                server = self.servers.get(resource)
                if server is None:
                    path = self.settings.plugin_dir / socket_name(resource)
                    server = ResourceServer(resource, path, self._state(devices))
                    try:
                        await server.start()
                    except KubegpuError as exc:
                        if not self.servers and not fresh:
                            raise  # nothing serves yet: a start-up failure
                        log.error("%s; %s is not served", exc, resource)
                        continue
                    self.servers[resource] = server
                    fresh.append(resource)
                else:
                    await server.servicer.update(self._state(devices))
            self._write_cdi()
        for resource in fresh:
            await self._register(resource)

    def _write_cdi(self) -> None:
        """The CDI spec of every advertised device (CDI strategies), and on a simulated node the stand-in devices
        any spec or device spec names, so the container runtime finds each host path it is handed."""
        options = allocate_options(self.config, stand_ins=self.stand_ins)
        cdi = self.settings.cdi_dir is not None and bool({"cdi-annotations", "cdi-cri"} & set(
            options.device_list_strategies))
        if not cdi and not (self.stand_ins is not None and options.pass_device_specs):
            return
        devices = [d for ds in self.listing.values() for d in ds]
        spec = cdi_spec(devices, options.cdi_kind, options.dev_root, self.stand_ins)
        try:
            if cdi and self.settings.cdi_dir is not None:
                write_cdi_spec(self.settings.cdi_dir, spec, self.stand_ins)
            else:
                ensure_stand_ins(spec, self.stand_ins)
        except KubegpuError as exc:
            log.error("%s", exc)

    async def _register(self, resource: str) -> None:
        """Register one resource; on failure remember it, and the kubelet watcher retries every second.

        Never twice at once: a Register still in flight (a busy kubelet answers slowly) is not sent again. The kubelet
        refuses a second Register for a socket it is still connecting ("device plugin already connected"), and then
        drops its record of the first connection while keeping the socket marked connected — every later Register
        on that socket is refused until the kubelet restarts."""
        kubelet = self.settings.kubelet_socket
        server = self.servers.get(resource)
        if kubelet is None or server is None or resource in self._registering:
            return
        self._unregistered.add(resource)
        if not kubelet.exists():
            log.warning("%s does not exist yet; %s registers when the kubelet appears", kubelet, resource)
            return
        self._registering.add(resource)
        try:
            await register(kubelet, server.socket_path.name, resource, timeout=2.0)
        except KubegpuError as exc:
            log.error("%s; will retry", exc)
            return
        finally:
            self._registering.discard(resource)
        self._unregistered.discard(resource)
        self.registrations += 1
        log.info("registered %s on %s", resource, server.socket_path.name)

    async def retry_registrations(self) -> None:
        for resource in sorted(self._unregistered):
            await self._register(resource)

    async def reregister(self) -> None:
        """The kubelet restarted (and removed our sockets): serve on fresh sockets and register everything."""
        async with self._lock:
            for resource, server in list(self.servers.items()):
                await server.stop(grace=0)
                fresh = ResourceServer(resource, server.socket_path, server.servicer.state)
                await fresh.start()
                self.servers[resource] = fresh
        for resource in list(self.servers):
            await self._register(resource)

    async def stop(self) -> None:
        async with self._lock:
            for server in self.servers.values():
                await server.stop(grace=0)
            self.servers.clear()

    # ------------------------------------------------------------------------------------------- changes

    def _stamp(self) -> object:
        """A cheap "has the node changed?" token: the sim state file's mtime, or its generation; None = unknown."""
        path = getattr(self.backend, "path", None)
        if isinstance(path, Path):
            return _mtime(path)
        generation = getattr(self.backend, "generation", None)
        return generation() if callable(generation) else None

    async def relist(self) -> bool:
        """Re-read GPUs, MIG devices and slices; push a new list only when something changed."""
        stamp = (self._stamp(), _mtime(self.settings.mps_slices_file) if self.settings.mps_slices_file else None)
        if stamp[0] is not None and stamp == self._relist_stamp:
            return False
        self._relist_stamp = stamp
        try:
            snapshot = await asyncio.to_thread(self._read_backend)
        except KubegpuError as exc:
            log.error("relist failed: %s", exc)
            return False
        if snapshot == self._snapshot:
            return False
        try:
            listing = self._compute(self.config, snapshot)
        except KubegpuError as exc:
            log.error("relist: %s (keeping the current devices)", exc)
            return False
        self._snapshot = snapshot
        await self._apply(listing)
        return True

    async def reload(self) -> bool:
        """Re-read the config; invalid → one log line and the running config stays."""
        self._config_seen = self._config_stamp()  # taken before reading: a change while reading is seen again
        try:
            config = config_dict(self.load_config())
            listing = self._compute(config, self._snapshot)
        except KubegpuError as exc:
            log.error("config reload rejected, keeping the running config: %s", exc)
            return False
        self._handover(True)
        self.config = config
        await self._apply(listing)
        self._handover(False)
        log.info("config reloaded: %s", ", ".join(f"{r}={len(d)}" for r, d in listing.items()) or "no devices")
        return True

    def request_reload(self) -> None:
        """Safe from a signal handler: the run loop performs the reload."""
        self._reload_requested.set()

    async def check_health(self) -> bool:
        """Feed new XID events to the tracker and try recovery; push lists when health changed."""
        now = self.clock.now()
        stamp = self._stamp()
        events = []
        if stamp is None or stamp != self._xid_stamp:
            try:
                events = await asyncio.to_thread(self.backend.xid_events, self._xid_since)
            except KubegpuError as exc:
                log.error("reading XID events failed: %s", exc)
                return False
            self._xid_stamp = stamp
        if events:
            self._xid_since = max(self._xid_since, *(e.timestamp for e in events))
        newly = self.tracker.observe(events, now)
        for index in newly:
            log.warning("GPU %d unhealthy after XID %d", index, self.tracker.last_xid.get(index, 0))
        recovered = self.tracker.recover(now, functools.partial(responds, self.backend))
        for index in recovered:
            log.info("GPU %d healthy again after a quiet period", index)
        if newly or recovered:
            await self._apply(self.listing)
            return True
        return False

    # ------------------------------------------------------------------------------------------- loops

    async def run(self, stop: asyncio.Event) -> None:
        """Until `stop` is set: follow the kubelet socket, relist, health, config file and reload requests."""
        tasks = [
            asyncio.create_task(self._watch_kubelet(stop)),
            asyncio.create_task(self._every(self.settings.relist_interval_s, self.relist, stop)),
            asyncio.create_task(self._every(self.settings.health_interval_s, self.check_health, stop)),
            asyncio.create_task(self._watch_config(stop)),
            asyncio.create_task(self._reload_on_request(stop)),
        ]
        try:
            await stop.wait()
        finally:
            for task in tasks:
                task.cancel()
            for task in tasks:
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            await self.stop()

    async def _every(self, interval: float, action: Callable[[], Awaitable[Any]], stop: asyncio.Event) -> None:
        while not stop.is_set():
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stop.wait(), interval)
            if not stop.is_set():
                await _logged(action)

    async def _watch_kubelet(self, stop: asyncio.Event) -> None:
        """Poll kubelet.sock's identity every 100 ms; a new socket means a new kubelet: register again."""
        path = self.settings.kubelet_socket
        if path is None:
            return
        seen = _identity(path)
        ticks = 0
        while not stop.is_set():
            await asyncio.sleep(KUBELET_POLL_S)
            ticks += 1
            current = _identity(path)
            if current is not None and current != seen:
                log.info("%s was re-created (kubelet restart); registering again", path)
                await _logged(self.reregister)
            elif self._unregistered and current is not None and ticks % 10 == 0:
                await _logged(self.retry_registrations)
            seen = current

    async def _reload_on_request(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            await self._reload_requested.wait()
            self._reload_requested.clear()
            if not stop.is_set():
                await _logged(self.reload)

    async def _watch_config(self, stop: asyncio.Event) -> None:
        path = self.settings.config_file
        while not stop.is_set():
            await asyncio.sleep(KUBELET_POLL_S * 3)
            if path is None:
                return
            current = _mtime(path)
            if current is not None and current != self._config_seen:  # compared with what was last read
                log.info("%s changed; reloading", path)
                await _logged(self.reload)

    def _config_stamp(self) -> object:
        return _mtime(self.settings.config_file) if self.settings.config_file else None


async def _logged(action: Callable[[], Awaitable[Any]]) -> None:
    """Run one step of a loop; a failure is logged and the loop goes on (nothing may crash the plugin)."""
    try:
        await action()
    except Exception:
        log.exception("device plugin step %s failed", getattr(action, "__name__", action))


def _identity(path: Path) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_ino, st.st_ctime_ns)


def _mtime(path: Path) -> tuple[int, int, int] | None:
    return file_identity(path)  # inode included: a per-node config switch re-points a symlink (configmanager)
