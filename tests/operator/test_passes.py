"""Whole operator passes on an in-memory API: apply order, status, deletion, singleton, invalid policies, node
labels, the MIG wedge healer and a rolling driver upgrade across six nodes."""

from __future__ import annotations

from typing import Any

from kubegpu.operator import upgrade
from kubegpu.operator.passes import run_pass
from kubegpu.operator.render import COMPONENT_LABEL, DRIVER_HASH, NAME_LABEL
from tests.operator.fakeapi import FakeApi, Pdb

NS = "kubegpu"
NFD = {"feature.node.kubernetes.io/pci-10de.present": "true", "nvidia.com/gpu.product": "NVIDIA-L4"}
DEPLOY = "nvidia.com/gpu.deploy."


def run(api: FakeApi, name: str = "p", now: float = 0.0) -> Any:
    return run_pass(api, name, NS, now, f"t{now}")


def status(api: FakeApi, name: str = "p") -> dict[str, Any]:
    result: dict[str, Any] = api.policies[name]["status"]
    return result


def condition(api: FakeApi, kind: str, name: str = "p") -> dict[str, Any]:
    return next(c for c in status(api, name)["conditions"] if c["type"] == kind)


def test_policy_becomes_objects_in_order_and_status_follows_the_daemonsets() -> None:
    api = FakeApi()
    api.add_policy("p", {}, "2026-01-01T00:00:00Z")
    api.add_node("gpu-0", NFD)
    run(api)
    kinds = [(k[1], k[3]) for k in api.applied]
    assert kinds[0] == ("RuntimeClass", "nvidia")
    ds_order = [name for kind, name in kinds if kind == "DaemonSet"]
    assert ds_order[:3] == ["kubegpu-driver", "kubegpu-container-toolkit", "kubegpu-operator-validator"]
    assert status(api)["state"] == "notReady"
    assert condition(api, "Error")["reason"] == "OperandNotReady"
    api.set_workloads_ready()
    result = run(api, now=5.0)
    assert status(api)["state"] == "ready" and condition(api, "Ready")["reason"] == "Reconciled"
    assert result.status.requeue_after is None
    api.set_workloads_ready(False)
    run(api, now=10.0)
    assert status(api)["state"] == "notReady"


def test_disabled_component_objects_are_deleted() -> None:
    api = FakeApi()
    api.add_policy("p", {}, "2026-01-01T00:00:00Z")
    run(api)
    assert ("DaemonSet", "kubegpu-dcgm-exporter") in api.kinds()
    api.policies["p"]["spec"] = {"dcgmExporter": {"enabled": False}}
    run(api)
    assert not [k for k in api.kinds() if k[1] == "kubegpu-dcgm-exporter"]
    assert ("DaemonSet", "kubegpu-device-plugin") in api.kinds()


def test_second_policy_is_ignored() -> None:
    api = FakeApi()
    api.add_policy("first", {}, "2026-01-01T00:00:00Z")
    api.add_policy("second", {"partitioner": {"enabled": True}}, "2026-01-02T00:00:00Z")
    run(api, "first")
    before = len(api.applied)
    run(api, "second")
    assert len(api.applied) == before  # nothing applied for the ignored one
    assert status(api, "second")["state"] == "ignored" and "first" in condition(api, "Ready", "second")["message"]
    assert ("Deployment", "kubegpu-partitioner") not in api.kinds()


def test_invalid_policy_is_reported_and_nothing_is_deleted() -> None:
    api = FakeApi()
    api.add_policy("p", {}, "2026-01-01T00:00:00Z")
    run(api)
    objects = dict(api.objects)
    api.policies["p"]["spec"] = {"mig": {"strategy": "sometimes"}}
    result = run(api)
    assert api.objects == objects and result.deleted == []
    assert status(api)["state"] == "notReady"
    error = condition(api, "Error")
    assert error["reason"] == "ReconcileFailed" and "spec.mig.strategy" in error["message"]


def test_node_labels_are_applied_and_operands_false_honoured() -> None:
    api = FakeApi()
    api.add_policy("p", {}, "2026-01-01T00:00:00Z")
    api.add_node("gpu-0", NFD)
    api.add_node("gpu-1", {**NFD, DEPLOY + "operands": "false", DEPLOY + "driver": "true"})
    api.add_node("cpu-0", {})
    run(api)
    labels = api.nodes["gpu-0"]["metadata"]["labels"]
    assert labels["nvidia.com/gpu.present"] == "true" and labels[DEPLOY + "device-plugin"] == "true"
    assert DEPLOY + "driver" not in api.nodes["gpu-1"]["metadata"]["labels"]
    assert api.nodes["cpu-0"]["metadata"]["labels"] == {}
    patched = run(api).node_patches
    assert "gpu-0" not in patched  # a second pass changes nothing


