"""A pod is judged by the share it was admitted under, nothing is done during a config hand-over, and a PID is
re-checked right before its kill.

The share record is written by the real device plugin (its Allocate, over the kubelet's gRPC socket) and read by the
guard; the config switch is the plugin's own reload, from 2 time-slicing replicas per GPU to 4."""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml

from kubegpu.clock import VirtualClock
from kubegpu.config.deviceplugin import effective_device_plugin_config
from kubegpu.deviceplugin.health import HealthPolicy
from kubegpu.deviceplugin.manager import DevicePluginManager, PluginSettings
from kubegpu.files import CorruptStateError
from kubegpu.gpu.simulated import SimulatedBackend
from kubegpu.guard.agent import Guard, KillOutcome, kill_host_process
from kubegpu.guard.core import GuardAction, Policy
from kubegpu.guard.procs import ProcReader
from kubegpu.kube.memory import MemoryCluster
from kubegpu.metrics import GuardMetrics
from kubegpu.sharing.allocations import Handover, RecordedShare, ShareRecorder, read_record
from kubegpu.sharing.attribution import PodResourcesClient
from kubegpu.sharing.names import SharingKind
from tests.fakes.fake_kubelet import FakeKubelet
from tests.fakes.fake_podresources import FakePodResources
from tests.guard.helpers import FakeEvictor, fake_process, pod

GPU = "nvidia.com/gpu"


def sliced(replicas: int) -> dict[str, Any]:
    return {"version": "v1", "sharing": {"timeSlicing": {"resources": [{"name": GPU, "replicas": replicas}]}}}


def read_share(mib: int) -> RecordedShare:
    return RecordedShare(SharingKind.TIME_SLICING, mib)


