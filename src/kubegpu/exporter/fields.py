"""How each DCGM field is read from one GPU or MIG instance.

The backend hands us one `GpuSample` per entity; this table says which of its values answers which DCGM field.
A value the backend does not provide (an attribute it lacks, or `None`) means "not supported on this entity",
and the series is left out rather than reported as a made-up zero.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from kubegpu.gpu.backend import GpuDevice, GpuSample, MigDevice


@dataclass(frozen=True)
class EntityReading:
    """One GPU, or one MIG instance of it, as read at one collection."""

    device: GpuDevice
    mig: MigDevice | None
    sample: GpuSample

    @property
    def memory_total_mib(self) -> int:
        return self.mig.memory_mib if self.mig is not None else self.device.memory_mib


Extractor = Callable[[EntityReading], float | None]


def _attr(name: str) -> Extractor:
    def read(reading: EntityReading) -> float | None:
        value = getattr(reading.sample, name, None)
        return None if value is None else float(value)

    return read


def _gpu_util(reading: EntityReading) -> float | None:
    """NVML has no utilization for a MIG instance (dcgm-exporter users' standing complaint); its graphics-engine
    activity is the same quantity on a 0..1 scale, so we report it as a percentage there."""
    if reading.mig is not None:
        active = getattr(reading.sample, "graphics_engine_active", None)
        return None if active is None else round(float(active) * 100.0, 2)
    return _attr("gpu_util")(reading)


def _fb_reserved(reading: EntityReading) -> float | None:
    sample = reading.sample
    return float(max(0, reading.memory_total_mib - sample.memory_used_mib - sample.memory_free_mib))


FIELD_EXTRACTORS: dict[str, Extractor] = {
    "DCGM_FI_DEV_SM_CLOCK": _attr("sm_clock_mhz"),
    "DCGM_FI_DEV_MEM_CLOCK": _attr("mem_clock_mhz"),
    "DCGM_FI_DEV_MEMORY_TEMP": _attr("memory_temperature_c"),
    "DCGM_FI_DEV_GPU_TEMP": _attr("temperature_c"),
    "DCGM_FI_DEV_POWER_USAGE": _attr("power_w"),
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": _attr("energy_mj"),
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": _attr("pcie_replay"),
    "DCGM_FI_DEV_GPU_UTIL": _gpu_util,
    "DCGM_FI_DEV_MEM_COPY_UTIL": _attr("mem_copy_util"),
    "DCGM_FI_DEV_ENC_UTIL": _attr("enc_util"),
    "DCGM_FI_DEV_DEC_UTIL": _attr("dec_util"),
    "DCGM_FI_DEV_XID_ERRORS": _attr("xid_last"),
    "DCGM_FI_DEV_FB_FREE": _attr("memory_free_mib"),
    "DCGM_FI_DEV_FB_USED": _attr("memory_used_mib"),
    "DCGM_FI_DEV_FB_RESERVED": _fb_reserved,
    "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL": _attr("nvlink_bandwidth_total"),
    "DCGM_FI_DEV_VGPU_LICENSE_STATUS": _attr("vgpu_license_status"),
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": _attr("uncorrectable_remapped_rows"),
    "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS": _attr("correctable_remapped_rows"),
    "DCGM_FI_DEV_ROW_REMAP_FAILURE": _attr("row_remap_failure"),
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE": _attr("graphics_engine_active"),
    "DCGM_FI_PROF_SM_ACTIVE": _attr("sm_active"),
    "DCGM_FI_PROF_SM_OCCUPANCY": _attr("sm_occupancy"),
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": _attr("tensor_active"),
    "DCGM_FI_PROF_DRAM_ACTIVE": _attr("dram_active"),
    "DCGM_FI_PROF_PCIE_TX_BYTES": _attr("pcie_tx_bytes"),
    "DCGM_FI_PROF_PCIE_RX_BYTES": _attr("pcie_rx_bytes"),
}

LABEL_FIELDS = ("DCGM_FI_DRIVER_VERSION", "DCGM_FI_DEV_NAME", "DCGM_FI_DEV_UUID")

KNOWN_FIELDS = frozenset(FIELD_EXTRACTORS) | frozenset(LABEL_FIELDS)


def label_field_value(field: str, device: GpuDevice, driver_version: str) -> str:
    """Values of the `label`-typed fields: static per device, attached to every series."""
    if field == "DCGM_FI_DRIVER_VERSION":
        return driver_version
    if field == "DCGM_FI_DEV_NAME":
        return device.product_name
    return device.uuid
