"""`dynamic-mig` and `dynamic-mps` for `kubegpu simulate`: the real partitioner controller on the virtual clock.

The strategy runs `kubegpu.partitioner.controller.PartitionerController` against the simulator's in-memory cluster
every `tick_interval` (the `kubegpu partitioner` default `--interval 5`), with its batch window (60 s timeout, 10 s
idle), in-flight bookkeeping, Events and planner, exactly as on a cluster (one replica: it always leads, so no Lease
is renewed); what it plays itself is the partition agent on every opted-in node (`kubegpu.io/gpu-partitioning`, set
as the node joins): before each pass it reports every node's instances or slices, marked used when a running pod
holds them (the engine's real allocations, `NodeView.held_mig` and `held_mps`), in the agent's status annotations;
after the pass it applies each new desired layout the controller wrote, through `SimControl`, and reports the plan
handled once the change is in place. The controller lists through `kubegpu.kube.informer.InformedCluster`, an
informer-style cache, so a pass copies no objects.

The delay is ours, not the GPU Operator's: the partition agent creates instances at exact placements and the device
plugin re-lists them within its 2 s poll, with no plugin restart, so we take 15 s for MIG (instance creation plus the
agent's report interval), against ~113 s measured for a MIG-manager label change (reference §4), and 5 s for MPS (a
file write and a re-list). Nothing is evicted: the planner keeps used instances and slices where they are and the
engine keeps them across the change. A plan the engine refuses (it would renumber an MPS slice a running pod holds:
a free slice of the same size before it dropped) is reported handled at once, unapplied, as the agent reports a
refused GPU, and planned again later.

Speed: the controller runs with `skip_futile_plans`, so a window that closes on the same input as the last plan that
changed nothing is not planned again; it matters when pods stay unservable for simulated hours.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from typing import Any

from kubegpu.errors import ConfigError
from kubegpu.gpu.backend import GpuDevice, MigDevice
from kubegpu.gpu.catalog import GpuModel
from kubegpu.gpu.geometry import PlacedInstance
from kubegpu.kube.errors import NotFound
from kubegpu.kube.informer import InformedCluster
from kubegpu.kube.leader import LeaderElector
from kubegpu.kube.memory import MemoryCluster
from kubegpu.partitionagent import annotations as ann
from kubegpu.partitioner.controller import LEASE_NAME, PartitionerController
from kubegpu.partitioner.planner import Mode
from kubegpu.sharing.names import mig_resource_name, mps_slice_resource_name, strip_replica
from kubegpu.sim.engine import InstanceInUseError
from kubegpu.sim.scenario import NodeGroup
from kubegpu.sim.strategies import (
    BaseStrategy,
    GpuRequest,
    NodeSetup,
    NodeView,
    SimControl,
    smallest_slice_request,
)
from kubegpu.sim.workload import Job
from kubegpu.sim.world import write_patch

MIG_RECONFIGURE_DELAY_S = 15.0
MPS_RECONFIGURE_DELAY_S = 5.0
MPS_SLICE_STEP_GB = 5  # slice sizes are rounded up to this step, so pods of similar size share slices
TICK_S = 5.0
SIM_IDENTITY = "kubegpu-simulator"


class SoleReplica(LeaderElector):
    """The simulated cluster runs one partitioner replica: it always leads, and renews no Lease every pass."""

    def __init__(self, cluster: Any) -> None:
        super().__init__(cluster, SIM_IDENTITY, LEASE_NAME)

    def try_acquire(self, now: float) -> bool:
        return True


SIM_PLAN_TIME_LIMIT_S = 120.0
"""The exact planner's budget in the simulator. Its limit is wall-clock time, so a tight one would make a simulated
day depend on how busy the machine is; the simulator's plans are small (well under a second), so with this budget
every plan is solved to proven optimality and the same seed gives the same day."""


class _Dynamic(BaseStrategy):
    """What both modes share: the controller, and the agents' report-apply loop around each of its passes."""

    tick_interval: float | None = TICK_S
    mode: Mode = "mig"
    delay = MIG_RECONFIGURE_DELAY_S  # seconds from a plan to its layout being in place

    def __init__(self, name: str, batch_timeout: float = 60.0, batch_idle: float = 10.0,
                 skip_futile_plans: bool = True, time_limit: float = SIM_PLAN_TIME_LIMIT_S,
                 **controller: Any) -> None:
        super().__init__(name)
        self.options: dict[str, Any] = {"batch_timeout": batch_timeout, "batch_idle": batch_idle,
                                        "skip_futile_plans": skip_futile_plans, "time_limit": time_limit,
                                        **controller}
        self.controller: PartitionerController | None = None
        self.applying: dict[str, tuple[float, str]] = {}  # node → (when its new layout is in place, plan id)
        self.handled: dict[str, str] = {}  # node → the last plan id its agent reported
        # node → its last report: the view, the plan handled, the agent's own state, each GPU's annotations
        self._status: dict[str, tuple[NodeView, str | None, int, list[dict[str, str]]]] = {}
        self._gpu_status: dict[tuple[str, ann.ReportedGpu], dict[str, str]] = {}  # one GPU's part of a report
        self._gpu_same: dict[int, tuple[ann.ReportedGpu, dict[str, str]]] = {}  # the same, by the object's id
        self.plans = 0
        self.recuts = 0
        self.skipped = 0  # windows not planned: same input as the last plan, which changed nothing
        self.refused = 0  # plans the engine refused (nothing changed); planned again later

    def on_start(self, sim: SimControl) -> None:
        cluster = sim.cluster
        if isinstance(cluster, MemoryCluster):  # list without copying, as an informer's cache would
            cluster = InformedCluster(cluster, ("Node", "Pod"), copy=False)
        self.controller = PartitionerController(cluster, identity=SIM_IDENTITY, elector=SoleReplica(cluster),
                                                **self.options)

    def on_tick(self, sim: SimControl) -> None:
        """Every agent reports (those whose node changed since their last report), then the controller's pass."""
        assert self.controller is not None
        now = sim.clock.now()
        applying, status, handled = self.applying, self._status, self.handled
        for view in sim.nodes():
            name = view.name
            last = status.get(name)
            if last is not None and last[0] is view and name not in applying:
                # the same view (cached until the node changes): the report would be the same. The agent's own
                # state (`agent_state`) changes only with a change it applies, which puts the node in `applying`
                # until the agent reports it handled.
                continue
            if not view.ready or not self.partitioned(view):
                continue
            started = applying.get(name)
            if started is not None:
                if started[0] > now:
                    continue  # the agent is still applying: its node stays in flight
                del applying[name]
                handled[name] = started[1]
            self.report(sim, view)
        result = self.controller.tick(now)
        self.plans += result.planned
        self.skipped += result.skipped
        if result.written:
            views = {view.name: view for view in sim.nodes()}
            for name in result.written:
                self.apply(sim, views[name], now)

    def report(self, sim: SimControl, view: NodeView) -> None:
        """The agent's report: what the node has, what running pods hold, and the last plan handled.

        Only what changed since the node's last report is written: a GPU whose part of the report is the very same
        (`_gpu_part`) as last time is skipped, so a pod starting on one GPU costs that GPU's few annotations."""
        plan_id = self.handled.get(view.name)
        state = self.agent_state(view)
        last = self._status.get(view.name)
        if last is not None and last[0] is view and last[1] == plan_id and last[2] == state:
            return  # nothing changed since the last report (views are cached until their node changes)
        parts = [self._gpu_part(self.mode, gpu) for gpu in self.reported_gpus(view)]
        if last is not None and len(last[3]) == len(parts):
            patch = _changed_annotations(last[1], last[3], plan_id, parts)
        else:
            before = _status(last[1], last[3]) if last is not None else {}
            patch = ann.replace_family(before, _status(plan_id, parts), "status")
        if patch:
            write_patch(sim.cluster, "Node", view.name, {"metadata": {"annotations": patch}})
        self._status[view.name] = (view, plan_id, state, parts)

    def _gpu_part(self, mode: str, gpu: ann.ReportedGpu) -> dict[str, str]:
        """A GPU's status annotations, remembered: most GPUs report the same instances pass after pass (and
        `reported_gpus` hands the very same `ReportedGpu` back for a GPU that did not change: found by identity)."""
        same = self._gpu_same.get(id(gpu))
        if same is not None and same[0] is gpu:
            return same[1]
        found = self._gpu_status.get((mode, gpu))
        if found is None:
            if len(self._gpu_status) > 100_000:
                self._gpu_status.clear()
            found = self._gpu_status[(mode, gpu)] = ann.gpu_status_annotations(mode, gpu)
        if len(self._gpu_same) > 100_000:
            self._gpu_same.clear()
        self._gpu_same[id(gpu)] = (gpu, found)
        return found

    def apply(self, sim: SimControl, view: NodeView, now: float) -> None:
        """Apply the desired layout the controller wrote on the node; report at once if nothing is to wait for."""
        try:
            annotations = sim.cluster.get("Node", view.name)["metadata"].get("annotations") or {}
        except NotFound:
            return
        plan_id = annotations[ann.SPEC_PLAN]
        try:
            changed = self.change(sim, view, annotations)
        except InstanceInUseError:
            self.refused += 1
            changed = 0
        self.recuts += changed
        if changed:
            self.applying[view.name] = (now + self.delay, plan_id)
        else:
            self.handled[view.name] = plan_id
            self.report(sim, view)

    def partitioned(self, view: NodeView) -> bool:
        return True

    def agent_state(self, view: NodeView) -> int:
        """What the report depends on beyond the node's view: a version of the state the agent itself keeps."""
        return 0

    def reported_gpus(self, view: NodeView) -> list[ann.ReportedGpu]:
        raise NotImplementedError

    def change(self, sim: SimControl, view: NodeView, annotations: dict[str, str]) -> int:
        """Apply the node's desired layout; the number of GPUs changed (InstanceInUseError: refused, none)."""
        raise NotImplementedError


