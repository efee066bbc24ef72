"""The planner: concrete cases for each rule of the objective, then properties over random states."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kubegpu.gpu.catalog import get_model
from kubegpu.gpu.geometry import PlacedInstance, layout_errors, place
from kubegpu.partitioner.planner import CurrentInstance, GpuInput, MpsSlice, NodeInput, Plan, plan, plan_violations
from kubegpu.scheduling import fits, node_info

A100 = "A100-SXM4-80GB"
ALL_1G = [("1g.10gb", s, False) for s in range(7)]


def layout_names(result: Plan, node: str, gpu: int = 0) -> list[str]:
    model = get_model(result.nodes[node].gpus[gpu].model_key)
    return [f"{model.profile(i.profile_id).name}@{i.start}" for i in result.nodes[node].gpus[gpu].instances]


def test_2g_on_all_1g_with_some_in_use_replaces_free_1gs_only(mig_node: Callable[..., NodeInput],
                                                              make_pod: Callable[..., dict[str, Any]]) -> None:
    used = {0, 1, 2}
    node = mig_node("n1", [(A100, [("1g.10gb", s, s in used) for s in range(7)])])
    pod = make_pod("p", {"nvidia.com/mig-2g.20gb": 1})
    result = plan([node], [pod])
    assert result.assignments == {"default/p": "n1"}
    names = layout_names(result, "n1")
    assert {"1g.10gb@0", "1g.10gb@1", "1g.10gb@2"} <= set(names)
    assert names.count("2g.20gb@4") + names.count("2g.20gb@2") == 0 or "2g.20gb@4" in names
    gpu = result.nodes["n1"].gpus[0]
    assert (gpu.created, gpu.destroyed) == (1, 2)  # only the two 1g under the new 2g go
    assert plan_violations([node], [pod], result) == []


def test_free_instance_is_reused_without_any_change(mig_node: Callable[..., NodeInput],
                                                    make_pod: Callable[..., dict[str, Any]]) -> None:
    node = mig_node("n1", [(A100, [("3g.40gb", 4, True), ("2g.20gb", 0, False)])])
    result = plan([node], [make_pod("p", {"nvidia.com/mig-2g.20gb": 1})])
    assert result.assignments == {"default/p": "n1"}
    assert not result.nodes["n1"].changed


def test_many_small_pods_beat_one_large_at_equal_priority(mig_node: Callable[..., NodeInput],
                                                          make_pod: Callable[..., dict[str, Any]]) -> None:
    node = mig_node("n1", [(A100, [])])
    pods = [make_pod("big", {"nvidia.com/mig-7g.80gb": 1})]
    pods += [make_pod(f"small-{i}", {"nvidia.com/mig-1g.10gb": 1}) for i in range(7)]
    result = plan([node], pods)
    assert len(result.assignments) == 7
    assert "default/big" in result.unschedulable


def test_higher_priority_pod_outweighs_any_number_of_lower_ones(mig_node: Callable[..., NodeInput],
                                                                make_pod: Callable[..., dict[str, Any]]) -> None:
    node = mig_node("n1", [(A100, [])])
    pods = [make_pod("big", {"nvidia.com/mig-7g.80gb": 1}, priority=100)]
    pods += [make_pod(f"small-{i}", {"nvidia.com/mig-1g.10gb": 1}) for i in range(7)]
    result = plan([node], pods)
    assert list(result.assignments) == ["default/big"]
    assert layout_names(result, "n1") == ["7g.80gb@0"]


def test_in_use_instances_are_never_moved_even_if_that_leaves_pods_pending(
        mig_node: Callable[..., NodeInput], make_pod: Callable[..., dict[str, Any]]) -> None:
    node = mig_node("n1", [(A100, [("1g.10gb", s, True) for s in (0, 2, 4, 6)])])
    result = plan([node], [make_pod("p", {"nvidia.com/mig-2g.20gb": 1})])
    assert result.assignments == {}
    assert "not enough free GPU capacity" in result.unschedulable["default/p"]
    assert layout_names(result, "n1") == ["1g.10gb@0", "1g.10gb@2", "1g.10gb@4", "1g.10gb@6"]


def test_placement_aware_where_a_count_only_planner_fails(mig_node: Callable[..., NodeInput],
                                                          make_pod: Callable[..., dict[str, Any]]) -> None:
    # 1g in use at 1 and 5: by counts a 3g (4 slots) "fits" in the 6 free slots, by placement it never does;
    # two 2g still fit at 2 and... only at 2 (0 overlaps 1, 4 overlaps 5), so one pod of the two is pending.
    node = mig_node("n1", [(A100, [("1g.10gb", 1, True), ("1g.10gb", 5, True)])])
    pods = [make_pod("three", {"nvidia.com/mig-3g.40gb": 1}), make_pod("two-a", {"nvidia.com/mig-2g.20gb": 1}),
            make_pod("two-b", {"nvidia.com/mig-2g.20gb": 1})]
    result = plan([node], pods)
    assert len(result.assignments) == 1
    assert "default/three" in result.unschedulable
    assert plan_violations([node], pods, result) == []


def test_node_selector_is_honoured(mig_node: Callable[..., NodeInput],
                                   make_pod: Callable[..., dict[str, Any]]) -> None:
    a = mig_node("a", [(A100, [])], labels={"zone": "x"})
    b = mig_node("b", [(A100, [])], labels={"zone": "y"})
    result = plan([a, b], [make_pod("p", {"nvidia.com/mig-3g.40gb": 1}, node_selector={"zone": "y"})])
    assert result.assignments == {"default/p": "b"}
    assert not result.nodes["a"].changed
    lonely = plan([a], [make_pod("q", {"nvidia.com/mig-3g.40gb": 1}, node_selector={"zone": "z"})])
    assert "node selector" in lonely.unschedulable["default/q"]


def test_unknown_model_and_unoffered_profile_are_reported_not_raised(
        make_pod: Callable[..., dict[str, Any]]) -> None:
    strange = NodeInput("s", "mig", {"metadata": {"name": "s"}}, (GpuInput(0, "Z9000", None),))
    result = plan([strange], [make_pod("p", {"nvidia.com/mig-5g.50gb": 1}), make_pod("q", {"cpu": 1})])
    assert result.nodes["s"].gpus[0].error == "GPU model 'Z9000' is not in the catalog"
    assert not result.nodes["s"].changed
    assert result.unschedulable["default/p"] == "no partitionable GPU offers nvidia.com/mig-5g.50gb"
    assert "requests no" in result.unschedulable["default/q"]


def test_a_pod_with_a_bad_spec_is_reported_and_the_rest_still_planned(
        mig_node: Callable[..., NodeInput], make_pod: Callable[..., dict[str, Any]]) -> None:
    node = mig_node("n1", [(A100, [])])
    bad_affinity = make_pod("aff", {"nvidia.com/mig-1g.10gb": 1})
    bad_affinity["spec"]["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [{"key": "a", "operator": "Bogus"}]}]}}}
    bad_selector = make_pod("sel", {"nvidia.com/mig-1g.10gb": 1})
    bad_selector["spec"]["nodeSelector"] = ["pool"]
    negative = make_pod("neg", {"nvidia.com/mig-1g.10gb": -1})
    misshapen = make_pod("shape", {})
    misshapen["spec"]["containers"] = 5
    affinity_int = make_pod("aff5", {"nvidia.com/mig-1g.10gb": 1})
    affinity_int["spec"]["affinity"] = 5
    priority = make_pod("prio", {"nvidia.com/mig-1g.10gb": 1})
    priority["spec"]["priority"] = "high"
    good = make_pod("good", {"nvidia.com/mig-2g.20gb": 1})
    result = plan([node], [bad_affinity, bad_selector, negative, misshapen, affinity_int, priority, good])
    assert result.unschedulable["default/shape"].startswith("invalid spec: TypeError")
    assert result.unschedulable["default/aff5"].startswith("invalid spec: spec.affinity / nodeSelector / tolerations")
    assert result.unschedulable["default/prio"] == "invalid spec: spec.priority must be an integer, not 'high'"
    assert result.assignments == {"default/good": "n1"}
    assert "matchExpressions[0].operator: 'Bogus'" in result.unschedulable["default/aff"]
    assert "spec.nodeSelector: expected a mapping" in result.unschedulable["default/sel"]
    assert result.unschedulable["default/neg"] == "invalid requests: nvidia.com/mig-1g.10gb must not be negative"
    assert {"default/aff", "default/sel", "default/neg"} <= result.impossible


def test_a30_profile_ids_differ_from_a100(mig_node: Callable[..., NodeInput],
                                          make_pod: Callable[..., dict[str, Any]]) -> None:
    node = mig_node("n", [("A30-24GB", [("1g.6gb", 0, True)])])
    result = plan([node], [make_pod("p", {"nvidia.com/mig-2g.12gb": 1})])
    assert result.assignments == {"default/p": "n"}
    assert layout_names(result, "n") == ["1g.6gb@0", "2g.12gb@2"]


def test_multi_instance_pod_gets_all_or_nothing(mig_node: Callable[..., NodeInput],
                                                make_pod: Callable[..., dict[str, Any]]) -> None:
    node = mig_node("n", [(A100, [("4g.40gb", 0, True)])])
    too_big = make_pod("p", {"nvidia.com/mig-2g.20gb": 3})
    result = plan([node], [too_big])
    assert result.assignments == {}
    assert not result.nodes["n"].changed
    two = plan([node], [make_pod("q", {"nvidia.com/mig-2g.20gb": 1, "nvidia.com/mig-1g.10gb": 1})])
    assert two.assignments == {"default/q": "n"}


def test_mps_slices_fit_memory_and_keep_used_ones(mps_node: Callable[..., NodeInput],
                                                  make_pod: Callable[..., dict[str, Any]]) -> None:
    node = mps_node("m", [(A100, [(30, True), (20, False), (20, False)])])
    pods = [make_pod("a", {"nvidia.com/gpu-25gb": 1}), make_pod("b", {"nvidia.com/gpu-20gb": 1})]
    result = plan([node], pods)
    gpu = result.nodes["m"].gpus[0]
    assert set(result.assignments) == {"default/a", "default/b"}
    assert sorted(gpu.slices) == [20, 25, 30]  # one free 20gb dropped for the 25gb, the other kept for pod b
    assert sum(gpu.slices) <= 80
    assert plan_violations([node], pods, result) == []


def test_same_input_same_plan(mig_node: Callable[..., NodeInput], make_pod: Callable[..., dict[str, Any]]) -> None:
    nodes = [mig_node(f"n{i}", [(A100, [("1g.10gb", 0, True)]), (A100, [])]) for i in range(3)]
    pods = [make_pod(f"p{i}", {f"nvidia.com/mig-{p}": 1}) for i, p in enumerate(["2g.20gb", "3g.40gb", "1g.10gb"] * 4)]
    first, second = plan(nodes, pods), plan(list(reversed(nodes)), list(pods))
    assert first.nodes == second.nodes and first.assignments == second.assignments


# --- properties -------------------------------------------------------------------------------------------------

MODELS = ["A100-SXM4-80GB", "H100-SXM5-80GB", "A30-24GB"]


@st.composite
def gpu_inputs(draw: st.DrawFn, index: int) -> GpuInput:
    model = get_model(draw(st.sampled_from(MODELS)))
    profiles = [p.profile_id for p in model.mig_profiles if not p.media_extensions]
    wanted = draw(st.lists(st.sampled_from(profiles), max_size=5))
    layout: list[PlacedInstance] = []
    for profile_id in wanted:  # grow a legal layout one instance at a time
        grown = place(model, [profile_id], layout)
        if grown is not None:
            layout = grown
    used = draw(st.lists(st.booleans(), min_size=len(layout), max_size=len(layout)))
    return GpuInput(index, model.key, model, tuple(CurrentInstance(i.profile_id, i.start, u)
                                                   for i, u in zip(layout, used, strict=True)))


@st.composite
def cluster_states(draw: st.DrawFn) -> tuple[list[NodeInput], list[dict[str, Any]]]:
    nodes = []
    for n in range(draw(st.integers(1, 3))):
        gpus = tuple(draw(gpu_inputs(i)) for i in range(draw(st.integers(1, 2))))
        labels = {"pool": draw(st.sampled_from(["a", "b"]))}
        nodes.append(NodeInput(f"node-{n}", "mig", {"metadata": {"name": f"node-{n}", "labels": labels}}, gpus))
    names = sorted({f"nvidia.com/{p.resource_name}" for m in MODELS for p in get_model(m).mig_profiles})
    pods = []
    for k in range(draw(st.integers(0, 8))):
        resource = draw(st.sampled_from([*names, "nvidia.com/mig-9g.99gb"]))
        selector = draw(st.sampled_from([{}, {"pool": "a"}, {"pool": "b"}]))
        pods.append({"metadata": {"name": f"pod-{k}", "namespace": "default"},
                     "spec": {"priority": draw(st.integers(0, 2)), "nodeSelector": selector,
                              "containers": [{"name": "c", "resources": {"limits": {resource: "1"}}}]}})
    return nodes, pods


def recount_fits(node: NodeInput, result: Plan, pods: list[dict[str, Any]]) -> list[str]:
    """Independent of the planner: allocatable from the new layout minus in-use instances, then kube's fit."""
    allocatable: Counter[str] = Counter({"pods": 110})
    for gpu_in, gpu_out in zip(node.gpus, result.nodes[node.name].gpus, strict=True):
        assert gpu_in.model is not None
        for inst in gpu_out.instances:
            allocatable[f"nvidia.com/{gpu_in.model.profile(inst.profile_id).resource_name}"] += 1
        for current in gpu_in.instances:
            if current.used:
                allocatable[f"nvidia.com/{gpu_in.model.profile(current.profile_id).resource_name}"] -= 1
    obj = {**node.node, "status": {"allocatable": {k: str(v) for k, v in allocatable.items()}}}
    info = node_info(obj)
    failures = []
    for pod in pods:
        key = f"default/{pod['metadata']['name']}"
        if result.assignments.get(key) != node.name:
            continue
        verdict = fits(pod, info)
        if not verdict.ok:
            failures.append(f"{key}: {verdict.reasons}")
        info.add_pod(pod)
    return failures


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cluster_states())
def test_every_plan_is_legal_keeps_used_instances_and_its_pods_fit(
        state: tuple[list[NodeInput], list[dict[str, Any]]]) -> None:
    nodes, pods = state
    result = plan(nodes, pods, time_limit=60.0)  # a budget no busy machine runs out of: the plan is deterministic
    assert len(result.assignments) + len(result.unschedulable) == len(pods)
    for node in nodes:
        for gpu_in, gpu_out in zip(node.gpus, result.nodes[node.name].gpus, strict=True):
            assert gpu_in.model is not None
            assert layout_errors(gpu_in.model, list(gpu_out.instances)) == []
            for inst in gpu_in.instances:
                if inst.used:
                    assert PlacedInstance(inst.profile_id, inst.start) in gpu_out.instances
        assert recount_fits(node, result, pods) == []
    again = plan(nodes, pods, time_limit=60.0)
    assert again.nodes == result.nodes and again.assignments == result.assignments


