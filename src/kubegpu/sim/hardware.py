"""Simulated node hardware: one in-memory `SimulatedBackend` per node.

The simulator changes MIG layouts the way the MIG manager does on a real node — MIG mode on (with the reset an
Ampere GPU needs), old GPU instances destroyed, new ones created at placements from the real geometry
(`kubegpu.gpu.geometry.place`) — and reads back `GpuDevice`/`MigDevice` records exactly as a backend reports
them. Those go to the device plugin's resource accounting, so node allocatable is computed by the code a real
node runs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from kubegpu.clock import Clock
from kubegpu.errors import ConfigError, KubegpuError
from kubegpu.gpu.backend import GpuDevice, MigDevice
from kubegpu.gpu.catalog import GpuModel
from kubegpu.gpu.geometry import PlacedInstance, place
from kubegpu.gpu.simulated import SimulatedBackend


def placed_layout(model: GpuModel, wanted: Sequence[int], where: str) -> list[PlacedInstance]:
    """Legal placements for the wanted GI profile ids on one GPU; ConfigError naming `where` when impossible."""
    placed = place(model, list(wanted))
    if placed is None:
        raise ConfigError(f"{where}: MIG profiles {list(wanted)} do not fit on one {model.key}")
    return placed


class NodeHardware:
    """The GPUs of one simulated node and their MIG devices."""

    def __init__(self, node: str, model: GpuModel, count: int, clock: Clock) -> None:
        self.node = node
        self.model = model
        self.backend = SimulatedBackend(None, gpus=[model] * count, node_name=node, clock=clock)
        self.gpus: list[GpuDevice] = self.backend.devices()
        self.mig: dict[int, list[MigDevice]] = {}

    def apply(self, layouts: Mapping[int, Sequence[PlacedInstance] | None], where: str) -> None:
        """Give each listed GPU its layout (None: MIG off); other GPUs keep theirs. ConfigError naming `where`."""
        try:
            for index, layout in sorted(layouts.items()):
                self._apply_one(index, layout)
        except KubegpuError as exc:
            raise ConfigError(f"{where}: {exc}") from None
        # read back; a GPU or MIG list equal to what was read before stays the same object, so what is derived from
        # it per object (the device lists, `kubegpu.sharing.devices`) is not derived again for an unchanged GPU
        old_gpus, old_mig = {g.index: g for g in self.gpus}, self.mig
        self.gpus = [old_gpus[g.index] if old_gpus.get(g.index) == g else g for g in self.backend.devices()]
        self.mig = {}
        for gpu in self.gpus:
            if gpu.mig_enabled:
                devices = self.backend.mig_devices(gpu.index)
                self.mig[gpu.index] = old_mig[gpu.index] if old_mig.get(gpu.index) == devices else devices

    def _apply_one(self, index: int, layout: Sequence[PlacedInstance] | None) -> None:
        backend = self.backend
        for device in backend.mig_devices(index):
            backend.destroy_mig_device(index, device.gi_id)
        enabled = layout is not None
        if enabled and not self.model.mig_capable:
            raise ConfigError(f"GPU {index} ({self.model.key}) cannot enable MIG")
        if self.model.mig_capable and backend.set_mig_mode(index, enabled):
            backend.reset_gpu(index)  # Ampere applies a MIG mode change only after a GPU reset
        for instance in sorted(layout or ()):
            backend.create_mig_device(index, instance.profile_id, instance.start)
