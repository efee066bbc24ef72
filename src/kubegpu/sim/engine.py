"""The discrete-event engine: one strategy, one workload, one simulated cluster, on a virtual clock.

Events (a heap ordered by time, then insertion): pod arrivals, run completions, OOM kills, node and MIG changes,
strategy ticks and metric samples. After all events of one instant, a scheduling pass binds pending pods the way
kube-scheduler does: highest priority first, FIFO within a priority, each pod to the best-scoring node that
`kubegpu.scheduling.fits` (least- or most-allocated). Nodes' allocatable comes from the device plugin's resource
accounting (`kubegpu.deviceplugin.resources`) over simulated GPUs and MIG devices (`kubegpu.sim.hardware`).

Why it is fast enough for a day of 800 GPUs and 50,000 pods: NodeInfos are updated in place (never rebuilt per
pod), pods are parsed once, pending pods are queued per request shape, and a shape that did not fit is not tried
again until capacity of its resource is freed (what kube-scheduler's queueing hints do).
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kubegpu.clock import VirtualClock
from kubegpu.deviceplugin.resources import (
    REPLICA_SEPARATOR,
    AnnotatedDevice,
    allocatable,
    config_dict,
    devices_by_resource,
    sharing_spec,
    strip_replica,
)
from kubegpu.discovery.labels import compute_labels
from kubegpu.errors import ConfigError, KubegpuError, NotFoundError
from kubegpu.gpu.backend import GpuDevice, MigDevice
from kubegpu.gpu.catalog import GpuModel, get_model
from kubegpu.gpu.geometry import PlacedInstance, layout_errors
from kubegpu.kube.errors import NotFound
from kubegpu.kube.memory import MemoryCluster
from kubegpu.scheduling import NodeInfo, PodRequirements, node_info, pod_requirements, select_node
from kubegpu.sim import hardware
from kubegpu.sim.metrics import Collector, StrategyResult
from kubegpu.sim.perf import DEFAULT_PARAMS, PerfParams, mig_speed, mps_speeds, newest_to_kill, time_slicing_speeds
from kubegpu.sim.scenario import NodeGroup, Scenario
from kubegpu.sim.strategies import GpuRequest, NodeView, Strategy
from kubegpu.sim.workload import Job

NODE_GROUP_LABEL = "kubegpu.io/node-group"
CLASS_LABEL = "kubegpu.io/sim-class"
MIG_RECONFIGURE_DELAY_S = 113.0  # measured: MIG-manager label change → resources allocatable, average (reference §4)
NODE_PROVISION_DELAY_S = 300.0  # a GPU instance booting, joining and running its GPU stack
RETRY_BACKOFF_S = 10.0
RETRY_BACKOFF_MAX_S = 300.0
PODS_PER_NODE = 110

# event kinds, in the order they are handled within one instant
_FINISH, _OOM, _NODE, _ARRIVAL, _TICK, _SAMPLE = range(6)


class InstanceInUseError(KubegpuError):
    """A controller asked for a MIG change that would destroy what a running pod uses (the partition agent refuses
    such a plan too), or for a change on a GPU whose last change is still being applied."""


@dataclass(frozen=True, slots=True)
class _MigChange:
    """One GPU's checked MIG change: what goes at once, what appears after the delay."""

    index: int
    layout: list[PlacedInstance] | None  # the whole new layout (None: MIG off)
    destroy: tuple[MigDevice, ...]
    create: tuple[PlacedInstance, ...]
    mode_change: bool  # MIG turned on or off: the whole GPU is out for the delay


@dataclass(eq=False, slots=True)
class Partition:
    """What the performance model treats as one unit: a whole GPU or one MIG device, with whoever runs on it."""

    key: str
    gpu_index: int
    memory_gib: float
    sms: int
    full_sms: int
    mig: bool
    sharing: str  # "none" | "time-slicing" | "mps"
    residents: list[Attempt] = field(default_factory=list)  # oldest first


@dataclass(eq=False, slots=True)
class Attempt:
    """One pod: a job's try at running (a job OOM-killed or evicted comes back as a new pod)."""

    job: Job
    attempt: int  # incarnation of the job: 0, then 1, 2, ... after each OOM kill or eviction
    ooms: int  # OOM kills the job has had before this pod
    name: str
    request: GpuRequest
    queued_at: float
    seq: int
    pod: dict[str, Any]
    requests: dict[str, float]
    need: PodRequirements
    node: SimNode | None = None
    devices: list[AnnotatedDevice] = field(default_factory=list)
    parts: list[Partition] = field(default_factory=list)
    remaining: float = 0.0
    speed: float = 0.0
    updated: float = 0.0
    version: int = 0
    alloc_weight: float = 0.0
    memory_in_use: float = 0.0
    thread_fraction: float = 1.0

    def sort_key(self) -> tuple[int, float, int]:
        return (-self.job.priority, self.queued_at, self.seq)