def _status(plan_id: str | None, parts: Sequence[dict[str, str]]) -> dict[str, str]:
    """A whole report's annotations (`ann.status_annotations` from each GPU's part)."""
    out = {ann.STATUS_PLAN: plan_id} if plan_id is not None else {}
    for part in parts:
        out.update(part)
    return out


def _changed_annotations(old_plan: str | None, old_parts: Sequence[dict[str, str]], plan_id: str | None,
                         parts: Sequence[dict[str, str]]) -> dict[str, str | None]:
    """`ann.replace_family(_status(old...), _status(new...), "status")`, key for key and in the same order, looking
    only at the GPUs whose part is not the very same object as before (the parts of one GPU, same index)."""
    patch: dict[str, str | None] = {}
    if old_plan is not None and plan_id is None:
        patch[ann.STATUS_PLAN] = None
    changed = [(old, new) for old, new in zip(old_parts, parts, strict=True) if old is not new]
    for old, new in changed:
        patch.update((key, None) for key in old if key not in new)
    if plan_id is not None and plan_id != old_plan:
        patch[ann.STATUS_PLAN] = plan_id
    for old, new in changed:
        patch.update((key, value) for key, value in new.items() if old.get(key) != value)
    return patch


def _label(mode: Mode) -> dict[str, str]:
    return {ann.PARTITIONING_LABEL: mode}


