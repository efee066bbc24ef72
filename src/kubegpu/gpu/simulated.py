"""A simulated GPU node: the `GpuBackend` the simulator, the tests and `--gpu-backend sim:PATH` use.

The node's whole state is one JSON document (format below). With a path it lives in a file that every
read-modify-write holds a lock on (flock, `<file>.lock`) and replaces atomically, so a device plugin, a MIG
manager and an exporter running as separate processes see one consistent node, as they would on real hardware.
Without a path it lives in memory, which is what the simulator uses for thousands of nodes.

The rules are the hardware's: MIG devices only at legal placements (`kubegpu.gpu.geometry`), a MIG mode change on
Ampere waits for a GPU reset (or reboot) while Hopper and newer switch at once, instances in use cannot be destroyed,
MIG devices do not survive a reset or reboot.

The state file format and its validation live in `kubegpu.gpu.simstate`.
"""

from __future__ import annotations

import contextlib
import copy
import json
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import filelock

from kubegpu.clock import Clock, RealClock
from kubegpu.errors import ConfigError, KubegpuError, NotFoundError
from kubegpu.files import decode_utf8, parse_json_text, read_bytes, write_durable
from kubegpu.gpu.backend import (
    BackendUnavailable,
    GpuBackendError,
    GpuDevice,
    GpuProcess,
    GpuSample,
    MigDevice,
    XidEvent,
)
from kubegpu.gpu.catalog import GpuModel, MigProfile
from kubegpu.gpu.geometry import PlacedInstance, layout_errors
from kubegpu.gpu.simlock import NodeFileLock
from kubegpu.gpu.simprocs import add_process, remove_process, set_process_memory
from kubegpu.gpu.simstate import (
    _IDLE_SM_CLOCK_MHZ,
    _UUID_NAMESPACE,
    DEFAULT_CUDA_VERSION,
    DEFAULT_DRIVER_VERSION,
    LOCK_TIMEOUT_S,
    MAX_GPUS_PER_NODE,
    MAX_XID_EVENTS,
    NODE_FILE_LIMIT,
    STATE_KIND,
    STATE_VERSION,
    State,
    _describe,
    _gpu,
    _idle_load,
    _mig_record,
    _model,
    _to_device,
    _to_mig_device,
    check_state,
    new_node_state,
    parse_gpu_spec,
)
from kubegpu.statefiles import CHECKSUM_FIELD, dumps_stamped, verify_checksum

__all__ = [
    "DEFAULT_CUDA_VERSION", "DEFAULT_DRIVER_VERSION", "MAX_GPUS_PER_NODE", "STATE_KIND", "STATE_VERSION",
    "SimulatedBackend", "State", "add_process", "check_state", "new_node_state", "parse_gpu_spec", "remove_process",
    "set_process_memory",
]


def set_mig_mode(state: State, index: int, enabled: bool) -> bool:
    gpu = _gpu(state, index)
    model = _model(gpu)
    if not model.mig_capable:
        raise GpuBackendError(f"{_describe(gpu)} is not MIG-capable")
    if enabled == gpu["mig_enabled"]:
        gpu["mig_pending_enabled"] = None
        return False
    if not enabled and gpu["mig_devices"]:
        raise GpuBackendError(f"{_describe(gpu)} still has {len(gpu['mig_devices'])} MIG devices; destroy them "
                              "before disabling MIG")
    if model.mig_resets_on_mode_change:
        gpu["mig_pending_enabled"] = enabled
        return True
    gpu["mig_enabled"] = enabled
    gpu["mig_pending_enabled"] = None
    return False


def reset_gpu(state: State, index: int, now: float) -> None:
    gpu = _gpu(state, index)
    if gpu["processes"]:
        pids = ", ".join(str(p["pid"]) for p in gpu["processes"])
        raise GpuBackendError(f"cannot reset {_describe(gpu)}: in use by process(es) {pids}")
    _power_cycle(gpu, now)


def reboot(state: State, now: float) -> None:
    """Every GPU comes back clean: pending modes applied, no MIG devices (they do not persist), no processes; the
    node's boot count goes up (its `boot_id` changes, as /proc's does on a real node)."""
    state["boots"] = state.get("boots", 0) + 1
    for gpu in state["gpus"]:
        gpu["processes"] = []
        _power_cycle(gpu, now)


