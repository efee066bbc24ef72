"""The cloud provider interface (Karpenter's operations) and a simulated, kwok-style provider.

`SimulatedProvider` "buys" a node by creating a Node object through the cluster interface: registered later,
tainted `kubegpu.io/unregistered:NoExecute`, with no GPU resources in allocatable — as a real kubelet zeroes
extended resources until the device plugin registers. Each node's GPUs are a `SimulatedBackend` in memory with the
NodePool's MIG config applied; after the registration delay `tick()` marks the node Ready, and publishes the device
plugin's `allocatable` for those GPUs once the node is registered too (see `tick`). That is the path a real GPU node
takes, so the NodeClaim lifecycle sees the same sequence (Launched → Registered → Initialized only once
`nvidia.com/*` is allocatable).

Its "cloud" is the Nodes themselves, so it confirms rather than assumes: an instance exists while its Node does and is
not being deleted, whatever this process remembers. After a restart (or a failover to another replica) it rebuilds
its instances from the Nodes it finds (`kwok://` providerIDs), so a NodeClaim's instance never "confirms gone" while
its Node runs. A launch is idempotent: the Node's name derives from the NodeClaim's uid, so a launch retried after a
crash finds the Node the first one made instead of making a second. `delete` deletes the Node and writes no
finalizer: those belong to whoever put them there (termination removes its own).
"""

from __future__ import annotations

import builtins
import contextlib
import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from kubegpu.autoscaler import labels as L
from kubegpu.autoscaler.dra_nodes import publish_node_slices, remove_node_slices
from kubegpu.autoscaler.fanout import each_at_once
from kubegpu.autoscaler.instancetypes import InstanceType, Offering
from kubegpu.autoscaler.objects import has_taint
from kubegpu.autoscaler.requirements import Requirements
from kubegpu.clock import Clock
from kubegpu.discovery.agent import discover_gpu_memory
from kubegpu.errors import KubegpuError, NotFoundError
from kubegpu.kube import Conflict, NotFound
from kubegpu.scheduling.quantity import format_quantity
from kubegpu.sharing.capacity import backend_allocatable, sharing_of, simulated_gpu_backend
from kubegpu.sharing.names import GPU_MEMORY_RESOURCE

if TYPE_CHECKING:
    from kubegpu.autoscaler.api import NodePool
    from kubegpu.gpu.backend import GpuBackend
    from kubegpu.kube import Cluster


READY_STATUS: dict[str, Any] = {"phase": "Running",
                                "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"}]}
NOT_READY_STATUS: dict[str, Any] = {"phase": "Pending",
                                    "conditions": [{"type": "Ready", "status": "False", "reason": "KubeletNotReady"}]}


class NodeClaimNotFoundError(NotFoundError):
    """The instance behind a NodeClaim is already gone (Delete is then a no-op for the caller)."""


class InsufficientCapacityError(KubegpuError):
    """No requested instance type has an available, compatible offering: the NodeClaim is deleted."""


class CloudProvider(Protocol):
    name: str

    def create(self, nodeclaim: dict[str, Any]) -> dict[str, Any]:
        """Launch an instance for the NodeClaim; returns the NodeClaim with providerID, labels, capacity set."""
        ...

    def delete(self, nodeclaim: dict[str, Any]) -> None: ...

    def get(self, provider_id: str) -> dict[str, Any]: ...

    def list(self) -> builtins.list[dict[str, Any]]: ...

    def instance_types(self, nodepool: NodePool) -> builtins.list[InstanceType]: ...

    def is_drifted(self, nodeclaim: dict[str, Any]) -> str:
        """A drift reason, or "" when the instance still matches its NodeClass."""
        ...

    def find(self, nodeclaim: dict[str, Any]) -> str | None:
        """The providerID of a live instance launched for this NodeClaim, found by what the launch marked it with
        (not by the claim's `status.providerID`: a process that died between the launch and recording it left
        none), or None when there is none."""
        ...


