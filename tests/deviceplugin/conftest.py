"""Fixtures for the device plugin tests: GPU and MIG device records shaped like the backend's."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from kubegpu.gpu.backend import GpuDevice, MigDevice
from tests.fakes.fake_kubelet import FakeKubelet

A100_80 = "NVIDIA A100-SXM4-80GB"


def make_gpu(index: int, product: str = A100_80, memory_mib: int = 81920, mig_enabled: bool = False,
             numa_node: int | None = None) -> GpuDevice:
    return GpuDevice(
        index=index, uuid=f"GPU-{index:08d}-0000-0000-0000-000000000000", product_name=product,
        model_key=None, memory_mib=memory_mib, pci_bus_id=f"00000000:{index + 16:02X}:00.0",
        pci_device_id="0x20B210DE", numa_node=numa_node if numa_node is not None else index // 4,
        compute_capability=(8, 0), multiprocessors=108, mig_capable=True, mig_enabled=mig_enabled,
        mig_pending=False,
    )


def make_mig(gpu: GpuDevice, gi_id: int, profile_name: str, profile_id: int, start: int, size: int,
             memory_mib: int) -> MigDevice:
    return MigDevice(
        gpu_index=gpu.index, gpu_uuid=gpu.uuid, uuid=f"MIG-{gpu.index:04d}{gi_id:04d}-0000-0000-0000-000000000000",
        gi_id=gi_id, ci_id=0, profile_id=profile_id, profile_name=profile_name, start=start, size=size,
        memory_mib=memory_mib, multiprocessors=14 * size,
    )


def balanced_migs(gpu: GpuDevice) -> list[MigDevice]:
    """A100-80GB all-balanced: 1g.10gb x2 + 2g.20gb + 3g.40gb."""
    return [
        make_mig(gpu, 2, "3g.40gb", 9, 4, 4, 40192),
        make_mig(gpu, 3, "2g.20gb", 14, 0, 2, 19968),
        make_mig(gpu, 9, "1g.10gb", 19, 2, 1, 9856),
        make_mig(gpu, 10, "1g.10gb", 19, 3, 1, 9856),
    ]


@pytest.fixture
def node() -> Any:
    """The builders, for tests that need MIG devices or odd GPUs."""
    import types

    return types.SimpleNamespace(gpu=make_gpu, mig=make_mig, balanced=balanced_migs)


@pytest.fixture
def gpus() -> Callable[..., list[GpuDevice]]:
    def build(count: int = 8, **kwargs: Any) -> list[GpuDevice]:
        return [make_gpu(i, **kwargs) for i in range(count)]

    return build


@pytest.fixture
def short_tmp() -> Any:
    """Unix socket paths are limited to ~107 bytes; pytest's tmp_path can be longer, so use a short dir."""
    import shutil
    import tempfile
    from pathlib import Path

    directory = Path(tempfile.mkdtemp(prefix="kgdp-", dir="/tmp"))
    yield directory
    shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture
async def kubelet(short_tmp: Any) -> Any:
    fake = FakeKubelet(short_tmp)
    await fake.start()
    yield fake
    await fake.stop()
