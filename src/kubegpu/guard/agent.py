"""The guard's loop: read the node, decide (`kubegpu.guard.core`), act through the Kubernetes API and the host.

Every round reads everything afresh — the GPU's processes and free memory from the backend, each process's pod from
its cgroup, the kubelet's device assignments from PodResources, the pods and their claims from the API server — so a
restarted guard picks up a leak where the last one left it. Pods are listed only when the assignments change, and
again before any action (the action then rests on a fresh pod: its annotation, whether it is already going).

Acting on a pod over its share (`--action`):
* evict: the `GPUMemoryExceeded` condition on the pod (share, used, GPU), a Warning Event, then an Eviction; a 429
  (a PodDisruptionBudget protects the pod) kills only the offending processes instead;
* kill-process: the condition, the Event, and the offending processes killed; the pod stays;
* warn: the Event and the metric only.

A pod is judged by the share its devices were allocated with (the device plugin's share record,
`kubegpu.sharing.allocations`), not by what today's config would give it; only devices with no record fall back to
today's derivation. While the device plugin switches configs the node is read in a half-switched state, so the
guard decides and reports but does not act until the hand-over has settled. A process is killed only after its
cgroup is read again, through a pidfd (`kill_host_process`): its PID was read before the API calls of the round.
"""

from __future__ import annotations

import builtins
import contextlib
import errno
import logging
import os
import signal
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum
from functools import partial
from pathlib import Path
from typing import Any, Protocol

from kubegpu.clock import Clock, RealClock
from kubegpu.errors import KubegpuError
from kubegpu.files import file_identity
from kubegpu.gpu.backend import GpuBackend, GpuDevice, MigDevice
from kubegpu.guard.core import Action, Decision, EntityKey, EntityReading, GuardAction, Policy, ProcessReading, decide
from kubegpu.guard.holdings import PodKey, build_holdings, pod_key
from kubegpu.guard.procs import ProcReader
from kubegpu.kube.cluster import Cluster, format_timestamp, record_event
from kubegpu.kube.resources import ResourceKind, register_kind
from kubegpu.metrics import GuardMetrics, GuardReading
from kubegpu.sharing.allocations import HANDOVER_SETTLE_S, ShareRecord, read_record
from kubegpu.sharing.attribution import ContainerDevices
from kubegpu.sharing.names import SharingKind
from kubegpu.sharing.shares import DeviceShare, with_recorded

log = logging.getLogger(__name__)

# The DRA driver registers the same kind; a node agent cannot import it, and the registry takes either (identical).
register_kind(ResourceKind("ResourceClaim", "resource.k8s.io", "v1", "resourceclaims", namespaced=True,
                           status_subresource=True, strategic_merge=False))

CONDITION_TYPE = "GPUMemoryExceeded"
EVENT_REASON = "GPUMemoryExceeded"
MPS_EVENT_REASON = "GPUMemoryLimitMissing"
COMPONENT = "kubegpu-gpu-guard"
MIB = 1024 * 1024


class Assignments(Protocol):
    """The kubelet's PodResources: who holds which device, and which device IDs the node can allocate."""

    def list(self) -> list[ContainerDevices] | None: ...

    def allocatable(self) -> builtins.list[tuple[str, builtins.list[str]]] | None: ...


Evictor = Callable[[str, str], bool]
"""(namespace, name) → True when evicted (or already gone), False when a PodDisruptionBudget refuses (429)."""
class KillOutcome(StrEnum):
    KILLED = "killed"
    GONE = "gone"  # the process had exited already: nothing left to kill, its memory is the driver's again
    NOT_OURS = "not-ours"  # its PID now names a process of someone else: left alone
    DENIED = "denied"


Killer = Callable[[int, Callable[[], bool]], KillOutcome]
"""(pid, still ours) → what became of the process. `still ours` re-reads the PID's cgroup and must be asked after
the process is pinned and before the signal, so a PID recycled since the reading is never hit."""


