"""The DRA driver's durable writes and what recovery does with them: intents saved once before the node changes (a
crash right after an instance exists still leaves it named), a claim without side effects written once, files of
claims never recorded swept at start, and a checkpoint whose incremental encoding is exactly the checksummed one."""

from __future__ import annotations

import json
import os
import stat
import tempfile
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest

from kubegpu.dra.checkpoint import COMPLETED, Checkpoint, ClaimRecord, PreparedDevice, _encode
from kubegpu.dra.driver import ClaimRef
from kubegpu.files import loads_checked, write_durable
from kubegpu.gpu.simulated import SimulatedBackend
from tests.dra.test_driver import Env, allocated


@pytest.fixture
def env() -> Iterator[Env]:
    with tempfile.TemporaryDirectory(prefix="drarec") as tmp:  # short: the driver's sockets live below
        root = Path(tmp)
        backend = SimulatedBackend.create(root / "node.json", gpus="1xA100-SXM4-40GB,1xL4", node_name="node-a")
        yield Env(root, backend, {})


def count_saves(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    saved: list[str] = []
    original = Checkpoint.save

    def save(self: Checkpoint, changed: str | None = None) -> None:
        saved.append(self.claims[changed].state if changed in self.claims else "removed")
        original(self, changed)

    monkeypatch.setattr(Checkpoint, "save", save)
    return saved


def test_durable_checkpoint_writes_per_claim(env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    driver = env.driver()
    saves = count_saves(monkeypatch)
    whole = ClaimRef(*env.add(allocated("whole", [("gpu", "gpu-1")])))
    assert driver.prepare([whole])[whole.uid].error == ""
    assert saves == ["PrepareCompleted"]  # no side effect: one write, after the CDI spec
    saves.clear()
    mig = ClaimRef(*env.add(allocated("mig", [("a", "gpu-0-mig-1g5gb-19-0"), ("b", "gpu-0-mig-1g5gb-19-1")])))
    assert driver.prepare([mig])[mig.uid].error == ""
    assert saves == ["PrepareStarted", "PrepareCompleted"]  # both instances' intents in one write
    saves.clear()
    assert driver.unprepare([mig, whole]) == {mig.uid: "", whole.uid: ""}
    assert saves == ["removed", "removed"]


def test_crash_right_after_an_instance_is_created_destroys_it(env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    ref = ClaimRef(*env.add(allocated("torn", [("a", "gpu-0-mig-1g5gb-19-0"), ("b", "gpu-0-mig-2g10gb-14-4")])))
    driver = env.driver()
    create = SimulatedBackend.create_mig_device

    def create_then_die(self: SimulatedBackend, index: int, profile_id: int, start: int) -> Any:
        create(self, index, profile_id, start)
        raise SystemExit("killed")  # the instance exists; nothing was saved after it

    monkeypatch.setattr(SimulatedBackend, "create_mig_device", create_then_die)
    with pytest.raises(SystemExit):
        driver._prepare_one(ref)
    monkeypatch.undo()
    assert [(m.profile_id, m.start) for m in env.backend.mig_devices(0)] == [(19, 0)]
    restarted = env.driver()
    assert env.backend.mig_devices(0) == [] and restarted.checkpoint.claims == {}
    assert restarted.prepare([ref])[ref.uid].error == ""
    assert sorted((m.profile_id, m.start) for m in env.backend.mig_devices(0)) == [(14, 4), (19, 0)]


def test_recovery_never_destroys_another_claims_instance(env: Env) -> None:
    driver = env.driver()
    kept = ClaimRef(*env.add(allocated("kept", [("m", "gpu-0-mig-1g5gb-19-3")])))
    assert driver.prepare([kept])[kept.uid].error == ""
    # a half-prepared claim whose intents name the same placement (as a torn checkpoint might)
    driver.checkpoint.claims["uid-torn"] = ClaimRecord("ml", "torn", planned_mig=[[0, 19, 3]])
    driver.checkpoint.save("uid-torn")
    restarted = env.driver()
    assert [(m.profile_id, m.start) for m in env.backend.mig_devices(0)] == [(19, 3)]
    assert set(restarted.checkpoint.claims) == {kept.uid}


def test_start_sweeps_limit_files_of_claims_never_recorded(env: Env) -> None:
    limits = env.root / "plugins" / "gpu.nvidia.com" / "mps"
    limits.mkdir(parents=True)
    (limits / "uid-ghost.json").write_text("{}")  # a crash after the limits, before any record
    env.driver()
    assert list(limits.iterdir()) == []


def test_incremental_checkpoint_is_the_canonical_checksummed_document(tmp_path: Path) -> None:
    checkpoint = Checkpoint(tmp_path / "checkpoint.json")
    for n in (3, 1, 2):
        checkpoint.claims[f"uid-{n}"] = ClaimRecord("ml", f"c{n}", state=COMPLETED, devices=[
            PreparedDevice(["gpu"], "node-a", f"gpu-{n}", [f"k8s.gpu.nvidia.com/claim=uid-{n}-gpu-{n}"])])
        checkpoint.save(f"uid-{n}")
    checkpoint.claims["uid-2"].cdi_spec = "/cdi/x.json"
    checkpoint.save("uid-2")
    del checkpoint.claims["uid-1"]
    checkpoint.save("uid-1")
    text = (tmp_path / "checkpoint.json").read_text()
    data = loads_checked(text, "checkpoint.json", "kubegpu-dra-checkpoint", 1)  # the checksum verifies
    assert isinstance(data, dict) and sorted(data["claims"]) == ["uid-2", "uid-3"]
    assert data["claims"]["uid-2"]["cdi_spec"] == "/cdi/x.json"
    assert json.loads(text)["data"] == data
    reloaded = Checkpoint(tmp_path / "checkpoint.json")
    assert reloaded.claims == checkpoint.claims
    for record in reloaded.claims.values():  # the direct encoding is asdict's, canonically
        assert _encode(record) == json.dumps(asdict(record), sort_keys=True, separators=(",", ":"))


def test_an_instance_that_appeared_since_the_refresh_is_used_as_found(env: Env) -> None:
    driver = env.driver()
    backend = SimulatedBackend(env.root / "node.json")
    backend.set_mig_mode(0, True)
    backend.reset_gpu(0)  # A100: the mode takes effect at reset
    orphan = backend.create_mig_device(0, 19, 2)  # made behind the driver's back, after its last refresh
    ref = ClaimRef(*env.add(allocated("found", [("m", "gpu-0-mig-1g5gb-19-2")])))
    assert driver.prepare([ref])[ref.uid].error == ""  # the creation fails on the overlap; the instance is used
    assert driver.checkpoint.claims[ref.uid].planned_mig == [] and driver.checkpoint.claims[ref.uid].created_mig == []
    assert driver.unprepare([ref]) == {ref.uid: ""}
    assert [m.uuid for m in backend.mig_devices(0)] == [orphan.uuid]  # not ours to destroy


def test_a_reboot_empties_the_checkpoint_and_claims_are_prepared_again(env: Env) -> None:
    driver = env.driver()
    whole = ClaimRef(*env.add(allocated("whole", [("gpu", "gpu-1")])))
    mig = ClaimRef(*env.add(allocated("mig", [("m", "gpu-0-mig-1g5gb-19-0")])))
    assert {uid: r.error for uid, r in driver.prepare([whole, mig]).items()} == {whole.uid: "", mig.uid: ""}
    before = env.backend.mig_devices(0)[0].uuid
    env.backend.reboot()  # the instance is gone, and so would be /var/run/cdi
    restarted = env.driver()
    assert restarted.checkpoint.claims == {} and env.cdi_files() == []  # nothing answered from the earlier boot
    again = restarted.prepare([whole, mig])
    assert {uid: r.error for uid, r in again.items()} == {whole.uid: "", mig.uid: ""}
    made = env.backend.mig_devices(0)
    assert [(m.profile_id, m.start) for m in made] == [(19, 0)] and made[0].uuid != before
    assert len(env.cdi_files()) == 2
    # the checkpoint now names this boot: a plain restart answers from it again
    assert set(env.driver().checkpoint.claims) == {whole.uid, mig.uid}
    assert env.backend.mig_devices(0) == made


def test_checkpoint_saves_sync_the_file_not_the_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """One journal commit per save on the pod-start path: the file's data (never torn), not the rename, which a power
    cut makes moot (the next boot drops the checkpoint); other durable writes still sync both."""
    synced: list[str] = []
    fsync = os.fsync

    def recording_fsync(fd: int) -> None:
        synced.append("directory" if stat.S_ISDIR(os.fstat(fd).st_mode) else "file")
        fsync(fd)

    monkeypatch.setattr(os, "fsync", recording_fsync)
    checkpoint = Checkpoint(tmp_path / "checkpoint.json")
    checkpoint.claims["uid-1"] = ClaimRecord("ml", "c1", state=COMPLETED)
    checkpoint.save("uid-1")
    assert synced == ["file"]
    synced.clear()
    write_durable(tmp_path / "other.json", "{}")
    assert synced == ["file", "directory"]
