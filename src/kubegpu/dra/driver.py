"""NodePrepareResources / NodeUnprepareResources: the DRA driver's node-side work, transport-free.

Prepare, for each claim: answer from the checkpoint when it is already prepared (idempotent); else read the claim's
allocation (our driver's results on this node's pool) and decode its opaque config; work out what each device needs
(a whole GPU, an existing MIG device, a dynamic-MIG instance to create) without touching anything; if the claim
changes the node — instances to create, an MPS control daemon to start — record those intents as `PrepareStarted`
(one durable write); then create the instances at exactly their placements, start the claim's daemon with its
limits, write the claim's CDI spec and record `PrepareCompleted`. Any failure rolls back that claim's partial work
and is reported for that claim only. Unprepare stops the daemon, destroys what prepare created and removes the spec;
an unknown claim is already unprepared. At start, a checkpoint from an earlier boot of the node is emptied (nothing
it describes survived the reboot; the kubelet prepares its claims again), claims a crash left half-prepared are
rolled back from their intents, and CDI specs and MPS limit files of claims never recorded are swept. Calls are
serialized (one lock): prepare is fast, and GPU reconfiguration must not interleave.
"""

from __future__ import annotations

import logging
import math
import shutil
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
from kubegpu.dra.devices import (
    DRIVER,
    WHOLE,
    GpuOffer,
    Placement,
    gpu_offers,
    placements_by_name,
    read_node,
    share_of,
)
from kubegpu.errors import KubegpuError
from kubegpu.gpu import standins
from kubegpu.gpu.backend import GpuBackend, GpuBackendError, MigDevice
from kubegpu.sharing.claimconfig import Sharing, sharing_by_request
from kubegpu.sharing.mps import DEFAULT_MPS_ROOT, MpsPlan
from kubegpu.sharing.mps_control import MpsControl, record_limits

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


@dataclass(frozen=True)
class _Step:
    """What one allocated device needs at prepare, decided before anything changes."""

    result: dict[str, str]
    placement: Placement
    existing: MigDevice | None = None  # a MIG device that is already there (static MIG)
    create: bool = False  # dynamic MIG: an instance to create at exactly the placement


