"""A fake `pynvml` (nvidia-ml-py) that models an 8x A100-SXM4-80GB node, for testing NVML adapters without a GPU.

It implements the part of the NVML surface kubegpu's adapters call — devices, MIG mode, GPU/compute instances
with placements, MIG device handles, processes, counters, XID event sets — with NVML's rules: MIG mode on
Ampere stays pending until a reset, GIs only at the driver's legal placements, a GI with compute instances or
processes is "in use", an empty event wait times out. The A100-80GB tables below are written out independently
of `kubegpu.gpu.catalog` (from `nvidia-smi mig -lgip/-lgipp` dumps), so the adapter is checked against data it
did not produce. Constants, error codes and ctypes structs are nvidia-ml-py's own.

Use `FakeNvml()` as the module (`NvmlBackend(module=FakeNvml())`); each instance is an independent node. The
`fake_*` methods play the world outside NVML: resets, processes, load and injected XIDs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pynvml as _real

MIB = 1024 * 1024
NO_INSTANCE = 0xFFFFFFFF


class NVMLError(Exception):
    """Like pynvml.NVMLError: `.value` is the NVML return code."""

    value: int = 999
    message = "Unknown Error"

    def __init__(self, value: int | None = None) -> None:
        if value is not None:
            self.value = value
        super().__init__(self.message)

    def __str__(self) -> str:
        return self.message


def _error_class(name: str, code: int, message: str) -> type[NVMLError]:
    return type(name, (NVMLError,), {"value": code, "message": message})


NVMLError_Uninitialized = _error_class("NVMLError_Uninitialized", 1, "Uninitialized")
NVMLError_InvalidArgument = _error_class("NVMLError_InvalidArgument", 2, "Invalid Argument")
NVMLError_NotSupported = _error_class("NVMLError_NotSupported", 3, "Not Supported")
NVMLError_NoPermission = _error_class("NVMLError_NoPermission", 4, "Insufficient Permissions")
NVMLError_NotFound = _error_class("NVMLError_NotFound", 6, "Not Found")
NVMLError_Timeout = _error_class("NVMLError_Timeout", 10, "Timeout")
NVMLError_LibraryNotFound = _error_class("NVMLError_LibraryNotFound", 12, "NVML Shared Library Not Found")
NVMLError_InUse = _error_class("NVMLError_InUse", 19, "In use by another client")
NVMLError_InsufficientResources = _error_class("NVMLError_InsufficientResources", 23, "Insufficient Resources")

# GI profile enum -> (profile id, name, memory slots, SM slices, SMs, memory MiB, max count, starts)
A100_80GB_GI_PROFILES: dict[int, tuple[int, str, int, int, int, int, int, tuple[int, ...]]] = {
    0: (19, "MIG 1g.10gb", 1, 1, 14, 9984, 7, (0, 1, 2, 3, 4, 5, 6)),
    7: (20, "MIG 1g.10gb+me", 1, 1, 14, 9984, 1, (0, 1, 2, 3, 4, 5, 6)),
    9: (15, "MIG 1g.20gb", 2, 1, 14, 19968, 4, (0, 2, 4, 6)),
    1: (14, "MIG 2g.20gb", 2, 2, 28, 19968, 3, (0, 2, 4)),
    2: (9, "MIG 3g.40gb", 4, 3, 42, 40192, 2, (0, 4)),
    3: (5, "MIG 4g.40gb", 4, 4, 56, 40192, 1, (0,)),
    4: (0, "MIG 7g.80gb", 8, 7, 98, 80384, 1, (0,)),
}
CI_SLICES = {0: 1, 1: 2, 2: 3, 3: 4, 4: 7}  # CI profile enum -> SM slices
BUSES = ("07", "0F", "47", "4E", "87", "90", "B7", "BD")


def _gi_id(profile_id: int, start: int) -> int:
    """Placement-derived GI ids like a real A100 (7g is GI 0); unique among instances that can coexist."""
    if profile_id == 0:
        return 0
    if profile_id in (5, 9):
        return 1 + start // 4
    if profile_id in (14, 15):
        return 3 + start // 2
    return 7 + start


@dataclass
class _Gpu:
    index: int
    minor: int  # /dev/nvidia<minor>: the driver's probe order, deliberately not the NVML index here
    mig_current: int = 0
    mig_pending: int = 0
    instances: dict[int, _GpuInstance] = field(default_factory=dict)
    processes: list[SimpleNamespace] = field(default_factory=list)
    util: int = 0
    memory_used_mib: int = 0


@dataclass
class _GpuInstance:
    gpu: _Gpu
    gi_id: int
    profile_id: int
    start: int
    size: int
    slices: int
    computes: dict[int, int] = field(default_factory=dict)  # ci id -> CI profile enum
    serial: int = 0


@dataclass
class _MigHandle:
    instance: _GpuInstance
    ci_id: int


class _EventSet:
    def __init__(self) -> None:
        self.devices: set[int] = set()
        self.queue: list[SimpleNamespace] = []


class FakeNvml:
    """One fake node. Attribute names mirror the `pynvml` module."""

    NVMLError = NVMLError
    NVMLError_Uninitialized = NVMLError_Uninitialized
    NVMLError_InvalidArgument = NVMLError_InvalidArgument
    NVMLError_NotSupported = NVMLError_NotSupported
    NVMLError_NoPermission = NVMLError_NoPermission
    NVMLError_NotFound = NVMLError_NotFound
    NVMLError_Timeout = NVMLError_Timeout
    NVMLError_LibraryNotFound = NVMLError_LibraryNotFound
    NVMLError_InUse = NVMLError_InUse
    NVMLError_InsufficientResources = NVMLError_InsufficientResources

    NVML_ERROR_UNINITIALIZED = _real.NVML_ERROR_UNINITIALIZED
    NVML_ERROR_INVALID_ARGUMENT = _real.NVML_ERROR_INVALID_ARGUMENT
    NVML_ERROR_NOT_SUPPORTED = _real.NVML_ERROR_NOT_SUPPORTED
    NVML_ERROR_NO_PERMISSION = _real.NVML_ERROR_NO_PERMISSION
    NVML_ERROR_NOT_FOUND = _real.NVML_ERROR_NOT_FOUND
    NVML_ERROR_TIMEOUT = _real.NVML_ERROR_TIMEOUT
    NVML_ERROR_LIBRARY_NOT_FOUND = _real.NVML_ERROR_LIBRARY_NOT_FOUND
    NVML_ERROR_DRIVER_NOT_LOADED = _real.NVML_ERROR_DRIVER_NOT_LOADED
    NVML_ERROR_IN_USE = _real.NVML_ERROR_IN_USE
    NVML_ERROR_INSUFFICIENT_RESOURCES = _real.NVML_ERROR_INSUFFICIENT_RESOURCES
    NVML_DEVICE_MIG_ENABLE = _real.NVML_DEVICE_MIG_ENABLE
    NVML_DEVICE_MIG_DISABLE = _real.NVML_DEVICE_MIG_DISABLE
    NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED = _real.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED
    NVML_TEMPERATURE_GPU = _real.NVML_TEMPERATURE_GPU
    NVML_CLOCK_SM = _real.NVML_CLOCK_SM
    NVML_CLOCK_MEM = _real.NVML_CLOCK_MEM
    nvmlEventTypeXidCriticalError = _real.nvmlEventTypeXidCriticalError
    c_nvmlGpuInstancePlacement_t = _real.c_nvmlGpuInstancePlacement_t

    def __init__(self, gpu_count: int = 8, library_present: bool = True) -> None:
        self._library_present = library_present
        self._initialised = 0
        # minors run backwards (GPU 0 is /dev/nvidia7 on 8 GPUs), as on hosts whose PCI probe order differs from
        # NVML's bus-id order, so a test catches code that builds /dev/nvidia<index>
        self._gpus = [_Gpu(index, minor=gpu_count - 1 - index) for index in range(gpu_count)]
        self._event_sets: list[_EventSet] = []
        self._serial = 0
        self.calls: list[str] = []  # names of NVML functions called, for tests that check the API used

    # -- plumbing --

    def _enter(self, name: str) -> None:
        self.calls.append(name)
        if not self._initialised:
            raise NVMLError_Uninitialized()

    def _gpu(self, handle: Any) -> _Gpu:
        if not isinstance(handle, _Gpu) or handle not in self._gpus:
            raise NVMLError_InvalidArgument()
        return handle

    @staticmethod
    def _deref(ref: Any) -> Any:
        """A ctypes pointer (`.contents`) or byref (`._obj`) argument, as NVML's C functions receive them."""
        return ref.contents if hasattr(ref, "contents") else ref._obj

    # -- init --

    def nvmlInit(self) -> None:
        self.calls.append("nvmlInit")
        if not self._library_present:
            raise NVMLError_LibraryNotFound()
        self._initialised += 1

    def nvmlShutdown(self) -> None:
        self._enter("nvmlShutdown")
        self._initialised -= 1

    def nvmlSystemGetDriverVersion(self) -> str:
        self._enter("nvmlSystemGetDriverVersion")
        return "550.54.15"

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        self._enter("nvmlSystemGetCudaDriverVersion")
        return 12040

    def nvmlSystemGetProcessName(self, pid: int) -> str:
        self._enter("nvmlSystemGetProcessName")
        for gpu in self._gpus:
            for proc in gpu.processes:
                if proc.pid == pid:
                    return str(proc.name)
        raise NVMLError_NotFound()

    # -- devices --

    def nvmlDeviceGetCount(self) -> int:
        self._enter("nvmlDeviceGetCount")
        return len(self._gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> _Gpu:
        self._enter("nvmlDeviceGetHandleByIndex")
        if not 0 <= index < len(self._gpus):
            raise NVMLError_InvalidArgument()
        return self._gpus[index]

    def nvmlDeviceGetIndex(self, handle: Any) -> int:
        self._enter("nvmlDeviceGetIndex")
        return self._gpu(handle).index

    def nvmlDeviceGetName(self, handle: Any) -> str:
        self._enter("nvmlDeviceGetName")
        if isinstance(handle, _MigHandle):
            name = A100_80GB_GI_PROFILES[self._enum_of(handle.instance.profile_id)][1]
            return f"NVIDIA A100-SXM4-80GB {name}"
        self._gpu(handle)
        return "NVIDIA A100-SXM4-80GB"

    def nvmlDeviceGetUUID(self, handle: Any) -> str:
        self._enter("nvmlDeviceGetUUID")
        if isinstance(handle, _MigHandle):
            inst = handle.instance
            return f"MIG-fa4e{inst.gpu.index:04x}-{inst.gi_id:04x}-{handle.ci_id:04x}-{inst.serial:012x}"
        return f"GPU-a100{self._gpu(handle).index:04x}-0000-4000-8000-000000000000"

    def nvmlDeviceGetPciInfo(self, handle: Any) -> SimpleNamespace:
        self._enter("nvmlDeviceGetPciInfo")
        gpu = self._gpu(handle)
        return SimpleNamespace(busId=f"00000000:{BUSES[gpu.index % 8]}:00.0".encode(), pciDeviceId=0x20B210DE,
                               pciSubSystemId=0x147F10DE)

    def nvmlDeviceGetNumaNodeId(self, handle: Any) -> int:
        self._enter("nvmlDeviceGetNumaNodeId")
        return 0 if self._gpu(handle).index < 4 else 1

    def nvmlDeviceGetMinorNumber(self, handle: Any) -> int:
        self._enter("nvmlDeviceGetMinorNumber")
        return self._gpu(handle).minor

    def nvmlDeviceGetCudaComputeCapability(self, handle: Any) -> tuple[int, int]:
        self._enter("nvmlDeviceGetCudaComputeCapability")
        self._gpu(handle)
        return (8, 0)

    def nvmlDeviceGetAttributes(self, handle: Any) -> SimpleNamespace:
        self._enter("nvmlDeviceGetAttributes")
        if isinstance(handle, _MigHandle):
            row = A100_80GB_GI_PROFILES[self._enum_of(handle.instance.profile_id)]
            return SimpleNamespace(multiprocessorCount=row[4], gpuInstanceSliceCount=row[3],
                                   computeInstanceSliceCount=row[3], memorySizeMB=row[5])
        self._gpu(handle)
        return SimpleNamespace(multiprocessorCount=108, gpuInstanceSliceCount=0, computeInstanceSliceCount=0,
                               memorySizeMB=81920)

    def nvmlDeviceGetMemoryInfo(self, handle: Any) -> SimpleNamespace:
        self._enter("nvmlDeviceGetMemoryInfo")
        if isinstance(handle, _MigHandle):
            total = A100_80GB_GI_PROFILES[self._enum_of(handle.instance.profile_id)][5]
            used = sum(p.usedGpuMemory // MIB for p in handle.instance.gpu.processes
                       if p.gpuInstanceId == handle.instance.gi_id)
        else:
            gpu = self._gpu(handle)
            total = 81920
            used = gpu.memory_used_mib + sum(p.usedGpuMemory // MIB for p in gpu.processes)
        return SimpleNamespace(total=total * MIB, used=used * MIB, free=(total - used) * MIB)

    def nvmlDeviceGetUtilizationRates(self, handle: Any) -> SimpleNamespace:
        self._enter("nvmlDeviceGetUtilizationRates")
        gpu = self._gpu(handle)
        return SimpleNamespace(gpu=gpu.util, memory=gpu.util // 2)

    def nvmlDeviceGetTemperature(self, handle: Any, sensor: int) -> int:
        self._enter("nvmlDeviceGetTemperature")
        return 31 + self._gpu(handle).util // 3

    def nvmlDeviceGetPowerUsage(self, handle: Any) -> int:
        self._enter("nvmlDeviceGetPowerUsage")
        return 60_000 + self._gpu(handle).util * 3_400  # milliwatts

    def nvmlDeviceGetClockInfo(self, handle: Any, clock_type: int) -> int:
        self._enter("nvmlDeviceGetClockInfo")
        gpu = self._gpu(handle)
        return 1593 if clock_type == self.NVML_CLOCK_MEM else (1410 if gpu.util else 210)

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: Any) -> int:
        self._enter("nvmlDeviceGetTotalEnergyConsumption")
        return 1_000_000 + self._gpu(handle).index

    def nvmlDeviceGetPcieReplayCounter(self, handle: Any) -> int:
        self._enter("nvmlDeviceGetPcieReplayCounter")
        raise NVMLError_NotSupported()  # not every board reports it: the adapter must cope

    def nvmlDeviceGetComputeRunningProcesses(self, handle: Any) -> list[SimpleNamespace]:
        self._enter("nvmlDeviceGetComputeRunningProcesses")
        return list(self._gpu(handle).processes)

    # -- MIG mode --

    def nvmlDeviceGetMigMode(self, handle: Any) -> list[int]:
        self._enter("nvmlDeviceGetMigMode")
        gpu = self._gpu(handle)
        return [gpu.mig_current, gpu.mig_pending]

    def nvmlDeviceSetMigMode(self, handle: Any, mode: int) -> int:
        self._enter("nvmlDeviceSetMigMode")
        gpu = self._gpu(handle)
        if mode not in (0, 1):
            raise NVMLError_InvalidArgument()
        if gpu.processes or gpu.instances:
            raise NVMLError_InUse()
        gpu.mig_pending = mode  # Ampere: takes effect at the next GPU reset
        return 0

    # -- GPU instances --

    @staticmethod
    def _enum_of(profile_id: int) -> int:
        for enum, row in A100_80GB_GI_PROFILES.items():
            if row[0] == profile_id:
                return enum
        raise NVMLError_InvalidArgument()

    def _mig_enabled(self, gpu: _Gpu) -> None:
        if gpu.mig_current != 1:
            raise NVMLError_NotSupported()

    def nvmlDeviceGetGpuInstanceProfileInfo(self, handle: Any, profile: int, version: int = 2) -> SimpleNamespace:
        self._enter("nvmlDeviceGetGpuInstanceProfileInfo")
        gpu = self._gpu(handle)
        self._mig_enabled(gpu)
        if not 0 <= profile < _real.NVML_GPU_INSTANCE_PROFILE_COUNT:
            raise NVMLError_InvalidArgument()
        if profile not in A100_80GB_GI_PROFILES:
            raise NVMLError_NotSupported()
        pid, name, _slots, slices, sms, mib, count, _starts = A100_80GB_GI_PROFILES[profile]
        return SimpleNamespace(id=pid, sliceCount=slices, instanceCount=count, multiprocessorCount=sms,
                               memorySizeMB=mib, name=name.encode())

    def nvmlDeviceGetGpuInstancePossiblePlacements(self, handle: Any, profile_id: int, placements: Any,
                                                   count_ref: Any) -> int:
        self._enter("nvmlDeviceGetGpuInstancePossiblePlacements")
        gpu = self._gpu(handle)
        self._mig_enabled(gpu)
        row = A100_80GB_GI_PROFILES[self._enum_of(profile_id)]
        count = self._deref(count_ref)
        if count.value < len(row[7]):
            raise _error_class("NVMLError_InsufficientSize", 7, "Insufficient Size")()
        for i, start in enumerate(row[7]):
            placements[i].start = start
            placements[i].size = row[2]
        count.value = len(row[7])
        return 0

    def nvmlDeviceCreateGpuInstanceWithPlacement(self, handle: Any, profile_id: int, placement_ref: Any) -> Any:
        self._enter("nvmlDeviceCreateGpuInstanceWithPlacement")
        gpu = self._gpu(handle)
        self._mig_enabled(gpu)
        _pid, _name, slots, slices, _sms, _mib, max_count, starts = A100_80GB_GI_PROFILES[self._enum_of(profile_id)]
        placement = self._deref(placement_ref)
        start, size = int(placement.start), int(placement.size)
        if start not in starts or size != slots:
            raise NVMLError_InvalidArgument()
        taken = {s for inst in gpu.instances.values() for s in range(inst.start, inst.start + inst.size)}
        used_slices = sum(inst.slices for inst in gpu.instances.values())
        same = sum(1 for inst in gpu.instances.values() if inst.profile_id == profile_id)
        media = profile_id == 20 and any(inst.profile_id == 20 for inst in gpu.instances.values())
        if taken & set(range(start, start + size)) or used_slices + slices > 7 or same >= max_count or media:
            raise NVMLError_InsufficientResources()
        self._serial += 1
        instance = _GpuInstance(gpu, _gi_id(profile_id, start), profile_id, start, size, slices, serial=self._serial)
        gpu.instances[instance.gi_id] = instance
        return instance

    def nvmlDeviceGetGpuInstanceById(self, handle: Any, gi_id: int) -> _GpuInstance:
        self._enter("nvmlDeviceGetGpuInstanceById")
        gpu = self._gpu(handle)
        self._mig_enabled(gpu)
        if gi_id not in gpu.instances:
            raise NVMLError_NotFound()
        return gpu.instances[gi_id]

    def nvmlGpuInstanceGetInfo(self, instance: _GpuInstance) -> SimpleNamespace:
        self._enter("nvmlGpuInstanceGetInfo")
        return SimpleNamespace(device=instance.gpu, id=instance.gi_id, profileId=instance.profile_id,
                               placement=SimpleNamespace(start=instance.start, size=instance.size))

    def nvmlGpuInstanceDestroy(self, instance: _GpuInstance) -> int:
        self._enter("nvmlGpuInstanceDestroy")
        gpu = instance.gpu
        if instance.computes or any(p.gpuInstanceId == instance.gi_id for p in gpu.processes):
            raise NVMLError_InUse()
        if gpu.instances.get(instance.gi_id) is not instance:
            raise NVMLError_InvalidArgument()
        del gpu.instances[instance.gi_id]
        return 0

    # -- compute instances --

    def nvmlGpuInstanceGetComputeInstanceProfileInfo(self, instance: _GpuInstance, profile: int, eng_profile: int,
                                                     version: int = 2) -> SimpleNamespace:
        self._enter("nvmlGpuInstanceGetComputeInstanceProfileInfo")
        if profile not in CI_SLICES or CI_SLICES[profile] > instance.slices:
            raise NVMLError_NotSupported()
        return SimpleNamespace(id=profile, sliceCount=CI_SLICES[profile], instanceCount=instance.slices
                               // CI_SLICES[profile])

    def nvmlGpuInstanceCreateComputeInstance(self, instance: _GpuInstance, profile_id: int) -> _MigHandle:
        self._enter("nvmlGpuInstanceCreateComputeInstance")
        if profile_id not in CI_SLICES or CI_SLICES[profile_id] > instance.slices:
            raise NVMLError_InvalidArgument()
        used = sum(CI_SLICES[p] for p in instance.computes.values())
        if used + CI_SLICES[profile_id] > instance.slices:
            raise NVMLError_InsufficientResources()
        ci_id = next(i for i in range(8) if i not in instance.computes)
        instance.computes[ci_id] = profile_id
        return _MigHandle(instance, ci_id)

    def nvmlGpuInstanceGetComputeInstanceById(self, instance: _GpuInstance, ci_id: int) -> _MigHandle:
        self._enter("nvmlGpuInstanceGetComputeInstanceById")
        if ci_id not in instance.computes:
            raise NVMLError_NotFound()
        return _MigHandle(instance, ci_id)

    def nvmlComputeInstanceDestroy(self, compute: _MigHandle) -> int:
        self._enter("nvmlComputeInstanceDestroy")
        if any(p.gpuInstanceId == compute.instance.gi_id for p in compute.instance.gpu.processes):
            raise NVMLError_InUse()
        compute.instance.computes.pop(compute.ci_id, None)
        return 0

    # -- MIG device handles --

    def nvmlDeviceGetMaxMigDeviceCount(self, handle: Any) -> int:
        self._enter("nvmlDeviceGetMaxMigDeviceCount")
        self._gpu(handle)
        return 7

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: Any, index: int) -> _MigHandle:
        self._enter("nvmlDeviceGetMigDeviceHandleByIndex")
        gpu = self._gpu(handle)
        self._mig_enabled(gpu)
        handles = [_MigHandle(inst, ci) for _gi, inst in sorted(gpu.instances.items()) for ci in sorted(inst.computes)]
        if not 0 <= index < len(handles):
            raise NVMLError_NotFound()
        return handles[index]

    def nvmlDeviceGetGpuInstanceId(self, handle: _MigHandle) -> int:
        self._enter("nvmlDeviceGetGpuInstanceId")
        if not isinstance(handle, _MigHandle):
            raise NVMLError_InvalidArgument()
        return handle.instance.gi_id

    def nvmlDeviceGetComputeInstanceId(self, handle: _MigHandle) -> int:
        self._enter("nvmlDeviceGetComputeInstanceId")
        if not isinstance(handle, _MigHandle):
            raise NVMLError_InvalidArgument()
        return handle.ci_id

    # -- events --

    def nvmlEventSetCreate(self) -> _EventSet:
        self._enter("nvmlEventSetCreate")
        event_set = _EventSet()
        self._event_sets.append(event_set)
        return event_set

    def nvmlDeviceRegisterEvents(self, handle: Any, event_types: int, event_set: _EventSet) -> None:
        self._enter("nvmlDeviceRegisterEvents")
        gpu = self._gpu(handle)
        if event_types & self.nvmlEventTypeXidCriticalError:
            event_set.devices.add(gpu.index)

    def nvmlEventSetWait_v2(self, event_set: _EventSet, timeout_ms: int) -> SimpleNamespace:
        self._enter("nvmlEventSetWait_v2")
        if not event_set.queue:
            raise NVMLError_Timeout()
        return event_set.queue.pop(0)

    def nvmlEventSetFree(self, event_set: _EventSet) -> None:
        self._enter("nvmlEventSetFree")
        self._event_sets.remove(event_set)

    # -- the world outside NVML --

    def fake_reset_gpu(self, index: int) -> None:
        """What `nvidia-smi --gpu-reset` does: apply the pending MIG mode; instances do not survive."""
        gpu = self._gpus[index]
        if gpu.processes:
            raise RuntimeError(f"GPU {index} is in use")
        gpu.mig_current = gpu.mig_pending
        gpu.instances.clear()

    def fake_gpu_instances(self, index: int) -> list[tuple[int, int, int]]:
        """(GI id, profile id, start) of every GPU instance on a GPU, with or without compute instances."""
        return [(i.gi_id, i.profile_id, i.start) for i in sorted(self._gpus[index].instances.values(),
                                                                 key=lambda i: i.gi_id)]

    def fake_add_process(self, index: int, pid: int, used_memory_mib: int, gi_id: int | None = None,
                         name: str = "python") -> None:
        gi = NO_INSTANCE if gi_id is None else gi_id
        self._gpus[index].processes.append(SimpleNamespace(pid=pid, usedGpuMemory=used_memory_mib * MIB,
                                                           gpuInstanceId=gi, computeInstanceId=0, name=name))

    def fake_remove_process(self, index: int, pid: int) -> None:
        self._gpus[index].processes = [p for p in self._gpus[index].processes if p.pid != pid]

    def fake_set_load(self, index: int, util: int, memory_used_mib: int) -> None:
        self._gpus[index].util = util
        self._gpus[index].memory_used_mib = memory_used_mib

    def fake_inject_xid(self, index: int, xid: int, gi_id: int | None = None) -> None:
        gi = NO_INSTANCE if gi_id is None else gi_id
        for event_set in self._event_sets:
            if index in event_set.devices:
                event_set.queue.append(SimpleNamespace(device=self._gpus[index],
                                                       eventType=self.nvmlEventTypeXidCriticalError, eventData=xid,
                                                       gpuInstanceId=gi, computeInstanceId=NO_INSTANCE))
