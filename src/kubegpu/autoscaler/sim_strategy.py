"""The `autoscaler` simulator strategy: the scenario's node groups become instance types of one NodePool, and the
real autoscaler (provisioning, NodeClaim lifecycle, consolidation) runs on the simulator's virtual clock.

    kubegpu simulate --strategies autoscaler,autoscaler:time-slicing-4,autoscaler:mig-all-balanced

The argument picks how nodes share GPUs, and the NodePool carries the same sharing config in its template, so the
provisioner counts exactly what the simulated device plugin will advertise: `exclusive` (default),
`time-slicing-<N>` or `mig-<mig-parted config>`. `dra-dynamic-mig` runs the simulator's DRA strategy (kube-scheduler
allocating MIG placements from our driver's dynamic-MIG slices, the driver cutting them) on the nodes the autoscaler
buys; pods ask for `nvidia.com/mig-<profile>`, which DeviceClasses serve as extended resources
(`mig_device_classes`), so the provisioner plans them as claims on the slices each node group's GPUs would publish.
Nodes are bought with `sim.add_node(group)` and returned with `sim.remove_node`, so the simulator's cost integral and
node counts are the autoscaler's bill; `timeline` records (time, nodes, $/h) at every tick for reports. With the
scenario's `spotInterruptions` the simulator takes bought nodes back; the strategy then deletes their NodeClaims
(Karpenter's interruption controller) and the provisioner buys replacements for the evicted pods.
"""

from __future__ import annotations

import builtins
import contextlib
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from kubegpu.autoscaler import labels as L
from kubegpu.autoscaler.api import NodePool, parse_nodepool
from kubegpu.autoscaler.controller import Autoscaler, Options
from kubegpu.autoscaler.gpu_capacity import sharing_capacity
from kubegpu.autoscaler.instancetypes import InstanceType, Offering
from kubegpu.autoscaler.objects import is_true, with_condition
from kubegpu.autoscaler.provider import InstanceListing, NodeClaimNotFoundError, launch_choice, quantities
from kubegpu.errors import ConfigError, KubegpuError
from kubegpu.scheduling import parse_quantity
from kubegpu.sharing.capacity import sharing_of
from kubegpu.sharing.names import GPU_RESOURCE, MIG_RESOURCE_PREFIX
from kubegpu.sim.dra_strategy import DRIVER, DraDynamicMig
from kubegpu.sim.strategies import (
    BaseStrategy,
    Exclusive,
    GpuRequest,
    NodeSetup,
    StaticMig,
    TimeSlicing,
)

if TYPE_CHECKING:
    from kubegpu.gpu.backend import GpuDevice
    from kubegpu.gpu.catalog import GpuModel
    from kubegpu.sim.scenario import NodeGroup
    from kubegpu.sim.strategies import NodeView, SimControl
    from kubegpu.sim.workload import Job

SIM_ZONE = "sim-zone"
PODS_PER_NODE = 110.0


def group_instance_type(group: NodeGroup) -> InstanceType:
    """A scenario node group as an instance type: its shape, its GPUs and its price (on-demand, one zone)."""
    capacity = {"cpu": float(group.cpu), "memory": parse_quantity(group.memory), "pods": PODS_PER_NODE,
                GPU_RESOURCE: float(group.gpus_per_node)}
    return InstanceType(group.name, "amd64", ("linux",), capacity,
                        (Offering(SIM_ZONE, "on-demand", group.price_per_hour),), gpu_model=group.gpu_model,
                        overhead={})