@st.composite
def mps_states(draw: st.DrawFn) -> tuple[list[NodeInput], list[dict[str, Any]]]:
    model = get_model("A100-SXM4-80GB")
    gpus = []
    for index in range(draw(st.integers(1, 3))):
        sizes = draw(st.lists(st.sampled_from([5, 10, 20, 40]), max_size=6))
        kept, total = [], 0
        for gb in sizes:
            if total + gb <= 80:
                kept.append(MpsSlice(gb, draw(st.booleans())))
                total += gb
        gpus.append(GpuInput(index, model.key, model, slices=tuple(kept)))
    node = NodeInput("m", "mps", {"metadata": {"name": "m", "labels": {}}}, tuple(gpus))
    pods = [{"metadata": {"name": f"pod-{k}", "namespace": "default"},
             "spec": {"containers": [{"name": "c", "resources": {"limits": {
                 f"nvidia.com/gpu-{draw(st.sampled_from([5, 10, 20, 40, 90]))}gb": "1"}}}]}}
            for k in range(draw(st.integers(0, 8)))]
    return [node], pods


@settings(max_examples=40, deadline=None)
@given(mps_states())
def test_every_mps_plan_fits_memory_keeps_used_slices_and_its_pods_fit(
        state: tuple[list[NodeInput], list[dict[str, Any]]]) -> None:
    nodes, pods = state
    node = nodes[0]
    result = plan(nodes, pods)
    allocatable: Counter[str] = Counter({"pods": 110})
    for gpu_in, gpu_out in zip(node.gpus, result.nodes["m"].gpus, strict=True):
        assert sum(gpu_out.slices) <= 80
        assert not Counter(s.size_gb for s in gpu_in.slices if s.used) - Counter(gpu_out.slices)
        allocatable.update(f"nvidia.com/gpu-{gb}gb" for gb in gpu_out.slices)
        allocatable.subtract(f"nvidia.com/gpu-{s.size_gb}gb" for s in gpu_in.slices if s.used)
    status = {"allocatable": {k: str(v) for k, v in allocatable.items()}}
    info = node_info({"metadata": {"name": "m"}, "status": status})
    for pod in pods:
        if result.assignments.get(f"default/{pod['metadata']['name']}") == "m":
            assert fits(pod, info).ok
            info.add_pod(pod)
    too_big = {f"default/{p['metadata']['name']}" for p in pods if "gpu-90gb" in str(p["spec"])}
    assert result.impossible == too_big  # no 80 GB GPU holds a 90 GB slice, whatever the layout


