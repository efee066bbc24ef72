"""`dynamic-mig` and `dynamic-mps` for `kubegpu simulate`: this planner and the controller's batch window on the
simulator's virtual clock.

Every `tick_interval` the strategy feeds the pending pods into the same `Batcher` the controller uses; when the
window closes it plans on a snapshot of the simulated nodes and applies the new layouts after a reconfiguration
delay. The delay is ours, not the GPU Operator's: the partition agent creates instances at exact placements and the
device plugin re-lists them within its 2 s poll, with no plugin restart, so we take 15 s for MIG (instance creation
plus the agent's report interval), against ~113 s measured for a MIG-manager label change (reference §4), and 5 s for
MPS (a file write and a re-list).

MIG changes are applied as the agent applies them: the strategy marks the instances running pods hold as used
(from the engine's real allocations, `NodeView.held_mig`), the planner keeps them where they are, and the engine
keeps them across the change while it creates and destroys only free instances — so busy GPUs are re-cut around
their pods, never evicting one. MPS changes likewise: slices running pods hold are marked used (`NodeView.held_mps`),
the planner keeps them, and the engine keeps their device IDs while it rewrites the free slices — so busy GPUs are
re-sliced too. A plan that keeps a held slice's size but not its device ID (a free slice of the same size before it
dropped) is refused by the engine and planned again later.

Speed: a window that closes with the same input as the last plan that changed nothing (same pending pods, same
instances or slices, same used flags) is not planned again — the planner is deterministic, so the answer would be
the same. It matters when pods stay unservable for hours (the planner would otherwise run every window).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from typing import Any

from kubegpu.deviceplugin.resources import strip_replica
from kubegpu.errors import ConfigError
from kubegpu.gpu.backend import GpuDevice
from kubegpu.gpu.catalog import GpuModel
from kubegpu.partitioner.controller import Batcher
from kubegpu.partitioner.planner import (
    CurrentInstance,
    GpuInput,
    MpsSlice,
    NodeInput,
    is_partition_resource,
    plan,
    pod_key,
)
from kubegpu.scheduling import pod_requests
from kubegpu.sim.engine import InstanceInUseError
from kubegpu.sim.scenario import NodeGroup
from kubegpu.sim.strategies import (
    BaseStrategy,
    GpuRequest,
    NodeSetup,
    NodeView,
    SimControl,
    register_strategy,
    smallest_slice_request,
)
from kubegpu.sim.workload import Job

MIG_RECONFIGURE_DELAY_S = 15.0
MPS_RECONFIGURE_DELAY_S = 5.0
MPS_SLICE_STEP_GB = 5  # slice sizes are rounded up to this step, so pods of similar size share slices
TICK_S = 5.0


class _Dynamic(BaseStrategy):
    """What both modes share: the batch window, the in-flight bookkeeping and the plan-apply loop."""

    tick_interval: float | None = TICK_S
    delay = MIG_RECONFIGURE_DELAY_S  # seconds from a plan to its layout being in place

    def __init__(self, name: str, batch_timeout: float = 60.0, batch_idle: float = 10.0,
                 skip_futile_plans: bool = True) -> None:
        super().__init__(name)
        self.batcher = Batcher(batch_timeout, batch_idle)
        self.skip_futile_plans = skip_futile_plans  # off only to check that skipping changes no result
        self.in_flight: dict[str, float] = {}  # node → when its new layout is in place
        self.serving: dict[str, str] = {}  # pod key → node whose in-flight layout serves it
        self.plans = 0
        self.recuts = 0
        self.skipped = 0  # plans not run: same input as the last plan, which changed nothing
        self._futile: tuple[tuple[str, ...], tuple[NodeInput, ...]] | None = None

    def on_tick(self, sim: SimControl) -> None:
        now = sim.clock.now()
        self.in_flight = {n: t for n, t in self.in_flight.items() if t > now}
        self.serving = {k: n for k, n in self.serving.items() if n in self.in_flight}
        pending = [p for p in sim.pending_pods() if _wants_slices(p) and pod_key(p) not in self.serving]
        keys = {pod_key(p) for p in pending}
        self.batcher.discard(self.batcher.items - keys)
        for key in sorted(keys):
            self.batcher.add(key, now)
        if not self.batcher.ready(now):
            return
        self.batcher.reset()
        views = [v for v in sim.nodes() if v.ready and v.name not in self.in_flight and not v.reconfiguring]
        inputs = [i for i in (self.node_input(v) for v in views) if i is not None]
        signature = (tuple(pod_key(p) for p in pending), tuple(inputs))
        if self.skip_futile_plans and signature == self._futile:
            self.skipped += 1  # the planner is deterministic: it would change nothing again
            return
        result = plan(inputs, pending)
        self.plans += 1
        self._futile = None if any(n.changed for n in result.nodes.values()) else signature
        for node in inputs:
            node_plan = result.nodes[node.name]
            if not node_plan.changed:
                continue
            if not self.apply(sim, node, node_plan.gpus):
                continue
            self.recuts += sum(1 for g in node_plan.gpus if g.changed)
            self.in_flight[node.name] = now + self.delay
            for key, where in result.assignments.items():
                if where == node.name:
                    self.serving[key] = where

    def node_input(self, view: NodeView) -> NodeInput | None:
        raise NotImplementedError

    def apply(self, sim: SimControl, node: NodeInput, gpus: Sequence[Any]) -> bool:
        """Apply a node's plan; False when the engine refused it (nothing changed)."""
        raise NotImplementedError