def kill_host_process(pid: int, still_ours: Callable[[], bool]) -> KillOutcome:
    """SIGKILL a process in the host's PID namespace (the DaemonSet runs with hostPID), if it is still the pod's.

    The PID was read from the driver a while ago, with API calls in between: the process may have exited and its
    PID gone to another process. So the process is pinned first — a pidfd refers to that one process for good —
    then its cgroup is checked again, and the signal goes through the pidfd: a process that exits after the check
    makes the signal fail (ESRCH) instead of hitting whatever took its PID. Where pidfds are missing (kernels before
    5.3, non-Linux) the check runs right before a plain kill, which leaves only the instants between the two."""
    pidfd_open = getattr(os, "pidfd_open", None)
    send = getattr(signal, "pidfd_send_signal", None)
    fd: int | None = None
    try:
        if pidfd_open is not None and send is not None:
            try:
                fd = pidfd_open(pid)
            except OSError as exc:
                if exc.errno != errno.ENOSYS:
                    raise
        if not still_ours():
            log.info("process %d no longer belongs to the pod; not killed", pid)
            return KillOutcome.NOT_OURS
        if fd is not None and send is not None:
            send(fd, signal.SIGKILL)
        else:
            os.kill(pid, signal.SIGKILL)
        return KillOutcome.KILLED
    except ProcessLookupError:
        return KillOutcome.GONE
    except PermissionError:
        log.warning("not allowed to kill process %d", pid)
        return KillOutcome.DENIED
    finally:
        if fd is not None:
            os.close(fd)


@dataclass
class NodeReading:
    gpus: list[GpuDevice]
    migs: list[MigDevice]
    entities: list[EntityReading]
    processes: list[ProcessReading]


@dataclass
class RoundResult:
    decision: Decision
    done: list[tuple[Action, str]] = field(default_factory=list)  # (action, what happened: evicted, killed, ...)
    held: bool = False  # a config hand-over was under way: the decision was made, nothing was done


