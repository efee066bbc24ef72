"""mig-parted layouts applied placement-aware and without collateral damage.

NVIDIA's mig-parted clears every GPU instance on a GPU before creating the new set, in whatever placement the
driver picks, so a running job on an instance that is also in the target layout dies for nothing. Here the plan
is computed first, as a pure function of the node's state: instances that already belong to the target stay
where they are (in-use ones are kept first), the rest of the target gets explicit placements from
`kubegpu.gpu.geometry.place`, and only instances outside the target are destroyed — never one a process is using
unless the caller forces it. Every check runs before the first change, so bad input leaves the node untouched.

Format and default config names: reference/mig-geometry-and-partitioning.md §2.1–§2.3.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from kubegpu.config.migparted import MigPartedConfig, resolve_layout
from kubegpu.errors import ConfigError, KubegpuError
from kubegpu.gpu.catalog import GpuModel, find_model
from kubegpu.gpu.geometry import PlacedInstance, place

if TYPE_CHECKING:
    from kubegpu.gpu.backend import GpuBackend, GpuDevice, GpuProcess, MigDevice


class InUseError(KubegpuError):
    """The plan would destroy a GPU instance (or reset a GPU) that a process is using."""


class ApplyError(KubegpuError):
    """The backend failed part-way through an apply; the message says what had already changed."""

    def __init__(self, message: str, changed_gpus: Sequence[int] = ()) -> None:
        super().__init__(message)
        self.changed_gpus = tuple(changed_gpus)


# --------------------------------------------------------------------------------------------- node state


@dataclass(frozen=True)
class NodeState:
    """A snapshot of one node's GPUs, their MIG devices and processes: everything a plan is computed from."""

    gpus: tuple[GpuDevice, ...]
    mig: Mapping[int, tuple[MigDevice, ...]]
    processes: Mapping[int, tuple[GpuProcess, ...]] = field(default_factory=dict)

    def gpu(self, index: int) -> GpuDevice:
        return next(g for g in self.gpus if g.index == index)

    def instances(self, index: int) -> list[MigDevice]:
        """One entry per GPU instance (a GI with several CIs is listed once)."""
        seen: dict[int, MigDevice] = {}
        for device in self.mig.get(index, ()):
            seen.setdefault(device.gi_id, device)
        return sorted(seen.values(), key=lambda d: (d.start, d.profile_id))


def read_state(backend: GpuBackend) -> NodeState:
    """Snapshot the backend (the only I/O in this module besides `execute`)."""
    gpus = tuple(sorted(backend.devices(), key=lambda g: g.index))
    mig = {g.index: tuple(backend.mig_devices(g.index)) if g.mig_enabled else () for g in gpus}
    processes = {g.index: tuple(backend.processes(g.index)) for g in gpus}
    return NodeState(gpus=gpus, mig=mig, processes=processes)


def model_of(gpu: GpuDevice) -> GpuModel:
    """The catalog model of a GPU; geometry-aware planning needs one."""
    model = find_model(gpu.model_key or gpu.product_name)
    if model is None:
        raise ConfigError(f"GPU {gpu.index} ({gpu.product_name}): not in the GPU catalog, its MIG geometry is unknown")
    return model


# --------------------------------------------------------------------------------------------- planning


@dataclass(frozen=True)
class GpuPlan:
    """What to do to one GPU: the target mode, instances kept, destroyed and created (at explicit placements)."""

    index: int
    mig_enabled: bool
    mode_change: bool
    keep: tuple[MigDevice, ...] = ()
    destroy: tuple[MigDevice, ...] = ()
    create: tuple[PlacedInstance, ...] = ()

    @property
    def changes(self) -> bool:
        return self.mode_change or bool(self.destroy) or bool(self.create)


@dataclass(frozen=True)
class ApplyPlan:
    config_name: str
    gpus: tuple[GpuPlan, ...]

    @property
    def changes(self) -> bool:
        return any(p.changes for p in self.gpus)


def resolve(config: MigPartedConfig, name: str, state: NodeState) -> dict[int, list[int] | None]:
    """Which GPU gets which GI profile ids under config `name` (None: MIG disabled); raises naming the fault."""
    return resolve_layout(config, name, list(state.gpus))


