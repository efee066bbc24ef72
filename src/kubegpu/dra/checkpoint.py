"""The DRA driver's checkpoint: which claims are prepared, with what, and what prepare changed on the node.

Written atomically with a checksum (`kubegpu.files`). A claim whose prepare changes the node (creates a MIG
instance, starts an MPS control daemon) is first recorded as `PrepareStarted` with what it is about to do — the MIG
placements it will create, the daemon's directories — so a crash at any point after that leaves a record naming
everything that may exist; a claim with no such side effect is only written once, `PrepareCompleted`, after its
CDI spec (a spec a crash left without a record is swept at start: its name comes from the claim UID). After a
restart, a completed claim is answered from here (idempotent prepare), and a started one is rolled back — its
instances destroyed, its daemon stopped, its spec removed — so the kubelet's retry starts clean and nothing leaks.

Everything a record describes is gone after a node reboot (MIG instances, daemons, specs under /var/run/cdi), so the
checkpoint names the boot it was written in (`boot_id`); the driver drops the records of an earlier boot. That also
makes the rename's own durability moot — a power cut means a new boot — so a save fsyncs the file (never torn) but
not its directory, one journal commit instead of two on the kubelet's pod-start path.

Each record's canonical JSON is kept between saves and re-encoded only when the driver names it as changed, so a
save costs one claim's encoding plus a checksum, not the whole node's claims.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from kubegpu.errors import KubegpuError
from kubegpu.files import CorruptStateError, dumps_checked_body, loads_checked, read_text, write_durable

KIND = "kubegpu-dra-checkpoint"
VERSION = 1
STARTED = "PrepareStarted"
COMPLETED = "PrepareCompleted"


@dataclass
class PreparedDevice:
    request_names: list[str]
    pool: str
    device: str
    cdi_device_ids: list[str]
    share_id: str | None = None  # the allocation's shareID, for a share of a device (consumable capacity)


@dataclass
class ClaimRecord:
    namespace: str
    name: str
    state: str = STARTED
    devices: list[PreparedDevice] = field(default_factory=list)
    created_mig: list[list[int]] = field(default_factory=list)  # [gpu index, gi id] made by this prepare
    cdi_spec: str = ""
    planned_mig: list[list[int]] = field(default_factory=list)  # [gpu index, profile id, start] it creates
    mps: dict[str, str] = field(default_factory=dict)  # the daemon it starts: resource, pipeDirectory, logDirectory


class Checkpoint:
    """Claim UID → record, persisted to `path` on every `save`."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.claims: dict[str, ClaimRecord] = {}
        self.boot_id = ""  # the node boot the records belong to; "" in a checkpoint written before it was recorded
        self._encoded: dict[str, str] = {}  # uid → canonical JSON of its record as last saved
        self._dir_made = False
        if path.exists():
            self._load()

    def _load(self) -> None:
        try:
            data = loads_checked(read_text(self.path), str(self.path), KIND, VERSION)
        except CorruptStateError as exc:
            raise KubegpuError(f"DRA checkpoint {self.path} is corrupt ({exc}); move it away to start empty") from exc
        if not isinstance(data, dict):
            raise KubegpuError(f"DRA checkpoint {self.path}: expected an object")
        self.boot_id = str(data.get("boot_id", ""))
        for uid, raw in data.get("claims", {}).items():
            devices = [PreparedDevice(**d) for d in raw.get("devices", [])]
            self.claims[uid] = ClaimRecord(namespace=raw["namespace"], name=raw["name"], state=raw["state"],
                                           devices=devices, created_mig=[list(x) for x in raw.get("created_mig", [])],
                                           cdi_spec=raw.get("cdi_spec", ""),
                                           planned_mig=[list(x) for x in raw.get("planned_mig", [])],
                                           mps=dict(raw.get("mps", {})))
        self._encoded = {uid: _encode(record) for uid, record in self.claims.items()}

    def on_disk(self, uid: str) -> bool:
        """Whether the last save included this claim (a record only in memory needs no save to be forgotten)."""
        return uid in self._encoded

    def save(self, changed: str | None = None) -> None:
        """Write every record; `changed`: the only claim whose record changed since the last save (added, edited
        or deleted) — the others' encodings are reused. None re-encodes all."""
        if changed is None:
            self._encoded = {}
        else:
            self._encoded.pop(changed, None)
        for uid in [u for u in self._encoded if u not in self.claims]:
            del self._encoded[uid]
        for uid, record in self.claims.items():
            if uid not in self._encoded:
                self._encoded[uid] = _encode(record)
        # exactly json.dumps({"boot_id": ..., "claims": ...}, sort_keys=True, separators=(",", ":")), which the
        # checksum covers
        body = (f'{{"boot_id":{json.dumps(self.boot_id)},"claims":{{'
                + ",".join(f"{json.dumps(uid)}:{self._encoded[uid]}" for uid in sorted(self._encoded)))
        if not self._dir_made:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._dir_made = True
        write_durable(self.path, dumps_checked_body(KIND, VERSION, body + "}}"), sync_directory=False)


def _encode(record: ClaimRecord) -> str:
    """`asdict(record)` as canonical JSON, built directly (`asdict` deep-copies every field, on every save)."""
    data = {**vars(record), "devices": [vars(d) for d in record.devices]}
    return json.dumps(data, sort_keys=True, separators=(",", ":"))