class Guard:
    """One node's guard. `shares_for` turns the node's GPUs into device shares (the device plugin's config when
    given, else the kubelet's allocatable IDs); `share_record` is the device plugin's record of the share each
    device ID was allocated with, which wins over both (a pod is judged by the share it was admitted under); `evict`
    and `kill` are the two ways to act. While the record says the device plugin is switching configs (or finished
    less than `handover_settle_s` ago), the guard reads and reports but does not act."""

    def __init__(self, backend: GpuBackend, cluster: Cluster, node_name: str, assignments: Assignments,
                 evict: Evictor, policy: Policy, metrics: GuardMetrics | None = None,
                 proc: ProcReader | None = None, kill: Killer = kill_host_process,
                 shares_for: Callable[[list[GpuDevice], list[MigDevice]], Mapping[str, DeviceShare]] | None = None,
                 clock: Clock | None = None, share_record: Path | None = None,
                 handover_settle_s: float = HANDOVER_SETTLE_S) -> None:
        self.backend = backend
        self.cluster = cluster
        self.node_name = node_name
        self.assignments = assignments
        self.evict = evict
        self.policy = policy
        self.metrics = metrics or GuardMetrics()
        self.proc = proc or ProcReader()
        self.kill = kill
        self.shares_for = shares_for
        self.clock: Clock = clock or RealClock()
        self.share_record = share_record
        self.handover_settle_s = handover_settle_s
        self._share_cache: tuple[object, ShareRecord | None] = (None, None)  # (file identity, what it held)
        self._held = False  # acting is held for a config hand-over (logged once per hand-over)
        self._pods: dict[PodKey, dict[str, Any]] = {}
        self._pods_for: frozenset[PodKey] | None = None
        self._warned: set[tuple[str, EntityKey, str]] = set()  # only to fold repeated warn Events; no decision uses it

    # ------------------------------------------------------------------ reading

    def read_node(self) -> NodeReading:
        gpus = self.backend.devices()
        migs: list[MigDevice] = []
        entities: list[EntityReading] = []
        processes: list[ProcessReading] = []
        for gpu in gpus:
            sample = self.backend.sample(gpu.index)
            entities.append(EntityReading((gpu.index, None), gpu.memory_mib, sample.memory_free_mib, gpu.uuid))
            if gpu.mig_enabled:
                for mig in self.backend.mig_devices(gpu.index):
                    migs.append(mig)
                    mig_sample = self.backend.sample(gpu.index, mig.gi_id)
                    entities.append(EntityReading((gpu.index, mig.gi_id), mig.memory_mib, mig_sample.memory_free_mib,
                                                  mig.uuid))
            for process in self.backend.processes(gpu.index):
                owner = self.proc.owner(process.pid)
                processes.append(ProcessReading(process.pid, (gpu.index, process.gi_id), process.used_memory_mib,
                                                owner.pod_uid if owner else None))
        return NodeReading(gpus, migs, entities, processes)

    def _shares(self, gpus: list[GpuDevice], migs: list[MigDevice],
                record: ShareRecord | None) -> Mapping[str, DeviceShare]:
        """Each device ID's share: as recorded at its allocation; for IDs with no record, what the config (or the
        kubelet's allocatable IDs) gives today — the only source for pods allocated before recording began."""
        if self.shares_for is not None:
            current = self.shares_for(gpus, migs)
        else:
            from kubegpu.sharing.shares import shares_from_allocatable

            current = shares_from_allocatable(self.assignments.allocatable() or [], gpus, migs)
        return current if record is None else with_recorded(current, record.devices, gpus, migs)

    def _read_record(self) -> ShareRecord | None:
        """The device plugin's share record (re-parsed only when the file changed); a torn or foreign one raises
        CorruptStateError, and the round does nothing rather than judge pods by guessed shares."""
        if self.share_record is None:
            return None
        identity = file_identity(self.share_record)
        if identity is None or identity != self._share_cache[0]:
            self._share_cache = (identity, read_record(self.share_record) if identity is not None else None)
        return self._share_cache[1]

    def _list_pods(self) -> None:
        pods = self.cluster.list("Pod", field_selector=f"spec.nodeName={self.node_name}")
        self._pods = {pod_key(pod): pod for pod in pods}

    def _claims(self, containers: Sequence[ContainerDevices]) -> dict[PodKey, dict[str, Any]]:
        out: dict[PodKey, dict[str, Any]] = {}
        for entry in containers:
            if entry.claim is None or (entry.namespace, entry.claim) in out:
                continue
            try:
                out[(entry.namespace, entry.claim)] = self.cluster.get("ResourceClaim", entry.claim, entry.namespace)
            except KubegpuError as exc:
                log.debug("claim %s/%s: %s", entry.namespace, entry.claim, exc)
        return out

    def _decide(self, reading: NodeReading, containers: Sequence[ContainerDevices],
                shares: Mapping[str, DeviceShare]) -> Decision:
        memory = {reading_.entity: reading_.total_mib for reading_ in reading.entities}
        minors = {gpu.device_minor: gpu.index for gpu in reading.gpus}
        placements = {(mig.gpu_index, mig.profile_id, mig.start): mig.gi_id for mig in reading.migs}
        claims = self._claims(containers) if any(c.claim for c in containers) else {}
        holdings = build_holdings(containers, shares, self._pods, claims, memory, minors, placements)
        mps = {(h.uid, h.entity) for h in holdings if h.kind == SharingKind.MPS}
        processes = [self._with_mps_limit(p) if (p.pod_uid, p.entity) in mps else p for p in reading.processes]
        return decide(reading.entities, holdings, processes, self.policy)

    def _with_mps_limit(self, process: ProcessReading) -> ProcessReading:
        """An MPS client's pinned-memory limit, from its environment (read only for MPS pods' processes)."""
        known, limit = self.proc.mps_limit(process.pid)
        return replace(process, mps_limit_mib=limit, mps_limit_known=known)

    # ------------------------------------------------------------------ one round

    def run_once(self) -> RoundResult:
        """Read, decide, act; on an API or kubelet failure nothing is done this round (the next one retries)."""
        try:
            result = self._round()
        except KubegpuError as exc:
            self.metrics.rounds.labels("failed").inc()
            log.warning("round failed: %s", exc)
            return RoundResult(Decision())
        self.metrics.rounds.labels("ok").inc()
        return result

    def _round(self) -> RoundResult:
        reading = self.read_node()
        containers = self.assignments.list()
        if containers is None:
            return RoundResult(Decision())
        record = self._read_record()
        shares = self._shares(reading.gpus, reading.migs, record)
        holders = frozenset((c.namespace, c.pod) for c in containers)
        if holders != self._pods_for:
            self._list_pods()
            self._pods_for = holders
        decision = self._decide(reading, containers, shares)
        if decision.actions or decision.findings:
            self._list_pods()  # act only on what the API says now (annotation, already being deleted)
            decision = self._decide(reading, containers, shares)
        self._record(decision)
        if log.isEnabledFor(logging.DEBUG):
            log.debug("round: %d containers, %d device shares, %d pods listed, %d processes (%d unattributed); %s",
                      len(containers), len(shares), len(self._pods), len(reading.processes),
                      sum(c for c, _ in decision.unattributed.values()),
                      ", ".join(f"{u.holding.pod} on {u.holding.entity[0]}: {u.used_mib}/{u.holding.share_mib} MiB"
                                for u in decision.usage) or "no pod on a shared GPU")
        result = RoundResult(decision)
        if record is not None and record.handover.running(self.clock.now(), self.handover_settle_s):
            if decision.actions and not self._held:
                log.info("the device plugin is switching configs: not acting on %s until it is done",
                         ", ".join(f"{a.holding.namespace}/{a.holding.pod}" for a in decision.actions))
            self._held = True
            result.held = True
            return result
        self._held = False
        for action in decision.actions:
            result.done.append((action, self._act(action)))
        return result

    # ------------------------------------------------------------------ acting

    def _act(self, action: Action) -> str:
        holding = action.holding
        pod = self._pods.get((holding.namespace, holding.pod), {})
        gpu = _where(holding.entity, action.uuid)
        message = (f"uses {action.used_mib} MiB of GPU memory on {gpu}, over its share of {holding.share_mib} MiB "
                   f"({action.free_mib} MiB free on the GPU)")
        kind = action.kind
        if kind == GuardAction.WARN:
            key = (holding.uid, holding.entity, "warn")
            if key not in self._warned:
                self._warned.add(key)
                self.metrics.actions.labels(kind.value, action.reason.value).inc()
                self._event(pod, f"{message}; --action warn: nothing done", EVENT_REASON)
            return "warned"
        self._condition(pod, holding.share_mib, action.used_mib, gpu)
        if kind == GuardAction.EVICT:
            self._event(pod, f"{message}; evicting the pod", EVENT_REASON)
            if self.evict(holding.namespace, holding.pod):
                self.metrics.actions.labels("evict", action.reason.value).inc()
                log.info("evicted %s/%s: %s", holding.namespace, holding.pod, message)
                return "evicted"
            log.info("%s/%s is protected by a PodDisruptionBudget; killing process(es) %s instead",
                     holding.namespace, holding.pod, ", ".join(map(str, action.pids)))
            killed = self._kill(action)
            if not killed:
                return "not killed (pdb; its processes' PIDs are someone else's now)"
            self._event(pod, f"{message}; a PodDisruptionBudget refused the eviction, so the offending process(es) "
                             f"{', '.join(map(str, killed))} were killed", EVENT_REASON)
            self.metrics.actions.labels("kill-process", "pdb-protected").inc()
            return "killed (pdb)"
        killed = self._kill(action)
        if not killed:
            return "not killed (its processes' PIDs are someone else's now)"
        self._event(pod, f"{message}; killed process(es) {', '.join(map(str, killed))}", EVENT_REASON)
        self.metrics.actions.labels("kill-process", action.reason.value).inc()
        return "killed"

    def _kill(self, action: Action) -> list[int]:
        """Kill the action's processes that still belong to its pod (each re-checked right before its signal);
        the PIDs that are no more (killed, or exited already)."""
        killed = []
        for pid in action.pids:
            outcome = self.kill(pid, partial(self._still_owned, pid, action.holding.uid))
            if outcome not in (KillOutcome.KILLED, KillOutcome.GONE):
                continue
            killed.append(pid)
            remove = getattr(self.backend, "remove_process", None)  # a simulated node: the driver frees it
            if remove is not None:
                with contextlib.suppress(KubegpuError):
                    remove(action.holding.entity[0], pid)
        return killed

    def _still_owned(self, pid: int, pod_uid: str) -> bool:
        owner = self.proc.owner(pid)
        return owner is not None and owner.pod_uid == pod_uid

    def _condition(self, pod: Mapping[str, Any], share_mib: int, used_mib: int, gpu: str) -> None:
        if not pod:
            return
        namespace, name = pod_key(pod)
        condition = {"type": CONDITION_TYPE, "status": "True", "reason": "ShareExceeded",
                     "message": f"GPU memory share {share_mib} MiB, used {used_mib} MiB, GPU {gpu}",
                     "lastTransitionTime": format_timestamp(self.clock.now())}
        try:
            self.cluster.patch("Pod", name, {"status": {"conditions": [condition]}}, namespace=namespace,
                               patch_type="strategic", subresource="status")
        except KubegpuError as exc:
            log.warning("pod %s/%s: cannot set condition %s: %s", namespace, name, CONDITION_TYPE, exc)

    def _event(self, pod: Mapping[str, Any], message: str, reason: str) -> None:
        if not pod:
            return
        try:
            record_event(self.cluster, {"apiVersion": "v1", "kind": "Pod", **pod}, reason, message,
                         component=COMPONENT)
        except KubegpuError as exc:
            log.warning("pod %s/%s: cannot record event: %s", *pod_key(pod), exc)

    def _record(self, decision: Decision) -> None:
        pods = tuple((u.holding.namespace, u.holding.pod, str(u.holding.entity[0]), _instance(u.holding.entity),
                      float(u.holding.share_mib * MIB), float(u.used_mib * MIB)) for u in decision.usage)
        unattributed = tuple((str(entity[0]), _instance(entity), float(count), float(mib * MIB))
                             for entity, (count, mib) in decision.unattributed.items())
        missing = tuple((f.holding.namespace, f.holding.pod, str(f.holding.entity[0]), str(f.pid))
                        for f in decision.findings)
        self.metrics.set_reading(GuardReading(pods, unattributed, missing))
        for finding in decision.findings:
            h = finding.holding
            key = (h.uid, h.entity, f"mps:{finding.pid}")
            if key not in self._warned:
                self._warned.add(key)
                limit = "none" if finding.limit_mib is None else f"{finding.limit_mib} MiB"
                self._event(self._pods.get((h.namespace, h.pod), {}),
                            f"MPS client process {finding.pid} on GPU {h.entity[0]} runs with pinned-memory limit "
                            f"{limit}, but its slice should limit it to {h.mps_limit_mib} MiB (a misconfiguration)",
                            MPS_EVENT_REASON)


def _instance(entity: EntityKey) -> str:
    return "" if entity[1] is None else str(entity[1])


def _where(entity: EntityKey, uuid: str) -> str:
    index, gi_id = entity
    place = f"{index}" if gi_id is None else f"{index} instance {gi_id}"
    return f"{place} ({uuid})" if uuid else place