def _wants_slices(pod: dict[str, Any]) -> bool:
    return any(is_partition_resource(r) for r in pod_requests(pod))


def _node_obj(view: NodeView) -> dict[str, Any]:
    return {"metadata": {"name": view.name, "labels": {"kubegpu.io/node-group": view.group}}, "spec": {}}


class DynamicMig(_Dynamic):
    """MIG GPUs start with MIG on and no instances; the planner cuts them to what the pending pods ask for."""

    def __init__(self, name: str, skip_futile_plans: bool = True) -> None:
        super().__init__(name, skip_futile_plans=skip_futile_plans)
        self.offered: dict[str, float] = {}  # resource → GiB, every non-media profile of the MIG models seen
        self.whole_gpus = False

    def node_setup(self, group: NodeGroup, model: GpuModel, gpus: Sequence[GpuDevice]) -> NodeSetup:
        config = {"version": "v1", "flags": {"migStrategy": "mixed"}}
        if not model.mig_capable:
            self.whole_gpus = True
            return NodeSetup(device_plugin_config=config)
        for profile in model.mig_profiles:
            if not profile.media_extensions:
                name = f"nvidia.com/{profile.resource_name}"
                memory = profile.memory_mib / 1024
                self.offered[name] = min(memory, self.offered.get(name, memory))
        return NodeSetup(device_plugin_config=config, mig_layout={gpu.index: [] for gpu in gpus})

    def request_for(self, job: Job, models: Sequence[GpuModel]) -> GpuRequest:
        return smallest_slice_request(job, self.offered, self.whole_gpus)

    def node_input(self, view: NodeView) -> NodeInput | None:
        """Every instance as the agent reports it, marked used when a running pod holds it (the engine's real
        allocations, by MIG UUID). Busy GPUs are not frozen: the planner keeps used instances where they are and
        may re-cut the free space around them, which the engine applies without touching the running pods."""
        if not view.model.mig_capable:
            return None
        gpus = []
        for gpu in view.gpus:
            instances = tuple(CurrentInstance(mig.profile_id, mig.start, mig.uuid in view.held_mig)
                              for mig in view.mig.get(gpu.index, ()))
            gpus.append(GpuInput(gpu.index, view.model.key, view.model, instances))
        return NodeInput(view.name, "mig", _node_obj(view), tuple(gpus))

    def apply(self, sim: SimControl, node: NodeInput, gpus: Sequence[Any]) -> bool:
        sim.set_mig_layout(node.name, {g.index: list(g.instances) for g in gpus if g.changed},
                           delay=MIG_RECONFIGURE_DELAY_S)
        return True


