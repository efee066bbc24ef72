"""The share each device ID was handed out with, recorded by the device plugin at Allocate, read by the guard.

A pod's GPU-memory share must be the one it was admitted under. Derived afresh from the node's config, a running
pod's share changes when the config does: after a switch from 2 to 4 time-slicing replicas every running pod's
share halves, and a pod well within the share it was admitted under would be evicted for it. The kubelet never
calls Allocate again for a running container (it reuses its checkpointed devices across its own restarts), and never
hands one device ID to two containers at once, so "device ID → share at its last Allocate" is exactly the share
of whoever holds that ID now. The device plugin writes it durably before it answers the kubelet (record before
act), so a container can never hold a device whose record is older than its allocation.

The same file carries the device plugin's config hand-over: when it starts applying a config (at start and on
every reload) and when it finished. While a hand-over runs, and for a short settle time after (the kubelet takes
the new device list asynchronously), the guard reads the node in a half-switched state and does not act.

The file lives on the host (`/var/lib/kubegpu`, which both DaemonSets mount), never in the kubelet's
device-plugins directory: the kubelet empties that one whenever it restarts. It is a checksummed envelope
(`kubegpu.files`): a torn or foreign file is a CorruptStateError, never a share read from garbage.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from kubegpu.errors import ConfigError
from kubegpu.files import CorruptStateError, dumps_checked, loads_checked, read_text, write_durable
from kubegpu.sharing.names import SharingKind

log = logging.getLogger(__name__)

KIND = "kubegpu-device-shares"
VERSION = 1
HANDOVER_SETTLE_S = 10.0
"""After a hand-over finished, how long the guard still waits: the kubelet's ListAndWatch and PodResources follow
the new device list asynchronously (well under a second on a healthy node; ten leaves a wide margin)."""
HANDOVER_STALE_S = 300.0
"""A hand-over started this long ago and never finished is a device plugin that died mid-switch: the guard acts
again (on recorded shares, which the switch never changes) rather than stay disabled until someone notices."""


@dataclass(frozen=True)
class RecordedShare:
    """One device ID as it was allocated: how it was shared, its memory share and MPS limit (None: unshared)."""

    kind: SharingKind
    share_mib: int | None
    mps_limit_mib: int | None = None
    allocated_at: float = 0.0


@dataclass(frozen=True)
class Handover:
    """The device plugin's last config application: started at, finished at (None while it runs)."""

    started_at: float | None = None
    finished_at: float | None = None

    def running(self, now: float, settle_s: float = HANDOVER_SETTLE_S, stale_s: float = HANDOVER_STALE_S) -> bool:
        """Whether a config switch is in progress at `now` (or finished less than `settle_s` ago). A switch that
        started more than `stale_s` ago and never finished is not one any more (its writer died)."""
        if self.started_at is None:
            return False
        if self.finished_at is None or self.finished_at < self.started_at:
            return now - self.started_at < stale_s
        return now - self.finished_at < settle_s


@dataclass(frozen=True)
class ShareRecord:
    devices: Mapping[str, RecordedShare] = field(default_factory=dict)
    handover: Handover = Handover()


def encode(record: ShareRecord) -> dict[str, Any]:
    return {
        "devices": {device_id: {"kind": share.kind.value, "shareMiB": share.share_mib,
                                "mpsLimitMiB": share.mps_limit_mib, "allocatedAt": share.allocated_at}
                    for device_id, share in sorted(record.devices.items())},
        "handover": {"startedAt": record.handover.started_at, "finishedAt": record.handover.finished_at},
    }


def decode(data: object, source: str) -> ShareRecord:
    """The record in a file's `data`; CorruptStateError naming the file and the entry at fault."""
    if not isinstance(data, Mapping):
        raise CorruptStateError(f"{source}: data is not a mapping")
    devices: dict[str, RecordedShare] = {}
    for device_id, entry in (data.get("devices") or {}).items():
        try:
            devices[str(device_id)] = RecordedShare(SharingKind(entry["kind"]), _mib(entry.get("shareMiB")),
                                                    _mib(entry.get("mpsLimitMiB")),
                                                    float(entry.get("allocatedAt") or 0.0))
        except (KeyError, TypeError, ValueError, AttributeError):
            raise CorruptStateError(f"{source}: device {device_id}: malformed entry") from None
    handover = data.get("handover") or {}
    try:
        started, finished = handover.get("startedAt"), handover.get("finishedAt")
        return ShareRecord(devices, Handover(None if started is None else float(started),
                                             None if finished is None else float(finished)))
    except (TypeError, ValueError, AttributeError):
        raise CorruptStateError(f"{source}: handover: malformed") from None


def _mib(value: object) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(value)
    return value


def read_record(path: Path) -> ShareRecord | None:
    """The record at `path`; None when there is none (no device plugin records here); CorruptStateError when torn."""
    if not path.exists():
        return None
    return decode(loads_checked(read_text(path), str(path), KIND, VERSION), str(path))


class ShareRecorder:
    """The device plugin's side: keeps the record in memory and writes all of it on every change.

    Loaded at start so a restarted device plugin keeps the records of the containers that still run. One writer per
    node (the device plugin process; its Allocate handlers run on one event loop, so writes never interleave)."""

    def __init__(self, path: Path, clock: Callable[[], float] = time.time) -> None:
        self.path = path
        self.clock = clock
        try:
            self.record = read_record(path) or ShareRecord()
        except ConfigError as exc:
            log.error("%s; starting an empty share record (running pods fall back to the config's shares)", exc)
            self.record = ShareRecord()

    def allocated(self, shares: Iterable[tuple[str, RecordedShare]]) -> None:
        """Record the device IDs one Allocate hands out; raises ConfigError when the write fails (the Allocate must
        then fail: a container must never hold a device whose record is not its own)."""
        now = self.clock()
        devices = dict(self.record.devices)
        devices.update((device_id, replace(share, allocated_at=now)) for device_id, share in shares)
        self._save(replace(self.record, devices=devices))

    def handover_started(self) -> None:
        self._save(replace(self.record, handover=Handover(self.clock(), None)))

    def handover_finished(self) -> None:
        self._save(replace(self.record, handover=Handover(self.record.handover.started_at, self.clock())))

    def _save(self, record: ShareRecord) -> None:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ConfigError(f"{self.path.parent}: cannot make the share record's directory: "
                              f"{exc.strerror or exc}") from None
        write_durable(self.path, dumps_checked(KIND, VERSION, encode(record)))
        self.record = record
