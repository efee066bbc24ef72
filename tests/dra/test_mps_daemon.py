"""MPS control daemons for MPS-shared claims, against a fake `nvidia-cuda-mps-control` on PATH: started at prepare
in the claim's own pipe and log directories with the claim's limits, stopped at unprepare and on rollback, never
started twice, and stopped on recovery when a crash came between its start and `PrepareCompleted`."""

from __future__ import annotations

import json
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kubegpu.dra.driver import ClaimRef, DraDriver
from kubegpu.errors import KubegpuError
from kubegpu.gpu.simulated import SimulatedBackend
from kubegpu.sharing.mps_control import find_mps_control
from tests.dra.test_driver import allocated
from tests.fakes import fake_mps_control

MPS_CONFIG = [{"source": "FromClaim", "requests": ["gpu"], "opaque": {"driver": "gpu.nvidia.com", "parameters": {
    "apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig", "sharing": {
        "strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 25,
                                         "defaultPinnedDeviceMemoryLimit": "10Gi"}}}}}]


class Node:
    def __init__(self, root: Path, binary: str) -> None:
        self.root = root
        self.binary = binary
        self.log = root / "bin" / "mps-invocations.jsonl"
        self.claims: dict[tuple[str, str], dict[str, Any]] = {}
        self.backend = SimulatedBackend.create(root / "node.json", gpus="1xA100-SXM4-40GB,1xL4", node_name="node-a")

    def driver(self) -> DraDriver:
        return DraDriver(SimulatedBackend(self.root / "node.json"), "node-a", self.root / "plugin", self.root / "cdi",
                         lambda ns, name: self.claims.get((ns, name)), dynamic_mig=True,
                         mps_root=str(self.root / "mps"), mps_binary=self.binary)

    def add(self, claim: dict[str, Any]) -> ClaimRef:
        self.claims[("ml", claim["metadata"]["name"])] = claim
        return ClaimRef("ml", claim["metadata"]["uid"], claim["metadata"]["name"])

    def calls(self) -> list[dict[str, Any]]:
        return fake_mps_control.invocations(self.log)

    def pipe(self, uid: str) -> str:
        return f"{self.root}/mps/claim-{uid}/pipe"


@pytest.fixture
def node(monkeypatch: pytest.MonkeyPatch) -> Iterator[Node]:
    with tempfile.TemporaryDirectory(prefix="drampsd") as tmp:
        root = Path(tmp)
        binary, _ = fake_mps_control.install(root / "bin")
        monkeypatch.setenv("PATH", f"{binary.parent}:/usr/bin:/bin")
        found = find_mps_control()  # what `kubegpu dra-driver` does on a real node
        assert found == str(binary)
        yield Node(root, found)


def test_claim_daemon_gets_its_own_dirs_and_limits_and_stops_at_unprepare(node: Node) -> None:
    driver = node.driver()
    ref = node.add(allocated("shared", [("gpu", "gpu-1")], config=MPS_CONFIG))
    first = driver.prepare([ref])[ref.uid]
    assert first.error == ""
    pipe, log = node.pipe(ref.uid), f"{node.root}/mps/claim-{ref.uid}/log"
    assert node.calls() == [
        {"args": ["-d"], "stdin": "", "pipe": pipe, "log": log},
        {"args": [], "stdin": "set_default_active_thread_percentage 25", "pipe": pipe, "log": log},
        {"args": [], "stdin": "set_default_device_pinned_mem_limit 1 10240M", "pipe": pipe, "log": log},
    ]
    assert fake_mps_control.running(pipe) and Path(pipe).is_dir() and Path(log).is_dir()
    assert driver.checkpoint.claims[ref.uid].mps == {"resource": f"claim-{ref.uid}", "pipeDirectory": pipe,
                                                     "logDirectory": log}
    spec = json.loads((node.root / "cdi" / f"k8s.gpu.nvidia.com-claim_{ref.uid}.json").read_text())
    assert {"hostPath": pipe, "containerPath": "/mps/pipe", "options": ["rbind", "rw"]} in \
        spec["containerEdits"]["mounts"]
    assert driver.prepare([ref])[ref.uid] == first  # answered from the checkpoint: no second daemon
    restarted = node.driver()
    assert restarted.prepare([ref])[ref.uid] == first  # nor after a restart
    assert len(node.calls()) == 3
    assert restarted.unprepare([ref]) == {ref.uid: ""}  # the daemon is known from the checkpoint alone
    assert node.calls()[3:] == [{"args": [], "stdin": "quit", "pipe": pipe, "log": log}]
    assert not fake_mps_control.running(pipe)
    assert restarted.unprepare([ref]) == {ref.uid: ""}  # already unprepared: fine, nothing sent
    assert len(node.calls()) == 4