def test_mig_wedge_healed_after_crash_and_after_timeout() -> None:
    api = FakeApi()
    api.add_policy("p", {"migManager": {"timeoutSeconds": 300}}, "2026-01-01T00:00:00Z")
    crashed = {**NFD, DEPLOY + "device-plugin": "paused-for-mig-change", "nvidia.com/mig.config.state": "success"}
    hung = {**NFD, DEPLOY + "dcgm-exporter": "paused-for-mig-change", "nvidia.com/mig.config.state": "pending"}
    api.add_node("crashed", crashed)
    api.add_node("hung", hung)
    result = run(api, now=1000.0)
    assert api.nodes["crashed"]["metadata"]["labels"][DEPLOY + "device-plugin"] == "true"
    assert any("crashed" in note for note in result.notes)
    hung_meta = api.nodes["hung"]["metadata"]
    assert hung_meta["labels"][DEPLOY + "dcgm-exporter"] == "paused-for-mig-change"
    assert hung_meta["annotations"]["kubegpu.io/mig-change-since"] == "1000.000"
    run(api, now=1200.0)  # an operator restart would read the same annotation
    assert hung_meta["labels"][DEPLOY + "dcgm-exporter"] == "paused-for-mig-change"
    run(api, now=1300.0)
    assert hung_meta["labels"][DEPLOY + "dcgm-exporter"] == "true"
    assert hung_meta["labels"]["nvidia.com/mig.config.state"] == "failed"
    assert "kubegpu.io/mig-change-since" not in hung_meta["annotations"]


# ------------------------------------------------------------------------------------------ driver upgrades

def kubelet(api: FakeApi, bad: set[str]) -> None:
    """Play the DaemonSet controller and kubelets: a missing driver pod comes back with the DaemonSet's current
    template (OnDelete), then the validator; workload pods evicted elsewhere come back on a usable node."""
    driver_ds = next(o for k, o in api.objects.items() if k[1:] == ("DaemonSet", NS, "kubegpu-driver"))
    current = driver_ds["spec"]["template"]["metadata"]["annotations"][DRIVER_HASH]
    for name in api.nodes:
        pods = api.list_pods(node=name, namespace=NS)
        components = {p["metadata"]["labels"][COMPONENT_LABEL] for p in pods}
        if "driver" not in components:
            api.add_pod(NS, f"driver-{name}-{api.clock}", name, {NAME_LABEL: "kubegpu", COMPONENT_LABEL: "driver"},
                        owner="DaemonSet", annotations={DRIVER_HASH: current})
            if name in bad:
                pod = api.list_pods(node=name, namespace=NS, labels={COMPONENT_LABEL: "driver"})[0]
                stored = api.pods[(NS, pod["metadata"]["name"])]
                stored["status"] = {"phase": "Running", "conditions": [{"type": "Ready", "status": "False"}],
                                    "containerStatuses": [{"state": {"waiting": {"reason": "CrashLoopBackOff"}}}]}
        if "operator-validator" not in components:
            validator = f"validator-{name}-{api.clock}"
            api.add_pod(NS, validator, name, {NAME_LABEL: "kubegpu", COMPONENT_LABEL: "operator-validator"},
                        owner="DaemonSet")
            if name in bad:
                api.pods[(NS, validator)]["status"]["conditions"][0]["status"] = "False"
    for replica in range(6):
        if not any(p["metadata"]["labels"].get("app") == "train" and p["metadata"]["name"].startswith(f"t{replica}-")
                   for p in api.pods.values()):
            target = next(n for n in sorted(api.nodes) if not api.nodes[n]["spec"].get("unschedulable"))
            api.add_pod("ml", f"t{replica}-{api.clock}", target, {"app": "train"}, gpu=True, owner="ReplicaSet")


def past_cordon(api: FakeApi) -> int:
    states = [n["metadata"]["labels"].get(upgrade.STATE_LABEL) for n in api.nodes.values()]
    return sum(1 for s in states if s in upgrade.IN_PROGRESS and s != upgrade.CORDON)


def upgrade_world(bad: set[str] | None = None) -> FakeApi:
    api = FakeApi()
    spec = {"driver": {"version": "550.1", "upgradePolicy": {"maxParallelUpgrades": 2, "maxUnavailable": "50%"}}}
    api.add_policy("p", spec, "2026-01-01T00:00:00Z")
    for i in range(6):
        api.add_node(f"gpu-{i}", NFD)
    api.pdbs.append(Pdb("ml", {"app": "train"}, min_available=5))
    run(api)
    kubelet(api, set())
    for _ in range(5):
        run(api)
    assert {n["metadata"]["labels"].get(upgrade.STATE_LABEL) for n in api.nodes.values()} == {upgrade.DONE}
    api.policies["p"]["spec"]["driver"]["version"] = "570.2"  # the new driver
    return api