def _power_cycle(gpu: dict[str, Any], now: float) -> None:
    if gpu.get("mig_pending_enabled") is not None:
        gpu["mig_enabled"] = gpu["mig_pending_enabled"]
        gpu["mig_pending_enabled"] = None
    gpu["mig_devices"] = []
    energy = _energy_mj(gpu, now)
    gpu["load"] = _idle_load(now) | {"energy_mj": energy, "xid_last": gpu["load"].get("xid_last", 0)}


def create_mig_device(state: State, index: int, profile_id: int, start: int) -> MigDevice:
    gpu = _gpu(state, index)
    model = _model(gpu)
    if not model.mig_capable:
        raise GpuBackendError(f"{_describe(gpu)} is not MIG-capable")
    if not gpu["mig_enabled"]:
        raise GpuBackendError(f"MIG mode is not enabled on {_describe(gpu)}")
    try:
        profile = model.profile(profile_id)
    except NotFoundError as exc:
        raise GpuBackendError(f"GPU {index}: {exc}") from exc
    layout = [PlacedInstance(d["profile_id"], d["start"]) for d in gpu["mig_devices"]]
    errors = layout_errors(model, [*layout, PlacedInstance(profile_id, start)])
    if errors:
        raise GpuBackendError(f"cannot create {profile.name}@{start} on {_describe(gpu)}: {'; '.join(errors)}")
    used_ids = {d["gi_id"] for d in gpu["mig_devices"]}
    gi_id = next(i for i in range(1, len(used_ids) + 2) if i not in used_ids)
    gpu["mig_serial"] += 1
    mig_uuid = "MIG-" + str(uuid.uuid5(_UUID_NAMESPACE, f"{gpu['uuid']}/gi/{gi_id}/{gpu['mig_serial']}"))
    record = {"gi_id": gi_id, "ci_id": 0, "profile_id": profile_id, "start": start, "uuid": mig_uuid,
              "load": {"gpu_util": 0.0, "memory_used_mib": 0}}
    gpu["mig_devices"].append(record)
    return _to_mig_device(gpu, record)


def destroy_mig_device(state: State, index: int, gi_id: int) -> None:
    gpu = _gpu(state, index)
    record = _mig_record(gpu, gi_id)
    users = [p["pid"] for p in gpu["processes"] if p["gi_id"] == gi_id]
    if users:
        raise GpuBackendError(f"GPU instance {gi_id} on {_describe(gpu)} is in use by process(es) "
                              f"{', '.join(map(str, users))}")
    gpu["mig_devices"].remove(record)


def set_load(state: State, index: int, now: float, gpu_util: float, memory_used_mib: int,
             gi_id: int | None = None, temperature_c: float | None = None, power_w: float | None = None,
             mem_copy_util: float | None = None) -> None:
    """Set what the GPU (or one MIG device) is doing; energy up to `now` is banked at the old power first."""
    gpu = _gpu(state, index)
    if not 0.0 <= gpu_util <= 100.0:
        raise GpuBackendError(f"GPU {index}: utilization {gpu_util} is outside 0..100")
    load = gpu["load"]
    load["energy_mj"] = _energy_mj(gpu, now)
    load["energy_at"] = now
    if gi_id is not None:
        _mig_record(gpu, gi_id)["load"] = {"gpu_util": float(gpu_util), "memory_used_mib": int(memory_used_mib)}
    else:
        load.update(gpu_util=float(gpu_util), memory_used_mib=int(memory_used_mib))
        if mem_copy_util is not None:
            load["mem_copy_util"] = float(mem_copy_util)
    if temperature_c is not None:
        load["temperature_c"] = float(temperature_c)
    if power_w is not None:
        load["power_w"] = float(power_w)


def inject_xid(state: State, index: int, xid: int, now: float, gi_id: int | None = None) -> XidEvent:
    gpu = _gpu(state, index)
    if gi_id is not None:
        _mig_record(gpu, gi_id)
    gpu["load"]["xid_last"] = xid
    event: dict[str, Any] = {"gpu_index": index, "xid": xid, "timestamp": now, "gi_id": gi_id}
    state["xid_events"] = [*state["xid_events"], event][-MAX_XID_EVENTS:]
    return XidEvent(**event)


