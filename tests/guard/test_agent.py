"""The guard agent end to end on a simulated node: attribution from cgroups and PodResources, each action, PDBs,
grace and reserve, MPS limits, shared DRA claims, and a restart in the middle of a leak."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from kubegpu.gpu.simulated import SimulatedBackend
from kubegpu.guard.agent import CONDITION_TYPE, Guard, KillOutcome
from kubegpu.guard.core import GuardAction, Policy
from kubegpu.guard.procs import ProcReader
from kubegpu.kube.memory import MemoryCluster
from kubegpu.metrics import GuardMetrics
from kubegpu.sharing.attribution import PodResourcesClient
from kubegpu.sharing.devices import devices_by_resource
from kubegpu.sharing.shares import shares_from_inventory
from tests.fakes.fake_podresources import FakePodResources
from tests.guard.helpers import FakeEvictor, fake_process, pod

SHARED = "nvidia.com/gpu.shared"


class Node:
    """Two A100 80GB: GPU 0 time-sliced 4 ways (pods a, b, c), GPU 1 whole (pod w)."""

    def __init__(self, tmp_path: Path) -> None:
        self.backend = SimulatedBackend.create(tmp_path / "node.json", gpus="2xA100-SXM4-80GB")
        self.cluster = MemoryCluster()
        self.proc = tmp_path / "proc"
        self.uuid0, self.uuid1 = (d.uuid for d in self.backend.devices())
        self.pods = {name: self.cluster.create(pod(name)) for name in ("a", "b", "c", "w")}
        self.assignments = [("ml", n, "main", SHARED, [f"{self.uuid0}::{k}"]) for k, n in enumerate("abc")]
        self.assignments.append(("ml", "w", "main", "nvidia.com/gpu", [self.uuid1]))
        # one entry per device ID, as the real kubelet answers GetAllocatableResources
        self.allocatable = [(SHARED, [f"{self.uuid0}::{k}"]) for k in range(4)] + [("nvidia.com/gpu", [self.uuid1])]
        self.evictor = FakeEvictor(self.cluster)
        self.killed: list[int] = []
        self.socket = tmp_path / "kubelet.sock"

    def uid(self, name: str) -> str:
        return str(self.pods[name]["metadata"]["uid"])

    def run(self, pid: int, owner: str | None, gpu: int, mib: int, environ: dict[str, str] | None = None) -> None:
        fake_process(self.proc, pid, self.uid(owner) if owner else None, environ)
        self.backend.add_process(gpu, pid, mib)

    def guard(self, policy: Policy | None = None, **kwargs: Any) -> Guard:
        return Guard(self.backend, self.cluster, "sim-node", PodResourcesClient(self.socket), self.evictor,
                     policy or Policy(), kwargs.pop("metrics", GuardMetrics()), ProcReader(self.proc),
                     kill=self.kill, **kwargs)

    def kill(self, pid: int, still_ours: Callable[[], bool]) -> KillOutcome:
        """The host killer's contract: the process's cgroup is asked again right before the signal."""
        if not still_ours():
            return KillOutcome.NOT_OURS
        self.killed.append(pid)
        return KillOutcome.KILLED

    def condition(self, name: str) -> dict[str, Any] | None:
        conditions = (self.cluster.get("Pod", name, "ml").get("status") or {}).get("conditions") or []
        return next((c for c in conditions if c["type"] == CONDITION_TYPE), None)

    def events(self, name: str) -> list[str]:
        return [e["message"] for e in self.cluster.list("Event", "ml") if e["involvedObject"]["name"] == name]


@pytest.fixture
def node(tmp_path: Path) -> Iterator[Node]:
    made = Node(tmp_path)
    with FakePodResources(made.socket, made.assignments, allocatable=made.allocatable):
        yield made


def test_only_the_pod_over_its_share_is_evicted_with_condition_and_event(node: Node) -> None:
    node.run(101, "a", 0, 8000)
    node.run(102, "b", 0, 19000)
    node.run(103, "c", 0, 12000)
    node.run(104, "w", 1, 79000)  # a whole GPU: its own, however full
    node.run(105, None, 0, 3000)  # a host process on the shared GPU: no pod, counted only
    metrics = GuardMetrics()
    guard = node.guard(metrics=metrics)
    assert guard.run_once().done == []
    node.backend.set_process_memory(102, 26000)  # b leaks past 80 GiB / 4
    result = guard.run_once()
    assert [(a.holding.pod, outcome) for a, outcome in result.done] == [("b", "evicted")]
    assert node.evictor.calls == ["b"]
    condition = node.condition("b")
    assert condition is not None and condition["status"] == "True"
    assert "share 20480 MiB" in condition["message"] and "used 26000 MiB" in condition["message"]
    assert node.uuid0 in condition["message"]
    assert any("over its share of 20480 MiB" in m for m in node.events("b"))
    assert all(node.condition(n) is None for n in ("a", "c", "w"))
    registry = metrics.registry
    labels = {"namespace": "ml", "pod": "b", "gpu": "0", "gpu_instance": ""}
    assert registry.get_sample_value("kubegpu_gpu_guard_pod_used_bytes", labels) == 26000 * 2**20
    assert registry.get_sample_value("kubegpu_gpu_guard_pod_share_bytes", labels) == 20480 * 2**20
    assert registry.get_sample_value("kubegpu_gpu_guard_actions_total",
                                     {"action": "evict", "reason": "over-share"}) == 1
    assert registry.get_sample_value("kubegpu_gpu_guard_unattributed_processes",
                                     {"gpu": "0", "gpu_instance": ""}) == 1
    assert registry.get_sample_value("kubegpu_gpu_guard_pod_used_bytes", {**labels, "pod": "w", "gpu": "1"}) is None
    # the next round sees b terminating: no second eviction while the GPU still has room
    guard.run_once()
    assert node.evictor.calls == ["b"]


def test_kill_process_kills_only_the_offending_process(node: Node) -> None:
    node.run(201, "a", 0, 16000)
    node.run(202, "a", 0, 9000)  # a's second worker: together 25000 MiB
    node.run(203, "b", 0, 10000)
    result = node.guard(Policy(GuardAction.KILL_PROCESS)).run_once()
    assert [(a.holding.pod, o) for a, o in result.done] == [("a", "killed")]
    assert node.killed == [201]
    assert sorted(p.pid for p in node.backend.processes(0)) == [202, 203]
    assert node.evictor.calls == [] and node.condition("a") is not None
    assert node.cluster.get("Pod", "a", "ml")["metadata"].get("deletionTimestamp") is None


def test_warn_is_an_event_and_a_metric_only(node: Node) -> None:
    node.run(301, "c", 0, 30000)
    metrics = GuardMetrics()
    guard = node.guard(Policy(GuardAction.WARN), metrics=metrics)
    guard.run_once()
    guard.run_once()
    assert node.evictor.calls == [] and node.killed == [] and node.condition("c") is None
    assert len(node.events("c")) == 1 and "--action warn" in node.events("c")[0]
    assert metrics.registry.get_sample_value("kubegpu_gpu_guard_actions_total",
                                             {"action": "warn", "reason": "over-share"}) == 1


def test_a_pdb_protected_pod_loses_its_offending_process_instead(node: Node) -> None:
    node.evictor.protected.add("a")
    node.run(401, "a", 0, 30000)
    result = node.guard().run_once()
    assert [(a.holding.pod, o) for a, o in result.done] == [("a", "killed (pdb)")]
    assert node.evictor.calls == ["a"] and node.killed == [401]
    assert node.backend.processes(0) == []
    assert any("PodDisruptionBudget" in m for m in node.events("a"))


def test_grace_and_reserve(node: Node) -> None:
    policy = Policy(grace=True, reserve_mib=8192)
    node.run(501, "a", 0, 30000)  # over its share, but the GPU has 50 GiB free
    guard = node.guard(policy)
    assert guard.run_once().done == []
    node.run(502, "b", 0, 20000)
    node.run(503, "c", 0, 20000)
    assert guard.run_once().done == []  # 11 GiB free: still above the reserve
    node.backend.set_process_memory(503, 19000)
    node.backend.set_process_memory(501, 35500)  # < 8 GiB free: the reserve is gone, act before the driver must
    result = guard.run_once()
    assert [(a.holding.pod, a.reason.value) for a, _ in result.done] == [("a", "reserve-exhausted")]


def test_the_annotation_lowers_a_share_and_a_bad_one_is_ignored(node: Node) -> None:
    node.cluster.patch("Pod", "a", {"metadata": {"annotations": {"kubegpu.io/gpu-memory-limit": "8Gi"}}}, "ml")
    node.cluster.patch("Pod", "b", {"metadata": {"annotations": {"kubegpu.io/gpu-memory-limit": "lots"}}}, "ml")
    node.cluster.patch("Pod", "c", {"metadata": {"annotations": {"kubegpu.io/gpu-memory-limit": "64Gi"}}}, "ml")
    node.run(601, "a", 0, 9000)
    node.run(602, "b", 0, 15000)
    node.run(603, "c", 0, 21000)  # asking for more than its config share gets it nothing
    result = node.guard().run_once()
    assert sorted(a.holding.pod for a, _ in result.done) == ["a", "c"]
    shares = {u.holding.pod: u.holding.share_mib for u in result.decision.usage}
    assert shares == {"a": 8192, "b": 20480, "c": 20480}


def test_a_restart_mid_leak_forgets_nothing(node: Node) -> None:
    node.run(701, "b", 0, 15000)
    first = node.guard()
    assert first.run_once().done == []
    node.backend.set_process_memory(701, 22000)  # the leak crosses the share while no guard runs
    second = node.guard()  # a fresh process: nothing carried over
    assert [a.holding.pod for a, _ in second.run_once().done] == ["b"]
    third = node.guard()  # and after another restart, the evicted pod is not evicted again
    third.run_once()
    assert node.evictor.calls == ["b"]


def test_mps_pods_from_the_config_and_a_client_without_its_limit(tmp_path: Path) -> None:
    made = Node(tmp_path)
    config = {"version": "v1", "flags": {"mpsRoot": "/run/nvidia/mps"},
              "sharing": {"mps": {"renameByDefault": True, "resources": [{"name": "nvidia.com/gpu", "replicas": 4}]}}}

    def shares_for(gpus: Any, migs: Any) -> Any:
        return shares_from_inventory(devices_by_resource(gpus, {}, config))

    made.assignments = [("ml", "a", "main", SHARED, [f"{made.uuid0}::0"]),
                        ("ml", "b", "main", SHARED, [f"{made.uuid0}::1"])]
    made.run(801, "a", 0, 5000, {"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=20480M"})
    made.run(802, "b", 0, 5000, {"PATH": "/bin"})  # started without the limit its slice should give it
    metrics = GuardMetrics()
    with FakePodResources(made.socket, made.assignments):
        guard = made.guard(metrics=metrics, shares_for=shares_for)
        result = guard.run_once()
        guard.run_once()
    assert result.done == []
    assert [(f.holding.pod, f.pid) for f in result.decision.findings] == [("b", 802)]
    assert {u.holding.pod: (u.holding.kind.value, u.holding.share_mib) for u in result.decision.usage} == {
        "a": ("mps", 20480), "b": ("mps", 20480)}
    assert len(made.events("b")) == 1 and "pinned-memory limit none" in made.events("b")[0]
    assert metrics.registry.get_sample_value("kubegpu_gpu_guard_mps_limit_missing",
                                             {"namespace": "ml", "pod": "b", "gpu": "0", "pid": "802"}) == 1


def _claim(name: str, consumers: list[str], sharing: dict[str, Any] | None = None) -> dict[str, Any]:
    devices: dict[str, Any] = {"results": [{"request": "gpu", "driver": "gpu.nvidia.com", "pool": "sim-node",
                                            "device": "gpu-1"}]}
    if sharing is not None:
        devices["config"] = [{"source": "FromClaim", "opaque": {"driver": "gpu.nvidia.com", "parameters": {
            "apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig", "sharing": sharing}}}]
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": "ml"}, "spec": {"devices": {"requests": []}},
            "status": {"allocation": {"devices": devices},
                       "reservedFor": [{"resource": "pods", "name": p, "uid": f"u-{p}"} for p in consumers]}}


def test_shared_dra_claims(tmp_path: Path) -> None:
    made = Node(tmp_path)
    for name in ("d1", "d2", "solo"):
        made.pods[name] = made.cluster.create(pod(name))
    made.cluster.create(_claim("shared", ["d1", "d2"], {"strategy": "TimeSlicing"}))
    made.cluster.create(_claim("alone", ["solo"]))
    claims = [("ml", "d1", "main", "shared", "gpu.nvidia.com", ["gpu-1"]),
              ("ml", "d2", "main", "shared", "gpu.nvidia.com", ["gpu-1"]),
              ("ml", "solo", "main", "alone", "gpu.nvidia.com", ["gpu-1"])]
    made.run(901, "d1", 1, 30000)
    made.run(902, "d2", 1, 45000)  # over half of the GPU the two share
    made.run(903, "solo", 1, 1000)
    with FakePodResources(made.socket, [], claims=claims, allocatable=made.allocatable):
        result = made.guard().run_once()
    assert [(a.holding.pod, o) for a, o in result.done] == [("d2", "evicted")]
    assert {u.holding.pod: u.holding.share_mib for u in result.decision.usage} == {"d1": 40960, "d2": 40960}
    mps = _claim("mps", ["d1"], {"strategy": "MPS", "mpsConfig": {"defaultPinnedDeviceMemoryLimit": "10Gi"}})
    made.cluster.delete("ResourceClaim", "shared", "ml")
    made.cluster.create(mps)
    with FakePodResources(made.socket, [], claims=[("ml", "d1", "main", "mps", "gpu.nvidia.com", ["gpu-1"])]):
        result = made.guard().run_once()
    assert [(a.holding.pod, a.holding.share_mib) for a, _ in result.done] == [("d1", 10240)]


def test_without_the_kubelet_nothing_is_done(tmp_path: Path) -> None:
    made = Node(tmp_path)
    made.run(1001, "a", 0, 60000)
    result = made.guard().run_once()  # no PodResources socket: no attribution, no action
    assert result.done == [] and made.evictor.calls == []
