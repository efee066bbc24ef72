"""The `AcceleratedHardwareReady` Node condition: the pure core, the status patch, and node repair seeing it."""

from __future__ import annotations

from typing import Any

import pytest
from typer.testing import CliRunner

from kubegpu.clock import VirtualClock
from kubegpu.discovery.health import (
    CONDITION_TYPE,
    HEALTHY_REASON,
    UNHEALTHY_REASON,
    HardwareCondition,
    HardwareHealth,
    NodeConditionReporter,
    condition_update,
)
from kubegpu.gpu.backend import GpuBackendError, GpuSample, XidEvent
from kubegpu.gpu.simulated import SimulatedBackend
from kubegpu.gpu.xid import APPLICATION_XIDS, FATAL_XIDS, HealthPolicy
from kubegpu.kube import MemoryCluster, format_timestamp

T0 = 1_755_600_000.0
QUIET = 300.0


def always(_: int) -> bool:
    return True


def xid(gpu: int, number: int, at: float) -> XidEvent:
    return XidEvent(gpu_index=gpu, xid=number, timestamp=at)


def test_critical_xid_makes_the_condition_false_naming_gpu_and_xid() -> None:
    health = HardwareHealth(HealthPolicy(quiet_period_s=QUIET))
    assert health.update([], T0, always).status == "True"
    cond = health.update([xid(3, 79, T0 + 1)], T0 + 1, always)
    assert (cond.status, cond.reason) == ("False", UNHEALTHY_REASON)
    assert "GPU 3 XID 79" in cond.message
    cond = health.update([xid(1, 48, T0 + 2)], T0 + 2, always)
    assert "GPU 1 XID 48, GPU 3 XID 79" in cond.message


@pytest.mark.parametrize("number", sorted(APPLICATION_XIDS))
def test_application_xids_leave_the_condition_true(number: int) -> None:
    health = HardwareHealth(HealthPolicy(quiet_period_s=QUIET))
    cond = health.update([xid(0, number, T0)], T0, always)
    assert (cond.status, cond.reason) == ("True", HEALTHY_REASON)


def test_recovery_after_the_quiet_period_and_a_good_probe_only() -> None:
    health = HardwareHealth(HealthPolicy(quiet_period_s=QUIET))
    health.update([xid(0, 79, T0)], T0, always)
    assert health.update([], T0 + QUIET - 1, always).status == "False"
    assert health.update([], T0 + QUIET, lambda _: False).status == "False"  # GPU still off the bus
    health.update([xid(0, 31, T0 + QUIET)], T0 + QUIET, lambda _: False)   # application XID: no new quiet period
    assert health.update([], T0 + QUIET + 1, always) == HardwareCondition("True", HEALTHY_REASON,
                                                                          health.condition().message)


def test_a_new_critical_xid_restarts_the_quiet_period() -> None:
    health = HardwareHealth(HealthPolicy(quiet_period_s=QUIET))
    health.update([xid(0, 48, T0)], T0, always)
    health.update([xid(0, 48, T0 + 200)], T0 + 200, always)
    assert health.update([], T0 + QUIET, always).status == "False"
    assert health.update([], T0 + 200 + QUIET, always).status == "True"


def test_old_events_read_after_a_restart_keep_their_age() -> None:
    health = HardwareHealth(HealthPolicy(quiet_period_s=QUIET))
    assert health.update([xid(0, 79, T0 - 250)], T0, always).status == "False"
    assert health.update([], T0 + 50, always).status == "True"


def test_condition_update_writes_only_changes_and_moves_transition_time_on_flips() -> None:
    bad = HardwareCondition("False", UNHEALTHY_REASON, "critical XID error: GPU 0 XID 79")
    first = condition_update([{"type": "Ready", "status": "True"}], bad, T0)
    assert first == {"type": CONDITION_TYPE, "status": "False", "reason": UNHEALTHY_REASON,
                     "message": bad.message, "lastTransitionTime": format_timestamp(T0)}
    assert condition_update([first], bad, T0 + 60) is None
    worse = HardwareCondition("False", UNHEALTHY_REASON, "critical XID error: GPU 0 XID 79, GPU 1 XID 48")
    second = condition_update([first], worse, T0 + 60)
    assert second is not None and second["lastTransitionTime"] == format_timestamp(T0)
    good = HardwareCondition("True", HEALTHY_REASON, "ok")
    third = condition_update([second], good, T0 + 900)
    assert third is not None and third["lastTransitionTime"] == format_timestamp(T0 + 900)


# ------------------------------------------------------------------------------------------- adapter


NODE_CONDITIONS = [
    {"type": "Ready", "status": "True", "reason": "KubeletReady", "lastTransitionTime": "2025-01-01T00:00:00Z"},
    {"type": "MemoryPressure", "status": "False", "reason": "KubeletHasSufficientMemory"},
]


def node_cluster(clock: VirtualClock, name: str = "n1") -> MemoryCluster:
    cluster = MemoryCluster(clock)
    cluster.create({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}})
    cluster.patch("Node", name, {"status": {"conditions": NODE_CONDITIONS}}, subresource="status")
    return cluster


def conditions(cluster: MemoryCluster, name: str = "n1") -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in cluster.get("Node", name)["status"]["conditions"]}