@dataclass(eq=False)
class SimNode:
    name: str
    group: NodeGroup
    model: GpuModel
    hardware: hardware.NodeHardware
    config: Any
    mps_slices: dict[int, list[int]]
    obj: dict[str, Any]
    info: NodeInfo
    allocatable: dict[str, int] = field(default_factory=dict)
    free: dict[str, list[AnnotatedDevice]] = field(default_factory=dict)
    partitions: dict[str, Partition] = field(default_factory=dict)
    running: list[Attempt] = field(default_factory=list)
    reconfiguring: set[int] = field(default_factory=set)  # GPUs out of allocatable until a change is applied
    mig_pending: dict[int, list[PlacedInstance]] = field(default_factory=dict)  # instances being created
    mps_pending: dict[int, set[str]] = field(default_factory=dict)  # new MPS slice device IDs not yet usable
    ready: bool = False
    added_at: float = 0.0
    rejects_multiple_shared: bool = False  # the plugin's failRequestsGreaterThanOne (MPS default)
    _key: tuple[Any, ...] | None = None
    _view: NodeView | None = None

    @property
    def gpus(self) -> list[GpuDevice]:
        return self.hardware.gpus

    @property
    def mig(self) -> dict[int, list[MigDevice]]:
        return self.hardware.mig

    def state_key(self) -> tuple[Any, ...]:
        """Nodes with equal keys look the same to the scheduler: same group (labels, taints), allocatable and
        requested. Cached until the node changes; `touch()` invalidates it."""
        if self._key is None:
            info = self.info
            self._key = (self.group.name, tuple(sorted(info.allocatable.items())),
                         tuple(sorted(info.requested.items())))
        return self._key

    def touch(self) -> None:
        self._key = None
        self._view = None

    def view(self) -> NodeView:
        """What controllers see; cached until the node changes (controllers ask every tick, nodes change less)."""
        if self._view is None:
            self._view = _view(self)
        return self._view


