"""The simulator's state: nodes, the partitions the performance model prices, pods' attempts, and the hooks the
engine's parts share (`SimCore`). Data only; what changes it lives in effects.py (the cluster: nodes, MIG and MPS
changes), accounting.py (pods: queueing, binding, speed and work) and engine.py (the event loop and the clock).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from kubegpu.clock import VirtualClock
from kubegpu.errors import KubegpuError
from kubegpu.gpu.backend import GpuDevice, MigDevice
from kubegpu.gpu.catalog import GpuModel
from kubegpu.gpu.geometry import PlacedInstance
from kubegpu.kube.memory import MemoryCluster
from kubegpu.scheduling import NodeInfo, PodRequirements
from kubegpu.sharing.devices import (
    REPLICA_SEPARATOR,
    AnnotatedDevice,
)
from kubegpu.sim import hardware
from kubegpu.sim.metrics import Collector
from kubegpu.sim.perf import MemoryUse, PerfParams
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

# event kinds, in the order they are handled within one instant; _OOM and _GUARD carry (partition, stamp): a
# device found full, and a guard check of it
_FINISH, _OOM, _NODE, _ARRIVAL, _TICK, _SAMPLE, _GUARD = range(7)


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
    stamp: int = 0  # bumped whenever its residents change: a memory event scheduled before is stale then


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
    share_gib: float | None = None  # its memory share of a shared GPU (kubegpu.sharing.shares); None when unshared
    alloc_at: float = 0.0  # when it makes its first GPU allocation; its use creeps from there (job growth)

    def sort_key(self) -> tuple[int, float, int]:
        return (-self.job.priority, self.queued_at, self.seq)

    def memory_use(self) -> MemoryUse:
        """Its GPU memory on each of its devices over time (`kubegpu.sim.perf.MemoryUse`)."""
        return MemoryUse(self.job.memory_gib, self.job.memory_growth_gib_per_hour / 3600.0, self.alloc_at)


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
    state_id: int = -1  # the engine's number for `state_key()` (accounting's `_state_id`); -1 until asked again
    # what running pods hold, kept as they start and end (`hold`, `release`) so a view need not walk them all
    _busy: dict[int, int] = field(default_factory=dict)  # GPU index → partitions of it held (a pod counts once each)
    _held_mig: dict[str, int] = field(default_factory=dict)  # MIG UUID → devices of it held
    _held_mps: dict[str, int] = field(default_factory=dict)  # MPS slice device ID → pods holding it

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
        self.state_id = -1

    def hold(self, run: Attempt) -> None:
        """Count what a pod that starts here holds (its partitions and devices are set)."""
        _count(self._busy, [part.gpu_index for part in run.parts], 1)
        _count(self._held_mig, [d.mig.uuid for d in run.devices if d.mig is not None], 1)
        _count(self._held_mps, [d.id for d in run.devices if _MPS_SLICE in d.id], 1)

    def release(self, run: Attempt) -> None:
        """Uncount what a pod that ends here held."""
        _count(self._busy, [part.gpu_index for part in run.parts], -1)
        _count(self._held_mig, [d.mig.uuid for d in run.devices if d.mig is not None], -1)
        _count(self._held_mps, [d.id for d in run.devices if _MPS_SLICE in d.id], -1)

    def view(self) -> NodeView:
        """What controllers see; cached until the node changes (controllers ask every tick, nodes change less)."""
        if self._view is None:
            self._view = _view(self)
        return self._view


class SimCore:
    """What the parts of a `Simulation` share: its state, and the hooks one part calls in another (the event queue
    in engine.py, freeing capacity and stopping a pod in accounting.py)."""

    scenario: Scenario
    strategy: Strategy
    clock: VirtualClock
    cluster: Any
    node_groups: Sequence[NodeGroup]
    models: list[GpuModel]
    params: PerfParams
    scoring: str
    mig_reconfigure_delay: float
    node_provision_delay: float
    metrics: Collector
    _seq: itertools.count[int]
    _nodes: dict[str, SimNode]
    _node_counter: dict[str, int]
    _queues: dict[GpuRequest, list[tuple[tuple[int, float, int], Attempt]]]
    _capacity_version: dict[str, int]
    _fleet_version: int  # bumped when a node becomes ready or leaves (what the cluster's capacity counts)
    _capacity_memo: tuple[int, float]  # (fleet version, the cluster's GPU memory then)
    _failed_at: dict[GpuRequest, int]
    _dirty: bool
    _teams: Any  # kubegpu.sim.teams.TeamAccount when the scenario has teams, else None

    def _push(self, t: float, kind: int, payload: Any) -> None:
        raise NotImplementedError

    def _freed(self, resource: str) -> None:
        raise NotImplementedError

    def _stop(self, run: Attempt, outcome: str) -> None:
        raise NotImplementedError


def write_patch(cluster: Any, kind: str, name: str, patch: dict[str, Any], namespace: str | None = None,
                subresource: str | None = None) -> None:
    """A merge patch whose result the simulator does not read: the in-memory store skips copying the object back
    (`MemoryCluster.update`); any other cluster patches as usual."""
    if isinstance(cluster, MemoryCluster):
        cluster.update(kind, name, patch, namespace=namespace, subresource=subresource)
    else:
        cluster.patch(kind, name, patch, namespace=namespace, subresource=subresource)


def write_create(cluster: Any, obj: dict[str, Any]) -> None:
    """A create whose result the simulator does not read (`MemoryCluster.add`: no copy handed back)."""
    if isinstance(cluster, MemoryCluster):
        cluster.add(obj)
    else:
        cluster.create(obj)


def _partition_key(device: AnnotatedDevice) -> str:
    return device.mig.uuid if device.mig is not None else device.gpu_uuid


def _partition(model: GpuModel, gpus: Sequence[GpuDevice], device: AnnotatedDevice) -> Partition:
    if device.mig is not None:
        return Partition(device.mig.uuid, device.gpu_index, device.mig.memory_mib / 1024,
                         device.mig.multiprocessors, model.multiprocessors, True, device.sharing)
    return Partition(device.gpu_uuid, device.gpu_index, model.memory_mib / 1024, model.multiprocessors,
                     model.multiprocessors, False, device.sharing)


_MPS_SLICE = f"{REPLICA_SEPARATOR}mps-"  # in the device ID of every MPS memory slice


def _count(counts: dict[Any, int], keys: Sequence[Any], step: int) -> None:
    for key in keys:
        left = counts.get(key, 0) + step
        if left:
            counts[key] = left
        else:
            del counts[key]


def _view(node: SimNode) -> NodeView:
    return NodeView(
        name=node.name, group=node.group.name, model=node.model, gpus=tuple(node.gpus),
        mig={i: tuple(d) for i, d in node.mig.items()}, allocatable=dict(node.allocatable),
        free={name: len(devices) for name, devices in node.free.items()}, busy_gpus=frozenset(node._busy),
        reconfiguring=frozenset(node.reconfiguring | set(node.mig_pending) | set(node.mps_pending)), ready=node.ready,
        held_mig=frozenset(node._held_mig), held_mps=frozenset(node._held_mps),
    )


def _unique(items: Sequence[Any]) -> list[Any]:
    seen: set[int] = set()
    out = []
    for item in items:
        if id(item) not in seen:
            seen.add(id(item))
            out.append(item)
    return out