def _utilization(gpu: dict[str, Any]) -> float:
    """GPU-wide utilization: the GPU's own load, or with MIG the slice-weighted load of its instances."""
    model = _model(gpu)
    util = float(gpu["load"]["gpu_util"])
    if gpu["mig_enabled"] and gpu["mig_devices"] and model.mig_compute_slices:
        weighted = sum(d["load"]["gpu_util"] * model.profile(d["profile_id"]).compute_slices
                       for d in gpu["mig_devices"])
        util = max(util, weighted / model.mig_compute_slices)
    return util


def _power_w(gpu: dict[str, Any]) -> float:
    explicit = gpu["load"].get("power_w")
    if explicit is not None:
        return float(explicit)
    max_power = _model(gpu).max_power_w
    idle = 0.15 * max_power
    return idle + (max_power - idle) * _utilization(gpu) / 100.0


def _energy_mj(gpu: dict[str, Any], now: float) -> int:
    load = gpu["load"]
    elapsed = max(0.0, now - float(load.get("energy_at", now)))
    return int(load.get("energy_mj", 0) + _power_w(gpu) * elapsed * 1000.0)


def sample(state: State, index: int, now: float, gi_id: int | None = None) -> GpuSample:
    gpu = _gpu(state, index)
    model = _model(gpu)
    load = gpu["load"]
    if gi_id is None:
        util = _utilization(gpu)
        used = int(load["memory_used_mib"]) + sum(int(p["used_memory_mib"]) for p in gpu["processes"])
        used += sum(int(d["load"]["memory_used_mib"]) for d in gpu["mig_devices"])
        total = model.memory_mib
    else:
        record = _mig_record(gpu, gi_id)
        profile = model.profile(record["profile_id"])
        util = float(record["load"]["gpu_util"])
        used = int(record["load"]["memory_used_mib"])
        used += sum(int(p["used_memory_mib"]) for p in gpu["processes"] if p["gi_id"] == gi_id)
        total = profile.memory_mib
    used = min(used, total)
    temperature = load.get("temperature_c")
    return GpuSample(
        gpu_util=util, mem_copy_util=float(load["mem_copy_util"]), memory_used_mib=used,
        memory_free_mib=total - used,
        temperature_c=float(temperature) if temperature is not None else 30.0 + 0.45 * _utilization(gpu),
        power_w=_power_w(gpu), sm_clock_mhz=model.max_sm_clock_mhz if _utilization(gpu) > 0 else _IDLE_SM_CLOCK_MHZ,
        mem_clock_mhz=model.mem_clock_mhz, energy_mj=_energy_mj(gpu, now), xid_last=int(load["xid_last"]),
        pcie_replay=int(load["pcie_replay"]), graphics_engine_active=util / 100.0,
    )


# --- adapter: in memory or a locked JSON file -----------------------------------------------------------------------