class DynamicMps(_Dynamic):
    """GPUs shared through MPS memory slices (`nvidia.com/gpu-<N>gb`), re-sliced to what the pending pods ask for."""

    delay = MPS_RECONFIGURE_DELAY_S

    def __init__(self, name: str, skip_futile_plans: bool = True) -> None:
        super().__init__(name, skip_futile_plans=skip_futile_plans)
        self.slices: dict[str, dict[int, list[int]]] = {}  # node → GPU index → slice sizes (the strategy sets them)
        self.largest_gb = 0
        self.refused = 0  # plans the engine refused: they would have renumbered a slice a running pod holds

    def node_setup(self, group: NodeGroup, model: GpuModel, gpus: Sequence[GpuDevice]) -> NodeSetup:
        self.largest_gb = max(self.largest_gb, model.memory_mib // 1024)
        return NodeSetup(device_plugin_config={"version": "v1"}, mps_slices={})

    def request_for(self, job: Job, models: Sequence[GpuModel]) -> GpuRequest:
        size = MPS_SLICE_STEP_GB * math.ceil(max(job.memory_gib, 1) / MPS_SLICE_STEP_GB)
        if self.largest_gb and size > self.largest_gb:
            size = self.largest_gb
        return GpuRequest(f"nvidia.com/gpu-{size}gb", job.gpus)

    def node_input(self, view: NodeView) -> NodeInput | None:
        """Every slice as the agent reports it, marked used when a running pod holds its device (the engine's real
        allocations, `NodeView.held_mps`). Busy GPUs are not frozen: the planner keeps used slices and may rewrite
        the free ones, which the engine applies without touching the running pods."""
        current = self.slices.setdefault(view.name, {})
        gpus = []
        for gpu in view.gpus:
            held = {device_id.rsplit("::", 1)[-1] for device_id in view.held_mps
                    if strip_replica(device_id) in (gpu.uuid, str(gpu.index))}
            counters: Counter[int] = Counter()
            slices = []
            for gb in current.get(gpu.index, []):
                slices.append(MpsSlice(gb, f"mps-{gb}gb-{counters[gb]}" in held))
                counters[gb] += 1
            gpus.append(GpuInput(gpu.index, view.model.key, view.model, slices=tuple(slices)))
        return NodeInput(view.name, "mps", _node_obj(view), tuple(gpus))

    def apply(self, sim: SimControl, node: NodeInput, gpus: Sequence[Any]) -> bool:
        """Hand the new slices to the engine; a plan that would renumber a held slice's device is refused there
        (`InstanceInUseError`) and dropped here, to be planned again once the pod is gone."""
        current = self.slices.setdefault(node.name, {})
        wanted = {**current, **{gpu.index: list(gpu.slices) for gpu in gpus}}
        try:
            sim.set_sharing(node.name, {"version": "v1"}, mps_slices=wanted, delay=MPS_RECONFIGURE_DELAY_S)
        except InstanceInUseError:
            self.refused += 1
            return False
        self.slices[node.name] = wanted
        return True


def _no_argument(name: str, argument: str | None) -> None:
    if argument:
        raise ConfigError(f"strategy {name}:{argument}: {name} takes no argument")


def _dynamic_mig(argument: str | None) -> DynamicMig:
    _no_argument("dynamic-mig", argument)
    return DynamicMig("dynamic-mig")


def _dynamic_mps(argument: str | None) -> DynamicMps:
    _no_argument("dynamic-mps", argument)
    return DynamicMps("dynamic-mps")


register_strategy("dynamic-mig", _dynamic_mig)
register_strategy("dynamic-mps", _dynamic_mps)