class DynamicMig(_Dynamic):
    """MIG GPUs start with MIG on and no instances; the planner cuts them to what the pending pods ask for."""

    def __init__(self, name: str, **options: Any) -> None:
        super().__init__(name, **options)
        self.offered: dict[str, float] = {}  # resource → GiB, every non-media profile of the MIG models seen
        self._last_gpus: dict[str, tuple[frozenset[str], dict[int, Any]]] = {}  # node → held, GPU → its last part
        self.whole_gpus = False

    def node_setup(self, group: NodeGroup, model: GpuModel, gpus: Sequence[GpuDevice]) -> NodeSetup:
        config = {"version": "v1", "flags": {"migStrategy": "mixed"}}
        if not model.mig_capable:
            self.whole_gpus = True
            return NodeSetup(device_plugin_config=config)
        for profile in model.mig_profiles:
            if not profile.media_extensions:
                name = mig_resource_name(profile.name)
                memory = profile.memory_mib / 1024
                self.offered[name] = min(memory, self.offered.get(name, memory))
        return NodeSetup(device_plugin_config=config, mig_layout={gpu.index: [] for gpu in gpus},
                         labels=_label("mig"))

    def request_for(self, job: Job, models: Sequence[GpuModel]) -> GpuRequest:
        return smallest_slice_request(job, self.offered, self.whole_gpus)

    def partitioned(self, view: NodeView) -> bool:
        return view.model.mig_capable

    def reported_gpus(self, view: NodeView) -> list[ann.ReportedGpu]:
        """Every instance, marked used when a running pod holds it (by MIG UUID). Busy GPUs are not frozen: the
        planner keeps used instances where they are and may re-cut the free space around them.

        A node is reported again whenever a pod on it starts or ends, but that touches one or two of its GPUs: a
        GPU whose instances and held instances are those of the node's last report gets its last `ReportedGpu`
        back (the same object), and only the others are built again."""
        held = view.held_mig
        last = self._last_gpus.get(view.name)
        changed = held ^ last[0] if last is not None else held
        parts: dict[int, tuple[Sequence[MigDevice], frozenset[str], ann.ReportedGpu]] = {}
        gpus = []
        for gpu in view.gpus:
            migs = view.mig.get(gpu.index, ())
            part = last[1].get(gpu.index) if last is not None else None
            if part is None or part[0] != migs or not changed.isdisjoint(part[1]):
                part = (migs, frozenset(mig.uuid for mig in migs), ann.ReportedGpu(gpu.index, view.model.key, tuple(
                    (PlacedInstance(mig.profile_id, mig.start), mig.uuid in held) for mig in migs)))
            parts[gpu.index] = part
            gpus.append(part[2])
        self._last_gpus[view.name] = (held, parts)
        return gpus

    def change(self, sim: SimControl, view: NodeView, annotations: dict[str, str]) -> int:
        desired = ann.parse_spec(annotations, "mig", {gpu.index: view.model for gpu in view.gpus})
        layout = {}
        for gpu in desired:
            current = sorted(PlacedInstance(m.profile_id, m.start) for m in view.mig.get(gpu.index, ()))
            if sorted(gpu.instances) != current:
                layout[gpu.index] = list(gpu.instances)
        if layout:
            sim.set_mig_layout(view.name, layout, delay=MIG_RECONFIGURE_DELAY_S)
        return len(layout)


