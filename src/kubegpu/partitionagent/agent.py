"""The partition agent: applies the desired layout the partitioner wrote on its Node, and reports what is there.

MIG: destroys and creates GPU instances at the exact placements asked for, through the GpuBackend; an instance with
processes on it is never destroyed — the agent refuses that GPU's change and says so (an Event on the Node). The
device plugin notices the new instances on its next re-list; nothing is restarted (docs/internals.md).
MPS: writes the memory-slice file the device plugin reads (`{"<gpu index>": [<GB>, ...]}` in a checksummed
envelope); a torn or foreign slices file is rebuilt from the plan on the Node, with one log line.
Either way it then reports free/used counts, the placement of every instance and the plan id it has handled.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubegpu.errors import KubegpuError, NotFoundError
from kubegpu.files import CorruptStateError
from kubegpu.gpu.backend import GpuBackend, GpuDevice, MigDevice
from kubegpu.gpu.catalog import GpuModel, get_model
from kubegpu.gpu.geometry import PlacedInstance, format_layout, layout_errors
from kubegpu.kube import Cluster, record_event
from kubegpu.partitionagent import annotations as ann
from kubegpu.partitionagent.annotations import node_mode
from kubegpu.scheduling import is_finished, pod_requests
from kubegpu.sharing.attribution import ContainerDevices, attribute
from kubegpu.sharing.mps import read_slices, write_slices
from kubegpu.sharing.names import mps_slice_size_of

log = logging.getLogger("kubegpu.partition-agent")
COMPONENT = "kubegpu-partition-agent"


@dataclass
class ApplyReport:
    created: list[str] = field(default_factory=list)  # "gpu0:2g.20gb@4"
    destroyed: list[str] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)  # one line per GPU left unchanged, with why


@dataclass
class PartitionAgent:
    cluster: Cluster
    backend: GpuBackend
    node_name: str
    mps_slices_file: Path | None = None
    allocations: Callable[[], Sequence[ContainerDevices] | None] | None = None  # kubelet pod-resources List
    applied_plan: str | None = None
    last: ApplyReport | None = None

    def tick(self) -> ApplyReport | None:
        """Apply a new desired layout if there is one, then report. Returns what the apply did (None: nothing new)."""
        node = self.cluster.get("Node", self.node_name)
        mode = node_mode(node)
        if mode is None:
            return None
        annotations = (node.get("metadata") or {}).get("annotations") or {}
        spec_plan = annotations.get(ann.SPEC_PLAN)
        report = None
        if spec_plan is not None and spec_plan != self.applied_plan:
            report = self.apply(node, mode, annotations)
            self.applied_plan = spec_plan
            self.last = report
        self.report(node, mode)
        return report

    # --- apply --------------------------------------------------------------------------------------------------

    def apply(self, node: dict[str, Any], mode: str, annotations: Mapping[str, str]) -> ApplyReport:
        report = ApplyReport()
        devices = {d.index: d for d in self.backend.devices()}
        models = {i: m for i, d in devices.items() if (m := _model(d)) is not None and m.mig_capable}
        try:
            desired = ann.parse_spec(annotations, mode, models)
        except KubegpuError as exc:
            report.refused.append(str(exc))
            self._event(node, "PartitioningRefused", str(exc))
            return report
        if mode == "mps":
            self._apply_mps(node, {d.index: d.slices for d in desired}, devices, report)
        else:
            for gpu in desired:
                self._apply_mig(node, devices.get(gpu.index), models.get(gpu.index), gpu.index,
                                list(gpu.instances), report)
        return report

    def _apply_mig(self, node: dict[str, Any], device: GpuDevice | None, model: GpuModel | None, index: int,
                   wanted: list[PlacedInstance], report: ApplyReport) -> None:
        refusal = _mig_refusal(device, model, wanted)
        destroy: list[MigDevice] = []
        create: list[PlacedInstance] = []
        if refusal is None and device is not None:
            current = self.backend.mig_devices(index)
            destroy = _take_surplus(current, Counter(wanted))
            create = list((Counter(wanted) - Counter(PlacedInstance(m.profile_id, m.start) for m in current))
                          .elements())
            refusal = self._destroy_refusal(device, destroy) if destroy else None
        if refusal is not None or model is None:
            line = f"GPU {index}: refusing the new layout: {refusal}"
            report.refused.append(line)
            self._event(node, "PartitioningRefused", line)
            return
        try:
            for mig in destroy:
                self.backend.destroy_mig_device(index, mig.gi_id)
                report.destroyed.append(f"gpu{index}:{mig.profile_name}@{mig.start}")
            for inst in sorted(create, key=lambda i: (-model.profile(i.profile_id).memory_slots, i.start)):
                self.backend.create_mig_device(index, inst.profile_id, inst.start)
                report.created.append(f"gpu{index}:{format_layout(model, [inst])}")
        except KubegpuError as exc:
            line = f"GPU {index}: applying the layout failed: {exc}"
            report.refused.append(line)
            self._event(node, "PartitioningFailed", line)

    def _destroy_refusal(self, device: GpuDevice, destroy: Sequence[MigDevice]) -> str | None:
        """Why these instances may not be destroyed, or None: in use by a process, or allocated to a container by
        the kubelet (a pod whose process has not started yet), or the kubelet could not be asked."""
        busy = self._used_gi_ids(device.index)
        if self.allocations is not None:
            containers = self.allocations()
            if containers is None:
                return "cannot tell which instances are allocated (the kubelet's pod-resources did not answer)"
            busy |= {gi for (_, gi) in attribute(containers, [device], destroy) if gi is not None}
        taken = [m for m in destroy if m.gi_id in busy]
        return f"instance {taken[0].profile_name}@{taken[0].start} is in use" if taken else None

    def _used_gi_ids(self, index: int) -> set[int]:
        return {p.gi_id for p in self.backend.processes(index) if p.gi_id is not None}

    def _allocated_gi_ids(self, device: GpuDevice, migs: Sequence[MigDevice]) -> set[int]:
        containers = self.allocations() if self.allocations is not None else None
        return {gi for (_, gi) in attribute(containers or [], [device], migs) if gi is not None}

    def _apply_mps(self, node: dict[str, Any], wanted: Mapping[int, Sequence[int]], devices: Mapping[int, GpuDevice],
                   report: ApplyReport) -> None:
        if self.mps_slices_file is None:
            line = "MPS layout asked for but the agent runs without --mps-slices-file"
            report.refused.append(line)
            self._event(node, "PartitioningRefused", line)
            return
        try:
            current = self._current_slices(node)
        except KubegpuError as exc:
            line = f"MPS layout not applied: {exc}"
            report.refused.append(line)
            self._event(node, "PartitioningRefused", line)
            return
        used = self._mps_used(current)
        result = dict(current)
        for index, sizes in sorted(wanted.items()):
            device = devices.get(index)
            capacity = device.memory_mib // 1024 if device else 0
            missing = used.get(index, Counter()) - Counter(sizes)
            if device is None or sum(sizes) > capacity or missing:
                why = ("no such GPU" if device is None else f"slices exceed {capacity} GB" if sum(sizes) > capacity
                       else f"slice {next(iter(missing))}gb is in use")
                line = f"GPU {index}: refusing the new slices: {why}"
                report.refused.append(line)
                self._event(node, "PartitioningRefused", line)
                continue
            before, after = Counter(current.get(index, [])), Counter(sizes)
            report.created += [f"gpu{index}:{gb}gb" for gb in (after - before).elements()]
            report.destroyed += [f"gpu{index}:{gb}gb" for gb in (before - after).elements()]
            result[index] = list(sizes)
        if result != current:
            write_slices(self.mps_slices_file, result)

    def _current_slices(self, node: dict[str, Any]) -> dict[int, list[int]]:
        """The slices file; a torn or foreign one is rebuilt from the plan on the Node, its source of truth."""
        assert self.mps_slices_file is not None
        try:
            return read_slices(self.mps_slices_file)
        except CorruptStateError as exc:
            annotations = (node.get("metadata") or {}).get("annotations") or {}
            try:
                rebuilt = {gpu.index: list(gpu.slices) for gpu in ann.parse_spec(annotations, "mps", {})}
            except KubegpuError:
                rebuilt = {}  # no readable plan: no slices, the state before any plan was applied
            write_slices(self.mps_slices_file, rebuilt)
            log.warning("%s; rebuilt it from the plan on Node %s (%d GPUs)", exc, self.node_name, len(rebuilt))
            return rebuilt

    def _mps_used(self, current: Mapping[int, Sequence[int]]) -> dict[int, Counter[int]]:
        """Slices held by pods on this node, attributed to GPUs in index order (the plugin hands them out so)."""
        held: Counter[int] = Counter()
        for pod in self.cluster.list("Pod", field_selector=f"spec.nodeName={self.node_name}"):
            if is_finished(pod):
                continue
            if (pod.get("spec") or {}).get("nodeName") != self.node_name:
                continue
            for resource, amount in pod_requests(pod).items():
                if (size := mps_slice_size_of(resource)) is not None:
                    held[size] += int(amount)
        used: dict[int, Counter[int]] = {}
        for index, sizes in sorted(current.items()):
            for gb in sizes:
                if held[gb] > 0:
                    used.setdefault(index, Counter())[gb] += 1
                    held[gb] -= 1
        return used

    # --- report -------------------------------------------------------------------------------------------------

    def report(self, node: dict[str, Any], mode: str) -> None:
        gpus = []
        slices: dict[int, list[int]] = {}
        if mode == "mps" and self.mps_slices_file:
            try:
                slices = self._current_slices(node)
            except KubegpuError as exc:
                log.error("%s", exc)  # reported once per pass; the GPUs show no slices until it is fixed
        used_mps = self._mps_used(slices) if mode == "mps" else {}
        for device in self.backend.devices():
            model = _model(device)
            key = model.key if model else device.product_name
            if mode == "mps":
                left = Counter(used_mps.get(device.index, Counter()))
                entries = []
                for gb in slices.get(device.index, []):
                    entries.append((gb, left[gb] > 0))
                    left[gb] -= 1
                gpus.append(ann.ReportedGpu(device.index, key, slices=tuple(entries)))
            elif model is not None and device.mig_enabled:
                migs = self.backend.mig_devices(device.index)
                used = self._used_gi_ids(device.index) | self._allocated_gi_ids(device, migs)
                gpus.append(ann.ReportedGpu(device.index, key, instances=tuple(
                    (PlacedInstance(m.profile_id, m.start), m.gi_id in used) for m in migs)))
            elif model is None:
                gpus.append(ann.ReportedGpu(device.index, key))
        current = (node.get("metadata") or {}).get("annotations") or {}
        plan_id = self.applied_plan if self.applied_plan is not None else current.get(ann.STATUS_PLAN)
        patch = ann.replace_family(current, ann.status_annotations(mode, gpus, plan_id), "status")
        if patch:
            self.cluster.patch("Node", self.node_name, {"metadata": {"annotations": patch}})

    def _event(self, node: dict[str, Any], reason: str, message: str) -> None:
        log.warning("%s: %s", self.node_name, message)
        try:
            record_event(self.cluster, node, reason, message, component=COMPONENT)
        except KubegpuError as exc:
            log.warning("cannot record event: %s", exc)


def _model(device: GpuDevice) -> GpuModel | None:
    for key in (device.model_key, device.product_name, device.pci_device_id):
        if key:
            try:
                return get_model(key)
            except NotFoundError:
                continue
    return None


def _mig_refusal(device: GpuDevice | None, model: GpuModel | None, wanted: list[PlacedInstance]) -> str | None:
    if device is None:
        return "no such GPU on this node"
    if model is None:
        return f"GPU model {device.product_name!r} is not in the catalog"
    if not device.mig_enabled:
        return "MIG mode is disabled (enable it with the MIG manager first)"
    errors = layout_errors(model, wanted)
    return f"layout is not legal: {errors[0]}" if errors else None


def _take_surplus(current: Sequence[MigDevice], wanted: Counter[PlacedInstance]) -> list[MigDevice]:
    """The current MIG devices the wanted layout has no place for."""
    left = Counter(wanted)
    surplus = []
    for mig in current:
        inst = PlacedInstance(mig.profile_id, mig.start)
        if left[inst] > 0:
            left[inst] -= 1
        else:
            surplus.append(mig)
    return surplus
