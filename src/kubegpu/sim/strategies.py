"""GPU-sharing strategies as plug-ins: how nodes share their GPUs, what each pod asks for, and (optionally) a
controller that reshapes the cluster while the simulation runs.

Writing a strategy (the partitioner and autoscaler do this in their own ``sim_strategy`` modules)::

    from kubegpu.sim.strategies import BaseStrategy, GpuRequest, NodeSetup, register_strategy

    class DynamicMig(BaseStrategy):
        tick_interval = 30.0                      # seconds of simulated time between on_tick calls; None: never

        def node_setup(self, group, model, gpus):  # once per node, when it joins
            return NodeSetup(device_plugin_config={"version": "v1", "flags": {"migStrategy": "mixed"}},
                             mig_layout={gpu.index: [] for gpu in gpus})   # MIG on, no instances yet

        def request_for(self, job, models):        # the pod's GPU request under this strategy
            return GpuRequest("nvidia.com/mig-2g.20gb", job.gpus)

        def on_tick(self, sim):                    # sim: a SimControl (see below)
            for pod in sim.pending_pods(): ...
            sim.set_mig_layout("h100-0", {3: [PlacedInstance(14, 0), PlacedInstance(9, 4)]})

    register_strategy("dynamic-mig", lambda argument: DynamicMig("dynamic-mig"))

The name on the command line is ``name[:argument][+modifier...]`` (``time-slicing:4``, ``time-slicing:4+guard``);
the factory gets the argument (or None) and raises ConfigError for a bad one. A modifier adds something on top of a
strategy (``+guard``: the GPU-memory guard on every node) — `register_modifier(name, apply)`, where ``apply(strategy)``
returns the strategy it changed or raises ConfigError where it does not apply; components may offer theirs as entry
points in the ``kubegpu.sim.modifiers`` group. Modifiers are parsed here and nowhere else.

The simulator knows no component: the built-in strategies above register here, and a component offers its own as
entry points in the ``kubegpu.sim.strategies`` group (pyproject.toml), name → factory, which `get_strategy` loads only
when that name is asked for::

    [project.entry-points."kubegpu.sim.strategies"]
    dynamic-mig = "mypackage.sim_strategy:dynamic_mig"      # dynamic_mig(argument) -> Strategy

A strategy with a controller runs the component's real controller on ``sim.clock`` against ``sim.cluster``, and
plays the parts outside the controller (a node agent, a cloud provider) through `SimControl`: the partitioner's
strategy is the partition agent on every node, the autoscaler's the cloud provider.

What a controller may do, through `SimControl` (implemented by the engine):
- read: ``sim.clock.now()``, ``sim.cluster`` (the in-memory Kubernetes store with every Node and Pod, so controller
  code written against `kubegpu.kube.Cluster` runs unchanged), ``sim.nodes()`` (`NodeView`: model, GPUs, MIG
  devices, allocatable, free devices, busy GPU indexes), ``sim.pending_pods()``, ``sim.node_groups``;
- change a node's MIG layout: ``sim.set_mig_layout(node, {gpu index: [PlacedInstance, ...] | None})``, as the
  partition agent does: instances in both layouts (same profile id and start) stay, with their device IDs and
  running pods; dropped instances go at once, new ones appear after ``sim.mig_reconfigure_delay`` seconds (default
  from the measured MIG-manager apply time, or ``delay``); turning MIG on or off takes the whole GPU out for the
  delay. Nothing is ever evicted: a change that would destroy an instance (or, for a MIG mode change, a GPU) a
  running pod uses, or that touches a GPU still being reconfigured, raises
  ``kubegpu.sim.engine.InstanceInUseError`` and changes nothing (``NodeView.held_mig`` tells what is in use);
- change a node's device-plugin config (time-slicing, MPS) and MPS memory slices: ``sim.set_sharing(...)``; a new
  config drains every GPU; a change of slices alone keeps the slices running pods hold (same device IDs, see
  ``NodeView.held_mps``), rewrites the free ones and holds back only the new ones for the delay; dropping a held
  slice raises ``InstanceInUseError`` and changes nothing;
- add a node of a group (ready after a provisioning delay) or remove one (its pods are evicted and requeued):
  ``sim.add_node(group)``, ``sim.remove_node(name)``. Cost is counted from request to removal.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache
from importlib.metadata import EntryPoint, entry_points
from typing import TYPE_CHECKING, Any, Protocol

from kubegpu.errors import ConfigError
from kubegpu.sharing.names import GPU_RESOURCE, GPU_SHARED_RESOURCE, mig_resource_name

if TYPE_CHECKING:
    from kubegpu.clock import Clock
    from kubegpu.gpu.backend import GpuDevice, MigDevice
    from kubegpu.gpu.catalog import GpuModel
    from kubegpu.gpu.geometry import PlacedInstance
    from kubegpu.sim.scenario import NodeGroup
    from kubegpu.sim.workload import Job

GPU = GPU_RESOURCE
GPU_SHARED = GPU_SHARED_RESOURCE
ENTRY_POINT_GROUP = "kubegpu.sim.strategies"
MODIFIER_ENTRY_POINT_GROUP = "kubegpu.sim.modifiers"


@dataclass(frozen=True)
class GpuRequest:
    """What a pod asks the scheduler for: `count` of the extended resource `resource`."""

    resource: str
    count: int


@dataclass
class NodeSetup:
    """How a node shares its GPUs when it joins.

    ``device_plugin_config``: NVIDIA's device-plugin config (a `DevicePluginConfig` or the same data as a dict);
    ``mig_layout``: GPU index → GI profile ids to create (placed with `kubegpu.gpu.geometry.place`), ``[]`` for MIG
    on with no instances, None or absent for MIG off; ``mps_slices``: GPU index → MPS memory slices in GiB;
    ``labels``: extra Node labels, as an operator would set them (the partitioner's opt-in label).
    """

    device_plugin_config: Any = field(default_factory=lambda: {"version": "v1"})
    mig_layout: dict[int, list[int] | None] = field(default_factory=dict)
    mps_slices: dict[int, list[int]] = field(default_factory=dict)
    labels: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class NodeView:
    """A read-only snapshot of one simulated node, for controllers."""

    name: str
    group: str
    model: GpuModel
    gpus: Sequence[GpuDevice]
    mig: Mapping[int, Sequence[MigDevice]]
    allocatable: Mapping[str, int]
    free: Mapping[str, int]  # free device IDs per resource
    busy_gpus: frozenset[int]  # GPU indexes with at least one running pod
    reconfiguring: frozenset[int]  # GPU indexes waiting for a MIG or sharing change to be applied
    ready: bool
    held_mig: frozenset[str] = frozenset()  # UUIDs of the MIG devices running pods hold (what the kubelet reports)
    held_mps: frozenset[str] = frozenset()  # device IDs of the MPS slices running pods hold


class SimControl(Protocol):
    """The engine as a controller sees it (see the module docstring)."""

    @property
    def clock(self) -> Clock: ...
    @property
    def cluster(self) -> Any: ...  # a kubegpu.kube Cluster (MemoryCluster) holding every Node and Pod
    @property
    def node_groups(self) -> Sequence[NodeGroup]: ...
    @property
    def mig_reconfigure_delay(self) -> float: ...
    @property
    def node_provision_delay(self) -> float: ...

    def nodes(self) -> list[NodeView]: ...
    def pending_pods(self) -> list[dict[str, Any]]: ...
    def set_mig_layout(
        self, node: str, layout: Mapping[int, Sequence[PlacedInstance] | None], delay: float | None = None
    ) -> None: ...
    def set_sharing(
        self, node: str, device_plugin_config: Any, mps_slices: Mapping[int, Sequence[int]] | None = None,
        delay: float | None = None,
    ) -> None: ...
    def add_node(self, group: str, delay: float | None = None) -> str: ...
    def remove_node(self, name: str) -> None: ...


class Strategy(Protocol):
    """A sharing strategy under comparison (see the module docstring for how to write one)."""

    name: str
    tick_interval: float | None

    def node_setup(self, group: NodeGroup, model: GpuModel, gpus: Sequence[GpuDevice]) -> NodeSetup: ...
    def request_for(self, job: Job, models: Sequence[GpuModel]) -> GpuRequest: ...
    def on_start(self, sim: SimControl) -> None: ...
    def on_tick(self, sim: SimControl) -> None: ...


class BaseStrategy:
    """Defaults for a strategy: whole GPUs, no controller. Subclasses override what they change."""

    tick_interval: float | None = None
    memory_shared: bool = False  # pods share a GPU's memory without isolation (time-slicing, MPS, shared claims)

    def __init__(self, name: str) -> None:
        self.name = name
        self.guard: Any = None  # the `+guard` modifier's settings (kubegpu.sim.guard); None without it

    def node_setup(self, group: NodeGroup, model: GpuModel, gpus: Sequence[GpuDevice]) -> NodeSetup:
        return NodeSetup()

    def request_for(self, job: Job, models: Sequence[GpuModel]) -> GpuRequest:
        return GpuRequest(GPU, job.gpus)

    def on_start(self, sim: SimControl) -> None:
        return None

    def on_tick(self, sim: SimControl) -> None:
        return None


class Exclusive(BaseStrategy):
    """Every pod gets whole GPUs (`nvidia.com/gpu`), the Kubernetes default."""


class TimeSlicing(BaseStrategy):
    """Every GPU advertised `replicas` times as `nvidia.com/gpu.shared` (NVIDIA's renameByDefault)."""

    memory_shared = True

    def __init__(self, name: str, replicas: int) -> None:
        super().__init__(name)
        self.replicas = replicas

    def node_setup(self, group: NodeGroup, model: GpuModel, gpus: Sequence[GpuDevice]) -> NodeSetup:
        sharing = {"renameByDefault": True, "resources": [{"name": GPU, "replicas": self.replicas}]}
        return NodeSetup(device_plugin_config={"version": "v1", "sharing": {"timeSlicing": sharing}})

    def request_for(self, job: Job, models: Sequence[GpuModel]) -> GpuRequest:
        return GpuRequest(GPU_SHARED, job.gpus)


class Mps(TimeSlicing):
    """Every GPU shared by `replicas` MPS clients as `nvidia.com/gpu.shared`: NVIDIA's MPS sharing, which pins each
    client to 1/N of the memory and 1/N of the SMs (`CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`,
    `CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`)."""

    def node_setup(self, group: NodeGroup, model: GpuModel, gpus: Sequence[GpuDevice]) -> NodeSetup:
        sharing = {"renameByDefault": True, "resources": [{"name": GPU, "replicas": self.replicas}]}
        return NodeSetup(device_plugin_config={"version": "v1", "sharing": {"mps": sharing}})


def smallest_slice_request(job: Job, offered: Mapping[str, float], whole_gpus: bool) -> GpuRequest:
    """The smallest offered MIG slice whose memory (GiB) holds the pod's, as a user sizing by memory asks; a pod too
    big for every slice asks for whole GPUs where the cluster has some, else the largest slice (and runs out of
    memory there)."""
    by_memory = sorted(offered.items(), key=lambda item: (item[1], item[0]))
    for resource, memory in by_memory:
        if job.memory_gib <= memory:
            return GpuRequest(resource, job.gpus)
    if whole_gpus or not by_memory:
        return GpuRequest(GPU, job.gpus)
    return GpuRequest(by_memory[-1][0], job.gpus)


class StaticMig(BaseStrategy):
    """MIG-capable GPUs carry one mig-parted layout (`all-balanced`, `all-3g.40gb`, ...) for the whole run, on every
    node or only on the node groups named after `@` (`static-mig:all-balanced@a100+l40s`); other nodes keep whole
    GPUs. A pod asks for the smallest offered slice whose memory holds its own (what a user sizing by memory
    does); a pod too big for every slice asks for whole GPUs where some exist, else the largest slice (and then
    runs out of memory)."""

    def __init__(self, name: str, layout_name: str, groups: frozenset[str] | None = None) -> None:
        super().__init__(name)
        self.layout_name = layout_name
        self.groups = groups
        self.offered: dict[str, float] = {}  # MIG resource → smallest memory GiB it has on any node
        self.whole_gpus = False

    def node_setup(self, group: NodeGroup, model: GpuModel, gpus: Sequence[GpuDevice]) -> NodeSetup:
        from kubegpu.config.migparted import default_mig_parted_config, resolve_layout

        config = {"version": "v1", "flags": {"migStrategy": "mixed"}}
        if not model.mig_capable or (self.groups is not None and group.name not in self.groups):
            self.whole_gpus = True
            return NodeSetup(device_plugin_config=config)
        parted = default_mig_parted_config([model])
        if self.layout_name not in parted.mig_configs:
            known = ", ".join(sorted(parted.mig_configs))
            raise ConfigError(f"strategy {self.name}: no mig-parted config {self.layout_name!r} for {model.key}; "
                              f"known: {known}")
        wanted = resolve_layout(parted, self.layout_name, list(gpus))
        layout = {index: (list(ids) if ids is not None else None) for index, ids in wanted.items()}
        for ids in layout.values():
            if ids is None:
                self.whole_gpus = True
            for profile_id in ids or ():
                profile = model.profile(profile_id)
                memory = profile.memory_mib / 1024
                name = mig_resource_name(profile.name)
                self.offered[name] = min(memory, self.offered.get(name, memory))
        return NodeSetup(device_plugin_config=config, mig_layout=layout)

    def request_for(self, job: Job, models: Sequence[GpuModel]) -> GpuRequest:
        return smallest_slice_request(job, self.offered, self.whole_gpus)

    def on_start(self, sim: SimControl) -> None:
        """A group after `@` that the cluster lacks is a typo, not a wish for whole GPUs on every node."""
        unknown = sorted((self.groups or frozenset()) - {group.name for group in sim.node_groups})
        if unknown:
            known = ", ".join(group.name for group in sim.node_groups)
            raise ConfigError(f"strategy {self.name}: no node group {', '.join(map(repr, unknown))} in the "
                              f"scenario; its node groups: {known}")


def _static_mig(argument: str | None) -> Strategy:
    layout, _, groups = (argument or "all-balanced").partition("@")
    if not layout:
        raise ConfigError(f"strategy static-mig:{argument}: name a mig-parted config, e.g. static-mig:all-balanced")
    selected = frozenset(g for g in groups.split("+") if g) if groups else None
    return StaticMig(f"static-mig:{argument or layout}", layout, selected)


StrategyFactory = Callable[[str | None], Strategy]
_REGISTRY: dict[str, StrategyFactory] = {}


def register_strategy(name: str, factory: StrategyFactory) -> None:
    """Make `name[:argument]` available to scenarios and `kubegpu simulate --strategies`."""
    _REGISTRY[name] = factory


def _replicas(argument: str | None, kind: str = "time-slicing") -> int:
    text = argument or "4"
    if not text.isdigit() or not 2 <= int(text) <= 48:
        raise ConfigError(f"strategy {kind}:{text}: replicas must be a whole number from 2 to 48")
    return int(text)


def _exclusive(argument: str | None) -> Strategy:
    if argument:
        raise ConfigError(f"strategy exclusive:{argument}: exclusive takes no argument")
    return Exclusive("exclusive")


register_strategy("exclusive", _exclusive)
register_strategy("time-slicing", lambda argument: TimeSlicing(f"time-slicing:{_replicas(argument)}",
                                                               _replicas(argument)))
register_strategy("mps", lambda argument: Mps(f"mps:{_replicas(argument, 'mps')}", _replicas(argument, "mps")))
register_strategy("static-mig", _static_mig)


@cache
def _plugins() -> dict[str, EntryPoint]:
    """The strategies components offer as entry points (read once; importing them waits until one is asked for)."""
    return {point.name: point for point in entry_points(group=ENTRY_POINT_GROUP)}


def _factory(name: str) -> StrategyFactory | None:
    factory = _REGISTRY.get(name)
    point = _plugins().get(name) if factory is None else None
    if point is not None:
        try:
            factory = point.load()
        except ModuleNotFoundError as exc:  # metadata left behind by a component that is no longer installed
            if exc.name is None or not point.module.startswith(exc.name):
                raise
            return None
        _REGISTRY[name] = factory
    return factory


def available_strategies() -> list[str]:
    return sorted(set(_REGISTRY) | set(_plugins()))


Modifier = Callable[[Strategy], Strategy]
_MODIFIERS: dict[str, Modifier] = {}
_BUILTIN_MODIFIERS = {"guard": "kubegpu.sim.guard"}  # module that registers it, imported when first asked for


def register_modifier(name: str, apply: Modifier) -> None:
    """Make `<strategy>+name` available: `apply` changes the strategy (or raises ConfigError where it cannot)."""
    _MODIFIERS[name] = apply


@cache
def _modifier_plugins() -> dict[str, EntryPoint]:
    return {point.name: point for point in entry_points(group=MODIFIER_ENTRY_POINT_GROUP)}


def _modifier(name: str) -> Modifier | None:
    if name not in _MODIFIERS and name in _BUILTIN_MODIFIERS:
        import importlib

        importlib.import_module(_BUILTIN_MODIFIERS[name])
    if name not in _MODIFIERS and name in _modifier_plugins():
        _MODIFIERS[name] = _modifier_plugins()[name].load()
    return _MODIFIERS.get(name)


def available_modifiers() -> list[str]:
    return sorted(set(_MODIFIERS) | set(_BUILTIN_MODIFIERS) | set(_modifier_plugins()))


def split_spec(spec: str) -> tuple[str, str | None, list[str]]:
    """`time-slicing:4+guard` → ("time-slicing", "4", ["guard"]): the one parser of strategy specs. Modifiers are
    the known names peeled off the end, so an argument may still hold a `+` of its own
    (`static-mig:all-balanced@a100+l40s+guard`)."""
    known = set(available_modifiers())
    base, modifiers = spec.strip(), list[str]()
    while "+" in base:
        head, _, last = base.rpartition("+")
        if last.strip() not in known:
            break
        modifiers.insert(0, last.strip())
        base = head
    name, _, argument = base.partition(":")
    return name, argument or None, modifiers


def get_strategy(spec: str) -> Strategy:
    """The strategy for `name[:argument][+modifier...]`; ConfigError naming the spec when unknown."""
    name, argument, modifiers = split_spec(spec)
    factory = _factory(name)
    if factory is None:
        raise ConfigError(f"unknown strategy {spec!r}; available: {', '.join(available_strategies())}")
    if "+" in (argument or "") and name != "static-mig":
        unknown = (argument or "").rpartition("+")[2]
        raise ConfigError(f"strategy {spec!r}: unknown modifier {'+' + unknown!r}; available: "
                          f"{', '.join('+' + m for m in available_modifiers())}")
    strategy = factory(argument)
    for modifier in modifiers:
        apply = _modifier(modifier)
        assert apply is not None  # split_spec only peels known names
        strategy = apply(strategy)
        strategy.name = f"{strategy.name}+{modifier}"
    return strategy
