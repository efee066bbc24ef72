"""What a cluster gets without the partitioner: the "best static layout" the planner is measured against.

An admin without a dynamic partitioner cuts every GPU up front with one of mig-parted's default layouts
(`all-<profile>` at its max count, `all-balanced`; reference/mig-geometry-and-partitioning.md §2.2) and leaves it.
The baseline picks, per GPU model, the default layout that serves the pending pods best, applied uniformly to every
GPU of that model, trying every combination over the models present. Used by benchmarks/partitioner_quality.py.

A static layout cannot move instances in use either. Definition, per GPU: the instances in use stay where they
are; the static layout's own placement (`geometry.place` of the resolved profiles on an empty GPU) is laid over
them and each of its instances that still fits beside what is kept stays at its position; the ones that collide
are then re-placed, largest first, anywhere they still fit (`place` with everything kept fixed), and dropped if
they fit nowhere. The free instances of that layout, plus the current free instances of GPUs that cannot be cut
(MPS nodes, models outside the catalog or without MIG), are what pods can get.

Pods are then matched greedily, never re-cutting: highest priority first, then the largest request, then pods with
fewer eligible nodes (node selector, affinity, taints via `kubegpu.scheduling.fits`); each takes free instances on
the first eligible node (by name) that has all it asks for. Non-GPU resources (cpu, memory) are not checked.
Combinations compare like the planner's objective: pods placed, priority level by priority level, highest first.
Pure: no I/O, no clocks; everything is computed from the arguments.
"""

from __future__ import annotations

import itertools
import json
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from kubegpu.config.migparted import default_mig_parted_config, resolve_layout
from kubegpu.errors import KubegpuError
from kubegpu.gpu.backend import GpuDevice
from kubegpu.gpu.catalog import GpuModel
from kubegpu.gpu.geometry import PlacedInstance, layout_errors, place
from kubegpu.partitioner.planner import (
    UNLIMITED,
    GpuInput,
    NodeInput,
    is_partition_resource,
    mig_resource,
    mps_resource,
    pod_key,
    pod_priority,
)
from kubegpu.scheduling import NodeInfo, fits, pod_requests

_SIZE_GB = re.compile(r"(\d+)gb")


@dataclass(frozen=True)
class StaticBaseline:
    """The best static layout found: the mig-parted config name per GPU model, and where each served pod went."""

    layouts: dict[str, str]  # GPU model key → default layout name, e.g. "all-1g.10gb"
    assignments: dict[str, str]  # pod key → node whose free instances serve it


# ---------------------------------------------------------------------------------------------------------------
# Layouts


def static_layouts(model: GpuModel) -> dict[str, tuple[int, ...]]:
    """mig-parted's default layouts for one model, name → GI profile ids: `all-<profile>` for every profile
    without media extensions, and `all-balanced`. Resolved by `resolve_layout`, so the geometry is checked."""
    return dict(_static_layouts(model))


@lru_cache(maxsize=64)
def _static_layouts(model: GpuModel) -> tuple[tuple[str, tuple[int, ...]], ...]:
    config = default_mig_parted_config([model])
    names = [f"all-{p.config_name}" for p in model.mig_profiles if not p.media_extensions]
    if "all-balanced" in config.mig_configs:
        names.append("all-balanced")
    device = _device(model)
    layouts = []
    for name in names:
        profile_ids = resolve_layout(config, name, [device]).get(device.index)
        if profile_ids:
            layouts.append((name, tuple(profile_ids)))
    return tuple(layouts)


def _device(model: GpuModel) -> GpuDevice:
    """A stand-in GPU of `model` for `resolve_layout`, which selects GPUs by device id and MIG capability."""
    return GpuDevice(
        index=0, uuid=f"GPU-static-{model.key}", product_name=model.product_name, model_key=model.key,
        memory_mib=model.memory_mib, pci_bus_id="00000000:00:00.0", pci_device_id=model.pci_device_id,
        numa_node=None, compute_capability=model.compute_capability, multiprocessors=model.multiprocessors,
        mig_capable=model.mig_capable, mig_enabled=True, mig_pending=False,
    )


def static_gpu_layout(model: GpuModel, profile_ids: Sequence[int], in_use: Sequence[PlacedInstance]
                      ) -> tuple[PlacedInstance, ...]:
    """The whole layout a GPU has under a static layout when `in_use` instances cannot move (see the module
    docstring): the in-use instances first, then the static layout's instances that fit around them."""
    return _static_gpu_layout(model, tuple(profile_ids), tuple(sorted(in_use)))