def target_layout(
    model: GpuModel, wanted: Sequence[int], existing: Sequence[MigDevice], busy: set[int]
) -> tuple[list[MigDevice], list[PlacedInstance]] | None:
    """Instances to keep and placements to create so the GPU holds exactly `wanted`; None if it cannot fit.

    Greedy but always feasible: an existing instance is kept only if the rest of the target still fits around
    everything kept so far. In-use instances are tried first, so they survive whenever any layout allows it.
    """
    if place(model, wanted) is None:
        return None
    remaining = Counter(wanted)
    keep: list[MigDevice] = []
    for device in sorted(existing, key=lambda d: (d.gi_id not in busy, d.start, d.profile_id)):
        if remaining[device.profile_id] == 0:
            continue
        fixed = [*_placed(keep), PlacedInstance(device.profile_id, device.start)]
        rest = list((remaining - Counter([device.profile_id])).elements())
        if place(model, rest, fixed) is not None:
            keep.append(device)
            remaining[device.profile_id] -= 1
    layout = place(model, list(remaining.elements()), _placed(keep))
    if layout is None:  # pragma: no cover - every step above kept the layout feasible
        return None
    return keep, layout[len(keep):]


def _placed(devices: Iterable[MigDevice]) -> list[PlacedInstance]:
    return [PlacedInstance(d.profile_id, d.start) for d in devices]


def plan_gpu(state: NodeState, index: int, wanted: list[int] | None, force: bool) -> GpuPlan:
    """The change for one GPU; raises ConfigError when it cannot fit, InUseError when it would hit a process."""
    gpu = state.gpu(index)
    existing = state.instances(index) if gpu.mig_enabled else []
    processes = state.processes.get(index, ())
    want_enabled = wanted is not None
    # A pending change (Ampere, awaiting a reset) counts too: asking for the current mode again cancels it.
    mode_change = bool(gpu.mig_enabled) != want_enabled or bool(gpu.mig_pending)
    if not want_enabled:
        plan = GpuPlan(index, False, mode_change, destroy=tuple(existing))
    else:
        model = model_of(gpu)
        busy = {p.gi_id for p in processes if p.gi_id is not None}
        target = target_layout(model, wanted or [], existing, busy)
        if target is None:
            names = ", ".join(model.profile(p).name for p in wanted or [])
            raise ConfigError(f"GPU {index} ({model.key}): layout [{names}] cannot be placed on its MIG geometry")
        keep, create = target
        kept = {d.gi_id for d in keep}
        destroy = tuple(d for d in existing if d.gi_id not in kept)
        plan = GpuPlan(index, True, mode_change, tuple(keep), destroy, tuple(create))
    if not force:
        _refuse_in_use(gpu, plan, processes)
    return plan


def _refuse_in_use(gpu: GpuDevice, plan: GpuPlan, processes: Sequence[GpuProcess]) -> None:
    doomed = {d.gi_id: d for d in plan.destroy}
    for process in processes:
        if process.gi_id is not None and process.gi_id in doomed:
            device = doomed[process.gi_id]
            raise InUseError(
                f"GPU {gpu.index}: MIG device {device.profile_name} at {device.start} (GI {device.gi_id}) is used by "
                f"pid {process.pid} ({process.name}); not destroying it (use --force)"
            )
        if process.gi_id is None and plan.mode_change:
            raise InUseError(
                f"GPU {gpu.index}: pid {process.pid} ({process.name}) is using the GPU; not changing its MIG mode "
                f"(use --force)"
            )


def plan_apply(config: MigPartedConfig, name: str, state: NodeState, force: bool = False) -> ApplyPlan:
    """The whole node's plan for config `name`; every error is raised before anything is changed."""
    resolved = resolve(config, name, state)
    plans = tuple(plan_gpu(state, index, wanted, force) for index, wanted in sorted(resolved.items()))
    return ApplyPlan(config_name=name, gpus=plans)


# --------------------------------------------------------------------------------------------- applying


@dataclass
class ApplyOutcome:
    """What an apply did: GPUs changed, GPUs whose MIG mode waits for a reset (their instances are not created)."""

    changed: list[int] = field(default_factory=list)
    pending_reset: list[int] = field(default_factory=list)

    @property
    def complete(self) -> bool:
        return not self.pending_reset


def execute(plan: ApplyPlan, backend: GpuBackend, reset: bool = True) -> ApplyOutcome:
    """Carry a plan out: destroy first (frees placements), switch modes, create at the planned placements.

    A mode change that waits for a GPU reset (Ampere) is followed by a reset when `reset` is allowed, as
    mig-parted does; when the reset is refused or not allowed, the GPU is reported in `pending_reset` and its
    instances are left for a later apply (after a reboot).

    A backend failure raises ApplyError naming the GPU and step, and which GPUs had already been changed,
    so the caller can report a partial apply instead of pretending nothing happened.
    """
    outcome = ApplyOutcome()
    for gpu_plan in plan.gpus:
        if not gpu_plan.changes:
            continue
        try:
            _execute_gpu(gpu_plan, backend, outcome, reset)
        except KubegpuError as exc:
            raise ApplyError(_partial(gpu_plan.index, str(exc), outcome), outcome.changed) from exc
        except Exception as exc:  # a backend's own failure (driver error, broken state file)
            message = _partial(gpu_plan.index, f"{type(exc).__name__}: {exc}", outcome)
            raise ApplyError(message, outcome.changed) from exc
    return outcome


