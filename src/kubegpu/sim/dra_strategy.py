"""Simulator strategies for DRA: `dra` (whole GPUs through DRA), `dra-dynamic-mig` (the scheduler cuts MIG) and
`dra-shared:N` (a GPU shared by up to N pods through one claim with `TimeSlicing`).

`dra-dynamic-mig` models NVIDIA-style dynamic MIG over partitionable devices with the real pieces: every node's
MIG GPUs are published as our dynamic-MIG ResourceSlices (`kubegpu.dra.devices`), each pending pod's MIG request
becomes a ResourceClaim whose CEL selector names the profile, and kube-scheduler's allocator
(`kubegpu.scheduling.dra`) picks node, GPU and placement first-fit against the counters — instances that exist or
are being created count as allocated. The chosen placement is then created (the driver does it at
NodePrepareResources; here after the simulator's MIG reconfiguration delay) and destroyed again when no pod holds it
and no pending pod wants it (NodeUnprepareResources). There is no planner: what differs from `dynamic-mig` (the
partitioner) is exactly what first-fit allocation does to fragmentation and waiting time.

`dra` gives whole GPUs through DRA (the `gpu.nvidia.com` class, reached by plain `nvidia.com/gpu` requests through
`extendedResourceName`): the scheduler's decisions equal `exclusive`'s, so it is there to make that visible in the
comparison table.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Sequence

from kubegpu.dra.classes import shipped_class_objects
from kubegpu.dra.devices import NodeGpus, Placement, gpu_offers, mig_device_name, placements_by_name
from kubegpu.dra.slices import build_slices
from kubegpu.errors import ConfigError
from kubegpu.gpu.backend import GpuDevice
from kubegpu.gpu.catalog import GpuModel
from kubegpu.gpu.geometry import PlacedInstance
from kubegpu.scheduling import pod_requests
from kubegpu.scheduling.dra import Allocator, DeviceId, ResourceSlice, allocate_one, parse_all, parse_claim
from kubegpu.sharing.names import MIG_RESOURCE_PREFIX, mig_resource_name
from kubegpu.sim.scenario import NodeGroup
from kubegpu.sim.strategies import (
    BaseStrategy,
    GpuRequest,
    NodeSetup,
    NodeView,
    SimControl,
    TimeSlicing,
    _replicas,
    smallest_slice_request,
)
from kubegpu.sim.workload import Job

DRIVER = "gpu.nvidia.com"


class DraDynamicMig(BaseStrategy):
    tick_interval = 5.0  # the scheduler allocates as pods arrive; a short tick stands for that

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.offered: dict[str, float] = {}
        self.whole_gpus = False
        self.classes = {c.name: c for c in parse_all(shipped_class_objects(), "DeviceClass", "classes")}
        self._coming: dict[tuple[str, int], list[str]] = {}  # (node, gpu) -> resources being created there
        self._profiles: dict[str, dict[str, str]] = defaultdict(dict)  # model key -> resource -> profile name
        self.claims_allocated = 0
        self.claims_failed = 0
        self._parsed: dict[str, tuple[object, list[ResourceSlice], dict[str, Placement]]] = {}
        self._allocator: tuple[tuple[int, ...], Allocator] | None = None
        self._last_failed: object = None
        self._asks: dict[int, tuple[object, list[tuple[str, int]]]] = {}
        # node -> (its view, slices, placements, devices taken): what `_node_world` derived from that view
        self._held: dict[str, tuple[NodeView, list[ResourceSlice], dict[str, Placement], frozenset[DeviceId]]] = {}
        self._names: dict[tuple[str, int, int, int], str] = {}  # (model, GPU minor, profile id, start) -> device name
        self._no_fit: dict[tuple[str, object], frozenset[DeviceId]] = {}  # (node, claim shape) -> node's in use then

    def node_setup(self, group: NodeGroup, model: GpuModel, gpus: Sequence[GpuDevice]) -> NodeSetup:
        config = {"version": "v1", "flags": {"migStrategy": "mixed"}}
        if not model.mig_capable:
            self.whole_gpus = True
            return NodeSetup(device_plugin_config=config)
        for profile in model.mig_profiles:
            if not profile.media_extensions:
                name = mig_resource_name(profile.config_name)
                memory = profile.memory_mib / 1024
                self.offered[name] = min(memory, self.offered.get(name, memory))
                self._profiles[model.key][name] = profile.name
        return NodeSetup(device_plugin_config=config, mig_layout={gpu.index: [] for gpu in gpus})

    def request_for(self, job: Job, models: Sequence[GpuModel]) -> GpuRequest:
        return smallest_slice_request(job, self.offered, self.whole_gpus)

    # --- the scheduler's allocation and the driver's prepare/unprepare ------------------------------------------------

    def on_tick(self, sim: SimControl) -> None:
        views = [v for v in sim.nodes() if v.ready and v.model.mig_capable]
        by_name = {v.name: v for v in views}
        for key in list(self._coming):
            view = by_name.get(key[0])
            if view is None or key[1] not in view.reconfiguring:
                del self._coming[key]
        wanted: list[tuple[str, int]] = []
        asks: dict[int, tuple[object, list[tuple[str, int]]]] = {}  # a pending pod's MIG asks, read once per pod
        for pod in sim.pending_pods():
            known = self._asks.get(id(pod))
            if known is None or known[0] is not pod:
                known = (pod, [(resource, int(amount)) for resource, amount in pod_requests(pod).items()
                               if resource.startswith(MIG_RESOURCE_PREFIX) and amount >= 1])
            asks[id(pod)] = known
            wanted.extend(known[1])
        self._asks = asks
        supply: Counter[str] = Counter()  # free instances of each MIG resource, over every node
        for view in views:
            supply.update({r: n for r, n in view.free.items() if r.startswith(MIG_RESOURCE_PREFIX)})
        supply.update(r for resources in self._coming.values() for r in resources)
        unmet = []
        for resource, amount in wanted:
            if supply[resource] >= amount:
                supply[resource] -= amount
            else:
                unmet.append((resource, amount))
        if unmet:
            self._allocate(sim, views, unmet)
        self._release(sim, views, Counter({r: n for r, n in supply.items() if n > 0}))

    def _world(
        self, views: list[NodeView],
    ) -> tuple[Allocator, dict[str, dict[str, Placement]], set[DeviceId], dict[str, frozenset[DeviceId]]]:
        """The scheduler's view: every node's slices (parsed once per node) and the devices in use, in all and per
        node."""
        parsed: list[ResourceSlice] = []
        placements: dict[str, dict[str, Placement]] = {}
        in_use: set[DeviceId] = set()
        per_node: dict[str, frozenset[DeviceId]] = {}
        coming: dict[str, set[int]] = defaultdict(set)
        for node, gpu_index in self._coming:
            coming[node].add(gpu_index)
        for view in views:
            slices, offered, taken = self._node_world(view)
            parsed.extend(slices)
            placements[view.name] = offered
            if view.name in coming:  # a GPU being reconfigured takes no new instance
                taken = taken | {DeviceId(DRIVER, view.name, f"gpu-{gpu.device_minor}") for gpu in view.gpus
                                 if gpu.index in coming[view.name]}
            per_node[view.name] = taken
            in_use |= taken
        key = tuple(map(id, parsed))
        if self._allocator is None or self._allocator[0] != key:
            self._allocator = (key, Allocator(parsed, self.classes))
        return self._allocator[1], placements, in_use, per_node

    def _node_world(self, view: NodeView) -> tuple[list[ResourceSlice], dict[str, Placement], frozenset[DeviceId]]:
        """One node's parsed slices, its placements by device name and its devices in use as the view shows them:
        every instance (created or being created: each was made for a claim) and every GPU being reconfigured.
        Kept while the node's view is the same object (the engine rebuilds a view only when its node changes)."""
        held = self._held.get(view.name)
        if held is not None and held[0] is view:
            return held[1], held[2], held[3]
        if held is not None and held[0].mig == view.mig and held[0].reconfiguring == view.reconfiguring \
                and held[0].gpus == view.gpus:
            # a pod started or ended there: the same GPUs and instances (the same objects: compared by identity first)
            self._held[view.name] = (view, *held[1:])
            return held[1], held[2], held[3]
        gpus = tuple(gpu.uuid for gpu in view.gpus)
        cached = self._parsed.get(view.name)
        if cached is None or cached[0] != gpus:
            # every instance here was made for a claim, so the offer never changes with the layout (only the live
            # instances' uuid attribute would): slices are built and parsed once per node, and what is taken is
            # told to the allocator as devices in use
            inventory = NodeGpus("0.0.0", (12, 0), tuple(view.gpus), {})
            offers = gpu_offers(inventory, dynamic_mig=True)
            cached = (gpus, parse_all(build_slices(view.name, offers), "ResourceSlice", view.name),
                      placements_by_name(offers))
            self._parsed[view.name] = cached
        taken: set[DeviceId] = set()
        for gpu in view.gpus:
            for mig in view.mig.get(gpu.index, ()):
                key = (view.model.key, gpu.device_minor, mig.profile_id, mig.start)
                name = self._names.get(key)
                if name is None:
                    profile = view.model.profile_by_id()[mig.profile_id]
                    name = self._names[key] = mig_device_name(gpu, profile, mig.start)
                taken.add(DeviceId(DRIVER, view.name, name))
            if gpu.index in view.reconfiguring:
                taken.add(DeviceId(DRIVER, view.name, f"gpu-{gpu.device_minor}"))
        frozen = frozenset(taken)
        self._held[view.name] = (view, cached[1], cached[2], frozen)
        return cached[1], cached[2], frozen

    def _allocate(self, sim: SimControl, views: list[NodeView], unmet: list[tuple[str, int]]) -> None:
        allocator, placements, in_use, per_node = self._world(views)
        attempt = (frozenset(in_use), tuple(sorted(unmet)))
        if attempt == self._last_failed:  # nothing freed, nothing new wanted: the same claims fail the same way
            return
        self._last_failed = attempt
        new: dict[tuple[str, int], list[tuple[str, PlacedInstance]]] = defaultdict(list)
        for index, (resource, amount) in enumerate(unmet):
            names = {n for v in views if (n := self._profiles[v.model.key].get(resource)) is not None}
            if not names:
                continue
            selector = " || ".join(f"device.attributes['gpu.nvidia.com'].profile == '{n}'" for n in sorted(names))
            claim = parse_claim({"metadata": {"name": f"pending-{index}", "namespace": "sim"}, "spec": {"devices": {
                "requests": [{"name": "mig", "exactly": {"deviceClassName": "mig.nvidia.com", "count": amount,
                                                         "selectors": [{"cel": {"expression": selector}}]}}]}}})
            # first fit over the nodes in name order, as the scheduler; a node where this claim shape found no room
            # is passed over while its devices in use are the same ones (the allocator's answer is a function of the
            # node's slices, which are fixed, and of what is in use there)
            shape = (selector, amount)
            nodes = [n for n in allocator.nodes() if self._no_fit.get((n, shape)) != per_node.get(n)]
            failed: set[tuple[str, object]] = set()
            outcome = allocate_one(allocator, claim, in_use, nodes, failed=failed, shape=shape)
            for node, _ in failed:
                self._no_fit[(node, shape)] = frozenset(per_node.get(node, ()))
            if outcome.results is None or outcome.node is None:
                self.claims_failed += 1
                continue
            self.claims_allocated += 1
            for result in outcome.results:
                in_use.add(result.id)
                per_node[outcome.node] = per_node.get(outcome.node, frozenset()) | {result.id}
                placement = placements[outcome.node][result.device]
                assert placement.profile_id is not None and placement.start is not None
                new[(outcome.node, placement.gpu_index)].append(
                    (resource, PlacedInstance(placement.profile_id, placement.start)))
        by_node: dict[str, dict[int, list[PlacedInstance]]] = defaultdict(dict)
        for (node, gpu_index), instances in new.items():
            view = _view(views, node)
            assert view is not None
            current = [PlacedInstance(m.profile_id, m.start) for m in view.mig.get(gpu_index, ())]
            by_node[node][gpu_index] = current + [i for _, i in instances]
            self._coming[(node, gpu_index)] = [r for r, _ in instances]
        for node, layouts in by_node.items():  # one change per node: its GPUs' new instances appear together
            sim.set_mig_layout(node, layouts)

    def _release(self, sim: SimControl, views: list[NodeView], surplus: Counter[str]) -> None:
        """Destroy instances no pod holds and no pending pod wants (the driver's unprepare).

        Every pass asks this of every node; only a node with a free instance of a resource in surplus can have one
        to destroy (a free instance is one no running pod holds), so the others are passed over unread."""
        live = [resource for resource, n in surplus.items() if n > 0]
        for view in views:
            if not live:
                break  # nothing left in surplus: no other node has anything to destroy
            if not any(view.free.get(resource) for resource in live):
                continue
            drop: dict[int, list[PlacedInstance]] = {}
            for gpu in view.gpus:
                if gpu.index in view.reconfiguring or (view.name, gpu.index) in self._coming:
                    continue
                keep = []
                for mig in view.mig.get(gpu.index, ()):
                    resource = mig_resource_name(view.model.profile_by_id()[mig.profile_id].config_name)
                    if mig.uuid not in view.held_mig and surplus[resource] > 0:
                        surplus[resource] -= 1
                        drop.setdefault(gpu.index, [])
                    else:
                        keep.append(PlacedInstance(mig.profile_id, mig.start))
                if gpu.index in drop:
                    drop[gpu.index] = keep
            if drop:
                sim.set_mig_layout(view.name, dict(drop), delay=0.0)
                live = [resource for resource, n in surplus.items() if n > 0]


def _view(views: list[NodeView], name: str) -> NodeView | None:
    return next((v for v in views if v.name == name), None)


def dra_dynamic_mig(argument: str | None) -> DraDynamicMig:
    if argument:
        raise ConfigError(f"strategy dra-dynamic-mig:{argument}: dra-dynamic-mig takes no argument")
    return DraDynamicMig("dra-dynamic-mig")


class DraShared(TimeSlicing):
    """`dra-shared:N`: each GPU is one ResourceClaim with NVIDIA's `TimeSlicing` sharing config that up to N pods
    reserve (`status.reservedFor`). Placement is time-slicing's (N pods per GPU at most); what differs is the memory
    share, which a shared claim gives as the device's memory over the pods sharing it *now*
    (`kubegpu.sharing.shares.claim_share`), so it shrinks as pods join — what the GPU-memory guard enforces under
    `+guard`."""

    claim_shared = True


def dra_shared(argument: str | None) -> DraShared:
    replicas = _replicas(argument, "dra-shared")
    return DraShared(f"dra-shared:{replicas}", replicas)


def dra(argument: str | None) -> BaseStrategy:
    if argument:
        raise ConfigError(f"strategy dra:{argument}: dra takes no argument")
    return BaseStrategy("dra")