class Simulation:
    """Runs one strategy over one workload; `run()` returns its `StrategyResult`. Implements `SimControl`."""

    def __init__(
        self,
        scenario: Scenario,
        strategy: Strategy,
        jobs: Sequence[Job],
        duration: float | None = None,
        params: PerfParams = DEFAULT_PARAMS,
        cluster: Any = None,
    ) -> None:
        self.scenario = scenario
        self.strategy = strategy
        self.jobs = jobs
        self.duration = scenario.duration if duration is None else duration
        self.params = params
        self.clock = VirtualClock()
        self.cluster = cluster if cluster is not None else MemoryCluster(self.clock)
        self.node_groups = scenario.cluster.node_groups
        self.mig_reconfigure_delay = MIG_RECONFIGURE_DELAY_S
        self.node_provision_delay = NODE_PROVISION_DELAY_S
        self.scoring = scenario.cluster.scoring
        self.models = [get_model(group.gpu_model) for group in self.node_groups]
        self._events: list[tuple[float, int, int, Any]] = []
        self._seq = itertools.count()
        self._nodes: dict[str, SimNode] = {}
        self._node_counter: dict[str, int] = {}
        self._queues: dict[GpuRequest, list[tuple[tuple[int, float, int], Attempt]]] = {}
        self._capacity_version: dict[str, int] = {}
        self._failed_at: dict[GpuRequest, int] = {}
        self._dirty = False
        self.metrics = Collector(strategy.name, self.duration)

    # ------------------------------------------------------------------------------------------------ running
    def run(self, progress: Callable[[float], None] | None = None) -> StrategyResult:
        """Simulate from 0 to the duration; `progress(simulated seconds)` is called at each metric sample."""
        for group in self.node_groups:
            for _ in range(group.count):
                self._join_node(group, ready=True)
        for job in self.jobs:
            self._push(job.arrival, _ARRIVAL, (job, 0, 0))
        self.strategy.on_start(self)
        if self.strategy.tick_interval:
            self._push(self.strategy.tick_interval, _TICK, None)
        self._push(0.0, _SAMPLE, None)
        while self._events and self._events[0][0] <= self.duration:
            now = self._events[0][0]
            self._advance(now)
            while self._events and self._events[0][0] == now:
                _, kind, _, payload = heapq.heappop(self._events)
                self._handle(kind, payload, progress)
            if self._dirty:
                self._schedule()
        self._advance(self.duration)
        self._finish_metrics()
        if progress is not None:
            progress(self.duration)
        return self.metrics.result(self.scenario, self.jobs)

    def _push(self, t: float, kind: int, payload: Any) -> None:
        heapq.heappush(self._events, (t, kind, next(self._seq), payload))

    def _advance(self, now: float) -> None:
        self.metrics.advance(now)
        self.clock.advance_to(max(now, self.clock.now()))

    def _handle(self, kind: int, payload: Any, progress: Callable[[float], None] | None) -> None:
        now = self.clock.now()
        if kind == _ARRIVAL:
            job, attempt, ooms = payload
            self._enqueue(job, attempt, ooms, now)
        elif kind == _FINISH:
            run, version = payload
            if run.node is not None and run.version == version:
                self._stop(run, "completed")
        elif kind == _OOM:
            if payload.node is not None:
                self._stop(payload, "oom")
        elif kind == _NODE:
            payload()
        elif kind == _TICK:
            self.strategy.on_tick(self)
            self._dirty = True
            interval = self.strategy.tick_interval
            if interval:
                self._push(now + interval, _TICK, None)
        elif kind == _SAMPLE:
            self.metrics.sample(now, self._pending_count())
            if progress is not None:
                progress(now)
            self._push(now + self.scenario.sample_interval, _SAMPLE, None)

    # ------------------------------------------------------------------------------------------------- nodes
    def _join_node(self, group: NodeGroup, ready: bool) -> SimNode:
        index = self._node_counter.get(group.name, 0)
        self._node_counter[group.name] = index + 1
        name = f"{group.name}-{index}"
        model = get_model(group.gpu_model)
        where = f"strategy {self.strategy.name}: node {name}"
        devices = hardware.NodeHardware(name, model, group.gpus_per_node, self.clock)
        setup = self.strategy.node_setup(group, model, devices.gpus)
        devices.apply({gpu_index: (None if ids is None else hardware.placed_layout(model, ids, where))
                       for gpu_index, ids in setup.mig_layout.items()}, where)
        obj = _node_object(name, group, model)
        node = SimNode(name, group, model, devices, setup.device_plugin_config, dict(setup.mps_slices), obj,
                       node_info(obj), added_at=self.clock.now())
        self._nodes[name] = node
        self.metrics.node_added(name, group, self.clock.now())
        if ready:
            self._node_ready(node)
        return node

    def _node_ready(self, node: SimNode) -> None:
        if self._nodes.get(node.name) is not node:  # removed while it was still provisioning
            return
        node.ready = True
        self._rebuild_devices(node)
        self.cluster.create(node.obj)

    def _rebuild_devices(self, node: SimNode) -> None:
        """Recompute device IDs and allocatable from the resource accounting; keep running pods' devices held."""
        gpus = [gpu for gpu in node.gpus if gpu.index not in node.reconfiguring]
        mig = {index: devices for index, devices in node.mig.items() if index not in node.reconfiguring}
        slices = {i: s for i, s in node.mps_slices.items() if i not in node.reconfiguring}
        pending = {device_id for ids in node.mps_pending.values() for device_id in ids}  # new slices, not yet up
        try:
            by_resource = devices_by_resource(gpus, mig, node.config, slices)
            counts = allocatable(gpus, mig, node.config, slices, unhealthy=pending)
        except ConfigError as exc:
            raise ConfigError(f"strategy {self.strategy.name}: node {node.name}: {exc}") from None
        if pending:
            by_resource = {name: [d for d in devices if d.id not in pending] for name, devices in by_resource.items()}
        node.rejects_multiple_shared = sharing_spec(config_dict(node.config)).fail_requests_greater_than_one
        held = {device.id for run in node.running for device in run.devices}
        old_resources = set(node.allocatable)
        node.allocatable = counts
        node.free = {name: [d for d in devices if d.id not in held] for name, devices in by_resource.items()}
        partitions: dict[str, Partition] = {}
        for devices in by_resource.values():
            for device in devices:
                key = _partition_key(device)
                if key not in partitions:
                    partitions[key] = node.partitions.get(key) or _partition(node.model, node.gpus, device)
        node.partitions = partitions
        try:
            gfd = _gfd_labels(node)
        except ConfigError as exc:
            raise ConfigError(f"strategy {self.strategy.name}: node {node.name}: {exc}") from None
        own = {k: v for k, v in node.obj["metadata"]["labels"].items() if not k.startswith("nvidia.com/")}
        node.obj["metadata"]["labels"] = {**own, **gfd}
        status = node.obj["status"]
        status["allocatable"] = {"pods": str(PODS_PER_NODE), "cpu": str(node.group.cpu),
                                 "memory": node.group.memory, **{k: str(v) for k, v in counts.items()}}
        status["capacity"] = dict(status["allocatable"])
        info = node_info(node.obj)
        for run in node.running:
            info.add_pod(run.pod, run.requests)
        node.info = info
        node.touch()
        for resource in old_resources | set(counts):
            self._freed(resource)
        if node.ready and _exists(self.cluster, node.name):
            self.cluster.patch("Node", node.name, {"status": status}, subresource="status")
            wanted = node.obj["metadata"]["labels"]
            current = self.cluster.get("Node", node.name)["metadata"].get("labels") or {}
            if current != wanted:
                gone = {key: None for key in current if key not in wanted}
                self.cluster.patch("Node", node.name, {"metadata": {"labels": {**gone, **wanted}}})

    def _freed(self, resource: str) -> None:
        self._capacity_version[resource] = self._capacity_version.get(resource, 0) + 1
        self._dirty = True

    # --------------------------------------------------------------------------------------------- scheduling
    def _enqueue(self, job: Job, attempt: int, ooms: int, now: float) -> None:
        request = self.strategy.request_for(job, self.models)
        name = job.name if attempt == 0 else f"{job.name}-r{attempt}"
        pod = _pod_object(name, job, request)
        requests = {request.resource: float(request.count), "pods": 1.0}
        run = Attempt(job, attempt, ooms, name, request, now, next(self._seq), pod, requests,
                      pod_requirements(pod, requests))
        heapq.heappush(self._queues.setdefault(request, []), (run.sort_key(), run))
        self.metrics.queued(run)
        self.cluster.create(pod)
        self._dirty = True

    def _pending_count(self) -> int:
        return sum(len(queue) for queue in self._queues.values())

    def _schedule(self) -> None:
        """One scheduling pass: bind pending pods in priority/FIFO order until every request shape stops fitting."""
        self._dirty = False
        heads = []
        for request, queue in self._queues.items():
            version = self._capacity_version.get(request.resource, 0)
            if queue and self._failed_at.get(request) != version:
                heads.append((queue[0][0], request))
        heapq.heapify(heads)
        while heads:
            _, request = heapq.heappop(heads)
            queue = self._queues[request]
            run = queue[0][1]
            node = self._choose_node(run)
            if node is None:
                self._failed_at[request] = self._capacity_version.get(request.resource, 0)
                continue
            heapq.heappop(queue)
            self._bind(run, node)
            if queue:
                heapq.heappush(heads, (queue[0][0], request))

    def _choose_node(self, run: Attempt) -> SimNode | None:
        """kube-scheduler's choice, asked of one node per class of identical nodes: fit and score are the same
        for all of them and ties go to the first, so the answer is the one the full list would give."""
        resource, count = run.request.resource, run.request.count
        representatives: dict[tuple[Any, ...], NodeInfo] = {}
        for node in self._nodes.values():
            if node.ready and len(node.free.get(resource, ())) >= count:
                representatives.setdefault(node.state_key(), node.info)
        if not representatives:
            return None
        chosen = select_node(run.need, representatives.values(), self.scoring)
        return None if chosen is None else self._nodes[chosen.name]

    def _bind(self, run: Attempt, node: SimNode) -> None:
        now = self.clock.now()
        run.node = node
        run.devices = _pick_devices(node, run.request)
        node.info.add_pod(run.pod, run.requests)
        node.running.append(run)
        node.touch()
        run.parts = _unique([node.partitions[_partition_key(d)] for d in run.devices])
        run.remaining = run.job.work
        run.updated = now
        run.speed = 0.0
        first = run.devices[0]
        run.thread_fraction = (first.mps_thread_percentage or 100) / 100.0
        run.alloc_weight = sum(_alloc_weight(node.model, d) for d in run.devices)
        run.memory_in_use = sum(min(run.job.memory_gib, part.memory_gib) for part in run.parts)
        for part in run.parts:
            part.residents.append(run)
        self.metrics.started(run, now)
        name, namespace = run.pod["metadata"]["name"], run.pod["metadata"]["namespace"]
        self.cluster.patch("Pod", name, {"spec": {"nodeName": node.name}}, namespace=namespace)
        self.cluster.patch("Pod", name, {"status": {"phase": "Running"}}, namespace=namespace,
                           subresource="status")
        if node.rejects_multiple_shared and run.request.count > 1 and run.devices[0].shared:
            self._stop(run, "rejected")  # the device plugin's Allocate fails: the kubelet fails the pod
            return
        for victim in self._oom_victims(run):
            self._push(now + self.params.oom_delay_s, _OOM, victim)
        self._reprice(run.parts)

    def _oom_victims(self, run: Attempt) -> list[Attempt]:
        """Who runs out of memory now that `run` has started: `run` itself when its isolated partition (MIG slice,
        MPS limit) is too small; on a shared whole GPU, the newest pods until the rest fits."""
        victims: list[Attempt] = []
        for part, device in zip(run.parts, run.devices, strict=False):
            limit = device.mps_memory_mib / 1024 if device.mps_memory_mib else None
            if part.mig or limit is not None:
                if run.job.memory_gib > (limit if limit is not None else part.memory_gib) + 1e-9:
                    victims.append(run)
            else:
                residents = part.residents
                for index in newest_to_kill([r.job.memory_gib for r in residents], part.memory_gib):
                    victims.append(residents[index])
        return _unique(victims)

    # ------------------------------------------------------------------------------------------------ running
    def _reprice(self, parts: Sequence[Partition]) -> None:
        """Recompute the speed of every pod on these partitions and move their completion events."""
        now = self.clock.now()
        speeds: dict[int, float] = {}
        affected: dict[int, Attempt] = {}
        part_speeds = {id(part): self._partition_speeds(part) for part in parts}
        for part in parts:
            for run in part.residents:
                affected[id(run)] = run
        for key, run in affected.items():
            speed = 1.0
            for part in run.parts:
                own = part_speeds.get(id(part))
                if own is None:
                    own = part_speeds[id(part)] = self._partition_speeds(part)
                speed = min(speed, own[id(run)])
            speeds[key] = speed
        for key, run in affected.items():
            speed = speeds[key]
            if speed == run.speed:
                continue
            run.remaining -= run.speed * run.job.gpus * (now - run.updated)
            run.updated = now
            self.metrics.speed_changed(run, run.speed, speed)
            run.speed = speed
            run.version += 1
            rate = speed * run.job.gpus
            if rate > 0:  # a pod at speed 0 (never with the built-in model) waits for its next repricing
                self._push(now + max(0.0, run.remaining) / rate, _FINISH, (run, run.version))

    def _partition_speeds(self, part: Partition) -> dict[int, float]:
        runs = part.residents
        needs = [run.job.compute for run in runs]
        if part.sharing == "mps":
            speeds = mps_speeds(needs, [run.thread_fraction for run in runs], self.params)
        else:
            speeds = time_slicing_speeds(needs, self.params)
        if part.mig:
            speeds = [s * mig_speed(run.job.compute, part.sms, part.full_sms, self.params)
                      for s, run in zip(speeds, runs, strict=True)]
        return {id(run): speed for run, speed in zip(runs, speeds, strict=True)}

    def _stop(self, run: Attempt, outcome: str) -> None:
        """A pod ends (completed, oom, evicted): free its devices, reprice its neighbours, retry if it may."""
        now = self.clock.now()
        node = run.node
        assert node is not None
        run.remaining -= run.speed * run.job.gpus * (now - run.updated)
        self.metrics.stopped(run, now, outcome)
        node.info.remove_pod(run.pod, run.requests)
        node.running.remove(run)
        node.touch()
        for part in run.parts:
            part.residents.remove(run)
        for device in run.devices:
            if device.resource in node.free and node.partitions.get(_partition_key(device)) is not None:
                node.free[device.resource].append(device)
        node.free.get(run.request.resource, []).sort(key=lambda d: d.id)
        run.node = None
        run.version += 1
        self._freed(run.request.resource)
        self.cluster.delete("Pod", run.pod["metadata"]["name"], namespace=run.pod["metadata"]["namespace"])
        self._reprice(run.parts)
        if outcome == "oom" and run.ooms < run.job.max_retries:
            backoff = min(RETRY_BACKOFF_MAX_S, RETRY_BACKOFF_S * 2**run.ooms)
            self._push(now + backoff, _ARRIVAL, (run.job, run.attempt + 1, run.ooms + 1))
        elif outcome == "evicted":
            self._push(now, _ARRIVAL, (run.job, run.attempt + 1, run.ooms))

    def _finish_metrics(self) -> None:
        now = self.clock.now()
        for queue in self._queues.values():
            for _, run in queue:
                self.metrics.still_pending(run, now)

    # ------------------------------------------------------------------------------------ SimControl (controllers)
    def nodes(self) -> list[NodeView]:
        return [node.view() for node in self._nodes.values()]

    def pending_pods(self) -> list[dict[str, Any]]:
        runs = [run for queue in self._queues.values() for _, run in queue]
        runs.sort(key=Attempt.sort_key)
        return [run.pod for run in runs]

    def set_mig_layout(
        self, node: str, layout: Mapping[int, Sequence[PlacedInstance] | None], delay: float | None = None
    ) -> None:
        """Change MIG layouts the way the partition agent does: an instance in both the old and the new layout
        (same profile id and start) stays, with its device ID and its pods; free instances that are dropped go at
        once; new ones appear after `delay` (default `mig_reconfigure_delay`) and evict nothing. Turning MIG on or
        off takes the whole GPU out for the delay. Refused (`InstanceInUseError`) when it would destroy an
        instance or a whole GPU a running pod uses, or touch a GPU still being reconfigured; nothing changes
        then."""
        target = self._node(node)
        checked = [self._mig_change(target, index, instances) for index, instances in sorted(layout.items())]
        changes = [change for change in checked if change.mode_change or change.destroy or change.create]
        if not changes:
            return
        wait = self.mig_reconfigure_delay if delay is None else delay
        backend = target.hardware.backend
        for change in changes:
            for device in change.destroy:
                backend.destroy_mig_device(change.index, device.gi_id)
            if change.mode_change:
                target.reconfiguring.add(change.index)
            elif change.create:
                target.mig_pending[change.index] = list(change.create)
        _reread(target.hardware, node)
        self._rebuild_devices(target)
        if any(change.mode_change or change.create for change in changes):  # else all done: only free ones went
            self._push(self.clock.now() + wait, _NODE, lambda: self._finish_mig_changes(target, changes))

    def _mig_change(self, node: SimNode, index: int, instances: Sequence[PlacedInstance] | None) -> _MigChange:
        """What one GPU's new layout means (checked, not yet applied); raises when it may not be applied."""
        where = f"node {node.name}: GPU {index}"
        if not 0 <= index < len(node.gpus):
            raise NotFoundError(f"node {node.name} has no GPU {index}")
        wanted = None if instances is None else sorted(instances)
        errors = layout_errors(node.model, wanted) if wanted is not None else []
        if errors:
            raise ConfigError(f"{where}: illegal MIG layout: {errors[0]}")
        if index in node.reconfiguring or index in node.mig_pending:
            raise InstanceInUseError(f"{where}: still being reconfigured; change it once its layout is in place")
        held = [device for run in node.running for device in run.devices if device.gpu_index == index]
        current = node.mig.get(index)
        if (current is None) != (wanted is None):
            if held:
                raise InstanceInUseError(f"{where}: MIG mode cannot change while {len(held)} device(s) are in use")
            return _MigChange(index, wanted, destroy=tuple(current or ()), create=(), mode_change=True)
        if current is None or wanted is None:
            return _MigChange(index, wanted, destroy=(), create=(), mode_change=False)
        kept = {PlacedInstance(d.profile_id, d.start) for d in current}
        destroy = tuple(d for d in current if PlacedInstance(d.profile_id, d.start) not in wanted)
        in_use = sorted({d.mig.uuid for d in held if d.mig is not None} & {d.uuid for d in destroy})
        if in_use:
            raise InstanceInUseError(f"{where}: the new layout would destroy MIG device(s) in use by running pods: "
                                     f"{', '.join(in_use)}")
        create = tuple(instance for instance in wanted if instance not in kept)
        return _MigChange(index, wanted, destroy=destroy, create=create, mode_change=False)

    def _finish_mig_changes(self, node: SimNode, changes: Sequence[_MigChange]) -> None:
        """The reconfiguration delay is over: GPUs whose MIG mode changed get their layout, new instances
        appear beside the kept ones."""
        if self._nodes.get(node.name) is not node:  # removed meanwhile
            return
        backend = node.hardware.backend
        for change in changes:
            for instance in change.create:
                backend.create_mig_device(change.index, instance.profile_id, instance.start)
            node.reconfiguring.discard(change.index)
            node.mig_pending.pop(change.index, None)
        whole = {change.index: change.layout for change in changes if change.mode_change}
        node.hardware.apply(whole, f"node {node.name}")  # also reads every device back
        self._rebuild_devices(node)

    def set_sharing(
        self, node: str, device_plugin_config: Any, mps_slices: Mapping[int, Sequence[int]] | None = None,
        delay: float | None = None,
    ) -> None:
        """New device-plugin config and/or MPS slices. A new config drains every GPU, which leaves allocatable
        until it is applied after `delay` seconds (default: at once). A change of MPS slices alone is applied the
        way the partition agent does it: slices running pods hold stay (same device IDs), free ones are rewritten,
        and only the new slices wait for `delay`; nothing is evicted. Refused (`InstanceInUseError`, nothing
        changes) when it would drop a held slice or touch a GPU whose slices are still being changed."""
        target = self._node(node)
        slices = {int(i): list(s) for i, s in (mps_slices or {}).items()}
        if config_dict(device_plugin_config) == config_dict(target.config):
            self._change_mps_slices(target, slices, delay)
            return
        changed = {gpu.index for gpu in target.gpus}
        self._evict(target, lambda run: any(part.gpu_index in changed for part in run.parts))

        def apply() -> None:
            target.config = device_plugin_config
            target.mps_slices = slices
            target.reconfiguring -= changed
            self._rebuild_devices(target)

        if delay:
            target.reconfiguring |= changed
            self._rebuild_devices(target)
            self._push(self.clock.now() + delay, _NODE, apply)
        else:
            apply()

    def _change_mps_slices(self, node: SimNode, slices: dict[int, list[int]], delay: float | None) -> None:
        """Rewrite the free MPS slices of the GPUs whose slices change; held ones keep their device IDs."""
        changed = sorted(i for i in set(slices) | set(node.mps_slices) if slices.get(i) != node.mps_slices.get(i))
        if not changed:
            return
        old_ids = self._device_ids(node, node.mps_slices)
        new_ids = self._device_ids(node, slices)
        for index in changed:
            where = f"node {node.name}: GPU {index}"
            if index in node.mps_pending or index in node.reconfiguring:
                raise InstanceInUseError(f"{where}: still being reconfigured; change it once its slices are in place")
            held = {d.id for run in node.running for d in run.devices if d.gpu_index == index}
            dropped = sorted(held - new_ids)
            if dropped:
                raise InstanceInUseError(f"{where}: the new MPS slices would drop device(s) in use by running pods: "
                                         f"{', '.join(dropped)}")
        added = {device_id for device_id in new_ids - old_ids if _MPS_SLICE in device_id}
        node.mps_slices = slices
        waiting = {i: {d for d in added if self._gpu_of(node, d) == i} for i in changed} if delay else {}
        waiting = {i: ids for i, ids in waiting.items() if ids}
        node.mps_pending.update(waiting)
        self._rebuild_devices(node)
        if waiting:
            self._push(self.clock.now() + (delay or 0.0), _NODE, lambda: self._finish_mps_changes(node, set(waiting)))

    @staticmethod
    def _device_ids(node: SimNode, slices: Mapping[int, Sequence[int]]) -> set[str]:
        """Every device ID the resource accounting gives the node with these MPS slices."""
        try:
            by_resource = devices_by_resource(node.gpus, node.mig, node.config, slices)
        except ConfigError as exc:
            raise ConfigError(f"node {node.name}: {exc}") from None
        return {d.id for devices in by_resource.values() for d in devices}

    @staticmethod
    def _gpu_of(node: SimNode, device_id: str) -> int:
        uuid = strip_replica(device_id)
        return next(gpu.index for gpu in node.gpus if gpu.uuid == uuid or str(gpu.index) == uuid)

    def _finish_mps_changes(self, node: SimNode, gpus: set[int]) -> None:
        """The reconfiguration delay is over: the new slices are advertised beside the kept ones."""
        if self._nodes.get(node.name) is not node:  # removed meanwhile
            return
        for index in gpus:
            node.mps_pending.pop(index, None)
        self._rebuild_devices(node)

    def add_node(self, group: str, delay: float | None = None) -> str:
        spec = next((g for g in self.node_groups if g.name == group), None)
        if spec is None:
            raise NotFoundError(f"node group {group!r} is not in the scenario")
        node = self._join_node(spec, ready=False)
        wait = self.node_provision_delay if delay is None else delay
        self._push(self.clock.now() + wait, _NODE, lambda: self._node_ready(node))
        return node.name

    def remove_node(self, name: str) -> None:
        node = self._node(name)
        self._evict(node, lambda run: True)
        node.ready = False
        node.touch()
        del self._nodes[name]
        self.metrics.node_removed(name, self.clock.now())
        if _exists(self.cluster, name):
            self.cluster.delete("Node", name)

    def _node(self, name: str) -> SimNode:
        node = self._nodes.get(name)
        if node is None:
            raise NotFoundError(f"node {name!r} is not in the simulated cluster")
        return node

    def _evict(self, node: SimNode, which: Callable[[Attempt], bool]) -> None:
        for run in [run for run in node.running if which(run)]:
            self._stop(run, "evicted")