class DraDriver:
    def __init__(self, backend: GpuBackend, node_name: str, plugin_dir: Path, cdi_root: Path, claims: ClaimGetter,
                 driver_name: str = DRIVER, dynamic_mig: bool = False, mps_root: str = DEFAULT_MPS_ROOT,
                 mps_binary: str | None = None, fractional: bool = False) -> None:
        """`mps_binary`: the `nvidia-cuda-mps-control` to start MPS-shared claims' daemons with; None records their
        limits only (a simulated node). `fractional`: whole GPUs are shared by thousandths (`devices` module doc);
        a claim's share is enforced by MPS, its limits from the share (`_sharing`)."""
        self.backend = backend
        self.node_name = node_name
        self.driver_name = driver_name
        self.dynamic_mig = dynamic_mig
        self.fractional = fractional
        self.cdi_root = cdi_root
        self.claims = claims
        self.plugin_dir = plugin_dir
        self.mps_root = mps_root
        self.mps = MpsControl(Path(mps_root), mps_binary)
        stand_in_dir = standins.for_backend(backend)  # a simulated node's stand-in /dev nodes, for its CDI specs
        self.stand_ins = str(stand_in_dir) if stand_in_dir is not None else None
        self.checkpoint = Checkpoint(plugin_dir / "checkpoint.json")
        self._lock = threading.Lock()
        self.offers: list[GpuOffer] = []
        self._mig_mode: set[int] = {gpu.index for gpu in backend.devices() if gpu.mig_enabled}
        self._placements: dict[str, Placement] = {}
        with self._lock:
            self._forget_earlier_boot()
            self._recover()
            self.refresh()

    # --- inventory --------------------------------------------------------------------------------------------------

    def claimed_mig(self) -> set[tuple[int, int]]:
        return {(gpu, gi) for record in self.checkpoint.claims.values() for gpu, gi in record.created_mig}

    def refresh(self) -> list[GpuOffer]:
        """Re-read the GPUs (MIG devices made by claims stay part of the dynamic offer)."""
        node = read_node(self.backend, self.claimed_mig())
        self._mig_mode = {gpu.index for gpu in node.gpus if gpu.mig_enabled}
        self.offers = gpu_offers(node, self.dynamic_mig, self.fractional)
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
        record = ClaimRecord(namespace=ref.namespace, name=ref.name)
        self.checkpoint.claims[ref.uid] = record
        try:
            steps = self._steps(results)
            plan = mps_plan(ref.uid, [(s.result["device"], s.placement, None, self._sharing(s, sharing))
                                      for s in steps], self.mps_root)
            daemon = plan is not None and self.mps.binary is not None
            # intents on disk before the node changes; a claim that changes nothing is only written once complete
            # (a crash before that leaves at most its CDI spec and limits file, which `_recover` sweeps)
            record.planned_mig = [[s.placement.gpu_index, s.placement.profile_id or 0, s.placement.start or 0]
                                  for s in steps if s.create]
            if plan is not None and daemon:
                record.mps = {"resource": plan.resource, "pipeDirectory": plan.pipe_dir, "logDirectory": plan.log_dir}
            if record.planned_mig or record.mps:
                self.checkpoint.save(ref.uid)
            devices = [(s.result["device"], s.placement, self._materialize(s, record), self._sharing(s, sharing))
                       for s in steps]
            if plan is not None:  # what the claim's daemon enforces, recorded as the device plugin does
                record_limits(self._mps_file(ref.uid), [plan])
                if daemon:
                    self.mps.start_daemon(plan)
                elif self.stand_ins is not None:
                    self._stand_in_mps_directories(plan)
            minors = {o.gpu.index: o.gpu.device_minor for o in self.offers}
            spec = claim_spec(ref.uid, devices, minors, mps_root=self.mps_root, stand_ins=self.stand_ins)
            record.cdi_spec = str(write_claim_spec(self.cdi_root, ref.uid, spec, self.stand_ins))
            record.devices = [
                PreparedDevice(request_names=[s.result["request"]], pool=s.result["pool"], device=s.result["device"],
                               cdi_device_ids=[qualified_name(ref.uid, s.result["device"])],
                               share_id=s.result.get("shareID"))
                for s in steps
            ]
            record.state = COMPLETED
            self.checkpoint.save(ref.uid)
        except Exception:
            try:
                self._rollback(ref.uid)
            except Exception:  # the claim's own error is what the kubelet must see; its retry rolls back again
                log.exception("rolling back claim %s/%s failed", ref.namespace, ref.name)
            raise
        return record.devices

    def _sharing(self, step: _Step, by_request: Mapping[str, Sharing]) -> Sharing:
        """How a device is shared: a share of a GPU (`consumedCapacity.compute` below 1000 thousandths) runs under
        MPS with the share as its active-thread percentage (rounded up) and the same share of the GPU's memory as
        its pinned device-memory limit — whatever the claim's config says, since the share is what the scheduler
        packed; otherwise the claim's or class's config."""
        share = share_of(step.result)
        if share is None:
            return by_request.get(step.result["request"], Sharing())
        memory = next((o.gpu.memory_mib for o in self.offers if o.gpu.index == step.placement.gpu_index), 0)
        return Sharing(strategy="MPS", thread_percentage=max(1, math.ceil(share / 10)),
                       pinned_memory_mib=memory * share // WHOLE)

    def _steps(self, results: list[dict[str, str]]) -> list[_Step]:
        """Each device's placement and what it needs, checked against the GPUs (reads only: nothing changes)."""
        steps = []
        cache: dict[int, list[MigDevice]] = {}

        def live(gpu: int) -> list[MigDevice]:  # one read per GPU per claim
            if gpu not in cache:
                cache[gpu] = self._live(gpu)
            return cache[gpu]

        for result in results:
            placement = self._placements.get(result["device"])
            if placement is None:
                raise PrepareError(f"device {result['device']} is not offered on node {self.node_name}")
            gpu = placement.gpu_index
            if placement.profile_id is None or placement.start is None:
                # a dynamic-MIG GPU left in MIG mode by earlier claims: CUDA sees no whole GPU until it is off
                if self.dynamic_mig and self._mig_enabled(gpu) and live(gpu):
                    raise PrepareError(f"GPU {gpu} still has MIG devices; it cannot be handed out whole")
                steps.append(_Step(result, placement))
                continue
            if self.dynamic_mig and placement.mig_uuid is None:
                # a placement with no instance at the last refresh: create it without reading the GPU first (an
                # instance that appeared since makes the creation fail, and `_materialize` looks then)
                steps.append(_Step(result, placement, create=True))
                continue
            there = [m for m in live(gpu)
                     if (m.profile_id, m.start) == (placement.profile_id, placement.start)]
            if there:
                if (gpu, there[0].gi_id) in self.claimed_mig():
                    raise PrepareError(f"MIG device {there[0].uuid} is already prepared for another claim")
                steps.append(_Step(result, placement, existing=there[0]))
            elif not self.dynamic_mig:
                raise PrepareError(f"MIG device {placement.profile_id}@{placement.start} on GPU {gpu} no longer "
                                   "exists")
            else:
                steps.append(_Step(result, placement, create=True))
        return steps

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

    def _materialize(self, step: _Step, record: ClaimRecord) -> MigDevice | None:
        """The MIG device behind a step: the existing one, or (dynamic MIG) one created at exactly its placement;
        None for a whole GPU (whose MIG mode a dynamic-MIG driver turns off first)."""
        placement = step.placement
        if not step.create:
            if step.existing is None and self.dynamic_mig and self._mig_enabled(placement.gpu_index):
                self._set_mig_mode(placement.gpu_index, False)
            return step.existing
        assert placement.profile_id is not None and placement.start is not None
        if not self._mig_enabled(placement.gpu_index):
            self._set_mig_mode(placement.gpu_index, True)
        try:
            mig = self.backend.create_mig_device(placement.gpu_index, placement.profile_id, placement.start)
        except GpuBackendError as exc:
            there = [m for m in self._live(placement.gpu_index)
                     if (m.profile_id, m.start) == (placement.profile_id, placement.start)]
            if not there:
                raise PrepareError(f"cannot create MIG device on GPU {placement.gpu_index}: {exc}") from None
            if (placement.gpu_index, there[0].gi_id) in self.claimed_mig():
                raise PrepareError(f"MIG device {there[0].uuid} is already prepared for another claim") from None
            # an instance nobody holds is already there: use it as found (unprepare leaves it, as for static MIG)
            record.planned_mig.remove([placement.gpu_index, placement.profile_id, placement.start])
            return there[0]
        # in memory only: the intent saved before (`planned_mig`) already names it for recovery
        record.created_mig.append([placement.gpu_index, mig.gi_id])
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
        if record.mps:  # first: its daemon may hold the instances
            self.mps.stop_daemon(MpsPlan(record.mps["resource"], record.mps["pipeDirectory"],
                                         record.mps["logDirectory"]))
        self._destroy_instances(uid, record)
        if self.stand_ins is not None:
            shutil.rmtree(Path(self.mps_root) / f"claim-{uid}", ignore_errors=True)
        remove_claim_spec(self.cdi_root, uid)
        self._mps_file(uid).unlink(missing_ok=True)
        del self.checkpoint.claims[uid]
        if self.checkpoint.on_disk(uid):
            self.checkpoint.save(uid)

    def _stand_in_mps_directories(self, plan: MpsPlan) -> None:
        """A simulated node runs no MPS daemon, but the claim's CDI spec mounts the daemon's pipe, log and shared
        memory directories, and a real runtime refuses a mount whose source is missing: make them, as the daemon
        would (removed with the claim)."""
        for path in (plan.pipe_dir, plan.log_dir, f"{self.mps_root.rstrip('/')}/shm"):
            try:
                Path(path).mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise PrepareError(f"{path}: cannot make the simulated MPS daemon's directory: "
                                   f"{exc.strerror or exc}") from None

    def _destroy_instances(self, uid: str, record: ClaimRecord) -> None:
        """Destroy the instances this claim created: those recorded, and any at a placement it meant to create
        (a crash between creating one and the next save) — never one another claim holds."""
        others = {(gpu, gi) for other, r in self.checkpoint.claims.items() if other != uid
                  for gpu, gi in r.created_mig}
        for gpu in sorted({g for g, _ in record.created_mig} | {g for g, _, _ in record.planned_mig}):
            mine = {gi for g, gi in record.created_mig if g == gpu}
            planned = {(p, s) for g, p, s in record.planned_mig if g == gpu}
            for mig in self._live(gpu):
                if (gpu, mig.gi_id) in others:
                    continue
                at_planned = (mig.profile_id, mig.start) in planned
                if (mig.gi_id in mine and (at_planned or not planned)) or (at_planned and mig.gi_id not in mine):
                    self.backend.destroy_mig_device(gpu, mig.gi_id)
        record.created_mig.clear()
        record.planned_mig.clear()

    def _live(self, gpu_index: int) -> list[MigDevice]:
        return self.backend.mig_devices(gpu_index) if self._mig_enabled(gpu_index) else []

    def _forget_earlier_boot(self) -> None:
        """Drop the records of an earlier boot: their MIG instances, daemons and (tmpfs) CDI specs are gone, and
        answering a prepare from them would hand out devices that no longer exist. What is left of them on disk
        (specs under a persistent CDI root, MPS limit files) is swept by `_recover` as unrecorded."""
        boot = self.backend.boot_id()
        checkpoint = self.checkpoint
        if not boot or boot == checkpoint.boot_id:
            return
        if checkpoint.boot_id and checkpoint.claims:
            log.warning("DRA checkpoint %s is from an earlier boot of the node: forgetting its %d prepared claim(s),"
                        " whose devices did not survive the reboot", checkpoint.path, len(checkpoint.claims))
            checkpoint.claims.clear()
        checkpoint.boot_id = boot
        if checkpoint.path.exists():
            checkpoint.save()

    def _recover(self) -> None:
        for uid, record in list(self.checkpoint.claims.items()):
            if record.state != COMPLETED:
                log.warning("rolling back claim %s/%s, left half-prepared", record.namespace, record.name)
                self._rollback(uid)
        for uid in claim_spec_uids(self.cdi_root):
            if uid not in self.checkpoint.claims:  # written just before a crash, never recorded as complete
                remove_claim_spec(self.cdi_root, uid)
        limits = self.plugin_dir / "mps"
        for path in sorted(limits.glob("*.json")) if limits.is_dir() else []:
            if path.stem not in self.checkpoint.claims:
                path.unlink(missing_ok=True)


__all__ = ["CDI_KIND", "ClaimRef", "DraDriver", "PrepareError", "PrepareResult"]