def test_cpu_and_pod_count_limit_what_a_recut_can_place(mig_node: Callable[..., NodeInput]) -> None:
    base = mig_node("n", [(A100, [])])
    node = NodeInput("n", "mig", {"metadata": {"name": "n", "labels": {}},
                                  "status": {"allocatable": {"cpu": "4", "memory": "64Gi", "pods": "10"}}},
                     base.gpus)
    pods = [{"metadata": {"name": f"p{i}", "namespace": "default"},
             "spec": {"containers": [{"name": "c", "resources": {
                 "requests": {"cpu": "3"}, "limits": {"nvidia.com/mig-1g.10gb": "1"}}}]}} for i in range(3)]
    result = plan([node], pods)
    assert len(result.assignments) == 1  # GPU room for all three, cpu for one
    assert result.nodes["n"].gpus[0].created == 1  # and only the instance that pod needs is created
    assert plan_violations([node], pods, result) == []


def test_planner_objects_own_their_caches_and_agree_with_one_shot_plans(
        mig_node: Callable[..., NodeInput], make_pod: Callable[..., dict[str, Any]]) -> None:
    """What a planner remembers between plans is its own: a second Planner starts empty, a planner that
    re-plans reuses what it computed, and the plan is the same as a fresh one-shot plan's."""
    import ast
    import inspect

    from kubegpu.partitioner import planner as package
    from kubegpu.partitioner.planner import Planner

    node = mig_node("n1", [(A100, [("1g.10gb", s, s < 2) for s in range(7)])] * 2)
    pods = [make_pod(f"p{k}", {"nvidia.com/mig-3g.40gb": 1}) for k in range(2)]
    first, second = Planner(), Planner()
    result = first.plan([node], pods)
    assert first.layouts._options and not second.layouts._options  # nothing shared between two planners
    remembered = dict(first.layouts._options)
    again = first.plan([node], pods)
    assert first.layouts._options == remembered  # the second plan reused every class's options
    one_shot = plan([node], pods)
    for other in (again, one_shot):
        assert other.assignments == result.assignments and other.nodes == result.nodes
    for module in (package, package.model, package.pods, package.gpus, package.greedy, package.layouts,
                   package.exact, package.solver, package.disagg):
        tree = ast.parse(inspect.getsource(module))
        assert not any(isinstance(n, ast.Global) for n in ast.walk(tree)), module.__name__
        memoised = [n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) for d in n.decorator_list
                    if ast.unparse(d).split("(")[0].rsplit(".", 1)[-1] in ("lru_cache", "cache")]
        assert not memoised, f"{module.__name__}: process-wide memo on {memoised}"