class SimulatedBackend:
    """`GpuBackend` over a node state in memory (`path=None`) or in a JSON file shared between processes."""

    def __init__(self, path: Path | str | None, gpus: str | Sequence[GpuModel] | None = None,
                 node_name: str = "sim-node", clock: Clock | None = None) -> None:
        """With a path and no `gpus`, open an existing node file; with `gpus`, create the node (replacing a file)."""
        self._clock: Clock = clock or RealClock()
        self._path = Path(path) if path is not None else None
        self._memory: State | None = None
        # the file's bytes as last validated here: an operation that finds them unchanged (the common case, even
        # with other processes sharing the file) only parses them again, without the depth and schema checks
        self._checked: bytes | None = None  # not b"": an empty (torn) file must never pass as already checked
        self._shared: tuple[bytes, State] | None = None  # the last read-only parse, reused while the bytes match
        self._filelock: NodeFileLock | None = None
        if gpus is not None:
            models = parse_gpu_spec(gpus) if isinstance(gpus, str) else list(gpus)
            state = new_node_state(models, node_name)
            for gpu in state["gpus"]:
                gpu["load"]["energy_at"] = self._clock.now()
            if self._path is None:
                self._memory = state
            else:
                self._create_file(state)
        elif self._path is None:
            raise KubegpuError("an in-memory simulated node needs gpus=..., e.g. '8xA100-SXM4-80GB'")
        elif not self._path.is_file():
            raise BackendUnavailable(f"simulated node file {self._path} not found; create it with "
                                     f"`kubegpu sim-node create --gpus 8xA100-SXM4-80GB --out {self._path}`")

    def _create_file(self, state: State) -> None:
        """Write a new node file. A directory or unwritable place fails at once in one line, not as an OS error
        or after the lock's timeout (a lock file that cannot be made looks like a lock that is held)."""
        assert self._path is not None
        if self._path.is_dir():
            raise ConfigError(f"{self._path} is a directory; name the node file to write, e.g. {self._path}/node.json")
        try:
            self._path.parent.mkdir(parents=True, exist_ok=True)
            Path(str(self._path) + ".lock").touch()
            with self._lock():
                self._write(state)
        except OSError as exc:
            raise GpuBackendError(f"cannot write simulated node file {self._path}: {exc.strerror or exc}") from exc
        except filelock.Timeout as exc:
            raise GpuBackendError(f"could not lock {self._path} within {LOCK_TIMEOUT_S:.0f} s") from exc

    @classmethod
    def create(cls, path: Path | str | None, gpus: str | Sequence[GpuModel] = "8xA100-SXM4-80GB",
               node_name: str = "sim-node", clock: Clock | None = None) -> SimulatedBackend:
        return cls(path, gpus=gpus, node_name=node_name, clock=clock)

    # -- state access --

    @property
    def path(self) -> Path | None:
        return self._path

    def _lock(self) -> NodeFileLock:
        """One lock object per backend (re-entrant per thread), not a new one per operation."""
        assert self._path is not None
        if self._filelock is None:
            self._filelock = NodeFileLock(str(self._path) + ".lock", timeout=LOCK_TIMEOUT_S)
        return self._filelock

    def _read(self, shared: bool = False) -> State:
        """The state in the file; with `shared` (a read-only operation) the parse of unchanged bytes is reused, so an
        agent polling every GPU of a big node parses the file once per change, not once per call."""
        assert self._path is not None
        try:
            data = read_bytes(self._path, limit=NODE_FILE_LIMIT)
        except ConfigError as exc:
            if not self._path.exists():
                raise BackendUnavailable(f"cannot read simulated node file {self._path}: not found") from None
            raise ConfigError(str(exc)) from None
        if data == self._checked:  # the bytes this process last validated (or wrote): parse, skip the checks
            if shared and self._shared is not None and self._shared[0] == data:
                return self._shared[1]
            state: State = json.loads(data)
            state.pop(CHECKSUM_FIELD, None)
            if shared:
                self._shared = (data, state)
            return state
        source = str(self._path)
        document = parse_json_text(decode_utf8(data, source), source)
        verify_checksum(document, source, "simulated node file")  # torn or tampered: one line; none: hand-written
        state = check_state(document, source)
        self._checked = data
        return state

    def _write(self, state: State) -> None:
        assert self._path is not None
        # Atomic and durable (unique temp, fsync, rename, fsync dir); 0644 so agents running as other users can read.
        # Compact: the C encoder is several times faster than an indented dump (`sim-node show` pretty-prints).
        # Stamped with a checksum over the state, so a reader tells a torn or tampered file from a hand-written one.
        data = dumps_stamped(state, string_keys=True).encode("utf-8")
        write_durable(self._path, data, mode=0o644)
        self._checked = data

    @contextlib.contextmanager
    def _state(self, write: bool = False) -> Iterator[State]:
        """The node state for one operation; with `write`, saved afterwards under the same lock (never on error).
        Without `write` it may be a parse shared with earlier reads: read-only operations never change it."""
        if self._memory is not None:
            yield self._memory
            if write:
                self._memory["generation"] += 1
            return
        try:
            with self._lock():
                state = self._read(shared=not write)
                yield state
                if write:
                    state["generation"] += 1
                    self._write(state)
        except filelock.Timeout as exc:
            raise GpuBackendError(f"could not lock {self._path} within {LOCK_TIMEOUT_S:.0f} s") from exc

    def snapshot(self) -> State:
        """A copy of the whole node state (for `sim-node show` and tests)."""
        with self._state() as state:
            return copy.deepcopy(state)

    def generation(self) -> int:
        """Bumped by every change, so a poller (the device plugin's re-list) can skip unchanged nodes cheaply."""
        with self._state() as state:
            return int(state["generation"])

    @property
    def node_name(self) -> str:
        with self._state() as state:
            return str(state["node_name"])

    # -- GpuBackend --

    def driver_version(self) -> str:
        with self._state() as state:
            return str(state["driver_version"])

    def cuda_driver_version(self) -> tuple[int, int]:
        with self._state() as state:
            major, minor = state["cuda_driver_version"]
            return int(major), int(minor)

    def devices(self) -> list[GpuDevice]:
        with self._state() as state:
            return [_to_device(gpu) for gpu in state["gpus"]]

    def set_mig_mode(self, index: int, enabled: bool) -> bool:
        with self._state(write=True) as state:
            return set_mig_mode(state, index, enabled)

    def reset_gpu(self, index: int) -> None:
        with self._state(write=True) as state:
            reset_gpu(state, index, self._clock.now())

    def reboot(self) -> None:
        with self._state(write=True) as state:
            reboot(state, self._clock.now())

    def boot_id(self) -> str:
        with self._state() as state:
            return f"{state['node_name']}/boot-{state.get('boots', 0)}"

    def mig_devices(self, index: int) -> list[MigDevice]:
        with self._state() as state:
            gpu = _gpu(state, index)
            return [_to_mig_device(gpu, record) for record in gpu["mig_devices"]]

    def create_mig_device(self, index: int, profile_id: int, start: int) -> MigDevice:
        with self._state(write=True) as state:
            return create_mig_device(state, index, profile_id, start)

    def destroy_mig_device(self, index: int, gi_id: int) -> None:
        with self._state(write=True) as state:
            destroy_mig_device(state, index, gi_id)

    def processes(self, index: int) -> list[GpuProcess]:
        with self._state() as state:
            gpu = _gpu(state, index)
            return [GpuProcess(pid=p["pid"], gpu_index=index, gi_id=p["gi_id"], used_memory_mib=p["used_memory_mib"],
                               name=p["name"]) for p in gpu["processes"]]

    def sample(self, index: int, gi_id: int | None = None) -> GpuSample:
        with self._state() as state:
            return sample(state, index, self._clock.now(), gi_id)

    def xid_events(self, since: float) -> list[XidEvent]:
        with self._state() as state:
            return [XidEvent(**event) for event in state["xid_events"] if event["timestamp"] > since]

    def close(self) -> None:
        """Nothing to release: every operation takes and drops the lock itself."""

    # -- extras for tests and the simulator --

    def inject_xid(self, index: int, xid: int, gi_id: int | None = None) -> XidEvent:
        with self._state(write=True) as state:
            return inject_xid(state, index, xid, self._clock.now(), gi_id)

    def set_load(self, index: int, util: float, mem_mib: int, gi_id: int | None = None,
                 temperature_c: float | None = None, power_w: float | None = None) -> None:
        with self._state(write=True) as state:
            set_load(state, index, self._clock.now(), util, mem_mib, gi_id=gi_id, temperature_c=temperature_c,
                     power_w=power_w)

    def add_process(self, index: int, pid: int, used_memory_mib: int, gi_id: int | None = None,
                    name: str = "python") -> None:
        with self._state(write=True) as state:
            add_process(state, index, pid, used_memory_mib, gi_id, name)

    def remove_process(self, index: int, pid: int) -> None:
        with self._state(write=True) as state:
            remove_process(state, index, pid)

    def set_process_memory(self, pid: int, used_memory_mib: int) -> int:
        """Grow or shrink a running process's memory; returns the GPU it runs on."""
        with self._state(write=True) as state:
            return set_process_memory(state, pid, used_memory_mib)

    def profile_of(self, index: int, profile_id: int) -> MigProfile:
        """The catalog profile for a GPU of this node (the sim knows its models exactly)."""
        with self._state() as state:
            return _model(_gpu(state, index)).profile(profile_id)