class DynamicMps(_Dynamic):
    """GPUs shared through MPS memory slices (`nvidia.com/gpu-<N>gb`), re-sliced to what the pending pods ask for."""

    mode: Mode = "mps"
    delay = MPS_RECONFIGURE_DELAY_S

    def __init__(self, name: str, **options: Any) -> None:
        super().__init__(name, **options)
        self.slices: dict[str, dict[int, list[int]]] = {}  # node → GPU index → slice sizes (the agent's slice file)
        # node → the held slices and slice version of its last report, and each GPU's `ReportedGpu` in it
        self._last_gpus: dict[str, tuple[frozenset[str], int, dict[int, ann.ReportedGpu]]] = {}
        self._slices_of: dict[str, tuple[str, str]] = {}  # MPS device ID → (GPU UUID or index, slice name)
        self.versions: dict[str, int] = {}  # node → how often its slices changed
        self.largest_gb = 0

    def node_setup(self, group: NodeGroup, model: GpuModel, gpus: Sequence[GpuDevice]) -> NodeSetup:
        self.largest_gb = max(self.largest_gb, model.memory_mib // 1024)
        return NodeSetup(device_plugin_config={"version": "v1"}, mps_slices={}, labels=_label("mps"))

    def request_for(self, job: Job, models: Sequence[GpuModel]) -> GpuRequest:
        size = MPS_SLICE_STEP_GB * math.ceil(max(job.memory_gib, 1) / MPS_SLICE_STEP_GB)
        if self.largest_gb and size > self.largest_gb:
            size = self.largest_gb
        return GpuRequest(mps_slice_resource_name(size), job.gpus)

    def agent_state(self, view: NodeView) -> int:
        return self.versions.get(view.name, 0)

    def reported_gpus(self, view: NodeView) -> list[ann.ReportedGpu]:
        """Every slice, marked used when a running pod holds its device (`NodeView.held_mps`).

        As for MIG, only the GPUs a pod started or ended on since the node's last report (or all of them, once its
        slices changed) are built again; the others get their last `ReportedGpu` back (the same object)."""
        current = self.slices.setdefault(view.name, {})
        held, version = view.held_mps, self.versions.get(view.name, 0)
        last = self._last_gpus.get(view.name)
        parts = last[2] if last is not None and last[1] == version else {}
        slice_of = self._slice_of
        changed = {slice_of(device_id)[0] for device_id in (held ^ last[0] if last is not None else held)}
        held_by_gpu: dict[str, set[str]] | None = None
        gpus = []
        for gpu in view.gpus:
            part = parts.get(gpu.index)
            if part is None or gpu.uuid in changed or str(gpu.index) in changed:
                if held_by_gpu is None:  # GPU UUID (or index) → slice names held on it, for the GPUs rebuilt
                    held_by_gpu = {}
                    rebuilt = changed if parts else None
                    for device_id in held:
                        where, name = slice_of(device_id)
                        if rebuilt is None or where in rebuilt:
                            held_by_gpu.setdefault(where, set()).add(name)
                on_gpu = held_by_gpu.get(gpu.uuid, set()) | held_by_gpu.get(str(gpu.index), set())
                counters: Counter[int] = Counter()
                slices = []
                for gb in current.get(gpu.index, []):
                    slices.append((gb, f"mps-{gb}gb-{counters[gb]}" in on_gpu))
                    counters[gb] += 1
                part = ann.ReportedGpu(gpu.index, view.model.key, slices=tuple(slices))
            gpus.append(part)
        self._last_gpus[view.name] = (held, version, {gpu.index: gpu for gpu in gpus})
        return gpus

    def _slice_of(self, device_id: str) -> tuple[str, str]:
        """An MPS slice's device ID → (its GPU's UUID or index, the slice's name), remembered."""
        found = self._slices_of.get(device_id)
        if found is None:
            found = self._slices_of[device_id] = (strip_replica(device_id), device_id.rsplit("::", 1)[-1])
        return found

    def change(self, sim: SimControl, view: NodeView, annotations: dict[str, str]) -> int:
        """Hand the new slices to the engine; a plan that would renumber a held slice's device is refused there."""
        current = self.slices.setdefault(view.name, {})
        wanted = {**current, **{gpu.index: list(gpu.slices) for gpu in ann.parse_spec(annotations, "mps", {})}}
        changed = sum(1 for index, sizes in wanted.items() if sorted(sizes) != sorted(current.get(index, [])))
        if changed:
            sim.set_sharing(view.name, {"version": "v1"}, mps_slices=wanted, delay=MPS_RECONFIGURE_DELAY_S)
            self.slices[view.name] = wanted
            self.versions[view.name] = self.versions.get(view.name, 0) + 1
        return changed


def _no_argument(name: str, argument: str | None) -> None:
    if argument:
        raise ConfigError(f"strategy {name}:{argument}: {name} takes no argument")


def dynamic_mig(argument: str | None) -> DynamicMig:
    """The `dynamic-mig` strategy (a `kubegpu.sim.strategies` entry point in pyproject.toml)."""
    _no_argument("dynamic-mig", argument)
    return DynamicMig("dynamic-mig")


def dynamic_mps(argument: str | None) -> DynamicMps:
    """The `dynamic-mps` strategy (a `kubegpu.sim.strategies` entry point in pyproject.toml)."""
    _no_argument("dynamic-mps", argument)
    return DynamicMps("dynamic-mps")