# ----------------------------------------------------------------------------------------------------- helpers
def _reread(devices: hardware.NodeHardware, node: str) -> None:
    """Read the node's GPUs and MIG devices back from its backend after instances were created or destroyed
    (`NodeHardware.apply` with nothing to apply does exactly that)."""
    devices.apply({}, f"node {node}")


def _exists(cluster: Any, name: str) -> bool:
    try:
        cluster.get("Node", name)
    except NotFound:
        return False
    return True


def _node_object(name: str, group: NodeGroup, model: GpuModel) -> dict[str, Any]:
    """The Node as the API server would hold it; its GPU labels are GFD's, set on every device rebuild."""
    labels = {"kubernetes.io/hostname": name, NODE_GROUP_LABEL: group.name}
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels},
            "spec": {}, "status": {"allocatable": {}, "capacity": {}}}


def _gfd_labels(node: SimNode) -> dict[str, str]:
    """What `kubegpu discover` would label this node with now: the same pure function, so a nodeSelector on
    `nvidia.com/gpu.product` or `nvidia.com/mig-2g.20gb.count` means in the simulator what it means in a cluster."""
    backend = node.hardware.backend
    return compute_labels(node.gpus, node.mig, node.config, backend.driver_version(), backend.cuda_driver_version(),
                          machine=None, now=None)


