"""`kubegpu place`: a secondary scheduler that picks node and GPU for GPU pods with the placement core.

Why a scheduler of its own, beside kube-scheduler, and not an extender or a scoring plugin: with DRA the device is
chosen inside kube-scheduler's DynamicResources plugin, first fit in slice order with no scoring (reference/dra.md
§4); an extender only filters and scores nodes and never sees which GPU a claim gets, and a plugin would mean
shipping a kube-scheduler build. Which GPU a share lands on is exactly what fragmentation is about, so kubegpu must
make that choice itself — as KAI-Scheduler and HAMi do, by scheduling its pods itself. Pods opt in with
`schedulerName: kubegpu` (a GPU pod through one claim, or a pod with no claim, placed by CPU and memory on the
GPU nodes); everything else stays with kube-scheduler, and both see each other's work through the
API: this controller counts every allocated ResourceClaim and bound pod, and kube-scheduler counts the claims it
allocates here (consumedCapacity on the same shared devices).

One pass (`tick`), while holding the `kubegpu-place` Lease: read nodes, the driver's ResourceSlices, pods and claims
from informers; build the placement state (`objects.build_state`); take pending pods in arrival order
(creationTimestamp, then name); for each, `choose` with the configured policy — the very code the trace simulator
runs — among the nodes kube-scheduler's other filters allow (cordon, taints, nodeSelector, required node affinity:
`kubegpu.scheduling.fit`), then, record before act: write the claim's allocation (devices, consumedCapacity,
shareID, node selector) and `reservedFor` in one status write carrying the resourceVersion read (a conflict means
someone else moved: the pod is retried next pass), and only then bind the pod through the Binding API. A pod
whose claim is already allocated and reserved for it (a bind that failed after the write) is bound to that node. A
pod that fits nowhere, or whose claim is of a shape not placed here, gets one FailedScheduling event and stays
pending.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from kubegpu.errors import KubegpuError
from kubegpu.kube.cluster import Cluster, record_event
from kubegpu.kube.errors import ApiError, Conflict, NotFound
from kubegpu.kube.leader import LeaderElector
from kubegpu.kube.resources import ResourceKind, register_kind
from kubegpu.placement.objects import (
    DRIVER,
    allocation_status,
    allowed_nodes,
    build_state,
    cpu_request,
    inventory,
    only_nodes,
    placed_devices,
    pod_claim_names,
    pod_request,
)
from kubegpu.scheduling.placement import ClusterState, Policy, choose
from kubegpu.scheduling.pods import is_finished, is_scheduling_gated, pod_key

log = logging.getLogger("kubegpu.placement")
SCHEDULER_NAME = "kubegpu"
LEASE_NAME = "kubegpu-place"
COMPONENT = "kubegpu-place"
FINALIZER = "resource.kubernetes.io/delete-protection"  # what kube-scheduler puts on a claim it allocates
KINDS = ("Node", "Pod", "ResourceSlice", "ResourceClaim", "DeviceClass")
for _kind in (
    ResourceKind("ResourceSlice", "resource.k8s.io", "v1", "resourceslices", namespaced=False,
                 status_subresource=False, strategic_merge=False),
    ResourceKind("ResourceClaim", "resource.k8s.io", "v1", "resourceclaims", namespaced=True,
                 status_subresource=True, strategic_merge=False),
    ResourceKind("DeviceClass", "resource.k8s.io", "v1", "deviceclasses", namespaced=False,
                 status_subresource=False, strategic_merge=False),
    ResourceKind("Binding", "", "v1", "bindings", namespaced=True, status_subresource=False),
):
    register_kind(_kind)


@dataclass(frozen=True)
class Decision:
    """Where one pod went (node, devices), for logs and tests."""

    pod: str
    node: str
    devices: tuple[str, ...]


@dataclass
class TickResult:
    bound: list[Decision] = field(default_factory=list)
    pending: int = 0


@dataclass
class PlacementController:
    cluster: Cluster
    policy: Policy
    scheduler_name: str = SCHEDULER_NAME
    identity: str = COMPONENT
    leader_elect: bool = True
    lease_namespace: str = "kubegpu"
    lease_duration: float = 15.0
    driver: str = DRIVER
    elector: LeaderElector | None = field(default=None, init=False)
    _reported: set[tuple[str, str]] = field(default_factory=set, init=False)
    _no_room: dict[str, bytes] = field(default_factory=dict, init=False)  # pod uid -> the state it did not fit
    # pods this controller bound that the informer may not show bound yet: uid -> (node index name, CPU, memory)
    _binding: dict[str, tuple[str, int, int]] = field(default_factory=dict, init=False)

    def __post_init__(self) -> None:
        if self.leader_elect:
            self.elector = LeaderElector(self.cluster, self.identity, LEASE_NAME, self.lease_namespace,
                                         lease_duration=self.lease_duration)

    def pending(self, pods: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Our pods waiting for a node, in arrival order."""
        ours = [p for p in pods if (p.get("spec") or {}).get("schedulerName") == self.scheduler_name
                and not (p.get("spec") or {}).get("nodeName") and not is_finished(p) and not is_scheduling_gated(p)
                and not (p.get("metadata") or {}).get("deletionTimestamp")]
        return sorted(ours, key=lambda p: (str((p.get("metadata") or {}).get("creationTimestamp") or ""),
                                           pod_key(p)))

    def tick(self, now: float) -> TickResult:
        if self.elector is not None and not self.elector.try_acquire(now):
            return TickResult()
        pods = self.cluster.list("Pod")
        waiting = self.pending(pods)
        if not waiting:
            return TickResult()
        claims = self.cluster.list("ResourceClaim")
        by_key = {f"{(c.get('metadata') or {}).get('namespace')}/{(c.get('metadata') or {}).get('name')}": c
                  for c in claims}
        gpus = inventory(self.cluster.list("ResourceSlice"), self.driver)
        nodes = self.cluster.list("Node")
        state = build_state(nodes, gpus, pods, claims, self.driver)
        by_name = {str((n.get("metadata") or {}).get("name")): n for n in nodes}
        uids = {str((p.get("metadata") or {}).get("uid") or pod_key(p)) for p in waiting}
        self._no_room = {uid: seen for uid, seen in self._no_room.items() if uid in uids}
        # a pod bound on an earlier pass that the informer still shows pending holds its CPU and memory there
        self._binding = {uid: held for uid, held in self._binding.items() if uid in uids}
        for node_name, cpu, memory in self._binding.values():
            if node_name in state.names:
                index = state.names.index(node_name)
                state.cpu_free[index] -= cpu
                state.memory_free[index] -= memory
                state.version[index] += 1
        result = TickResult()
        for pod in waiting:
            if str((pod.get("metadata") or {}).get("uid") or pod_key(pod)) in self._binding:
                continue
            namespace = (pod.get("metadata") or {}).get("namespace") or "default"
            names = pod_claim_names(pod)
            if len(names) > 1:
                self._report(pod, "the pod must have at most one resourceClaims entry")
                continue
            claim = by_key.get(f"{namespace}/{names[0]}") if names and names[0] else None
            if names and claim is None:  # generated from its template, not created yet: next pass
                result.pending += 1
                continue
            try:
                ask = pod_request(pod, claim) if claim is not None else cpu_request(pod)
                allowed = allowed_nodes(pod, by_name, state)
            except KubegpuError as exc:
                self._report(pod, str(exc))
                continue
            node = self._already_placed(claim, pod) if claim is not None else None
            if node is None:
                # a policy may learn from the requests it is asked about (kubegpu's popularity model): ask again
                # about a pod that did not fit only once the cluster changed, so waiting does not count as demand
                uid = str((pod.get("metadata") or {}).get("uid") or pod_key(pod))
                seen = _digest(state, allowed)
                placement = None
                if self._no_room.get(uid) != seen:
                    with only_nodes(state, allowed):
                        placement = choose(ask.request, state, self.policy)
                if placement is None:
                    self._no_room[uid] = seen
                    result.pending += 1
                    self._report(pod, f"no node has {ask.request.gpu_count} GPU(s) with {ask.request.gpu_milli} "
                                      f"free thousandths and {ask.request.cpu_milli}m CPU, "
                                      f"{ask.request.memory_mib}Mi memory")
                    continue
                self._no_room.pop(uid, None)
                node = state.names[placement.node]
                devices = placed_devices(gpus[node], placement)
                if claim is not None and not self._allocate(claim, pod, ask, node, devices):
                    result.pending += 1
                    continue
                state.apply(ask.request, placement)
            else:
                assert claim is not None
                devices = [r["device"] for r in claim["status"]["allocation"]["devices"]["results"]]
            if self._bind(pod, node):
                result.bound.append(Decision(pod_key(pod), node, tuple(devices)))
                self._binding[str((pod.get("metadata") or {}).get("uid") or pod_key(pod))] = (
                    node, ask.request.cpu_milli, ask.request.memory_mib)
            else:
                result.pending += 1
        return result

    def _already_placed(self, claim: Mapping[str, Any], pod: Mapping[str, Any]) -> str | None:
        """The node of a claim already allocated and reserved for this pod (our earlier pass wrote it)."""
        status = claim.get("status") or {}
        uid = (pod.get("metadata") or {}).get("uid")
        if not status.get("allocation") or not any(r.get("uid") == uid for r in status.get("reservedFor") or ()):
            return None
        results = (status["allocation"].get("devices") or {}).get("results") or []
        return str(results[0]["pool"]) if results else None

    def _allocate(self, claim: Mapping[str, Any], pod: Mapping[str, Any], ask: Any, node: str,
                  devices: list[str]) -> bool:
        """The claim's finalizer, then its allocation and reservation, each guarded by the resourceVersion read;
        False when the claim changed meanwhile (or is already allocated elsewhere): the pod waits a pass."""
        meta = claim.get("metadata") or {}
        name, namespace = str(meta.get("name")), str(meta.get("namespace") or "default")
        if (claim.get("status") or {}).get("allocation"):
            self._report(pod, f"ResourceClaim {namespace}/{name} is already allocated for another pod")
            return False
        class_name = claim["spec"]["devices"]["requests"][0]["exactly"]["deviceClassName"]
        try:
            device_class = self.cluster.get("DeviceClass", class_name)
        except NotFound:
            self._report(pod, f"DeviceClass {class_name} not found")
            return False
        status = allocation_status(ask, claim, pod, node, devices, (device_class.get("spec") or {}).get("config")
                                   or (), self.driver)
        version = meta.get("resourceVersion")
        try:
            if FINALIZER not in (meta.get("finalizers") or []):
                written = self.cluster.patch("ResourceClaim", name, {"metadata": {
                    "resourceVersion": version, "finalizers": [*(meta.get("finalizers") or []), FINALIZER]}},
                                             namespace=namespace)
                version = (written.get("metadata") or {}).get("resourceVersion")
            self.cluster.patch("ResourceClaim", name, {"metadata": {"resourceVersion": version}, "status": status},
                               namespace=namespace, subresource="status")
        except (Conflict, NotFound) as exc:
            log.info("claim %s/%s changed while placing pod %s (%s): next pass", namespace, name, pod_key(pod), exc)
            return False
        except ApiError as exc:  # refused (RBAC, validation): this pod waits, the others go on
            self._report(pod, f"ResourceClaim {namespace}/{name}: cannot write its allocation: {exc}")
            return False
        return True

    def _bind(self, pod: Mapping[str, Any], node: str) -> bool:
        meta = pod.get("metadata") or {}
        binding = {"apiVersion": "v1", "kind": "Binding",
                   "metadata": {"name": meta.get("name"), "namespace": meta.get("namespace") or "default",
                                "uid": meta.get("uid")},
                   "target": {"apiVersion": "v1", "kind": "Node", "name": node}}
        try:
            self.cluster.create(binding)
        except (Conflict, NotFound) as exc:  # bound meanwhile, or gone
            log.info("binding pod %s to %s: %s", pod_key(pod), node, exc)
            return False
        except ApiError as exc:  # refused: reported; the claim stays reserved, so the next pass binds it there
            self._report(pod, f"cannot bind the pod to {node}: {exc}")
            return False
        log.info("bound pod %s to node %s", pod_key(pod), node)
        return True

    def _report(self, pod: Mapping[str, Any], message: str) -> None:
        """One FailedScheduling event per pod and reason (a pod waiting for room is not reported every pass)."""
        key = (pod_key(pod), message)
        if key in self._reported:
            return
        self._reported.add(key)
        log.info("pod %s: %s", pod_key(pod), message)
        try:
            record_event(self.cluster, {"kind": "Pod", **pod}, "FailedScheduling", message, component=COMPONENT)
        except KubegpuError as exc:
            log.warning("cannot record an event for pod %s: %s", pod_key(pod), exc)


def _digest(state: ClusterState, allowed: set[int]) -> bytes:
    """What the state holds (free CPU, memory, per-GPU thousandths) and the nodes a pod may use, to tell whether
    its answer could have changed."""
    return hashlib.sha1(state.cpu_free.tobytes() + state.memory_free.tobytes() + state.gpu_free.tobytes()
                        + repr(sorted(allowed)).encode()).digest()


def run(controller: PlacementController, interval: float, stop: Callable[[], bool],
        now: Callable[[], float] = time.time) -> None:
    """The `kubegpu place` loop: one pass every `interval` seconds until `stop()`."""
    while not stop():
        started = now()
        try:
            result = controller.tick(started)
            if result.bound:
                log.info("place: bound %d pod(s), %d pending", len(result.bound), result.pending)
        except KubegpuError as exc:
            log.warning("placement pass failed: %s", exc)
        time.sleep(max(0.0, interval - (now() - started)))