def states(api: FakeApi) -> dict[str, str]:
    return {name: n["metadata"]["labels"].get(upgrade.STATE_LABEL, "") for name, n in api.nodes.items()}


def test_rolling_driver_upgrade_six_nodes_two_at_a_time_pdb_held() -> None:
    api = upgrade_world()
    most = 0
    for step in range(120):
        run(api, now=10.0 * step)
        most = max(most, past_cordon(api))
        assert sum(1 for p in api.pods.values() if p["metadata"]["labels"].get("app") == "train") >= 5
        kubelet(api, set())
        if set(states(api).values()) == {upgrade.DONE} and step > 3:
            break
    assert set(states(api).values()) == {upgrade.DONE}
    assert most == 2
    assert not any(n["spec"].get("unschedulable") for n in api.nodes.values())
    driver_ds = next(o for k, o in api.objects.items() if k[1:] == ("DaemonSet", NS, "kubegpu-driver"))
    current = driver_ds["spec"]["template"]["metadata"]["annotations"][DRIVER_HASH]
    drivers = api.list_pods(namespace=NS, labels={COMPONENT_LABEL: "driver"})
    assert len(drivers) == 6 and {p["metadata"]["annotations"][DRIVER_HASH] for p in drivers} == {current}
    assert driver_ds["spec"]["updateStrategy"] == {"type": "OnDelete"}
    assert api.evictions_refused > 0  # the PDB pushed back at least once and was obeyed


def test_failed_node_recovers_once_the_new_driver_validates() -> None:
    api = upgrade_world()
    bad = {"gpu-3"}
    for step in range(150):
        run(api, now=10.0 * step)
        kubelet(api, bad)
    assert states(api)["gpu-3"] == upgrade.FAILED
    assert all(s == upgrade.DONE for n, s in states(api).items() if n != "gpu-3")
    bad.clear()  # the admin fixes the node: the driver pod restarts healthy, the validator passes
    for pod in api.list_pods(node="gpu-3", namespace=NS):
        api.delete_pod(NS, pod["metadata"]["name"])
    kubelet(api, bad)
    for step in range(150, 155):
        run(api, now=10.0 * step)
    assert states(api)["gpu-3"] == upgrade.DONE and not api.nodes["gpu-3"]["spec"].get("unschedulable")


def test_scheduler_requeues_after_5s_while_not_ready_and_60s_once_ready(monkeypatch: Any) -> None:
    from kubegpu.operator import controller

    clock = [1000.0]
    monkeypatch.setattr(controller.time, "time", lambda: clock[0])
    api = FakeApi()
    api.add_policy("p", {}, "2026-01-01T00:00:00Z")
    api.add_node("gpu-0", NFD)
    from prometheus_client import CollectorRegistry

    from kubegpu.metrics import OperatorMetrics

    registry = CollectorRegistry()
    scheduler = controller.Scheduler(api, NS, OperatorMetrics.create(registry))
    first = scheduler.run("p")
    assert registry.get_sample_value("gpu_operator_reconciliation_status") == 0
    assert registry.get_sample_value("gpu_operator_gpu_nodes_total") == 1
    assert first is not None and first.state == "notReady" and scheduler.due["p"] == 1005.0
    clock[0] = 1003.0
    assert scheduler.run("p") is None  # not due yet
    api.set_workloads_ready()
    clock[0] = 1005.0
    ready = scheduler.run("p")
    assert ready is not None and ready.reason == "Reconciled" and scheduler.due["p"] == 1065.0
    assert registry.get_sample_value("gpu_operator_reconciliation_status") == 1
    assert registry.get_sample_value("gpu_operator_reconciliation_last_success_ts_seconds") == 1005.0
    assert registry.get_sample_value("gpu_operator_reconciliation_total") == 2
    assert registry.get_sample_value("gpu_operator_nodes_upgrades", {"phase": "done"}) == 1
    assert scheduler.run("p", force=True) is not None  # an event does not wait
    assert scheduler.active() == "p"


def test_an_api_failure_mid_pass_ends_in_the_status() -> None:
    class Flaky(FakeApi):
        def list_nodes(self) -> list[dict[str, Any]]:
            raise ConnectionError("apiserver went away")

    api = Flaky()
    api.add_policy("p", {}, "2026-01-01T00:00:00Z")
    result = run(api)
    assert result.status.reason == "ReconcileFailed" and "apiserver went away" in result.status.message
    assert status(api)["state"] == "notReady"