class EngineProvider(InstanceListing):
    """A cloud provider whose instances are simulator nodes."""

    name = "kubegpu-simulator"

    def __init__(self, sim: SimControl, types: Sequence[InstanceType]) -> None:
        self.sim = sim
        self.types = list(types)
        self.instances: dict[str, str] = {}   # providerID → node name
        self._ready: set[str] = set()

    def instance_types(self, nodepool: NodePool) -> builtins.list[InstanceType]:
        return list(self.types)

    def create(self, nodeclaim: dict[str, Any]) -> dict[str, Any]:
        meta = nodeclaim["metadata"]
        sharing = sharing_of(meta.get("labels") or {}, meta.get("annotations") or {}, f"NodeClaim {meta['name']}")
        it, offering = launch_choice(self.types, nodeclaim, lambda t: sharing_capacity(sharing, t))
        node_name = self.sim.add_node(it.name)
        provider_id = f"sim://{node_name}"
        self.instances[provider_id] = node_name
        full = sharing_capacity(sharing, it)
        labels = {**(meta.get("labels") or {}), **it.labels, **offering.labels()}
        return {**nodeclaim, "metadata": {**meta, "labels": labels},
                "status": {**(nodeclaim.get("status") or {}), "providerID": provider_id, "nodeName": node_name,
                           "capacity": quantities(full), "allocatable": quantities(full)}}

    def tick(self) -> None:
        """The kubelet's part: mark our simulator nodes Ready once the simulator has brought them up."""
        ours = set(self.instances.values())
        for view in self.sim.nodes():
            if view.name in ours and view.ready and view.name not in self._ready:
                try:
                    node = self.sim.cluster.get("Node", view.name)
                except KubegpuError:
                    continue
                conditions = with_condition((node.get("status") or {}).get("conditions") or [], "Ready", "True",
                                            "KubeletReady", self.sim.clock.now())
                self.sim.cluster.patch("Node", view.name, {"status": {"conditions": conditions}},
                                       subresource="status")
                self._ready.add(view.name)

    def delete(self, nodeclaim: dict[str, Any]) -> None:
        provider_id = (nodeclaim.get("status") or {}).get("providerID", "")
        name = self.instances.pop(provider_id, None)
        if name is None:
            raise NodeClaimNotFoundError(f"nodeclaim {nodeclaim['metadata']['name']}: instance already gone")
        with contextlib.suppress(KubegpuError):
            self.sim.cluster.patch("Node", name, {"metadata": {"finalizers": None}})
        self._ready.discard(name)
        try:
            self.sim.remove_node(name)
        except KubegpuError as exc:
            raise NodeClaimNotFoundError(str(exc)) from None

    def reclaimed(self, views: Sequence[NodeView] | None = None) -> builtins.list[str]:
        """Provider IDs whose simulator node is gone without our asking (a spot interruption), forgotten here: the
        instance no longer exists, as the cloud would answer. `views`: `sim.nodes()` when the caller has it."""
        alive = {view.name for view in (self.sim.nodes() if views is None else views)}
        gone = [pid for pid, name in self.instances.items() if name not in alive]
        for pid in gone:
            name = self.instances.pop(pid)
            self._ready.discard(name)
            with contextlib.suppress(KubegpuError):  # the Node object goes with its instance, finalizer or not
                self.sim.cluster.patch("Node", name, {"metadata": {"finalizers": None}})
        return gone

    def get(self, provider_id: str) -> dict[str, Any]:
        name = self.instances.get(provider_id)
        if name is None:
            raise NodeClaimNotFoundError(f"instance {provider_id} not found")
        result: dict[str, Any] = self.sim.cluster.get("Node", name)
        return result


def mig_device_classes(offered: Iterable[str]) -> list[dict[str, Any]]:
    """For `dra-dynamic-mig`, where pods ask for `nvidia.com/mig-<profile>`: a DeviceClass per MIG resource that
    serves it as an extended resource (DRAExtendedResource) from our driver's MIG devices of that profile, so the
    provisioner plans those pods by allocating MIG placements on the slices a new node's GPUs would publish."""
    out = []
    for resource in sorted(offered):
        profile = resource.removeprefix(MIG_RESOURCE_PREFIX)
        expression = (f"device.driver == '{DRIVER}' && device.attributes['{DRIVER}'].type == 'mig' && "
                      f"device.attributes['{DRIVER}'].profile == '{profile}'")
        out.append({"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
                    "metadata": {"name": f"mig-{profile}.sim.kubegpu.io"},
                    "spec": {"selectors": [{"cel": {"expression": expression}}], "extendedResourceName": resource}})
    return out


def _sharing(argument: str | None) -> tuple[BaseStrategy, dict[str, str], dict[str, str]]:
    """The simulator strategy that shapes nodes and pod requests, plus the NodePool labels/annotations to match."""
    text = argument or "exclusive"
    if text == "exclusive":
        return Exclusive("exclusive"), {}, {}
    if text.startswith("time-slicing-") and text.removeprefix("time-slicing-").isdigit():
        replicas = int(text.removeprefix("time-slicing-"))
        if not 2 <= replicas <= 48:
            raise ConfigError(f"strategy autoscaler:{text}: replicas must be 2..48")
        config = ("version: v1\nsharing:\n  timeSlicing:\n    renameByDefault: true\n    resources:\n"
                  f"    - name: nvidia.com/gpu\n      replicas: {replicas}\n")
        return TimeSlicing(text, replicas), {}, {L.DEVICE_PLUGIN_CONFIG_ANNOTATION: config}
    if text.startswith("mig-") and len(text) > 4:
        layout = text.removeprefix("mig-")
        return StaticMig(text, layout), {L.MIG_CONFIG_LABEL: layout}, {}
    if text == "dra-dynamic-mig":
        return DraDynamicMig(text), {}, {}
    raise ConfigError(f"strategy autoscaler:{text}: want exclusive, time-slicing-<N>, mig-<mig-parted config> or "
                      "dra-dynamic-mig")


