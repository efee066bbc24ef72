"""The operator's pure decisions: active policy, apply/delete plan, readiness, status; the MIG wedge healer."""

from __future__ import annotations

from typing import Any

from kubegpu.operator import reconcile as R
from kubegpu.operator.mighandoff import PAUSED, SINCE_ANNOTATION, heal
from kubegpu.operator.policy import parse_policy
from kubegpu.operator.render import render


def policy(name: str = "p", **spec: Any) -> Any:
    return parse_policy({"apiVersion": "kubegpu.io/v1", "kind": "ClusterPolicy",
                         "metadata": {"name": name, "uid": "u-1"}, "spec": spec})


def test_oldest_policy_acts_name_breaks_ties() -> None:
    def p(name: str, ts: str) -> dict[str, Any]:
        return {"metadata": {"name": name, "creationTimestamp": ts}}

    assert R.active_policy([p("b", "2026-01-02T00:00:00Z"), p("a", "2026-01-03T00:00:00Z")]) == "b"
    assert R.active_policy([p("z", "2026-01-01T00:00:00Z"), p("y", "2026-01-01T00:00:00Z")]) == "y"
    assert R.active_policy([]) is None
    status = R.ignored("y")
    assert status.state == "ignored" and status.requeue_after is None


def test_daemonset_readiness_rules() -> None:
    def ds(generation: int = 1, **status: int) -> dict[str, Any]:
        return {"metadata": {"generation": generation}, "spec": {"updateStrategy": {"type": "RollingUpdate"}},
                "status": status}

    assert R.daemonset_ready(ds(desiredNumberScheduled=0, observedGeneration=1))
    assert not R.daemonset_ready(ds(desiredNumberScheduled=2, numberUnavailable=1, numberAvailable=1))
    full = {"desiredNumberScheduled": 2, "numberAvailable": 2, "updatedNumberScheduled": 2, "observedGeneration": 1}
    assert R.daemonset_ready(ds(**full))
    assert not R.daemonset_ready(ds(generation=2, **full))  # new generation not observed yet
    assert not R.daemonset_ready(ds(**{**full, "updatedNumberScheduled": 1}))  # rollout in progress
    assert not R.daemonset_ready({"metadata": {}, "spec": {}})  # just created, no status yet
    assert not R.daemonset_ready(ds(generation=1, desiredNumberScheduled=0))  # zeros before the controller saw it


def test_plan_applies_in_state_order_and_deletes_only_what_the_policy_owns() -> None:
    full = render(policy(dcgmExporter={"enabled": True}))
    existing = [obj for _, objs in full for obj in objs]
    foreign = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "other", "namespace": "kubegpu",
                                                                    "labels": {"app": "x"}}}
    reduced = render(policy(dcgmExporter={"enabled": False}))
    plan = R.plan(reduced, [*existing, foreign], "p")
    deleted = {(k[1], k[3]) for k in plan.delete}
    assert deleted == {("ServiceAccount", "kubegpu-dcgm-exporter"), ("DaemonSet", "kubegpu-dcgm-exporter"),
                       ("Service", "kubegpu-dcgm-exporter")}
    kinds = [k[1] for k in plan.delete]
    assert kinds.index("Service") < kinds.index("DaemonSet") < kinds.index("ServiceAccount")
    applied_states = [plan.states[R.key_of(o)] for o in plan.apply]
    assert applied_states == sorted(applied_states, key=[s for s, _ in reduced].index)
    assert all(o["metadata"]["ownerReferences"][0]["uid"] == "u-1" for o in plan.apply)


def test_status_outcomes_follow_the_gpu_operator() -> None:
    plan = R.plan(render(policy()), [], "p")
    not_ready = R.states_not_ready(plan, {})
    assert not_ready[:3] == ["state-driver", "state-container-toolkit", "state-operator-validation"]
    status = R.outcome(not_ready, gpu_nodes=3, nfd_labelled=True)
    assert (status.state, status.reason, status.requeue_after) == ("notReady", "OperandNotReady", 5.0)
    assert "state-driver" in status.message
    live = {}
    for obj in plan.apply:
        if obj["kind"] == "DaemonSet":
            live[R.key_of(obj)] = {**obj, "status": {"desiredNumberScheduled": 0, "observedGeneration": 1}}
    assert R.states_not_ready(plan, live) == []
    assert R.outcome([], 3, True).reason == "Reconciled"
    assert R.outcome([], 0, True).reason == "NoGPUNodes"
    missing = R.outcome([], 0, False)
    assert missing.state == "ready" and missing.reason == "NFDLabelsMissing" and missing.requeue_after == 45.0
    conditions = {c["type"]: c for c in R.failed("spec.mig.strategy: bad").conditions("t")}
    assert conditions["Error"]["status"] == "True" and conditions["Error"]["reason"] == "ReconcileFailed"
    assert conditions["Ready"]["status"] == "False"


def test_condition_transition_time_kept_while_status_unchanged() -> None:
    first = R.outcome([], 1, True).body("kubegpu", "t1")
    second = R.outcome([], 1, True).body("kubegpu", "t2", first)
    assert {c["lastTransitionTime"] for c in second["conditions"]} == {"t1"}
    third = R.outcome(["state-driver"], 1, True).body("kubegpu", "t3", second)
    assert {c["type"]: c["lastTransitionTime"] for c in third["conditions"]} == {"Ready": "t3", "Error": "t3"}


DP = "nvidia.com/gpu.deploy.device-plugin"
GFD = "nvidia.com/gpu.deploy.gpu-feature-discovery"


def test_mig_wedge_after_a_crash_is_restored_at_once() -> None:
    labels = {DP: PAUSED, GFD: PAUSED, "nvidia.com/mig.config.state": "failed"}
    patch = heal(labels, {}, now=100.0, timeout=600)
    assert patch.labels == {DP: "true", GFD: "true"} and "restored" in patch.reason
    assert heal({DP: "true"}, {}, 100.0, 600).empty


def test_mig_change_timeout_is_recorded_on_the_node_and_survives_a_restart() -> None:
    labels = {DP: PAUSED, "nvidia.com/mig.config.state": "pending"}
    first = heal(labels, {}, now=1000.0, timeout=600)
    assert first.labels == {} and first.annotations == {SINCE_ANNOTATION: "1000.000"}
    annotations = {SINCE_ANNOTATION: "1000.000"}  # what the operator wrote; a restarted operator reads it back
    assert heal(labels, annotations, now=1599.0, timeout=600).empty
    late = heal(labels, annotations, now=1600.0, timeout=600)
    assert late.labels == {DP: "true", "nvidia.com/mig.config.state": "failed"}
    assert late.annotations == {SINCE_ANNOTATION: None}
    done = heal({DP: "true", "nvidia.com/mig.config.state": "success"}, annotations, 1700.0, 600)
    assert done.labels == {} and done.annotations == {SINCE_ANNOTATION: None}  # record cleaned up