@lru_cache(maxsize=16384)
def _static_gpu_layout(model: GpuModel, profile_ids: tuple[int, ...], in_use: tuple[PlacedInstance, ...]
                       ) -> tuple[PlacedInstance, ...]:
    wanted = place(model, profile_ids)
    if wanted is None or layout_errors(model, in_use):
        return in_use  # resolve_layout checked the layout; an illegal in-use layout is left as it is
    kept = list(in_use)
    collided: list[int] = []
    for instance in wanted:
        if layout_errors(model, [*kept, instance]):
            collided.append(instance.profile_id)
        else:
            kept.append(instance)
    slots = {p.profile_id: p.memory_slots for p in model.mig_profiles}
    for profile_id in sorted(collided, key=lambda p: -slots[p]):
        placed = place(model, [profile_id], kept)
        if placed is not None:
            kept = placed
    return tuple(kept)


def _free_under(gpu: GpuInput, profile_ids: Sequence[int] | None) -> Counter[str]:
    """Free partition resources of one GPU: under a static layout, or as it is now (`profile_ids` None)."""
    model = gpu.model
    if gpu.slices:
        return Counter(mps_resource(s.size_gb) for s in gpu.slices if not s.used)
    if model is None:
        return Counter()
    if profile_ids is None:
        return Counter(mig_resource(model, i.profile_id) for i in gpu.instances if not i.used)
    in_use = [PlacedInstance(i.profile_id, i.start) for i in gpu.instances if i.used]
    layout = static_gpu_layout(model, profile_ids, in_use)
    return Counter(mig_resource(model, i.profile_id) for i in layout[len(in_use):])


def _cuttable(node: NodeInput, gpu: GpuInput) -> GpuModel | None:
    return gpu.model if node.mode == "mig" and gpu.model is not None and gpu.model.mig_capable else None


# ---------------------------------------------------------------------------------------------------------------
# Pods


@dataclass(frozen=True)
class _PodClass:
    """Pods that are interchangeable for the matching: same units, priority and eligible nodes."""

    units: Counter[str]
    priority: int
    nodes: tuple[str, ...]
    keys: tuple[str, ...]

    def sort_key(self) -> tuple[Any, ...]:
        size = sum(_size_gb(u) * n for u, n in self.units.items())
        return (-self.priority, -size, len(self.nodes), sorted(self.units.items()))


def _size_gb(resource: str) -> int:
    """Memory of one unit, from its name (`mig-3g.40gb` → 40, `gpu-20gb` → 20): the larger request goes first."""
    sizes = _SIZE_GB.findall(resource)
    return int(sizes[-1]) if sizes else 0


def _pod_classes(nodes: Sequence[NodeInput], pods: Sequence[dict[str, Any]]) -> list[_PodClass]:
    """Pending pods asking for partition resources, grouped and in matching order. Pods with malformed requests
    or none of these resources are left out: no layout serves them."""
    eligible_cache: dict[str, tuple[str, ...]] = {}
    groups: dict[tuple[Any, ...], list[str]] = {}
    for pod in pods:
        try:
            requests = pod_requests(pod)
        except KubegpuError:
            continue
        units = tuple(sorted((r, round(q)) for r, q in requests.items() if is_partition_resource(r) and q > 0))
        if not units:
            continue
        key = (units, pod_priority(pod), _eligible(pod, nodes, eligible_cache))
        groups.setdefault(key, []).append(pod_key(pod))
    classes = [_PodClass(Counter(dict(units)), priority, names, tuple(sorted(keys)))
               for (units, priority, names), keys in groups.items()]
    return sorted(classes, key=_PodClass.sort_key)


def _eligible(pod: dict[str, Any], nodes: Sequence[NodeInput], cache: dict[str, tuple[str, ...]]) -> tuple[str, ...]:
    """Nodes, by name, whose labels, taints and required affinity admit the pod (GPU capacity aside)."""
    spec = pod.get("spec") or {}
    signature = json.dumps([spec.get("nodeSelector"), spec.get("affinity"), spec.get("tolerations")],
                           sort_keys=True, default=str)
    if signature not in cache:
        kept = {k: v for k, v in spec.items() if k not in ("containers", "initContainers", "overhead")}
        probe = {**pod, "spec": {**kept, "containers": []}}
        cache[signature] = tuple(sorted(
            n.name for n in nodes
            if fits(probe, NodeInfo(node=n.node, allocatable={"pods": UNLIMITED}, requested={}, pods=[])).ok))
    return cache[signature]


