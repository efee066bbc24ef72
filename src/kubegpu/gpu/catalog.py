"""The GPU models kubegpu knows, with their exact MIG geometry.

Source: reference/mig-geometry-and-partitioning.md §1 (tables quoted from the NVIDIA MIG User Guide and real
`nvidia-smi mig -lgip/-lgipp` dumps). Each profile and model carries `confirmed`: True where every geometry value
(id, placement, SMs, max count) was confirmed there (C), False where any of them is inferred (I) or, where the
reference has no value (?), a plausible choice of ours documented next to it. Memory sizes in MiB are the GiB an
`nvidia-smi mig -lgip` dump prints times 1024; they drift between drivers, which is why the geometry is keyed on the
GI profile id and placement, never on the `Ngb` name.

`confirmed` covers the geometry and sizes. Engine counts (copy/decoder/encoder/jpeg/ofa, for GFD's
`mig-<p>.engines.*` labels) follow the reference's UG "HW" columns where it has them and real lgip dumps otherwise;
treat them as informative, not authoritative.

On real hardware the NVML adapter reads profiles from the driver; these tables drive the simulator, the planner and
config validation, and are the fixtures the tests check NVML-shaped data against.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property

from kubegpu.errors import NotFoundError


@dataclass(frozen=True)
class MigEngines:
    """Engine counts of one MIG GPU instance, as GFD labels them (`engines.copy`, `.decoder`, ...)."""

    copy: int
    decoder: int
    encoder: int
    jpeg: int
    ofa: int


@dataclass(frozen=True)
class MigProfile:
    """One GPU-instance profile of one GPU model (the CI always spans the whole GI)."""

    profile_id: int
    name: str
    memory_slots: int
    compute_slices: int
    multiprocessors: int
    memory_mib: int
    max_count: int
    starts: tuple[int, ...]
    engines: MigEngines
    media_extensions: bool
    confirmed: bool

    @property
    def resource_name(self) -> str:
        """The mixed-strategy resource suffix: `mig-1g.10gb`, `+me` written `.me` as mig-parted does."""
        return "mig-" + self.name.replace("+", ".")

    @property
    def config_name(self) -> str:
        """The profile name as mig-parted config names write it (`1g.10gb.me`)."""
        return self.name.replace("+", ".")


@dataclass(frozen=True)
class GpuModel:
    """A GPU model: identity as NVML reports it, capacity, and (for MIG models) every GI profile."""

    key: str
    product_name: str
    pci_device_id: str
    memory_mib: int
    multiprocessors: int
    compute_capability: tuple[int, int]
    architecture: str
    mig_memory_slots: int
    mig_compute_slices: int
    mig_profiles: tuple[MigProfile, ...]
    confirmed: bool
    # Spec-sheet values (not in the reference, so inferred) that drive the simulated node's power and clocks.
    max_power_w: int = 300
    max_sm_clock_mhz: int = 1410
    mem_clock_mhz: int = 1593

    @property
    def mig_capable(self) -> bool:
        return self.mig_memory_slots > 0

    @property
    def mig_resets_on_mode_change(self) -> bool:
        """Ampere needs a GPU reset (or reboot) for a MIG mode change; Hopper and newer toggle at once (C)."""
        return self.mig_capable and self.architecture == "ampere"

    def profile(self, key: str | int) -> MigProfile:
        """Look a profile up by GI profile id, display name or config name (`1g.10gb+me` or `1g.10gb.me`).

        An `Nc.` compute prefix equal to the GI's slices (`7c.7g.80gb`) is accepted, since it means the same device.
        """
        for candidate in self.mig_profiles:
            if isinstance(key, int):
                if candidate.profile_id == key:
                    return candidate
            elif _normalise_profile_name(key) == candidate.config_name:
                return candidate
        known = ", ".join(p.name for p in self.mig_profiles) or "none (not MIG-capable)"
        raise NotFoundError(f"GPU model {self.key} has no MIG profile {key!r}; known: {known}")

    def profile_by_id(self) -> Mapping[int, MigProfile]:
        """Profiles by GI profile id: built once per model (a fleet-sized plan asks thousands of times)."""
        return self._profiles_by_id

    @cached_property
    def _profiles_by_id(self) -> Mapping[int, MigProfile]:
        return {p.profile_id: p for p in self.mig_profiles}


def _normalise_profile_name(name: str) -> str:
    name = name.strip().replace("+", ".")
    parts = name.split(".", 1)
    if len(parts) == 2 and parts[0].endswith("c") and parts[1][:1].isdigit():
        compute, rest = parts[0][:-1], parts[1]
        if rest.startswith(compute + "g"):
            return rest
    return name


def gfd_family(compute_capability: tuple[int, int]) -> str:
    """GFD's `nvidia.com/gpu.family` from a compute capability (kubelet-device-plugin.md §4)."""
    major, minor = compute_capability
    if major == 7:
        return "volta" if minor < 5 else "turing"
    if major == 8:
        return "ada-lovelace" if minor >= 9 else "ampere"
    families = {1: "tesla", 2: "fermi", 3: "kepler", 5: "maxwell", 6: "pascal", 9: "hopper", 10: "blackwell",
                12: "blackwell", 13: "rubin"}
    return families.get(major, "undefined")