def _execute_gpu(gpu_plan: GpuPlan, backend: GpuBackend, outcome: ApplyOutcome, reset: bool) -> None:
    index = gpu_plan.index
    for device in gpu_plan.destroy:
        _mark_changed(outcome, index)
        backend.destroy_mig_device(index, device.gi_id)
    if gpu_plan.mode_change:
        _mark_changed(outcome, index)
        if backend.set_mig_mode(index, gpu_plan.mig_enabled) and not _reset(backend, index, reset):
            outcome.pending_reset.append(index)
            return
    for instance in gpu_plan.create:
        _mark_changed(outcome, index)
        backend.create_mig_device(index, instance.profile_id, instance.start)


def _reset(backend: GpuBackend, index: int, allowed: bool) -> bool:
    """Reset a GPU so its pending MIG mode takes effect; False when not allowed or refused (a reboot is needed)."""
    from kubegpu.gpu.backend import GpuBackendError

    if not allowed:
        return False
    try:
        backend.reset_gpu(index)
    except GpuBackendError:
        return False
    return not any(g.mig_pending for g in backend.devices() if g.index == index)


def _mark_changed(outcome: ApplyOutcome, index: int) -> None:
    if index not in outcome.changed:
        outcome.changed.append(index)


def _partial(index: int, error: str, outcome: ApplyOutcome) -> str:
    done = [i for i in outcome.changed if i != index]
    already = f"; GPUs already changed: {done}" if done else ""
    return f"GPU {index}: apply failed: {error}{already}"


# --------------------------------------------------------------------------------------------- assert / export


def assert_mismatches(config: MigPartedConfig, name: str, state: NodeState) -> list[str]:
    """Why the node does not carry config `name` ([] when it does): mode and per-profile counts per GPU."""
    resolved = resolve(config, name, state)
    problems = []
    for index, wanted in sorted(resolved.items()):
        gpu = state.gpu(index)
        if wanted is None:
            if gpu.mig_enabled or gpu.mig_pending:
                problems.append(f"GPU {index}: MIG is {'pending' if gpu.mig_pending else 'enabled'}, expected disabled")
            continue
        if not gpu.mig_enabled or gpu.mig_pending:
            problems.append(f"GPU {index}: MIG is {'pending' if gpu.mig_pending else 'disabled'}, expected enabled")
            continue
        have = Counter(d.profile_id for d in state.instances(index))
        if have != Counter(wanted):
            model = model_of(gpu)
            problems.append(f"GPU {index}: has {_describe(model, have)}, expected {_describe(model, Counter(wanted))}")
    return problems


def _describe(model: GpuModel, counts: Counter[int]) -> str:
    if not counts:
        return "no MIG devices"
    return ", ".join(f"{n}x{model.profile(p).name}" for p, n in sorted(counts.items()))


def export_config(state: NodeState, name: str = "current") -> dict[str, Any]:
    """The node's current layout as a mig-parted `version: v1` document, one entry per group of identical GPUs."""
    capable = [g for g in state.gpus if g.mig_capable]
    models = {g.pci_device_id for g in capable}
    groups: dict[tuple[str, bool, tuple[tuple[str, int], ...]], list[int]] = {}
    for gpu in capable:
        counts = Counter(d.profile_name for d in state.instances(gpu.index)) if gpu.mig_enabled else Counter()
        key = (gpu.pci_device_id, bool(gpu.mig_enabled), tuple(sorted(counts.items())))
        groups.setdefault(key, []).append(gpu.index)
    entries: list[dict[str, Any]] = []
    for (pci_id, enabled, profile_counts), indices in groups.items():
        entry: dict[str, Any] = {}
        if len(models) > 1:
            entry["device-filter"] = pci_id
        entry["devices"] = "all" if len(indices) == len(capable) else indices
        entry["mig-enabled"] = enabled
        if enabled:
            entry["mig-devices"] = dict(profile_counts)
        entries.append(entry)
    return {"version": "v1", "mig-configs": {name: entries}}
