"""The DRA driver's checkpoint: which claims are prepared, with what, and what prepare changed on the GPUs.

Written atomically with a checksum (`kubegpu.files`) before and after every side effect: a claim is recorded as
`PrepareStarted` (with every MIG device it created, as soon as it exists) before its work begins and becomes
`PrepareCompleted` once its CDI spec is written. After a restart or crash, a completed claim is answered from here
(idempotent prepare), and a started one is rolled back — its MIG devices destroyed, its CDI spec removed — so
the kubelet's retry starts clean and nothing leaks.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from kubegpu.errors import KubegpuError
from kubegpu.files import CorruptStateError, dumps_checked, loads_checked, read_text, write_durable

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


@dataclass
class ClaimRecord:
    namespace: str
    name: str
    state: str = STARTED
    devices: list[PreparedDevice] = field(default_factory=list)
    created_mig: list[list[int]] = field(default_factory=list)  # [gpu index, gi id] made by this prepare
    cdi_spec: str = ""


class Checkpoint:
    """Claim UID → record, persisted to `path` on every `save`."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.claims: dict[str, ClaimRecord] = {}
        if path.exists():
            self._load()

    def _load(self) -> None:
        try:
            data = loads_checked(read_text(self.path), str(self.path), KIND, VERSION)
        except CorruptStateError as exc:
            raise KubegpuError(f"DRA checkpoint {self.path} is corrupt ({exc}); move it away to start empty") from exc
        if not isinstance(data, dict):
            raise KubegpuError(f"DRA checkpoint {self.path}: expected an object")
        for uid, raw in data.get("claims", {}).items():
            devices = [PreparedDevice(**d) for d in raw.get("devices", [])]
            self.claims[uid] = ClaimRecord(namespace=raw["namespace"], name=raw["name"], state=raw["state"],
                                           devices=devices, created_mig=[list(x) for x in raw.get("created_mig", [])],
                                           cdi_spec=raw.get("cdi_spec", ""))

    def save(self) -> None:
        data: dict[str, Any] = {"claims": {uid: asdict(record) for uid, record in sorted(self.claims.items())}}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        write_durable(self.path, dumps_checked(KIND, VERSION, data))