# --- profile tables -------------------------------------------------------------------------------------------------

_STARTS_1 = (0, 1, 2, 3, 4, 5, 6)  # 8-slot GPUs: 1g and 1g+me never start at 7 (-lgipp {0..6}:1)
_STARTS_1D = (0, 2, 4, 6)
_STARTS_2 = (0, 2, 4)
_STARTS_3 = (0, 4)
_STARTS_FULL = (0,)


def _e(copy: int, decoder: int, jpeg: int = 0, ofa: int = 0, encoder: int = 0) -> MigEngines:
    return MigEngines(copy=copy, decoder=decoder, encoder=encoder, jpeg=jpeg, ofa=ofa)


def _eight_slot_profiles(
    names: tuple[str, str, str, str, str, str],
    sms: tuple[int, int, int, int, int, int],
    mib: tuple[int, int, int, int, int],
    engines: tuple[MigEngines, MigEngines, MigEngines, MigEngines, MigEngines, MigEngines, MigEngines],
    confirmed: tuple[bool, bool, bool, bool, bool, bool, bool],
) -> tuple[MigProfile, ...]:
    """The generic 8-memory-slot / 7-SM-slice table (§1.2), filled in with one model's names, SMs and sizes.

    names: 1g, 1g double-memory, 2g, 3g, 4g, 7g (the +me name is derived); sms in the same order;
    mib: 1g, 2-slot (2g), 4-slot (3g and 4g), full, 1g double-mem (0: same as 2g);
    engines/confirmed: 1g, 1g+me, 1d, 2g, 3g, 4g, 7g.
    """
    n1, n1d, n2, n3, n4, n7 = names
    s1, s1d, s2, s3, s4, s7 = sms
    m1, m2, m4, m8, m1d = mib
    rows = (
        (19, n1, 1, 1, s1, m1, 7, _STARTS_1, False),
        (20, n1 + "+me", 1, 1, s1, m1, 1, _STARTS_1, True),
        (15, n1d, 2, 1, s1d, m1d or m2, 4, _STARTS_1D, False),
        (14, n2, 2, 2, s2, m2, 3, _STARTS_2, False),
        (9, n3, 4, 3, s3, m4, 2, _STARTS_3, False),
        (5, n4, 4, 4, s4, m4, 1, _STARTS_FULL, False),
        (0, n7, 8, 7, s7, m8, 1, _STARTS_FULL, False),
    )
    return tuple(
        MigProfile(profile_id=pid, name=name, memory_slots=slots, compute_slices=slices, multiprocessors=sm,
                   memory_mib=size, max_count=count, starts=starts, engines=engines[i], media_extensions=me,
                   confirmed=confirmed[i])
        for i, (pid, name, slots, slices, sm, size, count, starts, me) in enumerate(rows)
    )


# A100 (lgip: 1g CE1 DEC0; +me DEC1 JPEG1 OFA1; 1g double-mem DEC1; 2g CE2 DEC1; 3g CE3 DEC2; 4g CE4 DEC2;
# 7g CE7 DEC5 JPEG1 OFA1; GA100 has no NVENC).
_A100_ENGINES = (_e(1, 0), _e(1, 1, 1, 1), _e(1, 1), _e(2, 1), _e(3, 2), _e(4, 2), _e(7, 5, 1, 1))
# Hopper (UG Table 7/8 HW column: g NVDEC and g JPEG per instance, OFA on +me and 7g, 8 CE on 7g; no NVENC).
_HOPPER_ENGINES = (_e(1, 1, 1), _e(1, 1, 1, 1), _e(1, 1, 1), _e(2, 2, 2), _e(3, 3, 3), _e(4, 4, 4), _e(8, 7, 7, 1))
# B200 (UG Table 9: CE 2/2/2/3/6/8/16, one NVDEC and one JPEG on every profile, OFA on +me; 7g OFA inferred).
_B200_ENGINES = (_e(2, 1, 1), _e(2, 1, 1, 1), _e(2, 1, 1), _e(3, 1, 1), _e(6, 1, 1), _e(8, 1, 1), _e(16, 1, 1, 1))