def _pod_object(name: str, job: Job, request: GpuRequest) -> dict[str, Any]:
    limits = {request.resource: str(request.count)}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": job.namespace, "uid": f"sim-{name}",
                     "labels": {CLASS_LABEL: job.klass}},
        "spec": {"priority": job.priority, "containers": [{"name": "main", "resources": {"limits": limits}}]},
        "status": {"phase": "Pending"},
    }


def _partition_key(device: AnnotatedDevice) -> str:
    return device.mig.uuid if device.mig is not None else device.gpu_uuid


def _partition(model: GpuModel, gpus: Sequence[GpuDevice], device: AnnotatedDevice) -> Partition:
    if device.mig is not None:
        return Partition(device.mig.uuid, device.gpu_index, device.mig.memory_mib / 1024,
                         device.mig.multiprocessors, model.multiprocessors, True, device.sharing)
    return Partition(device.gpu_uuid, device.gpu_index, model.memory_mib / 1024, model.multiprocessors,
                     model.multiprocessors, False, device.sharing)


def _alloc_weight(model: GpuModel, device: AnnotatedDevice) -> float:
    """How much of a GPU one device ID hands out: a whole GPU, a MIG slice's compute share, or one replica."""
    if device.mps_memory_mib and device.replica is None:
        return device.mps_memory_mib / model.memory_mib
    share = 1.0 / device.replicas if device.replica is not None else 1.0
    if device.mig is not None and model.mig_compute_slices:
        share *= model.profile(device.mig.profile_id).compute_slices / model.mig_compute_slices
    return share