def test_reporter_sets_the_condition_keeps_other_conditions_and_patches_only_on_change() -> None:
    clock = VirtualClock(T0)
    cluster = node_cluster(clock)
    backend = SimulatedBackend.create(None, "2xH100-SXM5-80GB", clock=clock)
    reporter = NodeConditionReporter(cluster, "n1", backend, clock, quiet_period_s=QUIET)
    assert reporter.report() is not None
    assert conditions(cluster)[CONDITION_TYPE]["status"] == "True"
    version = cluster.resource_version
    clock.advance(60)
    assert reporter.report() is None and cluster.resource_version == version   # nothing new: no write

    backend.inject_xid(1, 13)   # a user's bad kernel
    clock.advance(1)
    assert reporter.report() is None
    backend.inject_xid(1, 79)   # fallen off the bus
    clock.advance(1)
    reporter.report()
    cond = conditions(cluster)
    assert (cond[CONDITION_TYPE]["status"], cond[CONDITION_TYPE]["reason"]) == ("False", UNHEALTHY_REASON)
    assert "GPU 1 XID 79" in cond[CONDITION_TYPE]["message"]
    assert cond[CONDITION_TYPE]["lastTransitionTime"] == format_timestamp(clock.now())
    assert {k: v for k, v in cond.items() if k != CONDITION_TYPE} == {c["type"]: c for c in NODE_CONDITIONS}

    clock.advance(QUIET)
    reporter.report()
    assert conditions(cluster)[CONDITION_TYPE]["status"] == "True"
    assert conditions(cluster)["Ready"] == NODE_CONDITIONS[0]


class _DeadGpu(SimulatedBackend):
    """A GPU that no longer answers: the probe fails, so the node must stay unhealthy."""

    def sample(self, index: int, gi_id: int | None = None) -> GpuSample:
        raise GpuBackendError(f"GPU {index} is lost")


def test_a_gpu_whose_probe_fails_never_recovers() -> None:
    clock = VirtualClock(T0)
    cluster = node_cluster(clock)
    backend = _DeadGpu(None, "1xA100-SXM4-80GB", clock=clock)
    reporter = NodeConditionReporter(cluster, "n1", backend, clock, quiet_period_s=QUIET)
    backend.inject_xid(0, sorted(FATAL_XIDS)[0])
    reporter.report()
    clock.advance(10 * QUIET)
    assert reporter.report() is None
    assert conditions(cluster)[CONDITION_TYPE]["status"] == "False"


def test_sim_node_inject_xid_from_the_cli_reaches_the_node(tmp_path: Any) -> None:
    from kubegpu.cli import app

    clock = VirtualClock(T0)
    cluster = node_cluster(clock)
    node_file = tmp_path / "node.json"
    SimulatedBackend.create(node_file, "2xA100-SXM4-80GB")
    reporter = NodeConditionReporter(cluster, "n1", SimulatedBackend(node_file), clock, quiet_period_s=QUIET)
    reporter.report()
    result = CliRunner().invoke(app, ["sim-node", "inject-xid", str(node_file), "--gpu", "0", "--xid", "48"])
    assert result.exit_code == 0, result.output
    reporter.report()
    assert conditions(cluster)[CONDITION_TYPE]["message"].startswith("critical XID error: GPU 0 XID 48")


def test_node_repair_replaces_the_node_the_agent_marked() -> None:
    """End to end: discovery's condition is what the autoscaler's node repair acts on, 10 minutes later."""
    from kubegpu.autoscaler import labels as L
    from kubegpu.autoscaler.lifecycle import Lifecycle

    clock = VirtualClock(T0)
    cluster = node_cluster(clock, "n0")
    for i in range(1, 6):
        cluster.create({"apiVersion": "v1", "kind": "Node", "metadata": {"name": f"n{i}"}})
    claims = [{"apiVersion": "kubegpu.io/v1", "kind": "NodeClaim",
               "metadata": {"name": f"c{i}", "labels": {L.NODEPOOL_LABEL: "gpu"}}, "status": {"nodeName": f"n{i}"}}
              for i in range(6)]
    backend = SimulatedBackend.create(None, "8xH100-SXM5-80GB", clock=clock)
    reporter = NodeConditionReporter(cluster, "n0", backend, clock, quiet_period_s=QUIET)
    terminated: list[str] = []
    life = Lifecycle(cluster, None, clock, lambda c, _: terminated.append(c["metadata"]["name"]))  # type: ignore[arg-type]

    def step(seconds: float) -> list[str]:
        clock.advance(seconds)
        reporter.report()
        return life.repair(claims, {n["metadata"]["name"]: n for n in cluster.list("Node")})

    assert step(1) == []
    # a GPU that keeps failing (a fresh XID every 4 minutes) never gets its quiet period; node repair replaces the
    # node once its condition has been False for 10 minutes
    results = []
    for minute in range(11):
        if minute % 4 == 0:
            backend.inject_xid(5, 95)
        results.append(step(60))
    assert results == [[]] * 10 + [["c0"]] and terminated == ["c0"]
    assert conditions(cluster, "n0")[CONDITION_TYPE]["reason"] == UNHEALTHY_REASON