_A100_40_PROFILES = _eight_slot_profiles(
    ("1g.5gb", "1g.10gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb"),
    (14, 14, 28, 42, 56, 98),
    (4864, 9984, 20096, 40448, 9856),  # 4.75 / 9.75 / 19.62 / 39.50 GiB; 1g double-mem ~9.6 GiB
    _A100_ENGINES,
    (True, False, False, True, True, True, True),  # 1g.5gb+me SMs (I); 1g.10gb (15) SMs (I)
)
_A100_80_PROFILES = _eight_slot_profiles(
    ("1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"),
    (14, 14, 28, 42, 56, 98),
    (9984, 19968, 40192, 80384, 0),  # 9.75 / 19.50 / 39.25 / 78.50 GiB
    _A100_ENGINES,
    (False,) * 7,  # placements inferred from the 40GB part (same GA100 die)
)
_H100_80_PROFILES = _eight_slot_profiles(
    ("1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"),
    (16, 26, 32, 60, 64, 132),
    (9984, 20096, 40448, 81152, 0),  # 9.75 / 19.62 / 39.50 / 79.25 GiB
    _HOPPER_ENGINES,
    (False,) * 7,  # lgip confirmed, placements inferred from the identical H100 NVL lgipp
)
_H100_NVL_PROFILES = _eight_slot_profiles(
    ("1g.12gb", "1g.24gb", "2g.24gb", "3g.47gb", "4g.47gb", "7g.94gb"),
    (16, 26, 32, 60, 64, 132),
    (11008, 22144, 47488, 95360, 0),  # 10.75 / 21.62 / 46.38 / 93.12 GiB
    _HOPPER_ENGINES,
    (True,) * 7,
)
_H200_PROFILES = _eight_slot_profiles(
    ("1g.18gb", "1g.35gb", "2g.35gb", "3g.71gb", "4g.71gb", "7g.141gb"),
    (16, 26, 32, 60, 64, 132),
    (16384, 33024, 71168, 143360, 0),  # 16.00 / 32.25 / 69.50 / 140.00 GiB
    _HOPPER_ENGINES,
    (False,) * 7,  # ids and SMs confirmed, placements inferred (8-slot pattern)
)
_B200_PROFILES = _eight_slot_profiles(
    ("1g.23gb", "1g.45gb", "2g.45gb", "3g.90gb", "4g.90gb", "7g.180gb"),
    # 1g 18, 1g double-mem 30, 2g 36 SMs confirmed; 3g/4g/7g unknown (?) -> our choice: 3 and 4 times the 1g's SMs,
    # and the whole die (148) for 7g as on Hopper. The go-nvml mock's 54/72/126 is known to be untrustworthy.
    (18, 30, 36, 54, 72, 148),
    (22528, 45312, 90624, 182784, 0),  # 22.00 / 44.25 GiB confirmed; 4-slot and full sizes scaled (I)
    _B200_ENGINES,
    (False,) * 7,
)


def _a30_profiles() -> tuple[MigProfile, ...]:
    """A30: 4 memory positions and 4 SM slices, from one card's lgip + lgipp (C)."""
    rows = (
        (14, "1g.6gb", 1, 1, 14, 5952, 4, (0, 1, 2, 3), _e(1, 0), False),
        (21, "1g.6gb+me", 1, 1, 14, 5952, 1, (0, 1, 2, 3), _e(1, 1, 1, 1), True),
        (5, "2g.12gb", 2, 2, 28, 11968, 2, (0, 2), _e(2, 2), False),
        (6, "2g.12gb+me", 2, 2, 28, 11968, 1, (0, 2), _e(2, 2, 1, 1), True),
        (0, "4g.24gb", 4, 4, 56, 24000, 1, (0,), _e(4, 4, 1, 1), False),
    )
    return tuple(
        MigProfile(profile_id=pid, name=name, memory_slots=slots, compute_slices=slices, multiprocessors=sm,
                   memory_mib=mib, max_count=count, starts=starts, engines=engines, media_extensions=me,
                   confirmed=True)
        for pid, name, slots, slices, sm, mib, count, starts, engines, me in rows
    )