def _pick_devices(node: SimNode, request: GpuRequest) -> list[AnnotatedDevice]:
    """The devices a pod gets: whole devices in ID order; replicas spread over the least-shared GPUs first (what
    NVIDIA's device plugin prefers for shared GPUs)."""
    free = node.free[request.resource]
    if free[0].replica is None:
        chosen = free[: request.count]
    else:
        load: dict[int, int] = {}
        for run in node.running:
            for device in run.devices:
                load[device.gpu_index] = load.get(device.gpu_index, 0) + 1
        ranked = sorted(free, key=lambda d: (load.get(d.gpu_index, 0), d.gpu_index, d.id))
        chosen, used_gpus = [], set()
        for device in ranked:
            if device.gpu_index not in used_gpus:
                chosen.append(device)
                used_gpus.add(device.gpu_index)
            if len(chosen) == request.count:
                break
        for device in ranked:
            if len(chosen) == request.count:
                break
            if device not in chosen:
                chosen.append(device)
    taken = {d.id for d in chosen}
    node.free[request.resource] = [d for d in free if d.id not in taken]
    return list(chosen)


_MPS_SLICE = f"{REPLICA_SEPARATOR}mps-"  # in the device ID of every MPS memory slice


def _view(node: SimNode) -> NodeView:
    busy = frozenset(part.gpu_index for run in node.running for part in run.parts)
    held_mig = frozenset(d.mig.uuid for run in node.running for d in run.devices if d.mig is not None)
    held_mps = frozenset(d.id for run in node.running for d in run.devices if _MPS_SLICE in d.id)
    return NodeView(
        name=node.name, group=node.group.name, model=node.model, gpus=tuple(node.gpus),
        mig={i: tuple(d) for i, d in node.mig.items()}, allocatable=dict(node.allocatable),
        free={name: len(devices) for name, devices in node.free.items()}, busy_gpus=busy,
        reconfiguring=frozenset(node.reconfiguring | set(node.mig_pending) | set(node.mps_pending)), ready=node.ready,
        held_mig=held_mig, held_mps=held_mps,
    )


def _unique(items: Sequence[Any]) -> list[Any]:
    seen: set[int] = set()
    out = []
    for item in items:
        if id(item) not in seen:
            seen.add(id(item))
            out.append(item)
    return out