class AutoscalerStrategy(BaseStrategy):
    tick_interval: float | None = 5.0
    idle_pass_interval = 30.0
    """With nothing pending and every NodeClaim settled, only disruption has work, and its clocks
    (consolidateAfter, expireAfter) run in tens of seconds: a full pass every 30 s then decides the same as every 5 s
    (pending pods and settling claims still get one every tick), at a sixth of the cost."""

    def __init__(self, name: str, argument: str | None) -> None:
        super().__init__(name)
        self.delegate, self.labels, self.annotations = _sharing(argument)
        self.autoscaler: Autoscaler | None = None
        self.provider: EngineProvider | None = None
        self.timeline: list[tuple[float, int, float]] = []   # (time, nodes, $/h)
        self.last_pass = float("-inf")

    def nodepool(self) -> NodePool:
        return parse_nodepool({
            "apiVersion": L.API_VERSION, "kind": "NodePool", "metadata": {"name": "sim"},
            "spec": {"template": {"metadata": {"labels": self.labels, "annotations": self.annotations},
                                  "spec": {"requirements": []}},
                     "disruption": {"consolidationPolicy": "WhenEmpty", "consolidateAfter": "60s"}},
        }, f"strategy {self.name}")

    def node_setup(self, group: NodeGroup, model: GpuModel, gpus: Sequence[GpuDevice]) -> NodeSetup:
        return self.delegate.node_setup(group, model, gpus)

    def request_for(self, job: Job, models: Sequence[GpuModel]) -> GpuRequest:
        return self.delegate.request_for(job, models)

    def on_start(self, sim: SimControl) -> None:
        from kubegpu.gpu.catalog import get_model
        from kubegpu.gpu.simulated import SimulatedBackend

        for group in sim.node_groups:   # let MIG request sizing know every profile a node could offer
            backend = SimulatedBackend.create(None, gpus=f"{group.gpus_per_node}x{group.gpu_model}")
            self.delegate.node_setup(group, get_model(group.gpu_model), backend.devices())
        pool = self.nodepool()
        sim.cluster.create(pool.model_dump(mode="json", exclude_none=True))
        if isinstance(self.delegate, DraDynamicMig):
            for device_class in mig_device_classes(self.delegate.offered):
                sim.cluster.create(device_class)
        self.provider = EngineProvider(sim, [group_instance_type(g) for g in sim.node_groups])
        self.autoscaler = Autoscaler(sim.cluster, self.provider, sim.clock, Options(evict_pods=False))

    def on_tick(self, sim: SimControl) -> None:
        if self.autoscaler is None:
            return
        views = sim.nodes()   # read once a tick (each read rebuilds the views of nodes whose pods changed) ...
        self._forget_interrupted(sim, views)
        if isinstance(self.delegate, DraDynamicMig):   # kube-scheduler's allocation and the driver's MIG cuts
            self.delegate.on_tick(sim)
        now = sim.clock.now()
        if now - self.last_pass >= self.idle_pass_interval or self._busy(sim, self.autoscaler):
            self.autoscaler.step()
            self.last_pass = now
            views = sim.nodes()   # ... and again only after a pass, which may have bought or returned nodes
        prices = {g.name: g.price_per_hour for g in sim.node_groups}
        self.timeline.append((sim.clock.now(), len(views), sum(prices.get(v.group, 0.0) for v in views)))


    def _forget_interrupted(self, sim: SimControl, views: Sequence[NodeView]) -> None:
        """Karpenter's interruption controller: a NodeClaim whose instance the cloud reclaimed is deleted, so the
        termination controller finishes it and the provisioner buys a replacement for the evicted pods."""
        gone = set(self.provider.reclaimed(views)) if self.provider is not None else set()
        if not gone:
            return
        for claim in sim.cluster.list("NodeClaim"):
            if (claim.get("status") or {}).get("providerID") in gone:
                with contextlib.suppress(KubegpuError):
                    sim.cluster.delete("NodeClaim", claim["metadata"]["name"])

    @staticmethod
    def _busy(sim: SimControl, scaler: Autoscaler) -> bool:
        """Pods wait, or a NodeClaim is still on its way to Initialized (or out): the next pass may act. The
        claims are read from the autoscaler's informer, uncopied (nothing here modifies them)."""
        if sim.pending_pods():
            return True
        return not all(is_true(claim, "Initialized") and not (claim.get("metadata") or {}).get("deletionTimestamp")
                       for claim in scaler.cluster.list_shared("NodeClaim"))


def autoscaler(argument: str | None) -> AutoscalerStrategy:
    """The `autoscaler[:sharing]` strategy (the `kubegpu.sim.strategies` entry point in pyproject.toml)."""
    return AutoscalerStrategy(f"autoscaler:{argument or 'exclusive'}", argument)