def _model(key: str, product: str, pci: str, mib: int, sms: int, cc: tuple[int, int],
           profiles: tuple[MigProfile, ...] = (), confirmed: bool = False,
           power_clocks: tuple[int, int, int] = (300, 1410, 1593)) -> GpuModel:
    slots = max((max(p.starts) + p.memory_slots for p in profiles), default=0)
    slices = max((p.compute_slices for p in profiles), default=0)
    power, sm_clock, mem_clock = power_clocks
    return GpuModel(key=key, product_name=product, pci_device_id=pci, memory_mib=mib, multiprocessors=sms,
                    compute_capability=cc, architecture=gfd_family(cc), mig_memory_slots=slots,
                    mig_compute_slices=slices, mig_profiles=profiles, confirmed=confirmed, max_power_w=power,
                    max_sm_clock_mhz=sm_clock, mem_clock_mhz=mem_clock)


# Non-MIG models are not in the reference: NVML names, PCI ids, memory and SMs are public spec-sheet values (I),
# as are every model's board power and max SM / memory clocks (W, MHz, MHz).
_MODELS = (
    _model("A100-SXM4-40GB", "NVIDIA A100-SXM4-40GB", "0x20B010DE", 40960, 108, (8, 0), _A100_40_PROFILES,
           power_clocks=(400, 1410, 1215)),
    _model("A100-SXM4-80GB", "NVIDIA A100-SXM4-80GB", "0x20B210DE", 81920, 108, (8, 0), _A100_80_PROFILES,
           power_clocks=(400, 1410, 1593)),
    _model("A30-24GB", "NVIDIA A30", "0x20B710DE", 24576, 56, (8, 0), _a30_profiles(), confirmed=True,
           power_clocks=(165, 1440, 1215)),
    _model("H100-SXM5-80GB", "NVIDIA H100 80GB HBM3", "0x233010DE", 81559, 132, (9, 0), _H100_80_PROFILES,
           power_clocks=(700, 1980, 2619)),
    _model("H100-NVL-94GB", "NVIDIA H100 NVL", "0x232110DE", 95830, 132, (9, 0), _H100_NVL_PROFILES, confirmed=True,
           power_clocks=(400, 1785, 2619)),
    _model("H200-141GB", "NVIDIA H200", "0x233510DE", 143771, 132, (9, 0), _H200_PROFILES,
           power_clocks=(700, 1980, 3201)),
    _model("B200-180GB", "NVIDIA B200", "0x290110DE", 183359, 148, (10, 0), _B200_PROFILES,
           power_clocks=(1000, 1965, 3996)),
    _model("L4", "NVIDIA L4", "0x27B810DE", 23034, 58, (8, 9), power_clocks=(72, 2040, 6251)),
    _model("T4", "Tesla T4", "0x1EB810DE", 15360, 40, (7, 5), power_clocks=(70, 1590, 5001)),
    _model("A10G", "NVIDIA A10G", "0x223710DE", 23028, 80, (8, 6), power_clocks=(300, 1710, 6251)),
    _model("L40S", "NVIDIA L40S", "0x26B910DE", 46068, 142, (8, 9), power_clocks=(350, 2520, 9001)),
)

CATALOG: dict[str, GpuModel] = {m.key: m for m in _MODELS}
# every spelling `get_model` accepts, lower-cased, to its model (the first model wins, as a scan in catalog order
# would): controllers look a model up for every GPU of every node, every pass
_BY_NAME: dict[str, GpuModel] = {}
for _entry in reversed(_MODELS):
    for _name in (_entry.key, _entry.product_name, _entry.product_name.replace(" ", "-"), _entry.pci_device_id):
        _BY_NAME[_name.lower()] = _entry


def get_model(key: str) -> GpuModel:
    """Find a model by catalog key, NVML product name, GFD's sanitised product label (`NVIDIA-A100-SXM4-80GB`, as
    in `nvidia.com/gpu.product`) or PCI device id; case-insensitive."""
    found = _BY_NAME.get(key.strip().lower())
    if found is None:
        raise NotFoundError(f"unknown GPU model {key!r}; known: {', '.join(CATALOG)}")
    return found


def find_model(key: str) -> GpuModel | None:
    """Like `get_model`, but None for a GPU the catalog does not know (real nodes may hold any GPU)."""
    try:
        return get_model(key)
    except NotFoundError:
        return None
