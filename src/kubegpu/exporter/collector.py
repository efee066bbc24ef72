"""Turning one reading of the node into DCGM-named metric families.

Collection runs on its own interval and scrapes are served from the last snapshot, so a slow driver call or a slow
kubelet never makes Prometheus time out, and scrape latency does not grow with the number of GPUs.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from kubegpu.exporter.counters import CounterSet
from kubegpu.exporter.fields import FIELD_EXTRACTORS, EntityReading, label_field_value
from kubegpu.gpu.backend import GpuBackend
from kubegpu.sharing.attribution import EntityKey, PodInfo


@dataclass(frozen=True)
class NodeReading:
    driver_version: str
    entities: tuple[EntityReading, ...]


def read_node(backend: GpuBackend) -> NodeReading:
    """Every GPU, and every MIG instance of a GPU in MIG mode, with one sample each."""
    entities: list[EntityReading] = []
    for device in backend.devices():
        entities.append(EntityReading(device, None, backend.sample(device.index)))
        if device.mig_enabled:
            for mig in backend.mig_devices(device.index):
                entities.append(EntityReading(device, mig, backend.sample(device.index, mig.gi_id)))
    return NodeReading(driver_version=backend.driver_version(), entities=tuple(entities))


def entity_labels(
    entity: EntityReading, counters: CounterSet, driver_version: str, hostname: str | None
) -> dict[str, str]:
    """dcgm-exporter's label set, in its order: gpu, UUID, pci_bus_id, device, modelName, [GPU_I_*], Hostname."""
    device = entity.device
    labels = {
        "gpu": str(device.index),
        "UUID": device.uuid,
        "pci_bus_id": device.pci_bus_id,
        "device": f"nvidia{device.index}",
        "modelName": device.product_name,
    }
    if entity.mig is not None:
        labels["GPU_I_PROFILE"] = entity.mig.profile_name
        labels["GPU_I_ID"] = str(entity.mig.gi_id)
    if hostname is not None:
        labels["Hostname"] = hostname
    for spec in counters.labels:
        labels[spec.field] = label_field_value(spec.field, device, driver_version)
    return labels


def pod_labels(pod: PodInfo) -> dict[str, str]:
    labels = {"pod": pod.pod, "namespace": pod.namespace, "container": pod.container}
    if pod.vgpu is not None:
        labels["vgpu"] = pod.vgpu
    if pod.claim is not None:
        labels["claim"] = pod.claim
    return labels


def entity_key(entity: EntityReading) -> EntityKey:
    return (entity.device.index, entity.mig.gi_id if entity.mig is not None else None)


def build_families(
    reading: NodeReading,
    counters: CounterSet,
    holders: Mapping[EntityKey, Sequence[PodInfo]] | None,
    hostname: str | None,
) -> list[Metric]:
    """One family per counter; per entity one series per holding pod (each with its own labels), or one
    unattributed series when no pod holds it."""
    families = {spec.field: Metric(spec.field, spec.help, spec.type) for spec in counters.series}
    for entity in reading.entities:
        base = entity_labels(entity, counters, reading.driver_version, hostname)
        pods = (holders or {}).get(entity_key(entity), ())
        label_sets = [{**base, **pod_labels(pod)} for pod in pods] or [base]
        for spec in counters.series:
            value = FIELD_EXTRACTORS[spec.field](entity)
            if value is None:
                continue
            for labels in label_sets:
                families[spec.field].add_sample(spec.field, labels, value)
    return [family for family in families.values() if family.samples]


class SnapshotCollector(Collector):
    """A prometheus_client collector that serves whatever the collection loop last produced."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._families: list[Metric] = []

    def update(self, families: list[Metric]) -> None:
        with self._lock:
            self._families = families

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            families = self._families
        return iter(families)