def _match(classes: Sequence[_PodClass], free: Mapping[str, Counter[str]]) -> list[list[tuple[str, int]]]:
    """Greedy matching, class by class in order: per class, (node, pods placed there) in node-name order."""
    left = {name: Counter(counts) for name, counts in free.items()}
    placed: list[list[tuple[str, int]]] = []
    for cls in classes:
        wanted = len(cls.keys)
        here: list[tuple[str, int]] = []
        for name in cls.nodes:
            if not wanted:
                break
            counts = left[name]
            n = min(wanted, *(counts[u] // k for u, k in cls.units.items()))
            if n > 0:
                for unit, k in cls.units.items():
                    counts[unit] -= n * k
                here.append((name, n))
                wanted -= n
        placed.append(here)
    return placed


def _score(classes: Sequence[_PodClass], placed: Sequence[Sequence[tuple[str, int]]]) -> tuple[int, ...]:
    """Pods placed per priority level, highest first: larger is better, compared as a tuple."""
    per_level: Counter[int] = Counter()
    for cls, here in zip(classes, placed, strict=True):
        per_level[cls.priority] += sum(n for _, n in here)
    return tuple(per_level[p] for p in sorted({c.priority for c in classes}, reverse=True))


# ---------------------------------------------------------------------------------------------------------------
# The baseline


def best_static_layout(nodes: Sequence[NodeInput], pods: Sequence[dict[str, Any]]) -> StaticBaseline:
    """The best static layout for these pending pods: every combination of one default layout per GPU model,
    first in (model key, layout order) on a tie; see the module docstring for what "static" allows."""
    classes = _pod_classes(nodes, pods)
    models = {m.key: m for node in nodes for gpu in node.gpus if (m := _cuttable(node, gpu)) is not None}
    keys = sorted(models)
    options = [static_layouts(models[k]) for k in keys]
    parts = _free_parts(nodes, options, keys)
    best: tuple[tuple[int, ...], dict[str, str], list[list[tuple[str, int]]]] | None = None
    for names in itertools.product(*(list(o) for o in options)):
        choice = dict(zip(keys, names, strict=True))
        free = {node.name: _node_free(parts[node.name], choice) for node in nodes}
        placed = _match(classes, free)
        score = _score(classes, placed)
        if best is None or score > best[0]:
            best = (score, choice, placed)
    assert best is not None  # product() of no options yields one empty combination
    return StaticBaseline(layouts=best[1], assignments=_assignments(classes, best[2]))


_Parts = tuple[Counter[str], dict[tuple[str, str], Counter[str]]]


def _free_parts(nodes: Sequence[NodeInput], options: Sequence[Mapping[str, tuple[int, ...]]], keys: Sequence[str]
                ) -> dict[str, _Parts]:
    """Per node: the free resources of GPUs that are not cut, and per (model, layout name) those of its GPUs of
    that model under that layout. Computed once, so each combination only adds counters."""
    by_key = dict(zip(keys, options, strict=True))
    parts: dict[str, _Parts] = {}
    for node in nodes:
        fixed: Counter[str] = Counter()
        cut: dict[tuple[str, str], Counter[str]] = {}
        for gpu in node.gpus:
            model = _cuttable(node, gpu)
            if model is None:
                fixed.update(_free_under(gpu, None))
                continue
            for name, profile_ids in by_key[model.key].items():
                cut.setdefault((model.key, name), Counter()).update(_free_under(gpu, profile_ids))
        parts[node.name] = (fixed, cut)
    return parts


def _node_free(parts: _Parts, choice: Mapping[str, str]) -> Counter[str]:
    fixed, cut = parts
    total = Counter(fixed)
    for (model_key, name), counts in cut.items():
        if choice[model_key] == name:
            total.update(counts)
    return total


def _assignments(classes: Sequence[_PodClass], placed: Sequence[Sequence[tuple[str, int]]]) -> dict[str, str]:
    """Pod key → node: within a class, pods by key take the class's places in node-name order."""
    result: dict[str, str] = {}
    for cls, here in zip(classes, placed, strict=True):
        pods = iter(cls.keys)
        for name, n in here:
            for key in itertools.islice(pods, n):
                result[key] = name
    return result
