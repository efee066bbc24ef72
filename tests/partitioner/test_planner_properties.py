"""Properties of both planners on generated clusters (hypothesis): every plan is legal for its GPU model, never
touches an instance or slice in use, every pod it calls schedulable fits the layout it produced, and the exact
planner is at least as good as the greedy on every state (and proves it optimal on these small ones)."""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kubegpu.gpu.catalog import GpuModel, get_model
from kubegpu.gpu.geometry import PlacedInstance, layout_errors
from kubegpu.partitioner.planner import CurrentInstance, GpuInput, MpsSlice, NodeInput, plan, plan_violations
from kubegpu.partitioner.planner.disagg import plan_objective
from kubegpu.partitioner.planner.greedy import prepare

MIG_MODELS = ["A100-SXM4-80GB", "H100-SXM5-80GB", "A30-24GB", "B200-180GB"]
MPS_SIZES = [5, 10, 20, 40]


@st.composite
def mig_gpu(draw: st.DrawFn, model: GpuModel, index: int) -> GpuInput:
    placements = [(p.profile_id, s) for p in model.mig_profiles for s in p.starts]
    layout: list[PlacedInstance] = []
    for k in draw(st.lists(st.integers(0, len(placements) - 1), max_size=8)):
        trial = [*layout, PlacedInstance(*placements[k])]
        if not layout_errors(model, trial):
            layout = trial
    used = draw(st.lists(st.booleans(), min_size=len(layout), max_size=len(layout)))
    return GpuInput(index, model.key, model, tuple(CurrentInstance(i.profile_id, i.start, u)
                                                   for i, u in zip(layout, used, strict=True)))


@st.composite
def mps_gpu(draw: st.DrawFn, model: GpuModel, index: int) -> GpuInput:
    slices: list[MpsSlice] = []
    for size in draw(st.lists(st.sampled_from(MPS_SIZES), max_size=4)):
        if sum(s.size_gb for s in slices) + size <= model.memory_mib // 1024:
            slices.append(MpsSlice(size, draw(st.booleans())))
    return GpuInput(index, model.key, model, slices=tuple(slices))


@st.composite
def cluster(draw: st.DrawFn) -> tuple[list[NodeInput], list[dict[str, Any]]]:
    nodes: list[NodeInput] = []
    resources: set[str] = set()
    for k in range(draw(st.integers(1, 3))):
        model = get_model(draw(st.sampled_from(MIG_MODELS)))
        mode = draw(st.sampled_from(["mig", "mig", "mps"]))
        count = draw(st.integers(1, 3))
        make = mps_gpu if mode == "mps" else mig_gpu
        gpus = tuple(draw(make(model, i)) for i in range(count))
        taints = [{"key": "dedicated", "value": "x", "effect": "NoSchedule"}] if draw(st.booleans()) else []
        node = {"metadata": {"name": f"n{k}", "labels": {"pool": draw(st.sampled_from("ab"))}},
                "spec": {"taints": taints}, "status": {}}
        nodes.append(NodeInput(f"n{k}", "mps" if mode == "mps" else "mig", node, gpus))
        if mode == "mps":
            resources.update(f"nvidia.com/gpu-{gb}gb" for gb in MPS_SIZES)
        else:
            resources.update(f"nvidia.com/{p.resource_name}" for p in model.mig_profiles)
    pods = []
    for k in range(draw(st.integers(0, 10))):
        resource = draw(st.sampled_from(sorted(resources)))
        spec: dict[str, Any] = {
            "priority": draw(st.sampled_from([0, 0, 1, 2])),
            "nodeSelector": {"pool": draw(st.sampled_from("ab"))} if draw(st.booleans()) else {},
            "tolerations": [{"key": "dedicated", "operator": "Exists"}] if draw(st.booleans()) else [],
            "containers": [{"name": "c", "resources": {"limits": {resource: str(draw(st.sampled_from([1, 1, 2])))}}}],
        }
        pods.append({"metadata": {"name": f"p{k}", "namespace": "default"}, "spec": spec})
    return nodes, pods


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cluster())
def test_plans_are_legal_and_exact_is_never_worse_than_greedy(
        state: tuple[list[NodeInput], list[dict[str, Any]]]) -> None:
    nodes, pods = state
    exact = plan(nodes, pods, time_limit=30)
    greedy = plan(nodes, pods, planner="greedy")
    assert plan_violations(nodes, pods, exact) == []
    assert plan_violations(nodes, pods, greedy) == []
    problem = prepare(nodes, pods)
    assert plan_objective(problem, exact) <= plan_objective(problem, greedy)
    assert exact.optimal
    assert exact.bound == exact.score
    for node in nodes:  # every layout legal for its own model (plan_violations checks in-use instances too)
        for gpu, gpu_plan in zip(node.gpus, exact.nodes[node.name].gpus, strict=True):
            assert gpu_plan.index == gpu.index
            if node.mode == "mig" and gpu.model is not None:
                assert layout_errors(gpu.model, list(gpu_plan.instances)) == []
    if not problem.candidates:
        assert exact.created == exact.destroyed == 0
