"""Node annotations between the partitioner and the partition agent (docs/internals.md), nos-shaped under kubegpu.io/.

Desired (controller):  kubegpu.io/spec-gpu-<i>-<profile>: "<count>"
                       kubegpu.io/spec-gpu-<i>-layout: "1g.10gb@0,2g.20gb@4"   (MPS: "10gb,20gb")
                       kubegpu.io/spec-partitioning-plan: "<plan id>"
Reported (agent):      kubegpu.io/status-gpu-<i>-<profile>-free|used: "<count>"
                       kubegpu.io/status-gpu-<i>-model: "<catalog key>"          (ours: the planner needs the model)
                       kubegpu.io/status-gpu-<i>-layout / -layout-used            (ours: placement of all / in-use)
                       kubegpu.io/status-partitioning-plan: "<plan id>"
`<profile>` is the MIG profile name with `+` written `.` (annotation keys allow no `+`), or `<N>gb` for MPS.
Writers replace their whole key family (stale keys set to null in one merge patch), as nos does.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from kubegpu.errors import ConfigError, NotFoundError
from kubegpu.gpu.catalog import GpuModel, get_model
from kubegpu.gpu.geometry import PlacedInstance, format_layout, parse_layout

PREFIX = "kubegpu.io/"
PARTITIONING_LABEL = PREFIX + "gpu-partitioning"
SPEC_PLAN = PREFIX + "spec-partitioning-plan"
STATUS_PLAN = PREFIX + "status-partitioning-plan"
_SPEC_LAYOUT = re.compile(r"^kubegpu\.io/spec-gpu-(\d+)-layout$")
_STATUS_MODEL = re.compile(r"^kubegpu\.io/status-gpu-(\d+)-model$")


def key_profile(model: GpuModel | None, profile_id: int | None = None, size_gb: int | None = None) -> str:
    if size_gb is not None:
        return f"{size_gb}gb"
    assert model is not None and profile_id is not None
    return model.profile(profile_id).resource_name.removeprefix("mig-")


def is_spec_key(key: str) -> bool:
    return key.startswith(PREFIX + "spec-gpu-") or key == SPEC_PLAN


def is_status_key(key: str) -> bool:
    return key.startswith(PREFIX + "status-gpu-") or key == STATUS_PLAN


def replace_family(current: Mapping[str, str], new: Mapping[str, str], family: str) -> dict[str, str | None]:
    """A merge patch that sets `new` and deletes every other key of `family` ("spec" or "status")."""
    belongs = is_spec_key if family == "spec" else is_status_key
    patch: dict[str, str | None] = {k: None for k in current if belongs(k) and k not in new}
    patch.update({k: v for k, v in new.items() if current.get(k) != v})
    return patch


# --- desired layout -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class DesiredGpu:
    index: int
    instances: tuple[PlacedInstance, ...] = ()  # MIG
    slices: tuple[int, ...] = ()  # MPS (GB)


def spec_annotations(mode: str, gpus: Sequence[tuple[int, GpuModel, Sequence[PlacedInstance] | Sequence[int]]],
                     plan_id: str) -> dict[str, str]:
    """Desired-state annotations for one node: per GPU its counts and exact layout, plus the plan id."""
    out: dict[str, str] = {SPEC_PLAN: plan_id}
    for index, model, items in gpus:
        if mode == "mps":
            sizes = [int(x) for x in items if isinstance(x, int)]
            out[f"{PREFIX}spec-gpu-{index}-layout"] = ",".join(f"{gb}gb" for gb in sizes)
            for gb, n in sorted(Counter(sizes).items()):
                out[f"{PREFIX}spec-gpu-{index}-{gb}gb"] = str(n)
        else:
            layout = [x for x in items if isinstance(x, PlacedInstance)]
            out[f"{PREFIX}spec-gpu-{index}-layout"] = format_layout(model, layout)
            for pid, n in sorted(Counter(i.profile_id for i in layout).items()):
                out[f"{PREFIX}spec-gpu-{index}-{key_profile(model, pid)}"] = str(n)
    return out


def parse_spec(annotations: Mapping[str, str], mode: str, models: Mapping[int, GpuModel]) -> list[DesiredGpu]:
    """The desired layout per GPU, read from the exact `-layout` keys; ConfigError naming the key if malformed."""
    desired = []
    for key, value in sorted(annotations.items()):
        m = _SPEC_LAYOUT.match(key)
        if not m:
            continue
        index = int(m.group(1))
        if mode == "mps":
            desired.append(DesiredGpu(index, slices=tuple(_parse_sizes(value, key))))
            continue
        if index not in models:
            raise ConfigError(f"annotation {key}: this node has no MIG-capable GPU {index}")
        desired.append(DesiredGpu(index, instances=tuple(parse_layout(models[index], value, f"annotation {key}"))))
    return desired


def _parse_sizes(value: str, source: str) -> list[int]:
    sizes = []
    for item in filter(None, (p.strip() for p in value.split(","))):
        m = re.fullmatch(r"(\d+)gb", item)
        if not m or int(m.group(1)) <= 0:
            raise ConfigError(f"annotation {source}: {item!r} is not <N>gb")
        sizes.append(int(m.group(1)))
    return sizes


# --- reported status ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ReportedGpu:
    index: int
    model_key: str
    instances: tuple[tuple[PlacedInstance, bool], ...] = ()  # MIG: (instance, used)
    slices: tuple[tuple[int, bool], ...] = ()  # MPS: (GB, used)


def status_annotations(mode: str, gpus: Sequence[ReportedGpu], plan_id: str | None,
                       per_gpu: Callable[[str, ReportedGpu], dict[str, str]] | None = None) -> dict[str, str]:
    """The agent's status annotations; `per_gpu` (default `gpu_status_annotations`) lets a caller that reports the
    same GPUs pass after pass (the simulator's agents) reuse each GPU's part."""
    out: dict[str, str] = {}
    if plan_id is not None:
        out[STATUS_PLAN] = plan_id
    for gpu in gpus:
        out.update((per_gpu or gpu_status_annotations)(mode, gpu))
    return out


def gpu_status_annotations(mode: str, gpu: ReportedGpu) -> dict[str, str]:
    """One GPU's status annotations: model, layout, instances in use, counts per profile."""
    out: dict[str, str] = {}
    base = f"{PREFIX}status-gpu-{gpu.index}"
    out[f"{base}-model"] = gpu.model_key
    counts: Counter[tuple[str, bool]] = Counter()
    if mode == "mps":
        out[f"{base}-layout"] = ",".join(f"{gb}gb" for gb, _ in gpu.slices)
        out[f"{base}-layout-used"] = ",".join(f"{gb}gb" for gb, used in gpu.slices if used)
        counts.update((f"{gb}gb", used) for gb, used in gpu.slices)
    else:
        model = get_model(gpu.model_key)
        out[f"{base}-layout"] = format_layout(model, [i for i, _ in gpu.instances])
        out[f"{base}-layout-used"] = format_layout(model, [i for i, used in gpu.instances if used])
        counts.update((key_profile(model, i.profile_id), used) for i, used in gpu.instances)
    for (profile, used), n in sorted(counts.items()):
        out[f"{base}-{profile}-{'used' if used else 'free'}"] = str(n)
    return out


def parse_status(annotations: Mapping[str, str], mode: str,
                 memo: dict[tuple[str, int, str, str, str], ReportedGpu | str] | None = None
                 ) -> tuple[list[ReportedGpu], list[str]]:
    """GPUs as the agent reported them; GPUs whose report cannot be read are returned as error lines instead.

    `memo` (the caller's, kept between calls) remembers each GPU's reading by its annotations: a controller reads
    the report again whenever one GPU of the node changed, and the others read as before."""
    gpus, errors = [], []
    for key, model_key in sorted(annotations.items()):
        m = _STATUS_MODEL.match(key)
        if not m:
            continue
        index = int(m.group(1))
        base = f"{PREFIX}status-gpu-{index}"
        layout, used = annotations.get(f"{base}-layout", ""), annotations.get(f"{base}-layout-used", "")
        if memo is not None:
            remembered = (mode, index, model_key, layout, used)
            found = memo.get(remembered)
            if found is None:
                if len(memo) > 100_000:
                    memo.clear()
                one, bad = parse_status({key: model_key, f"{base}-layout": layout, f"{base}-layout-used": used}, mode)
                found = memo[remembered] = one[0] if one else bad[0]
            if isinstance(found, str):
                errors.append(found)
            else:
                gpus.append(found)
            continue
        try:
            if mode == "mps":
                sizes, used_sizes = _parse_sizes(layout, f"{base}-layout"), Counter(_parse_sizes(used, base))
                slices = []
                for gb in sizes:
                    slices.append((gb, used_sizes[gb] > 0))
                    used_sizes[gb] -= 1
                gpus.append(ReportedGpu(index, model_key, slices=tuple(slices)))
                continue
            try:
                model = get_model(model_key)
            except NotFoundError:
                gpus.append(ReportedGpu(index, model_key))  # the planner reports unknown models itself
                continue
            everything = parse_layout(model, layout, f"annotation {base}-layout")
            in_use = set(parse_layout(model, used, f"annotation {base}-layout-used"))
            gpus.append(ReportedGpu(index, model.key, instances=tuple((i, i in in_use) for i in everything)))
        except ConfigError as exc:
            errors.append(str(exc))
    return gpus, errors


def node_mode(node: Mapping[str, Any]) -> Literal["mig", "mps"] | None:
    """How the node opted into dynamic partitioning (label `kubegpu.io/gpu-partitioning`), or None."""
    value = ((node.get("metadata") or {}).get("labels") or {}).get(PARTITIONING_LABEL)
    return "mig" if value == "mig" else "mps" if value == "mps" else None