def test_unprepare_of_a_daemon_that_already_died_succeeds(node: Node) -> None:
    driver = node.driver()
    ref = node.add(allocated("died", [("gpu", "gpu-1")], config=MPS_CONFIG))
    assert driver.prepare([ref])[ref.uid].error == ""
    (Path(node.pipe(ref.uid)) / "control").unlink()  # the daemon died on its own
    assert driver.unprepare([ref]) == {ref.uid: ""}
    assert node.calls()[-1]["stdin"] == "quit" and driver.checkpoint.claims == {}


def test_crash_between_daemon_start_and_completed_stops_it_on_recovery(node: Node,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    ref = node.add(allocated("crash", [("gpu", "gpu-0-mig-1g5gb-19-0")], config=MPS_CONFIG))
    driver = node.driver()

    def crash(*args: Any, **kwargs: Any) -> Any:
        raise SystemExit("killed")  # the process dies after starting the daemon, before the CDI spec

    monkeypatch.setattr("kubegpu.dra.driver.claim_spec", crash)
    with pytest.raises(SystemExit):
        driver._prepare_one(ref)
    pipe = node.pipe(ref.uid)
    assert fake_mps_control.running(pipe) and len(node.backend.mig_devices(0)) == 1  # left by the "dead" process
    monkeypatch.undo()
    restarted = node.driver()
    assert not fake_mps_control.running(pipe)  # stopped at start from the checkpoint's intents
    assert [c["args"] or c["stdin"] for c in node.calls()][-1] == "quit"
    assert node.backend.mig_devices(0) == [] and restarted.checkpoint.claims == {}
    assert restarted.prepare([ref])[ref.uid].error == ""  # the kubelet's retry starts exactly one daemon
    assert [c["args"] for c in node.calls()].count(["-d"]) == 2 and fake_mps_control.running(pipe)
    assert all("already running" not in str(c) for c in node.calls())


def test_a_failed_prepare_stops_the_daemon_it_started(node: Node, monkeypatch: pytest.MonkeyPatch) -> None:
    ref = node.add(allocated("nospec", [("gpu", "gpu-1")], config=MPS_CONFIG))
    driver = node.driver()

    def full_disk(*args: Any, **kwargs: Any) -> Any:
        raise KubegpuError("cdi: cannot write CDI spec: No space left on device")

    monkeypatch.setattr("kubegpu.dra.driver.write_claim_spec", full_disk)
    assert "No space left" in driver.prepare([ref])[ref.uid].error
    assert [c["args"] or c["stdin"] for c in node.calls()][-1] == "quit"
    assert not fake_mps_control.running(node.pipe(ref.uid)) and driver.checkpoint.claims == {}
    assert not (node.root / "plugin" / "mps" / f"{ref.uid}.json").exists()


def test_a_daemon_refusing_a_limit_fails_the_claim_and_is_stopped(node: Node,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_MPS_FAIL", "set_default_device_pinned_mem_limit")
    ref = node.add(allocated("refused", [("gpu", "gpu-1")], config=MPS_CONFIG))
    result = node.driver().prepare([ref])[ref.uid]
    assert "set_default_device_pinned_mem_limit" in result.error and "injected failure" in result.error
    assert not fake_mps_control.running(node.pipe(ref.uid))
    assert [c["args"] or c["stdin"] for c in node.calls()][-1] == "quit"
    assert not list(node.root.glob("cdi/*.json")) and not list(node.root.glob("plugin/mps/*.json"))


def test_without_the_binary_only_the_limits_are_recorded(node: Node) -> None:
    node.binary = None  # type: ignore[assignment]
    driver = node.driver()
    ref = node.add(allocated("simonly", [("gpu", "gpu-1")], config=MPS_CONFIG))
    assert driver.prepare([ref])[ref.uid].error == ""
    assert node.calls() == [] and driver.checkpoint.claims[ref.uid].mps == {}
    assert (node.root / "plugin" / "mps" / f"{ref.uid}.json").exists()
    assert driver.unprepare([ref]) == {ref.uid: ""} and node.calls() == []