class Node:
    """One A100 80GB time-sliced by the real device plugin; pods a and b allocated under 2 replicas (40 GiB each),
    then the config switched to 4 (20 GiB each) and pod c allocated under it."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.backend = SimulatedBackend.create(tmp / "node.json", gpus="1xA100-SXM4-80GB")
        self.uuid = self.backend.devices()[0].uuid
        self.record = tmp / "state" / "device-shares.json"
        self.config = tmp / "config.yaml"
        self.cluster = MemoryCluster()
        self.pods = {name: self.cluster.create(pod(name)) for name in "abc"}
        self.proc = tmp / "proc"
        self.evictor = FakeEvictor(self.cluster)
        self.killed: list[int] = []
        self.socket = tmp / "podres.sock"

    def uid(self, name: str) -> str:
        return str(self.pods[name]["metadata"]["uid"])

    def run(self, pid: int, owner: str, mib: int) -> None:
        fake_process(self.proc, pid, self.uid(owner))
        self.backend.add_process(0, pid, mib)

    def kill(self, pid: int, still_ours: Callable[[], bool]) -> KillOutcome:
        if not still_ours():
            return KillOutcome.NOT_OURS
        self.killed.append(pid)
        return KillOutcome.KILLED

    def guard(self, **kwargs: Any) -> Guard:
        return Guard(self.backend, self.cluster, "sim-node", PodResourcesClient(self.socket), self.evictor,
                     kwargs.pop("policy", Policy()), GuardMetrics(), ProcReader(self.proc), kill=self.kill,
                     share_record=self.record, **kwargs)

    def assignments(self) -> list[tuple[str, str, str, str, list[str]]]:
        return [("ml", name, "main", GPU, [f"{self.uuid}::{k}"]) for k, name in enumerate("abc")]

    def allocatable(self) -> list[tuple[str, list[str]]]:
        return [(GPU, [f"{self.uuid}::{k}"]) for k in range(4)]  # what the kubelet lists under the new config


async def admit_across_a_config_switch(node: Node) -> None:
    """The real device plugin: a and b allocated under 2 replicas, a reload to 4, c allocated under 4."""
    node.config.write_text(yaml.safe_dump(sliced(2)))
    kubelet = FakeKubelet(node.tmp)
    await kubelet.start()
    plugin = DevicePluginManager(
        node.backend, lambda: effective_device_plugin_config(node.config, {}, {}),
        PluginSettings(plugin_dir=node.tmp, kubelet_socket=kubelet.socket, share_record_file=node.record),
        HealthPolicy(quiet_period_s=300))
    try:
        await plugin.start()
        await kubelet.wait_for(lambda: kubelet.summary() == {GPU: (2, 2)})
        await kubelet.allocate(GPU, [f"{node.uuid}::0"])
        await kubelet.allocate(GPU, [f"{node.uuid}::1"])
        node.config.write_text(yaml.safe_dump(sliced(4)))
        assert await plugin.reload()
        await kubelet.wait_for(lambda: kubelet.summary() == {GPU: (4, 4)})
        await kubelet.allocate(GPU, [f"{node.uuid}::2"])
    finally:
        await plugin.stop()
        await kubelet.stop()


@pytest.fixture
def short_tmp() -> Any:
    """Unix socket paths are limited to ~107 bytes: a short directory of our own."""
    import shutil
    import tempfile

    directory = Path(tempfile.mkdtemp(prefix="kggr-", dir="/tmp"))
    yield directory
    shutil.rmtree(directory, ignore_errors=True)


async def test_a_pod_is_judged_by_the_share_it_was_admitted_under(short_tmp: Path) -> None:
    node = Node(short_tmp)
    await admit_across_a_config_switch(node)
    record = read_record(node.record)
    assert record is not None
    shares = {device_id: share.share_mib for device_id, share in record.devices.items()}
    assert shares == {f"{node.uuid}::0": 40960, f"{node.uuid}::1": 40960, f"{node.uuid}::2": 20480}
    node.run(101, "a", 30000)  # within the 40 GiB it was admitted under; over today's 20 GiB
    node.run(102, "b", 12000)
    node.run(103, "c", 25000)  # admitted under 4 replicas: over its 20 GiB
    clock = VirtualClock(record.handover.finished_at or 0.0)
    clock.advance(60)  # the hand-over has long settled
    with FakePodResources(node.socket, node.assignments(), allocatable=node.allocatable()):
        result = node.guard(clock=clock).run_once()
    assert not result.held
    assert [(a.holding.pod, outcome) for a, outcome in result.done] == [("c", "evicted")]
    assert node.evictor.calls == ["c"]
    usage = {u.holding.pod: u.holding.share_mib for u in result.decision.usage}
    assert usage == {"a": 40960, "b": 40960, "c": 20480}


async def test_without_a_record_a_pod_falls_back_to_todays_share(short_tmp: Path) -> None:
    node = Node(short_tmp)
    node.run(101, "a", 30000)
    with FakePodResources(node.socket, node.assignments(), allocatable=node.allocatable()):
        result = node.guard().run_once()  # no record file: today's derivation, 80 GiB / 4
    assert [(a.holding.pod, outcome) for a, outcome in result.done] == [("a", "evicted")]


async def test_the_device_plugin_marks_its_config_hand_over(short_tmp: Path) -> None:
    node = Node(short_tmp)
    times = iter([100.0, 101.0, 102.0, 103.0, 104.0, 105.0, 106.0, 107.0])
    recorder = ShareRecorder(node.record, clock=lambda: next(times))
    recorder.handover_started()
    record = read_record(node.record)
    assert record is not None and record.handover == Handover(100.0, None)
    assert record.handover.running(150.0) and not record.handover.running(100.0 + 301)  # stale: its writer died
    recorder.handover_finished()
    record = read_record(node.record)
    assert record is not None and record.handover == Handover(100.0, 101.0)
    assert record.handover.running(105.0) and not record.handover.running(112.0)
    # a restarted device plugin keeps what it recorded (running pods keep their shares)
    recorder.allocated([("x::0", read_share(40960))])
    assert set(ShareRecorder(node.record).record.devices) == {"x::0"}


def test_nothing_is_done_during_a_config_hand_over(short_tmp: Path) -> None:
    node = Node(short_tmp)
    recorder = ShareRecorder(node.record, clock=lambda: 1000.0)
    recorder.allocated([(f"{node.uuid}::0", read_share(20480))])
    recorder.handover_started()
    node.run(101, "a", 30000)
    clock = VirtualClock(1005.0)
    with FakePodResources(node.socket, node.assignments()[:1], allocatable=node.allocatable()):
        guard = node.guard(clock=clock)
        held = guard.run_once()
        assert held.held and held.done == [] and node.evictor.calls == []
        assert [u.used_mib for u in held.decision.usage] == [30000]  # still read and reported
        recorder.clock = lambda: 1010.0
        recorder.handover_finished()
        clock.advance(6)  # 1 s after the hand-over finished: the kubelet may still be catching up
        assert guard.run_once().held and node.evictor.calls == []
        clock.advance(10)
        result = guard.run_once()
    assert not result.held and [(a.holding.pod, o) for a, o in result.done] == [("a", "evicted")]


def test_a_torn_record_stops_the_round(short_tmp: Path) -> None:
    node = Node(short_tmp)
    ShareRecorder(node.record).allocated([(f"{node.uuid}::0", read_share(20480))])
    node.record.write_text(node.record.read_text()[:-20])
    with pytest.raises(CorruptStateError):
        read_record(node.record)
    node.run(101, "a", 30000)
    with FakePodResources(node.socket, node.assignments()[:1], allocatable=node.allocatable()):
        result = node.guard().run_once()
    assert result.done == [] and node.evictor.calls == []


def test_a_recycled_pid_is_not_killed(short_tmp: Path) -> None:
    """The PID was read, then the API answered (a 429 here); meanwhile the process exited and its PID went to a
    process of another pod. The kill re-reads the cgroup and leaves it alone."""
    node = Node(short_tmp)
    node.run(101, "a", 30000)
    evictor = node.evictor
    evictor.protected.add("a")

    def evict_and_recycle(namespace: str, name: str) -> bool:
        answer = evictor(namespace, name)
        fake_process(node.proc, 101, node.uid("b"))  # PID 101 is now b's
        return answer

    node.evictor = evict_and_recycle  # type: ignore[assignment]
    with FakePodResources(node.socket, node.assignments()[:2], allocatable=node.allocatable()):
        result = node.guard().run_once()
    assert evictor.calls == ["a"] and node.killed == []
    assert [(a.holding.pod, o) for a, o in result.done] == [
        ("a", "not killed (pdb; its processes' PIDs are someone else's now)")]


def test_kill_host_process_pins_the_process_before_the_check() -> None:
    assert hasattr(os, "pidfd_open")  # Linux, Python 3.9+: the path the guard takes on every real node
    child = subprocess.Popen(["sleep", "60"])
    try:
        assert kill_host_process(child.pid, lambda: False) == KillOutcome.NOT_OURS
        assert child.poll() is None  # not ours: alive
        assert kill_host_process(child.pid, lambda: True) == KillOutcome.KILLED
        assert child.wait(timeout=10) == -signal.SIGKILL
    finally:
        child.kill()
        child.wait()
    other = subprocess.Popen(["sleep", "60"])
    try:
        def exits_after_the_check() -> bool:
            other.kill()
            other.wait()  # reaped: its PID is free for anyone now; the pidfd still names the dead process
            return True

        # the signal went to the pinned process, which is gone: nothing else was hit
        assert kill_host_process(other.pid, exits_after_the_check) == KillOutcome.GONE
    finally:
        other.kill()
        other.wait()


def test_kill_process_action_uses_the_recheck(short_tmp: Path) -> None:
    node = Node(short_tmp)
    node.run(101, "a", 30000)
    with FakePodResources(node.socket, node.assignments()[:1], allocatable=node.allocatable()):
        result = node.guard(policy=Policy(GuardAction.KILL_PROCESS)).run_once()
    assert node.killed == [101] and [o for _, o in result.done] == ["killed"]


async def test_an_allocation_whose_share_cannot_be_recorded_fails(short_tmp: Path) -> None:
    """Record before act: a container must never get a device whose record is not its own (an older record of the
    same ID would then speak for it)."""
    node = Node(short_tmp)
    (short_tmp / "state").write_text("a file where the record's directory should be")
    node.config.write_text(yaml.safe_dump(sliced(2)))
    kubelet = FakeKubelet(short_tmp)
    await kubelet.start()
    plugin = DevicePluginManager(
        node.backend, lambda: effective_device_plugin_config(node.config, {}, {}),
        PluginSettings(plugin_dir=short_tmp, kubelet_socket=kubelet.socket, share_record_file=node.record),
        HealthPolicy(quiet_period_s=300))
    try:
        await plugin.start()
        await kubelet.wait_for(lambda: kubelet.summary() == {GPU: (2, 2)})
        with pytest.raises(grpc.aio.AioRpcError) as failed:
            await kubelet.allocate(GPU, [f"{node.uuid}::0"])
        assert failed.value.code() == grpc.StatusCode.INTERNAL
        assert "share record" in (failed.value.details() or "")
    finally:
        await plugin.stop()
        await kubelet.stop()
