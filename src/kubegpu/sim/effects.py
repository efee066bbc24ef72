"""Cluster effects: nodes joining and leaving, their devices and allocatable recomputed by the device plugin's
resource accounting (`kubegpu.sharing.devices`) over simulated GPUs (`kubegpu.sim.hardware`), GFD's labels, and the
MIG and MPS changes controllers ask for through `SimControl` — applied the way the partition agent applies them,
never evicting a running pod (`InstanceInUseError` instead). The Nodes are mirrored into the in-memory cluster.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from kubegpu.discovery.labels import compute_labels
from kubegpu.errors import ConfigError, NotFoundError
from kubegpu.gpu.catalog import GpuModel, get_model
from kubegpu.gpu.geometry import PlacedInstance, layout_errors
from kubegpu.kube.errors import NotFound
from kubegpu.scheduling import node_info
from kubegpu.sharing.devices import (
    config_dict,
    devices_by_resource,
    sharing_spec,
    strip_replica,
)
from kubegpu.sim import hardware
from kubegpu.sim.scenario import NodeGroup
from kubegpu.sim.strategies import NodeView
from kubegpu.sim.world import (
    _MPS_SLICE,
    _NODE,
    NODE_GROUP_LABEL,
    PODS_PER_NODE,
    Attempt,
    InstanceInUseError,
    Partition,
    SimCore,
    SimNode,
    _MigChange,
    _partition,
    _partition_key,
)


class ClusterEffects(SimCore):
    """The node side of `Simulation` (and of `SimControl`: nodes, set_mig_layout, set_sharing, add/remove_node)."""

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
        obj = _node_object(name, group, model, setup.labels)
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
        self._fleet_version += 1
        self._rebuild_devices(node)
        self.cluster.create(node.obj)

    def _rebuild_devices(self, node: SimNode, layout_changed: bool = True) -> None:
        """Recompute device IDs and allocatable from the resource accounting; keep running pods' devices held.
        `layout_changed=False` (nothing on the node's GPUs changed): only the free lists are put back in the device
        plugin's order and pending pods are tried again; partitions, labels and the Node object stay."""
        gpus = [gpu for gpu in node.gpus if gpu.index not in node.reconfiguring]
        mig = {index: devices for index, devices in node.mig.items() if index not in node.reconfiguring}
        slices = {i: s for i, s in node.mps_slices.items() if i not in node.reconfiguring}
        pending = {device_id for ids in node.mps_pending.values() for device_id in ids}  # new slices, not yet up
        try:
            by_resource = devices_by_resource(gpus, mig, node.config, slices)
        except ConfigError as exc:
            raise ConfigError(f"strategy {self.strategy.name}: node {node.name}: {exc}") from None
        # what `allocatable(..., unhealthy=pending)` counts, from the same lists (not computed a second time)
        counts = {name: sum(1 for d in devices if d.id not in pending) for name, devices in by_resource.items()}
        if pending:
            by_resource = {name: [d for d in devices if d.id not in pending] for name, devices in by_resource.items()}
        node.rejects_multiple_shared = sharing_spec(config_dict(node.config)).fail_requests_greater_than_one
        held = {device.id for run in node.running for device in run.devices}
        old_resources = set(node.allocatable)
        node.allocatable = counts
        node.free = {name: [d for d in devices if d.id not in held] for name, devices in by_resource.items()}
        if not layout_changed:
            node.touch()
            for resource in old_resources | set(counts):
                self._freed(resource)
            return
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

    def nodes(self) -> list[NodeView]:
        return [node.view() for node in self._nodes.values()]

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
        if any(change.mode_change or change.destroy for change in changes):
            _reread(target.hardware, node)
            self._rebuild_devices(target)
        else:  # only new instances, which appear after the delay: no device changed yet
            self._rebuild_devices(target, layout_changed=False)
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
        spot = self.scenario.spot_interruptions
        if spot is not None and spot.per_node_hour > 0:  # bought at run time: a spot node
            at = self.clock.now() + spot_lifetime(self.scenario.seed, node.name, spot.per_node_hour)
            self._push(at + spot.notice, _NODE, lambda: self._interrupt(node))
        return node.name

    def _interrupt(self, node: SimNode) -> None:
        """The spot notice ran out: the instance is reclaimed, whatever runs there is evicted (and requeued)."""
        if self._nodes.get(node.name) is not node:  # given back before the cloud took it
            return
        self.metrics.spot_interrupted(node.name, self.clock.now())
        self.remove_node(node.name)

    def remove_node(self, name: str) -> None:
        node = self._node(name)
        self._evict(node, lambda run: True)
        node.ready = False
        self._fleet_version += 1
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


def spot_lifetime(seed: int, node: str, per_node_hour: float) -> float:
    """Seconds from a spot node's purchase to its interruption notice: exponential with the given rate, drawn from
    an RNG of its own (seed and node name), so a node's fate does not depend on what else the run draws."""
    return random.Random(f"{seed}:spot:{node}").expovariate(per_node_hour / 3600.0)


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


def _node_object(name: str, group: NodeGroup, model: GpuModel, extra: Mapping[str, str]) -> dict[str, Any]:
    """The Node as the API server would hold it; its GPU labels are GFD's, set on every device rebuild."""
    labels = {**extra, "kubernetes.io/hostname": name, NODE_GROUP_LABEL: group.name}
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels},
            "spec": {}, "status": {"allocatable": {}, "capacity": {}}}


def _gfd_labels(node: SimNode) -> dict[str, str]:
    """What `kubegpu discover` would label this node with now: the same pure function, so a nodeSelector on
    `nvidia.com/gpu.product` or `nvidia.com/mig-2g.20gb.count` means in the simulator what it means in a cluster."""
    backend = node.hardware.backend
    return compute_labels(node.gpus, node.mig, node.config, backend.driver_version(), backend.cuda_driver_version(),
                          machine=None, now=None)
