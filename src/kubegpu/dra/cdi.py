"""CDI specs for prepared claims: one transient spec file per claim, devices named `<claimUID>-<deviceName>` under
NVIDIA's kind `k8s.gpu.nvidia.com/claim` (reference/dra.md §5.6). Which /dev nodes a GPU or MIG device needs comes
from `kubegpu.sharing.cdi`, shared with the device plugin. Environment goes in the spec-level edits, once per claim:
CDI merges device edits in order, so a variable set per device would keep only the last device's value. MPS claims
get a daemon plan from `kubegpu.sharing.mps` (the device plugin's arithmetic), whose pipe and log directories are
mounted and whose limits reach the CUDA runtime through the environment."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from kubegpu.dra.devices import Placement
from kubegpu.errors import KubegpuError
from kubegpu.files import write_durable
from kubegpu.gpu.backend import MigDevice
from kubegpu.sharing.cdi import CDI_VERSION, CONTROL_DEVICES, device_node, device_nodes, ensure_stand_ins
from kubegpu.sharing.claimconfig import Sharing
from kubegpu.sharing.devices import AnnotatedDevice
from kubegpu.sharing.mps import DEFAULT_MPS_ROOT, GpuLimits, MpsPlan

CDI_VENDOR = "k8s.gpu.nvidia.com"
CDI_CLASS = "claim"
CDI_KIND = f"{CDI_VENDOR}/{CDI_CLASS}"


def qualified_name(claim_uid: str, device: str) -> str:
    return f"{CDI_KIND}={claim_uid}-{device}"


def spec_path(root: Path, claim_uid: str) -> Path:
    return root / f"{CDI_VENDOR}-{CDI_CLASS}_{claim_uid}.json"


MPS_CONTAINER_ROOT = "/mps"


def mps_plan(claim_uid: str, devices: Sequence[tuple[str, Placement, MigDevice | None, Sharing]],
             mps_root: str) -> MpsPlan | None:
    """The MPS control daemon a claim's MPS-shared devices need (`kubegpu.sharing.mps`, as the device plugin plans
    its daemons): pipe and log directories of its own, and per GPU the claim's pinned-memory limit (the per-device
    map by index or UUID first, then the default) and active-thread percentage."""
    limits: dict[int, GpuLimits] = {}
    for _, placement, _, sharing in devices:
        if sharing.strategy != "MPS" or placement.gpu_index in limits:
            continue
        per_device = sharing.per_device_pinned_mib
        pinned = per_device.get(placement.gpu_uuid, per_device.get(str(placement.gpu_index),
                                                                    sharing.pinned_memory_mib or 0))
        limits[placement.gpu_index] = GpuLimits(placement.gpu_index, placement.gpu_uuid, 1, int(pinned),
                                                int(sharing.thread_percentage or 100))
    if not limits:
        return None
    base = f"{mps_root.rstrip('/')}/claim-{claim_uid}"
    return MpsPlan(f"claim-{claim_uid}", f"{base}/pipe", f"{base}/log", tuple(limits[i] for i in sorted(limits)))


Prepared = tuple[str, Placement, MigDevice | None, Sharing]  # device name, what it is, its MIG device, its sharing


def _environment(devices: Sequence[Prepared], plan: MpsPlan | None) -> list[str]:
    """The claim's environment: every device's UUID, then MPS limits (device ordinals in the container) or the
    time-slice interval."""
    uuids = [mig.uuid if mig else placement.gpu_uuid for _, placement, mig, _ in devices]
    env = [f"NVIDIA_VISIBLE_DEVICES={','.join(uuids) or 'void'}"]
    strategies = {sharing.strategy for *_, sharing in devices}
    if plan is not None:
        env.append(f"CUDA_MPS_PIPE_DIRECTORY={MPS_CONTAINER_ROOT}/pipe")
        env.append(f"CUDA_MPS_LOG_DIRECTORY={MPS_CONTAINER_ROOT}/log")
        env.append(f"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE={min(g.active_thread_percentage for g in plan.gpus)}")
        by_gpu = {g.gpu_index: g.pinned_memory_mib for g in plan.gpus}
        limits = [f"{n}={by_gpu[p.gpu_index]}M" for n, (_, p, _, _) in enumerate(devices) if by_gpu.get(p.gpu_index)]
        if limits:
            env.append(f"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT={','.join(limits)}")
    elif "TimeSlicing" in strategies:
        interval = next(s.interval for *_, s in devices if s.strategy == "TimeSlicing")
        env.append(f"KUBEGPU_TIME_SLICE_INTERVAL={interval}")
    return env


def _mps_mounts(plan: MpsPlan, mps_root: str) -> list[dict[str, Any]]:
    return [
        {"hostPath": plan.pipe_dir, "containerPath": f"{MPS_CONTAINER_ROOT}/pipe", "options": ["rbind", "rw"]},
        {"hostPath": plan.log_dir, "containerPath": f"{MPS_CONTAINER_ROOT}/log", "options": ["rbind", "ro"]},
        {"hostPath": f"{mps_root.rstrip('/')}/shm", "containerPath": "/dev/shm", "options": ["rbind", "rw"]},
    ]


def claim_spec(claim_uid: str, devices: Sequence[tuple[str, Placement, MigDevice | None, Sharing]],
               minors: Mapping[int, int], dev_root: str = "/", mps_root: str = DEFAULT_MPS_ROOT,
               stand_ins: str | None = None) -> dict[str, Any]:
    """The CDI spec of one claim; `minors`: GPU index → /dev/nvidia<minor>; `stand_ins`: a simulated node's
    stand-in device directory, named as every node's host path (`kubegpu.sharing.cdi.host_path`)."""
    plan = mps_plan(claim_uid, devices, mps_root)
    entries = []
    for name, placement, mig, _ in devices:
        annotated = AnnotatedDevice(id=name, resource="", gpu_index=placement.gpu_index, gpu_uuid=placement.gpu_uuid,
                                    mig=mig, replica=None, replicas=1, numa_node=None,
                                    physical_id=mig.uuid if mig else placement.gpu_uuid,
                                    minor=minors.get(placement.gpu_index, -1))
        nodes = [device_node(node, dev_root, stand_ins) for node in device_nodes(annotated)]
        entries.append({"name": f"{claim_uid}-{name}", "containerEdits": {"deviceNodes": nodes}})
    edits: dict[str, Any] = {"env": _environment(devices, plan),
                             "deviceNodes": [device_node(p, dev_root, stand_ins) for p in CONTROL_DEVICES]}
    if plan is not None:
        edits["mounts"] = _mps_mounts(plan, mps_root)
    return {"cdiVersion": CDI_VERSION, "kind": CDI_KIND, "devices": entries, "containerEdits": edits}


def write_claim_spec(root: Path, claim_uid: str, spec: dict[str, Any], stand_ins: str | None = None) -> Path:
    """Write one claim's spec (compact, atomically), after making the simulated node's stand-ins it names."""
    ensure_stand_ins(spec, stand_ins)
    target = spec_path(root, claim_uid)
    try:
        root.mkdir(parents=True, exist_ok=True)
        write_durable(target, json.dumps(spec, separators=(",", ":")))  # compact: C-encoded, read by runtimes
    except OSError as exc:
        raise KubegpuError(f"{target}: cannot write CDI spec: {exc.strerror or exc}") from exc
    return target


def claim_spec_uids(root: Path) -> list[str]:
    """Claim UIDs that have a spec file under `root`."""
    prefix = f"{CDI_VENDOR}-{CDI_CLASS}_"
    if not root.is_dir():
        return []
    return sorted(p.name[len(prefix):-len(".json")] for p in root.glob(f"{prefix}*.json"))


def remove_claim_spec(root: Path, claim_uid: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        spec_path(root, claim_uid).unlink()
