"""The exact planner (HiGHS): optimal where the greedy is not, the fallbacks, the time budget and how the CLI and
the controller say whether a plan is proven optimal."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from kubegpu.clock import VirtualClock
from kubegpu.errors import ConfigError
from kubegpu.gpu.catalog import CATALOG, get_model
from kubegpu.gpu.geometry import feasible_multisets
from kubegpu.kube import MemoryCluster
from kubegpu.partitionagent import annotations as ann
from kubegpu.partitioner.controller import PartitionerController
from kubegpu.partitioner.planner import NodeInput, plan, plan_violations
from kubegpu.partitioner.planner.disagg import plan_objective
from kubegpu.partitioner.planner.greedy import prepare

MakePod = Callable[..., dict[str, Any]]
MigNode = Callable[..., NodeInput]
H100 = "H100-SXM5-80GB"


def fragmented(mig_node: MigNode) -> NodeInput:
    """Two H100s: one with free 1g.20gb@0, 1g.10gb@5 and 1g.20gb@6, one with a 3g in use at 0 beside a free
    1g.20gb@6. Pods 2 x 1g, 3g, 4g, 7g: the optimum serves four (4g + two 1g on the first, 3g@4 on the second);
    the greedy, which keeps free instances where a pod can use them, serves three."""
    return mig_node("node-a", [(H100, [("1g.20gb", 0, False), ("1g.10gb", 5, False), ("1g.20gb", 6, False)]),
                               (H100, [("3g.40gb", 0, True), ("1g.20gb", 6, False)])])


def fragmented_pods(make_pod: MakePod) -> list[dict[str, Any]]:
    wanted = ["1g.10gb", "1g.10gb", "3g.40gb", "4g.40gb", "7g.80gb"]
    return [make_pod(f"p{k}", {f"nvidia.com/mig-{profile}": 1}) for k, profile in enumerate(wanted)]


def test_exact_serves_the_optimum_where_the_greedy_falls_short(mig_node: MigNode, make_pod: MakePod) -> None:
    nodes, pods = [fragmented(mig_node)], fragmented_pods(make_pod)
    exact = plan(nodes, pods, time_limit=10)
    greedy = plan(nodes, pods, planner="greedy")
    assert (exact.planner, greedy.planner) == ("exact", "greedy")
    assert len(greedy.assignments) == 3
    assert sorted(exact.assignments) == ["default/p0", "default/p1", "default/p2", "default/p3"]
    assert exact.optimal and exact.bound == exact.score == 4
    assert not greedy.optimal and greedy.bound is None
    assert plan_violations(nodes, pods, exact) == []
    layouts = [sorted((i.profile_id, i.start) for i in g.instances) for g in exact.nodes["node-a"].gpus]
    assert (9, 0) in layouts[1] and (9, 4) in layouts[1]  # the 3g in use stays; the new 3g goes beside it


def test_same_input_gives_the_same_plan(mig_node: MigNode, make_pod: MakePod) -> None:
    nodes, pods = [fragmented(mig_node)], fragmented_pods(make_pod)
    first, second = plan(nodes, pods, time_limit=10), plan(nodes, pods, time_limit=10)
    assert first.assignments == second.assignments
    assert first.nodes == second.nodes


def test_nothing_to_serve_keeps_every_layout_and_says_optimal(mig_node: MigNode, make_pod: MakePod) -> None:
    nodes = [fragmented(mig_node)]
    for pods in ([], [make_pod("cpu-only", {"cpu": 1})]):
        result = plan(nodes, pods)
        assert result.created == result.destroyed == 0
        assert not result.nodes["node-a"].changed
        assert result.optimal and result.bound == 0
        assert list(result.unschedulable) == [f"default/{p['metadata']['name']}" for p in pods]


def test_identical_gpus_are_disaggregated_unchanged_ones_first(mig_node: MigNode, make_pod: MakePod) -> None:
    """Four empty A100s and one 7g pod: one GPU changes, and it is the last by index, the rest stay empty."""
    node = mig_node("node-a", [("A100-SXM4-80GB", [])] * 4)
    result = plan([node], [make_pod("big", {"nvidia.com/mig-7g.80gb": 1})])
    changed = [g.index for g in result.nodes["node-a"].gpus if g.changed]
    assert changed == [3] and result.created == 1 and result.optimal


def test_a30_and_b200_and_priorities(mig_node: MigNode, make_pod: MakePod) -> None:
    """A 4-slot A30 and an 8-slot B200; the priority-1 4g pod wins the A30 over two priority-0 2g pods."""
    nodes = [mig_node("a30", [("A30-24GB", [("1g.6gb", 0, True)])]),
             mig_node("b200", [("B200-180GB", [("3g.90gb", 4, True)])])]
    pods = [make_pod("low-a", {"nvidia.com/mig-2g.12gb": 1}), make_pod("low-b", {"nvidia.com/mig-2g.12gb": 1}),
            make_pod("high", {"nvidia.com/mig-4g.24gb": 1}, priority=1),
            make_pod("b", {"nvidia.com/mig-3g.90gb": 1})]
    result = plan(nodes, pods, time_limit=10)
    # the A30's 1g in use at 0 leaves room for one 2g at 2 only; no 4g fits beside it, so "high" cannot be served
    assert result.assignments == {"default/low-a": "a30", "default/b": "b200"}
    assert result.optimal and plan_violations(nodes, pods, result) == []


@pytest.mark.parametrize("model_key", [key for key, m in CATALOG.items() if m.mig_capable])
def test_every_mig_model_in_the_catalog_is_planned(model_key: str, mig_node: MigNode, make_pod: MakePod) -> None:
    """An empty GPU of each MIG model and one pod per profile without +me: the optimum is the largest set of those
    profiles one GPU can hold, and the plan is legal for the model."""
    model = get_model(model_key)
    profiles = [p for p in model.mig_profiles if not p.media_extensions]
    pods = [make_pod(f"p{k}", {f"nvidia.com/{p.resource_name}": 1}) for k, p in enumerate(profiles)]
    nodes = [mig_node("n", [(model_key, [])])]
    result = plan(nodes, pods, time_limit=10)
    best = max(len(m) for m in feasible_multisets(model) if len(set(m)) == len(m))  # one pod per profile
    assert result.optimal and len(result.assignments) == best
    assert plan_violations(nodes, pods, result) == []


def test_required_node_affinity_and_taints_limit_where_pods_go(mig_node: MigNode, make_pod: MakePod) -> None:
    tainted = mig_node("a-tainted", [("A100-SXM4-80GB", [])], labels={"zone": "z1"})
    tainted.node["spec"] = {"taints": [{"key": "team", "value": "ml", "effect": "NoSchedule"}]}
    plain = mig_node("b-plain", [("A100-SXM4-80GB", [("7g.80gb", 0, True)])], labels={"zone": "z2"})
    wants_z1 = make_pod("z1", {"nvidia.com/mig-3g.40gb": 1})
    wants_z1["spec"]["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [{"key": "zone", "operator": "In", "values": ["z1"]}]}]}}}
    tolerant = make_pod("tolerant", {"nvidia.com/mig-3g.40gb": 1})
    tolerant["spec"]["tolerations"] = [{"key": "team", "operator": "Equal", "value": "ml"}]
    result = plan([tainted, plain], [wants_z1, tolerant], time_limit=10)
    # z1 needs the tainted node but does not tolerate it; the tolerant pod gets it (b-plain is full)
    assert result.assignments == {"default/tolerant": "a-tainted"}
    assert "selector, affinity or tolerations" in result.unschedulable["default/z1"]
    assert result.optimal


def test_multi_instance_pods_and_cpu_limits_are_planned_per_node(mig_node: MigNode, make_pod: MakePod) -> None:
    """Node-level model: a pod asking two 2g instances needs both on one node, and cpu can run out."""
    small = mig_node("a-small", [("A100-SXM4-80GB", [])])
    small.node["status"] = {"allocatable": {"cpu": "2", "memory": "64Gi", "pods": "10"}}
    big = mig_node("b-big", [("A100-SXM4-80GB", []), ("A100-SXM4-80GB", [])])
    pods = [make_pod("pair", {"nvidia.com/mig-3g.40gb": 2}),
            make_pod("cpu-hungry", {"nvidia.com/mig-1g.10gb": 1, "cpu": 3}),
            make_pod("one", {"nvidia.com/mig-3g.40gb": 1})]
    result = plan([small, big], pods, time_limit=10)
    assert plan_violations([small, big], pods, result) == []
    assert result.assignments["default/cpu-hungry"] == "b-big"  # 3 cpu do not fit on a-small
    assert len(result.assignments) == 3 and result.optimal


def test_mps_slices_are_planned_exactly(mps_node: Callable[..., NodeInput], make_pod: MakePod) -> None:
    node = mps_node("mps-a", [("A100-SXM4-80GB", [(40, True), (20, False)]), ("A100-SXM4-80GB", [])])
    pods = [make_pod(f"s{k}", {"nvidia.com/gpu-30gb": 1}) for k in range(3)]
    pods.append(make_pod("ten", {"nvidia.com/gpu-10gb": 1}))
    result = plan([node], pods, time_limit=10)
    assert plan_violations([node], pods, result) == []
    # 80 GB on the empty GPU takes two 30 GB slices; the busy one has 40 GB left: one 30, then the 10 beside it
    assert len(result.assignments) == 4 and result.optimal
    assert 40 in result.nodes["mps-a"].gpus[0].slices


def test_a_pod_no_layout_can_serve_is_proven_unservable(mps_node: Callable[..., NodeInput],
                                                       make_pod: MakePod) -> None:
    """An A30 with 20 of its 24 GB held: a 10 GB slice fits no layout, the model has nothing to decide."""
    node = mps_node("mps-a", [("A30-24GB", [(20, True)])])
    result = plan([node], [make_pod("ten", {"nvidia.com/gpu-10gb": 1})])
    assert result.optimal and (result.score, result.bound) == (0, 0)
    assert result.assignments == {} and not result.nodes["mps-a"].changed


def test_a_tiny_time_limit_still_returns_a_valid_plan_no_worse_than_greedy(mig_node: MigNode,
                                                                           make_pod: MakePod) -> None:
    nodes = [mig_node(f"n{k}", [("A100-SXM4-80GB", [("1g.10gb", s, s % 2 == 0) for s in range(7)])] * 4)
             for k in range(4)]
    pods = [make_pod(f"p{k}", {f"nvidia.com/mig-{('1g.10gb', '2g.20gb', '3g.40gb')[k % 3]}": 1})
            for k in range(60)]
    result = plan(nodes, pods, time_limit=1e-6)
    greedy = plan(nodes, pods, planner="greedy")
    problem = prepare(nodes, pods)
    assert plan_violations(nodes, pods, result) == []
    assert plan_objective(problem, result) <= plan_objective(problem, greedy)
    assert not result.optimal and result.planner == "exact" and "time limit" in result.note
    assert result.bound is not None and result.score is not None and result.bound >= result.score


@pytest.mark.parametrize(("planner", "limit", "message"), [
    ("best", 1.0, "planner: must be one of exact, greedy, not 'best'"),
    ("exact", 0.0, "time_limit: must be a number of seconds > 0, got 0.0"),
    ("exact", float("nan"), "time_limit: must be a number of seconds > 0, got nan"),
])
def test_bad_planner_or_time_limit_is_one_line(planner: str, limit: float, message: str) -> None:
    with pytest.raises(ConfigError, match="^" + message.replace("(", r"\(") + "$"):
        plan([], [], planner=planner, time_limit=limit)


# --- the CLI and the controller ---------------------------------------------------------------------------------

STATE = """
nodes:
- name: node-a
  gpus:
  - model: H100-SXM5-80GB
    instances: [{profile: 1g.20gb, start: 0}, {profile: 1g.10gb, start: 5}, {profile: 1g.20gb, start: 6}]
  - model: H100-SXM5-80GB
    instances: [{profile: 3g.40gb, start: 0, used: true}, {profile: 1g.20gb, start: 6}]
