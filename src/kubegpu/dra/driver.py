"""NodePrepareResources / NodeUnprepareResources: the DRA driver's node-side work, transport-free.

Prepare, for each claim: answer from the checkpoint when it is already prepared (idempotent); else read the claim's
allocation (our driver's results on this node's pool), decode its opaque config, record `PrepareStarted`, create
the exact MIG placement for dynamic-MIG devices (each creation checkpointed at once), write the claim's CDI spec and
record `PrepareCompleted`. Any failure rolls back that claim's partial work and is reported for that claim only.
Unprepare destroys what prepare created and removes the spec; an unknown claim is already unprepared. At start,
claims a crash left half-prepared are rolled back. Calls are serialized (one lock): prepare is fast, and GPU
reconfiguration must not interleave.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kubegpu.dra.cdi import (
    CDI_KIND,
    claim_spec,
    claim_spec_uids,
    mps_plan,
    qualified_name,
    remove_claim_spec,
    write_claim_spec,
)
from kubegpu.dra.checkpoint import COMPLETED, Checkpoint, ClaimRecord, PreparedDevice
from kubegpu.dra.config import Sharing, sharing_by_request
from kubegpu.dra.devices import DRIVER, GpuOffer, Placement, gpu_offers, placements_by_name, read_node
from kubegpu.errors import KubegpuError
from kubegpu.files import write_durable
from kubegpu.gpu.backend import GpuBackend, GpuBackendError, MigDevice
from kubegpu.sharing.mps import DEFAULT_MPS_ROOT, limits_document

log = logging.getLogger("kubegpu.dra")

ClaimGetter = Callable[[str, str], Mapping[str, Any] | None]  # (namespace, name) -> ResourceClaim object


@dataclass(frozen=True)
class ClaimRef:
    namespace: str
    uid: str
    name: str


@dataclass(frozen=True)
class PrepareResult:
    devices: tuple[PreparedDevice, ...] = ()
    error: str = ""


class PrepareError(KubegpuError):
    """Preparing one claim failed; the message goes back to the kubelet for that claim."""


class DraDriver:
    def __init__(self, backend: GpuBackend, node_name: str, plugin_dir: Path, cdi_root: Path, claims: ClaimGetter,
                 driver_name: str = DRIVER, dynamic_mig: bool = False, mps_root: str = DEFAULT_MPS_ROOT) -> None:
        self.backend = backend
        self.node_name = node_name
        self.driver_name = driver_name
        self.dynamic_mig = dynamic_mig
        self.cdi_root = cdi_root
        self.claims = claims
        self.plugin_dir = plugin_dir
        self.mps_root = mps_root
        self.checkpoint = Checkpoint(plugin_dir / "checkpoint.json")
        self._lock = threading.Lock()
        self.offers: list[GpuOffer] = []
        self._mig_mode: set[int] = {gpu.index for gpu in backend.devices() if gpu.mig_enabled}
        self._placements: dict[str, Placement] = {}
        with self._lock:
            self._recover()
            self.refresh()

    # --- inventory --------------------------------------------------------------------------------------------------

    def claimed_mig(self) -> set[tuple[int, int]]:
        return {(gpu, gi) for record in self.checkpoint.claims.values() for gpu, gi in record.created_mig}

    def refresh(self) -> list[GpuOffer]:
        """Re-read the GPUs (MIG devices made by claims stay part of the dynamic offer)."""
        node = read_node(self.backend, self.claimed_mig())
        self._mig_mode = {gpu.index for gpu in node.gpus if gpu.mig_enabled}
        self.offers = gpu_offers(node, self.dynamic_mig)
        self._placements = placements_by_name(self.offers)
        return self.offers

    def resync(self) -> list[GpuOffer]:
        """`refresh` between prepare calls (the health loop's view of the GPUs)."""
        with self._lock:
            return self.refresh()

    # --- prepare ----------------------------------------------------------------------------------------------------

    def prepare(self, refs: Sequence[ClaimRef]) -> dict[str, PrepareResult]:
        out = {}
        with self._lock:
            for ref in refs:
                try:
                    out[ref.uid] = PrepareResult(devices=tuple(self._prepare_one(ref)))
                except KubegpuError as exc:
                    out[ref.uid] = PrepareResult(error=str(exc))
                except Exception as exc:  # a bug or an unexpected driver error must not fail the other claims
                    log.exception("preparing claim %s/%s failed", ref.namespace, ref.name)
                    out[ref.uid] = PrepareResult(error=f"internal error: {exc}")
        return out

    def _prepare_one(self, ref: ClaimRef) -> list[PreparedDevice]:
        record = self.checkpoint.claims.get(ref.uid)
        if record is not None and record.state == COMPLETED:
            return record.devices
        if record is not None:  # started earlier and failed in between: start over from a clean state
            self._rollback(ref.uid)
        claim = self.claims(ref.namespace, ref.name)
        if claim is None:
            raise PrepareError(f"ResourceClaim {ref.namespace}/{ref.name} not found")
        uid = (claim.get("metadata") or {}).get("uid")
        if uid and uid != ref.uid:
            raise PrepareError(f"ResourceClaim {ref.namespace}/{ref.name} has UID {uid}, not {ref.uid}")
        results, configs = self._allocation(claim, ref)
        sharing = sharing_by_request(configs, self.driver_name, [r["request"] for r in results])
        # recorded in memory now, on disk before the first GPU change (`_materialize`) and when complete; a crash
        # before either leaves at most a CDI spec, which `_recover` sweeps
        record = ClaimRecord(namespace=ref.namespace, name=ref.name)
        self.checkpoint.claims[ref.uid] = record
        try:
            prepared = []
            for result in results:
                placement = self._placements.get(result["device"])
                if placement is None:
                    raise PrepareError(f"device {result['device']} is not offered on node {self.node_name}")
                mig = self._materialize(placement, record)
                prepared.append((result, placement, mig, sharing.get(result["request"], Sharing())))
            minors = {o.gpu.index: o.gpu.device_minor for o in self.offers}
            devices = [(r["device"], p, m, s) for r, p, m, s in prepared]
            plan = mps_plan(ref.uid, devices, self.mps_root)
            if plan is not None:  # what the claim's MPS daemon must enforce, recorded as the device plugin does
                self._mps_file(ref.uid).parent.mkdir(parents=True, exist_ok=True)
                write_durable(self._mps_file(ref.uid), json.dumps(limits_document([plan]), indent=2))
            spec = claim_spec(ref.uid, devices, minors, mps_root=self.mps_root)
            record.cdi_spec = str(write_claim_spec(self.cdi_root, ref.uid, spec))
            record.devices = [
                PreparedDevice(request_names=[r["request"]], pool=r["pool"], device=r["device"],
                               cdi_device_ids=[qualified_name(ref.uid, r["device"])])
                for r, _, _, _ in prepared
            ]
            record.state = COMPLETED
            self.checkpoint.save()
        except Exception:
            self._rollback(ref.uid)
            raise
        return record.devices

    def _allocation(self, claim: Mapping[str, Any], ref: ClaimRef) -> tuple[list[dict[str, str]], list[Any]]:
        allocation = ((claim.get("status") or {}).get("allocation") or {}).get("devices") or {}
        ours = (self.driver_name, self.node_name)
        results = [r for r in allocation.get("results") or []
                   if isinstance(r, Mapping) and (r.get("driver"), r.get("pool")) == ours]
        if not allocation:
            raise PrepareError(f"ResourceClaim {ref.namespace}/{ref.name} is not allocated")
        if not all(isinstance(r.get(k), str) for r in results for k in ("request", "device")):
            raise PrepareError(f"ResourceClaim {ref.namespace}/{ref.name}: malformed allocation result")
        return [dict(r) for r in results], list(allocation.get("config") or [])

    def _materialize(self, placement: Placement, record: ClaimRecord) -> MigDevice | None:
        """The MIG device behind a placement: the existing one, or (dynamic MIG) one created at exactly it."""
        if placement.profile_id is None or placement.start is None:
            if self.dynamic_mig and self._mig_enabled(placement.gpu_index):
                # a dynamic-MIG GPU left in MIG mode by earlier claims: CUDA sees no whole GPU until it is off
                if self._live(placement.gpu_index):
                    raise PrepareError(f"GPU {placement.gpu_index} still has MIG devices; it cannot be handed out "
                                       "whole")
                self._set_mig_mode(placement.gpu_index, False)
            return None
        live = [m for m in self.backend.mig_devices(placement.gpu_index)
                if (m.profile_id, m.start) == (placement.profile_id, placement.start)] \
            if self._mig_enabled(placement.gpu_index) else []
        if live:
            if (placement.gpu_index, live[0].gi_id) in self.claimed_mig():
                raise PrepareError(f"MIG device {live[0].uuid} is already prepared for another claim")
            return live[0]
        if not self.dynamic_mig:
            raise PrepareError(f"MIG device {placement.profile_id}@{placement.start} on GPU {placement.gpu_index} "
                               "no longer exists")
        self.checkpoint.save()  # PrepareStarted on disk before the GPU changes
        if not self._mig_enabled(placement.gpu_index):
            self._set_mig_mode(placement.gpu_index, True)
        try:
            mig = self.backend.create_mig_device(placement.gpu_index, placement.profile_id, placement.start)
        except GpuBackendError as exc:
            raise PrepareError(f"cannot create MIG device on GPU {placement.gpu_index}: {exc}") from None
        record.created_mig.append([placement.gpu_index, mig.gi_id])
        self.checkpoint.save()
        return mig

    def _mps_file(self, uid: str) -> Path:
        return self.plugin_dir / "mps" / f"{uid}.json"

    def _mig_enabled(self, index: int) -> bool:
        """MIG mode as this driver last saw or set it (reading the driver on every prepare would cost a query of
        every GPU; the mode only changes here, or on a `refresh`)."""
        return index in self._mig_mode

    def _set_mig_mode(self, index: int, enabled: bool) -> None:
        if self.backend.set_mig_mode(index, enabled):
            self.backend.reset_gpu(index)
        if enabled:
            self._mig_mode.add(index)
        else:
            self._mig_mode.discard(index)

    # --- unprepare --------------------------------------------------------------------------------------------------

    def unprepare(self, refs: Sequence[ClaimRef]) -> dict[str, str]:
        out = {}
        with self._lock:
            for ref in refs:
                try:
                    self._rollback(ref.uid)
                    out[ref.uid] = ""
                except KubegpuError as exc:
                    out[ref.uid] = str(exc)
                except Exception as exc:
                    log.exception("unpreparing claim %s/%s failed", ref.namespace, ref.name)
                    out[ref.uid] = f"internal error: {exc}"
        return out

    def _rollback(self, uid: str) -> None:
        """Undo whatever a claim's prepare did (all of it, or the part a crash left), then forget the claim."""
        record = self.checkpoint.claims.get(uid)
        if record is None:
            return
        for gpu_index, gi_id in list(record.created_mig):
            if any(m.gi_id == gi_id for m in self._live(gpu_index)):
                self.backend.destroy_mig_device(gpu_index, gi_id)
            record.created_mig.remove([gpu_index, gi_id])
            self.checkpoint.save()
        remove_claim_spec(self.cdi_root, uid)
        self._mps_file(uid).unlink(missing_ok=True)
        del self.checkpoint.claims[uid]
        if self.checkpoint.path.exists() or self.checkpoint.claims:
            self.checkpoint.save()

    def _live(self, gpu_index: int) -> list[MigDevice]:
        return self.backend.mig_devices(gpu_index) if self._mig_enabled(gpu_index) else []

    def _recover(self) -> None:
        for uid, record in list(self.checkpoint.claims.items()):
            if record.state != COMPLETED:
                log.warning("rolling back claim %s/%s, left half-prepared", record.namespace, record.name)
                self._rollback(uid)
        for uid in claim_spec_uids(self.cdi_root):
            if uid not in self.checkpoint.claims:  # written just before a crash, never recorded as complete
                remove_claim_spec(self.cdi_root, uid)


__all__ = ["CDI_KIND", "ClaimRef", "DraDriver", "PrepareError", "PrepareResult"]
