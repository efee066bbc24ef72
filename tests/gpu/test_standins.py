"""Stand-in device nodes for simulated GPUs: every CDI spec written for a simulated node names host paths
that exist — character devices under `<node file>.dev/` — while the container paths stay `/dev/nvidia*`, so a real
container runtime can inject simulated GPUs; real hardware keeps the host's own /dev."""

from __future__ import annotations

import errno
import json
import os
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kubegpu.dra.driver import ClaimRef, DraDriver
from kubegpu.errors import KubegpuError
from kubegpu.gpu import standins
from kubegpu.gpu.simulated import SimulatedBackend
from kubegpu.sharing.cdi import CONTROL_DEVICES, cdi_spec, spec_device_paths, write_cdi_spec
from kubegpu.sharing.devices import devices_by_resource

root_only = pytest.mark.skipif(os.geteuid() != 0, reason="making character devices (mknod) needs root")


@pytest.fixture
def node() -> Iterator[SimulatedBackend]:
    with tempfile.TemporaryDirectory(prefix="standin") as tmp:
        yield SimulatedBackend.create(Path(tmp) / "node.json", gpus="2xA100-SXM4-80GB", node_name="node-a")


def device_nodes(spec: dict[str, Any]) -> list[dict[str, str]]:
    edits = [spec["containerEdits"], *(d["containerEdits"] for d in spec["devices"])]
    return [n for e in edits for n in e.get("deviceNodes", [])]


def assert_stand_ins(spec: dict[str, Any], node: SimulatedBackend) -> None:
    directory = standins.for_backend(node)
    assert directory == Path(f"{node.path}.dev").resolve()
    nodes = device_nodes(spec)
    assert nodes
    for entry in nodes:
        assert entry["path"].startswith("/dev/nvidia"), entry
        host = Path(entry["hostPath"])
        assert host.parent == directory or directory in host.parents, entry  # never the host's /dev
        info = host.stat()  # containerd stats every hostPath: it must exist
        assert stat.S_ISCHR(info.st_mode) and (os.major(info.st_rdev), os.minor(info.st_rdev)) == (1, 3), entry
        assert host.name == Path(entry["path"]).name


@root_only
def test_dra_claim_spec_points_at_stand_ins(node: SimulatedBackend) -> None:
    """Fails on the old code: the spec named /dev/nvidia0 etc., which do not exist on a GPU-less host."""
    assert node.path is not None
    claim = {"metadata": {"name": "c", "namespace": "ml", "uid": "uid-c"}, "status": {"allocation": {"devices": {
        "results": [{"request": "gpu", "driver": "gpu.nvidia.com", "pool": "node-a", "device": "gpu-1"}]}}}}
    base = node.path.parent
    driver = DraDriver(SimulatedBackend(node.path), "node-a", base / "plugins", base / "cdi",
                       lambda ns, name: claim)
    result = driver.prepare([ClaimRef("ml", "uid-c", "c")])["uid-c"]
    assert not result.error, result.error
    [spec_file] = (base / "cdi").glob("*.json")
    spec = json.loads(spec_file.read_text())
    assert_stand_ins(spec, node)
    assert {n["path"] for n in device_nodes(spec)} == {"/dev/nvidia1", *CONTROL_DEVICES}


@root_only
def test_device_plugin_spec_and_mig_caps_point_at_stand_ins(node: SimulatedBackend) -> None:
    node.set_mig_mode(0, True)
    node.reset_gpu(0)
    node.create_mig_device(0, 19, 0)  # 1g.10gb: its GPU-instance and compute-instance capability nodes too
    listing = devices_by_resource(node.devices(), {0: node.mig_devices(0)},
                                  {"version": "v1", "flags": {"migStrategy": "mixed"}})
    devices = [d for ds in listing.values() for d in ds]
    directory = str(standins.for_backend(node))
    spec = cdi_spec(devices, stand_ins=directory)
    assert any("/dev/nvidia-caps/" in p for p in spec_device_paths(spec))
    with tempfile.TemporaryDirectory() as cdi:
        written = json.loads(write_cdi_spec(Path(cdi), spec, directory).read_text())
    assert_stand_ins(written, node)


def test_real_hardware_keeps_the_host_paths() -> None:
    assert standins.for_backend(SimulatedBackend(None, gpus="1xA100-SXM4-80GB")) is None  # in memory: no file
    nodes = device_nodes(cdi_spec([], dev_root="/run/nvidia/driver"))
    assert {(n["path"], n["hostPath"]) for n in nodes} == {(p, f"/run/nvidia/driver{p}") for p in CONTROL_DEVICES}


def test_a_stand_in_that_may_not_be_made_is_one_line(node: SimulatedBackend, monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*_: Any) -> None:
        raise PermissionError(errno.EPERM, "Operation not permitted")

    monkeypatch.setattr(os, "mknod", refuse)
    directory = standins.for_backend(node)
    assert directory is not None
    with pytest.raises(KubegpuError) as caught:
        standins.ensure(directory, ["/dev/nvidia0"])
    message = str(caught.value)
    assert "\n" not in message and "nvidia0" in message and "root" in message and "mknod c 1 3" in message


def test_only_device_paths_get_stand_ins(node: SimulatedBackend) -> None:
    directory = standins.for_backend(node)
    assert directory is not None
    for bad in ("/etc/passwd", "/dev/../etc/shadow", "/dev/"):
        with pytest.raises(KubegpuError):
            standins.ensure(directory, [bad])
    (directory / "nvidia0").parent.mkdir(parents=True, exist_ok=True)
    (directory / "nvidia0").write_text("not a device")
    with pytest.raises(KubegpuError, match="not a character device"):
        standins.ensure(directory, ["/dev/nvidia0"])
