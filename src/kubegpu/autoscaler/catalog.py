"""Builders for instance-type catalogues: the shipped GPU/CPU catalogue and Karpenter's benchmark shape.

`shipped_catalogue()` regenerates `data/instance_types.json` (run this module as a script). Shapes follow the
public AWS families the issue names (p4d/p4de/p5/p5e, g4dn/g5/g6/g6e, c/m/r); prices are on-demand list prices
rounded, with spot at a fixed discount per zone, so tests and benchmarks are reproducible.
`fake_instance_types(n)` is Karpenter's `fake.InstanceTypes(n)`: type i has i+1 vCPU, 2(i+1) GiB, 10(i+1) pods,
priced 0.1·vCPU + 0.1·GiB, offered spot in two zones and on-demand in three.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from kubegpu.autoscaler.instancetypes import InstanceType, Offering, to_kwok
from kubegpu.sharing.names import GPU_RESOURCE

GIB = 2.0**30
ZONES = ("test-zone-a", "test-zone-b", "test-zone-c", "test-zone-d")
_SPOT_FACTORS = (0.38, 0.41, 0.44, 0.47)

# name, vCPU, memory GiB, GPUs, GPU model, on-demand $/h
GPU_SHAPES: tuple[tuple[str, int, int, int, str, float], ...] = (
    ("p4d.24xlarge", 96, 1152, 8, "A100-SXM4-40GB", 32.77),
    ("p4de.24xlarge", 96, 1152, 8, "A100-SXM4-80GB", 40.97),
    ("p5.48xlarge", 192, 2048, 8, "H100-SXM5-80GB", 98.32),
    ("p5e.48xlarge", 192, 2048, 8, "H200-141GB", 113.45),
    ("g4dn.xlarge", 4, 16, 1, "T4", 0.526),
    ("g4dn.2xlarge", 8, 32, 1, "T4", 0.752),
    ("g4dn.4xlarge", 16, 64, 1, "T4", 1.204),
    ("g4dn.8xlarge", 32, 128, 1, "T4", 2.176),
    ("g4dn.12xlarge", 48, 192, 4, "T4", 3.912),
    ("g4dn.16xlarge", 64, 256, 1, "T4", 4.352),
    ("g5.xlarge", 4, 16, 1, "A10G", 1.006),
    ("g5.2xlarge", 8, 32, 1, "A10G", 1.212),
    ("g5.4xlarge", 16, 64, 1, "A10G", 1.624),
    ("g5.8xlarge", 32, 128, 1, "A10G", 2.448),
    ("g5.12xlarge", 48, 192, 4, "A10G", 5.672),
    ("g5.16xlarge", 64, 256, 1, "A10G", 4.096),
    ("g5.24xlarge", 96, 384, 4, "A10G", 8.144),
    ("g5.48xlarge", 192, 768, 8, "A10G", 16.288),
    ("g6.xlarge", 4, 16, 1, "L4", 0.805),
    ("g6.2xlarge", 8, 32, 1, "L4", 0.978),
    ("g6.4xlarge", 16, 64, 1, "L4", 1.323),
    ("g6.8xlarge", 32, 128, 1, "L4", 2.014),
    ("g6.12xlarge", 48, 192, 4, "L4", 4.602),
    ("g6.24xlarge", 96, 384, 4, "L4", 6.675),
    ("g6.48xlarge", 192, 768, 8, "L4", 13.35),
    ("g6e.xlarge", 4, 32, 1, "L40S", 1.861),
    ("g6e.12xlarge", 48, 384, 4, "L40S", 10.493),
    ("g6e.48xlarge", 192, 1536, 8, "L40S", 30.131),
)
# family, memory GiB per vCPU, on-demand $ per vCPU-hour
CPU_FAMILIES = (("c6i", 2, 0.0425), ("m6i", 4, 0.048), ("r6i", 8, 0.063))
CPU_SIZES = (("large", 2), ("xlarge", 4), ("2xlarge", 8), ("4xlarge", 16), ("8xlarge", 32), ("12xlarge", 48),
             ("16xlarge", 64), ("24xlarge", 96), ("32xlarge", 128))


def _offerings(on_demand: float, zones: tuple[str, ...] = ZONES) -> tuple[Offering, ...]:
    spot = tuple(Offering(z, "spot", round(on_demand * f, 4)) for z, f in zip(zones, _SPOT_FACTORS, strict=False))
    return tuple(Offering(z, "on-demand", on_demand) for z in zones) + spot


def shipped_catalogue() -> list[InstanceType]:
    types = [
        InstanceType(name, "amd64", ("linux",),
                     {"cpu": cpu, "memory": mem * GIB, "pods": 110.0, GPU_RESOURCE: float(gpus)},
                     _offerings(price), gpu_model=model)
        for name, cpu, mem, gpus, model, price in GPU_SHAPES
    ]
    for family, mem_per_cpu, per_cpu in CPU_FAMILIES:
        for size, cpu in CPU_SIZES:
            types.append(InstanceType(f"{family}.{size}", "amd64", ("linux",),
                                      {"cpu": float(cpu), "memory": cpu * mem_per_cpu * GIB, "pods": 110.0},
                                      _offerings(round(cpu * per_cpu, 4))))
    return types


def fake_instance_types(count: int) -> list[InstanceType]:
    """Karpenter's `fake.InstanceTypes(count)` (the scheduling benchmark's 400 types)."""
    out = []
    for i in range(count):
        cpu, mem_gib = i + 1, 2 * (i + 1)
        price = 0.1 * cpu + 0.1 * mem_gib * GIB / 1e9
        offerings = (Offering("test-zone-1", "spot", price), Offering("test-zone-2", "spot", price),
                     Offering("test-zone-1", "on-demand", price), Offering("test-zone-2", "on-demand", price),
                     Offering("test-zone-3", "on-demand", price))
        out.append(InstanceType(f"fake-it-{i}", "amd64", ("linux",),
                                {"cpu": float(cpu), "memory": mem_gib * GIB, "pods": 10.0 * (i + 1)}, offerings))
    return out


def write_shipped(path: Path) -> None:
    path.write_text(json.dumps(to_kwok(shipped_catalogue()), indent=1) + "\n")


if __name__ == "__main__":  # pragma: no cover - regenerates package data
    write_shipped(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).parent / "data" / "instance_types.json")
