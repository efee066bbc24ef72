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
"""

from __future__ import annotations

import builtins
import contextlib
import logging
import os
import signal
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from kubegpu.clock import Clock, RealClock
from kubegpu.errors import KubegpuError
from kubegpu.gpu.backend import GpuBackend, GpuDevice, MigDevice
from kubegpu.guard.core import Action, Decision, EntityKey, EntityReading, GuardAction, Policy, ProcessReading, decide
from kubegpu.guard.holdings import PodKey, build_holdings, pod_key
from kubegpu.guard.procs import ProcReader
from kubegpu.kube.cluster import Cluster, format_timestamp, record_event
from kubegpu.kube.resources import ResourceKind, register_kind
from kubegpu.metrics import GuardMetrics, GuardReading
from kubegpu.sharing.attribution import ContainerDevices
from kubegpu.sharing.names import SharingKind
from kubegpu.sharing.shares import DeviceShare

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
Killer = Callable[[int], None]


def kill_host_process(pid: int) -> None:
    """SIGKILL a process in the host's PID namespace (the DaemonSet runs with hostPID); one already gone is fine."""
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    except PermissionError:
        log.warning("not allowed to kill process %d", pid)


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


class Guard:
    """One node's guard. `shares_for` turns the node's GPUs into device shares (the device plugin's config when
    given, else the kubelet's allocatable IDs); `evict` and `kill` are the two ways to act."""

    def __init__(self, backend: GpuBackend, cluster: Cluster, node_name: str, assignments: Assignments,
                 evict: Evictor, policy: Policy, metrics: GuardMetrics | None = None,
                 proc: ProcReader | None = None, kill: Killer = kill_host_process,
                 shares_for: Callable[[list[GpuDevice], list[MigDevice]], Mapping[str, DeviceShare]] | None = None,
                 clock: Clock | None = None) -> None:
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

    def _shares(self, gpus: list[GpuDevice], migs: list[MigDevice]) -> Mapping[str, DeviceShare]:
        if self.shares_for is not None:
            return self.shares_for(gpus, migs)
        from kubegpu.sharing.shares import shares_from_allocatable

        return shares_from_allocatable(self.assignments.allocatable() or [], gpus, migs)

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
        shares = self._shares(reading.gpus, reading.migs)
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
            self._kill(action)
            self._event(pod, f"{message}; a PodDisruptionBudget refused the eviction, so the offending process(es) "
                             f"{', '.join(map(str, action.pids))} were killed", EVENT_REASON)
            self.metrics.actions.labels("kill-process", "pdb-protected").inc()
            return "killed (pdb)"
        self._kill(action)
        self._event(pod, f"{message}; killed process(es) {', '.join(map(str, action.pids))}", EVENT_REASON)
        self.metrics.actions.labels("kill-process", action.reason.value).inc()
        return "killed"

    def _kill(self, action: Action) -> None:
        for pid in action.pids:
            self.kill(pid)
            remove = getattr(self.backend, "remove_process", None)  # a simulated node: the driver frees it
            if remove is not None:
                with contextlib.suppress(KubegpuError):
                    remove(action.holding.entity[0], pid)

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