def quantities(amounts: dict[str, float]) -> dict[str, str]:
    return {k: format_quantity(v) for k, v in amounts.items()}


def launch_choice(types: Sequence[InstanceType], claim: dict[str, Any],
                  capacity_of: Any = None) -> tuple[InstanceType, Offering]:
    """Karpenter's pick: among the NodeClaim's instance types, the cheapest available compatible offering."""
    reqs = Requirements.from_api(claim["spec"].get("requirements") or [])
    type_req = reqs.get(L.INSTANCE_TYPE_LABEL)
    zone, ctype = reqs.get(L.ZONE_LABEL), reqs.get(L.CAPACITY_TYPE_LABEL)
    requests = {k: v for k, v in (claim["spec"].get("resources") or {}).get("requests", {}).items()}
    from kubegpu.scheduling import parse_quantity

    need = {k: parse_quantity(v) for k, v in requests.items()}
    best: tuple[InstanceType, Offering] | None = None
    for it in types:
        if type_req is not None and not type_req.has(it.name):
            continue
        alloc = capacity_of(it) if capacity_of else it.allocatable
        if any(alloc.get(k, 0.0) + 1e-9 < v for k, v in need.items()):
            continue
        offer = it.cheapest_offering(lambda o: (zone is None or zone.has(o.zone))
                                     and (ctype is None or ctype.has(o.capacity_type)))
        if offer is not None and (best is None or offer.price < best[1].price):
            best = (it, offer)
    if best is None:
        name = claim["metadata"]["name"]
        raise InsufficientCapacityError(f"nodeclaim {name}: no requested instance type has an available offering")
    return best


def kwok_node_name(nodeclaim: str, uid: str) -> str:
    """The Node a launch makes for a claim, named from its uid (or, for a claim the API server has not seen, a
    count): a launch retried after a crash gets the same name and finds the Node the first attempt made, and so does
    termination looking for an instance whose providerID was never recorded."""
    digest = hashlib.sha1(f"{nodeclaim}/{uid}".encode()).hexdigest()[:5]
    # the name is also the `kubernetes.io/hostname` label, whose values stop at 63 characters
    return f"kwok-{nodeclaim[:63 - len('kwok--') - len(digest)]}-{digest}"


@dataclass
class _Instance:
    node_name: str
    provider_id: str
    nodeclaim: str
    created: float
    backend: GpuBackend | None
    sharing_labels: dict[str, str]
    sharing_annotations: dict[str, str]
    ready: bool = False       # the kubelet has reported Ready
    published: bool = False   # the device plugin has published the GPUs (the node was registered)


def _ready(node: Mapping[str, Any]) -> bool:
    return any(c.get("type") == "Ready" and c.get("status") == "True"
               for c in (node.get("status") or {}).get("conditions") or [])


class InstanceListing:
    """What the simulated providers share: the instances they launched, keyed by providerID, listed through `get`.
    Nothing they launch ever drifts from its NodePool's provider-side settings."""

    instances: Mapping[str, Any]

    def get(self, provider_id: str) -> dict[str, Any]:
        raise NotImplementedError

    def list(self) -> builtins.list[dict[str, Any]]:
        out = []
        for provider_id in builtins.list(self.instances):
            try:
                out.append(self.get(provider_id))
            except KubegpuError:
                continue
        return out

    def is_drifted(self, nodeclaim: dict[str, Any]) -> str:
        return ""

    def find(self, nodeclaim: dict[str, Any]) -> str | None:
        """A launch records its providerID in the same step that makes the instance: nothing to find."""
        return None