pods:
- {name: p0, requests: {nvidia.com/mig-1g.10gb: 1}}
- {name: p1, requests: {nvidia.com/mig-1g.10gb: 1}}
- {name: p2, requests: {nvidia.com/mig-3g.40gb: 1}}
- {name: p3, requests: {nvidia.com/mig-4g.40gb: 1}}
- {name: p4, requests: {nvidia.com/mig-7g.80gb: 1}}
"""


def run(argv: list[str], monkeypatch: pytest.MonkeyPatch) -> int:
    from kubegpu.cli import main

    monkeypatch.setattr(sys, "argv", ["kubegpu", *argv])
    try:
        main()
    except SystemExit as exc:
        return int(exc.code or 0)
    return 0


def test_plan_json_says_optimal_with_its_bound(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    state = tmp_path / "state.yaml"
    state.write_text(STATE)
    assert run(["plan", "--state", str(state), "-o", "json", "--time-limit", "10"], monkeypatch) == 0
    doc = json.loads(capsys.readouterr().out)
    assert (doc["planner"], doc["optimal"], doc["bound"], doc["score"]) == ("exact", True, 4, 4)
    assert doc["schedulable"] == ["p0", "p1", "p2", "p3"]
    assert run(["plan", "--state", str(state), "-o", "json", "--planner", "greedy"], monkeypatch) == 0
    doc = json.loads(capsys.readouterr().out)
    assert (doc["planner"], doc["optimal"], doc["bound"]) == ("greedy", False, None)
    assert len(doc["schedulable"]) == 3


def test_plan_table_has_the_optimality_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    state = tmp_path / "state.yaml"
    state.write_text(STATE)
    assert run(["plan", "--state", str(state), "--time-limit", "10"], monkeypatch) == 0
    out = capsys.readouterr().out
    assert "planner exact: proven optimal (score 4, bound 4; optimal)" in out


@pytest.mark.parametrize(("flags", "error"), [
    (["--planner", "fastest"], "Invalid value for '--planner': 'fastest' is not one of exact, greedy"),
    (["--time-limit", "-1"], "Invalid value for '--time-limit': must be more than 0, got '-1'"),
])
def test_plan_rejects_bad_planner_flags_in_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                    capsys: pytest.CaptureFixture[str], flags: list[str],
                                                    error: str) -> None:
    state = tmp_path / "state.yaml"
    state.write_text(STATE)
    assert run(["plan", "--state", str(state), *flags], monkeypatch) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and err.startswith("error: ") and error in err


def test_controller_records_an_event_saying_the_plan_is_optimal() -> None:
    clock = VirtualClock(1000)
    cluster = MemoryCluster(clock)
    status = {"kubegpu.io/status-gpu-0-model": "A100-SXM4-80GB", "kubegpu.io/status-gpu-0-layout-used": "",
              "kubegpu.io/status-gpu-0-layout-free": ""}
    cluster.create({"apiVersion": "v1", "kind": "Node",
                    "metadata": {"name": "gpu-node", "labels": {ann.PARTITIONING_LABEL: "mig"},
                                 "annotations": status},
                    "status": {"allocatable": {"cpu": "64", "memory": "512Gi", "pods": "110"}}})
    cluster.create({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "wants-3g", "namespace": "default"},
                    "spec": {"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/mig-3g.40gb": "1"}}}]},
                    "status": {"phase": "Pending", "conditions": [
                        {"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}]}})
    controller = PartitionerController(cluster, batch_timeout=0, batch_idle=0, time_limit=5)
    result = controller.tick(1000)
    assert result.planned and result.written == ["gpu-node"], result
    [event] = [e for e in cluster.list("Event") if e["reason"] == "PartitioningPlanned"]
    assert event["involvedObject"]["name"] == "gpu-node"
    assert event["message"] == (f"plan {result.plan_id}: 1 pods fit; planner exact: proven optimal "
                                "(score 1, bound 1; optimal)")


def test_controller_rejects_an_unknown_planner() -> None:
    with pytest.raises(ConfigError, match=r"^planner: must be one of exact, greedy, not 'fast'$"):
        PartitionerController(MemoryCluster(VirtualClock(0)), planner="fast")


def test_nodes_alike_beyond_the_pods_that_may_go_there_are_left_out_of_a_node_level_model(
        mig_node: MigNode, make_pod: MakePod, monkeypatch: pytest.MonkeyPatch) -> None:
    """Twelve empty A100 nodes alike and two pods (one asking two instances: node-level): two of them stay in the
    supply, the others keep their layouts, and the plan is as good as the one over every node."""
    from kubegpu.partitioner.planner import columns
    from kubegpu.partitioner.planner.layouts import LayoutCache

    nodes = [mig_node(f"n{k:02d}", [("A100-SXM4-80GB", []), ("A100-SXM4-80GB", [])]) for k in range(12)]
    nodes.append(mig_node("z-busy", [("A100-SXM4-80GB", [("3g.40gb", 0, True)])]))
    pods = [make_pod("pair", {"nvidia.com/mig-3g.40gb": 2}), make_pod("one", {"nvidia.com/mig-1g.10gb": 1})]
    model = columns.build(prepare(nodes, pods), LayoutCache())
    assert model.node_level and sorted(model.groups) == ["n00", "n01", "z-busy"]
    result = plan(nodes, pods, time_limit=10)
    assert plan_violations(nodes, pods, result) == [] and result.optimal and len(result.assignments) == 2
    assert not any(result.nodes[f"n{k:02d}"].changed for k in range(2, 12))
    monkeypatch.setattr(columns, "_surplus", lambda problem, eligible: [])
    everything = plan(nodes, pods, time_limit=10)
    assert everything.optimal and len(columns.build(prepare(nodes, pods), LayoutCache()).groups) == 13
    assert plan_objective(prepare(nodes, pods), result) == plan_objective(prepare(nodes, pods), everything)


def test_bound_pods_requests_are_parsed_once_per_version(monkeypatch: pytest.MonkeyPatch) -> None:
    from kubegpu.partitioner.planner import model as planner_model

    calls: list[str] = []
    original = planner_model.pod_requests

    def counted(pod: dict[str, Any]) -> dict[str, float]:
        calls.append(pod["metadata"]["name"])
        return original(pod)

    monkeypatch.setattr(planner_model, "pod_requests", counted)
    pod = {"metadata": {"name": "bound", "resourceVersion": "1"},
           "spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": "2"}}}]}}
    assert planner_model.bound_requests(pod)["cpu"] == 2.0
    assert planner_model.bound_requests(pod)["cpu"] == 2.0 and calls == ["bound"]
    pod["metadata"]["resourceVersion"] = "2"
    pod["spec"]["containers"][0]["resources"]["requests"]["cpu"] = "3"
    assert planner_model.bound_requests(pod)["cpu"] == 3.0 and calls == ["bound", "bound"]
    copy = {**pod, "metadata": {**pod["metadata"], "name": "copy"}}
    assert planner_model.bound_requests(copy)["cpu"] == 3.0 and calls == ["bound", "bound", "copy"]


def test_a_nodes_base_view_is_rebuilt_only_when_its_pods_or_allocatable_change(mig_node: MigNode) -> None:
    from dataclasses import replace

    from kubegpu.partitioner.planner import model as planner_model

    node = mig_node("n", [("A100-SXM4-80GB", [])])
    node.node["status"] = {"allocatable": {"cpu": "8", "memory": "64Gi", "pods": "10"}}
    pod = {"metadata": {"name": "bound", "resourceVersion": "1"},
           "spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": "2"}}}]}}
    first = planner_model.base_view(replace(node, pods=(pod,)))
    assert first.free("cpu") == 6.0
    assert planner_model.base_view(replace(node, pods=(pod,))) is first  # a new NodeInput, the same objects
    pod["metadata"]["resourceVersion"] = "2"
    pod["spec"]["containers"][0]["resources"]["requests"]["cpu"] = "3"
    assert planner_model.base_view(replace(node, pods=(pod,))).free("cpu") == 5.0
    node.node["status"]["allocatable"]["cpu"] = "4"
    assert planner_model.base_view(replace(node, pods=(pod,))).free("cpu") == 1.0