class SimulatedProvider(InstanceListing):
    """A kwok-style provider: Nodes in the cluster, GPUs as in-memory simulated backends."""

    name = "kubegpu-sim"

    def __init__(self, cluster: Cluster, instance_types: Sequence[InstanceType], clock: Clock,
                 registration_delay: float = 30.0, parallelism: int = 1) -> None:
        self.cluster = cluster   # writes: the cloud's own (its Nodes), not a leader's, so never behind a fence
        self.reader = cluster    # reads: the autoscaler's informers once attached
        self.types = list(instance_types)
        self.clock = clock
        self.registration_delay = registration_delay
        self.parallelism = max(1, parallelism)   # nodes a tick updates at a time (the command: 16, as launches)
        self.instances: dict[str, _Instance] = {}
        self._fresh: dict[str, dict[str, Any]] = {}   # providerID → the Node as created, until the lifecycle takes it
        self._adopted = False   # the instances a previous process launched are rebuilt from the Nodes once
        self.create_calls = 0

    def instance_types(self, nodepool: NodePool) -> builtins.list[InstanceType]:
        return list(self.types)

    def create(self, nodeclaim: dict[str, Any]) -> dict[str, Any]:
        from kubegpu.autoscaler.gpu_capacity import sharing_capacity

        meta = nodeclaim["metadata"]
        labels, annotations = dict(meta.get("labels") or {}), dict(meta.get("annotations") or {})
        sharing = sharing_of(labels, annotations, f"NodeClaim {meta['name']}: metadata")
        it, offering = launch_choice(self.types, nodeclaim, lambda t: sharing_capacity(sharing, t))
        self.create_calls += 1
        node_name = kwok_node_name(meta["name"], str(meta.get("uid") or self.create_calls))
        provider_id = f"kwok://{node_name}"
        ready = self.registration_delay <= 0   # no delay: the kubelet is Ready from the start (no status write later)
        backend = simulated_gpu_backend(it.gpu_model, it.gpu_count, sharing.mig_config) \
            if it.gpu_model and it.gpu_count else None
        # the claim's name too, as a kubelet's --node-labels would: a claim whose providerID was never recorded still
        # finds its instance (`find`)
        node_labels = {**labels, **it.labels, **offering.labels(), L.HOSTNAME_LABEL: node_name,
                       L.NODECLAIM_LABEL: meta["name"], L.SIMULATED_NODE_LABEL: "true", "kwok.x-k8s.io/node": "fake"}
        capacity = {k: v for k, v in it.capacity.items() if not k.startswith("nvidia.com/")}
        allocatable = {k: v for k, v in it.allocatable.items() if not k.startswith("nvidia.com/")}
        node = {
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": node_name, "labels": node_labels,
                         "annotations": {**annotations, "kwok.x-k8s.io/node": "fake",
                                         "eks-node-viewer/instance-price": str(offering.price)}},
            "spec": {"providerID": provider_id, "taints": [dict(L.UNREGISTERED_TAINT)]},
            "status": {"capacity": quantities(capacity), "allocatable": quantities(allocatable),
                       **(READY_STATUS if ready else NOT_READY_STATUS)},
        }
        try:
            self._fresh[provider_id] = self.cluster.create(node)
        except Conflict:   # launched before, by a process that died before recording it: the same instance
            existing = self.reader.get("Node", node_name)
            if (existing.get("spec") or {}).get("providerID") != provider_id or \
                    (existing.get("metadata") or {}).get("deletionTimestamp"):
                raise
            ready = _ready(existing)
        self.instances[provider_id] = _Instance(node_name, provider_id, meta["name"], self.clock.now(), backend,
                                                labels, annotations, ready=ready)
        full = sharing_capacity(sharing, it)
        status = dict(nodeclaim.get("status") or {})
        status.update({"providerID": provider_id, "nodeName": node_name, "imageID": "kwok",
                       "capacity": quantities({**it.capacity, **full}), "allocatable": quantities(full)})
        result = dict(nodeclaim)
        result["metadata"] = {**meta, "labels": {**labels, **it.labels, **offering.labels()}}
        result["status"] = status
        return result

    def _rebuild(self, node: dict[str, Any]) -> _Instance | None:
        """The instance behind a kwok Node this process did not launch (a previous leader did), from the Node."""
        meta = node.get("metadata") or {}
        provider_id = str((node.get("spec") or {}).get("providerID") or "")
        labels = dict(meta.get("labels") or {})
        if not provider_id.startswith("kwok://") or labels.get(L.SIMULATED_NODE_LABEL) != "true" or \
                meta.get("deletionTimestamp"):
            return None
        annotations = dict(meta.get("annotations") or {})
        it = next((t for t in self.types if t.name == labels.get(L.INSTANCE_TYPE_LABEL)), None)
        backend = None
        if it is not None and it.gpu_model and it.gpu_count:
            sharing = sharing_of(labels, annotations, f"node {meta.get('name')}")
            backend = simulated_gpu_backend(it.gpu_model, it.gpu_count, sharing.mig_config)
        published = _ready(node) and not has_taint(node, L.UNREGISTERED_TAINT) and (backend is None or any(
            k.startswith("nvidia.com/") for k in ((node.get("status") or {}).get("allocatable") or {})))
        inst = _Instance(str(meta.get("name")), provider_id, labels.get(L.NODECLAIM_LABEL, ""),
                         self.clock.now() - self.registration_delay, backend, labels, annotations,
                         ready=_ready(node), published=published)
        return self.instances.setdefault(provider_id, inst)

    def _adopt(self) -> None:
        """Rebuild, once per process, every instance a previous one launched (their Nodes are all there is)."""
        if self._adopted:
            return
        for node in self.reader.list("Node", label_selector=f"{L.SIMULATED_NODE_LABEL}=true"):
            provider_id = (node.get("spec") or {}).get("providerID")
            if provider_id and provider_id not in self.instances:
                self._rebuild(node)
        self._adopted = True

    def _instance(self, provider_id: str) -> _Instance | None:
        """The running instance behind `provider_id`: the Node, read now, decides (not this process's memory)."""
        node_name = provider_id.removeprefix("kwok://") if provider_id.startswith("kwok://") else ""
        if not node_name:
            return None
        try:
            node = self.reader.get("Node", node_name)
        except NotFound:
            self._forget(provider_id)
            return None
        if (node.get("spec") or {}).get("providerID") != provider_id or \
                (node.get("metadata") or {}).get("deletionTimestamp"):
            self._forget(provider_id)   # its Node is going: the instance is terminated
            return None
        return self.instances.get(provider_id) or self._rebuild(node)

    def _forget(self, provider_id: str) -> None:
        inst = self.instances.pop(provider_id, None)
        self._fresh.pop(provider_id, None)
        if inst is not None and inst.backend is not None:
            inst.backend.close()

    def tick(self) -> None:
        """Once the registration delay has passed, the kubelet reports Ready; the device plugin publishes the GPUs
        only once the node is registered as well (no `kubegpu.io/unregistered` taint), as on a real node, where the
        plugin's DaemonSet pod cannot run before. `tick` runs before the pass that registers, so the GPUs appear a
        pass after the NoExecute taint goes, never in the same instant: were lifting it the last thing a GPU pod
        waited for, kube-scheduler would bind the pod at once, and kube-controller-manager's taint-eviction
        controller, whose Node informer can lag its Pod informer, could delete the pod as if the taint were still
        there (kubernetes#119862)."""
        self._adopt()
        now = self.clock.now()
        due = [inst for inst in list(self.instances.values())   # launches (other threads of `run`) add meanwhile
               if not inst.published and now >= inst.created + self.registration_delay]
        each_at_once(self._tick_one, due, self.parallelism)   # a burst's nodes come up together

    def launched_node(self, provider_id: str) -> dict[str, Any] | None:
        """The Node `create` made for `provider_id`, once (then forgotten): the lifecycle registers it in the pass
        that launched it, as the Node exists already (a real instance's kubelet registers its Node later)."""
        return self._fresh.pop(provider_id, None)

    def attach(self, cluster: Cluster) -> None:
        """Read through the autoscaler's informed view of the same cluster (`Autoscaler` calls this): a tick then
        reads each waiting Node from the informer's cache instead of GETting it from the API server every pass.
        Writes stay on the plain cluster: they are the cloud's (a kubelet's status, an instance's Node), and which
        replica may make the provider act at all is fenced where it calls `create` and `delete`, so replicas that
        share this provider, as they share a cloud, each act only while they lead."""
        self.reader = cluster

    def _tick_one(self, inst: _Instance) -> None:
        try:
            node = self.reader.get("Node", inst.node_name)
        except KubegpuError:
            return
        status: dict[str, Any] = {}
        if not inst.ready:
            status.update(READY_STATUS)
        registered = not has_taint(node, L.UNREGISTERED_TAINT)
        if registered and inst.backend is not None:
            sharing = sharing_of(inst.sharing_labels, inst.sharing_annotations, f"node {inst.node_name}")
            gpu = {k: str(v) for k, v in backend_allocatable(inst.backend, sharing).items()}
            gpu[GPU_MEMORY_RESOURCE] = str(discover_gpu_memory(inst.backend, sharing.plugin_config_dict))  # discovery's
            # a merge patch: the maps' other entries (cpu, memory, pods) stay as they are on the server
            status["allocatable"] = gpu
            status["capacity"] = gpu
        if status:
            self.cluster.patch("Node", inst.node_name, {"status": status}, subresource="status")
        if registered and inst.backend is not None:   # the DRA driver's slices appear with the device plugin's GPUs
            try:
                publish_node_slices(self.cluster, node, inst.backend)
            except KubegpuError:
                return   # not published yet: the next tick tries again
        inst.ready, inst.published = True, registered

    def delete(self, nodeclaim: dict[str, Any]) -> None:
        """Terminate the instance: delete its Node. Finalizers on the Node are not ours to remove (termination
        removes its own once it sees the instance gone); errors other than "already gone" are the caller's to
        retry."""
        provider_id = (nodeclaim.get("status") or {}).get("providerID") or ""
        inst = self._instance(provider_id)
        if inst is None:
            raise NodeClaimNotFoundError(f"nodeclaim {nodeclaim['metadata']['name']}: instance already gone")
        with contextlib.suppress(NotFound):
            self.cluster.delete("Node", inst.node_name)
        if inst.backend is not None:
            with contextlib.suppress(KubegpuError):   # owned by the Node: the garbage collector takes any left
                remove_node_slices(self.cluster, inst.node_name, inst.backend)
        self._forget(provider_id)

    def find(self, nodeclaim: dict[str, Any]) -> str | None:
        """The instance a launch made for the claim, from its Nodes: the one named from the claim's uid (every
        launch names it so), or one labelled with the claim's name; only a kwok Node that is not being deleted."""
        meta = nodeclaim.get("metadata") or {}
        name = str(meta.get("name") or "")
        nodes = []
        if meta.get("uid"):
            with contextlib.suppress(NotFound):
                nodes.append(self.reader.get("Node", kwok_node_name(name, str(meta["uid"]))))
        if name:
            nodes.extend(self.reader.list("Node", label_selector=f"{L.NODECLAIM_LABEL}={name}"))
        for node in nodes:
            provider_id = str((node.get("spec") or {}).get("providerID") or "")
            if provider_id.startswith("kwok://") and self._instance(provider_id) is not None:
                return provider_id
        return None

    def get(self, provider_id: str) -> dict[str, Any]:
        inst = self._instance(provider_id)
        if inst is None:
            raise NodeClaimNotFoundError(f"instance {provider_id} not found")
        return self.reader.get("Node", inst.node_name)

    def list(self) -> builtins.list[dict[str, Any]]:
        self._adopt()
        return super().list()

    def backend_for(self, node_name: str) -> GpuBackend | None:
        for inst in self.instances.values():
            if inst.node_name == node_name:
                return inst.backend
        return None
