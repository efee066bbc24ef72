"""The "best static layout" baseline of benchmarks/partitioner_quality.py, on cases whose answer is worked out by
hand, then against the benchmark's exact optimum on generated states."""

from __future__ import annotations

import random
from collections.abc import Callable
from types import ModuleType
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from kubegpu.gpu.catalog import get_model
from kubegpu.gpu.geometry import PlacedInstance, layout_errors
from kubegpu.partitioner.baselines import best_static_layout, static_gpu_layout, static_layouts
from kubegpu.partitioner.planner import NodeInput, plan

A100 = "A100-SXM4-80GB"

MakePod = Callable[..., dict[str, Any]]
MigNode = Callable[..., NodeInput]


def test_layouts_are_migparted_defaults_without_media_extensions() -> None:
    a30 = get_model("A30-24GB")
    layouts = static_layouts(a30)
    assert list(layouts) == ["all-1g.6gb", "all-2g.12gb", "all-4g.24gb", "all-balanced"]
    assert layouts["all-1g.6gb"] == (a30.profile("1g.6gb").profile_id,) * 4
    assert sorted(layouts["all-balanced"]) == sorted([a30.profile("1g.6gb").profile_id] * 2
                                                     + [a30.profile("2g.12gb").profile_id])


def test_in_use_instance_stays_and_static_instances_fill_around_it() -> None:
    a100 = get_model(A100)
    in_use = [PlacedInstance(a100.profile("4g.40gb").profile_id, 0)]
    layout = static_gpu_layout(a100, static_layouts(a100)["all-1g.10gb"], in_use)
    one_g = a100.profile("1g.10gb").profile_id
    assert layout == (in_use[0], *(PlacedInstance(one_g, s) for s in (4, 5, 6)))
    assert not layout_errors(a100, list(layout))


def test_colliding_instance_is_re_placed_where_it_still_fits() -> None:
    a100 = get_model(A100)
    three_g = a100.profile("3g.40gb").profile_id
    in_use = [PlacedInstance(a100.profile("1g.10gb").profile_id, 4)]  # the 3g@4 of all-3g.40gb collides
    layout = static_gpu_layout(a100, static_layouts(a100)["all-3g.40gb"], in_use)
    assert layout == (in_use[0], PlacedInstance(three_g, 0))


def test_static_layout_below_optimum_where_only_a_re_cut_serves_everyone(
        make_pod: MakePod, mig_node: MigNode) -> None:
    # An empty A100: 3g@4 plus four 1g at 0-3 serves all five pods (the optimum, and our plan); no default layout
    # does: all-1g.10gb serves the four 1g pods, all-balanced only the 3g and two 1g.
    nodes = [mig_node("n1", [(A100, [])])]
    pods = [make_pod("big", {"nvidia.com/mig-3g.40gb": 1})]
    pods += [make_pod(f"small-{i}", {"nvidia.com/mig-1g.10gb": 1}) for i in range(4)]
    baseline = best_static_layout(nodes, pods)
    assert baseline.layouts == {A100: "all-1g.10gb"}
    assert sorted(baseline.assignments) == [f"default/small-{i}" for i in range(4)]
    assert len(plan(nodes, pods).assignments) == 5 > len(baseline.assignments)


def test_static_layout_matches_optimum_when_a_default_layout_is_ideal(make_pod: MakePod, mig_node: MigNode) -> None:
    # 4g in use at 0: slots 4-7 are left. Three 1g pods fit only as 1g@4,5,6 (all-1g.10gb): 3 = optimum = ours.
    nodes = [mig_node("n1", [(A100, [("4g.40gb", 0, True)])])]
    pods = [make_pod(f"small-{i}", {"nvidia.com/mig-1g.10gb": 1}) for i in range(3)]
    baseline = best_static_layout(nodes, pods)
    assert baseline.layouts == {A100: "all-1g.10gb"}
    assert len(baseline.assignments) == 3 == len(plan(nodes, pods).assignments)


def test_higher_priority_decides_the_layout(make_pod: MakePod, mig_node: MigNode) -> None:
    # Same GPU: all-1g.10gb would serve the three 1g pods, but all-2g.20gb serves the one priority-1 pod.
    nodes = [mig_node("n1", [(A100, [("4g.40gb", 0, True)])])]
    pods = [make_pod("urgent", {"nvidia.com/mig-2g.20gb": 1}, priority=1)]
    pods += [make_pod(f"small-{i}", {"nvidia.com/mig-1g.10gb": 1}) for i in range(3)]
    baseline = best_static_layout(nodes, pods)
    assert baseline.layouts == {A100: "all-2g.20gb"}
    assert baseline.assignments == {"default/urgent": "n1"}
    ours = plan(nodes, pods).assignments  # 2g@4 and 1g@6: the urgent pod and one more
    assert "default/urgent" in ours and len(ours) == 2


def test_pods_with_fewer_eligible_nodes_are_matched_first(make_pod: MakePod, mig_node: MigNode) -> None:
    # Each node has room for one 1g (slot 6) beside its instances in use; the unconstrained pod sorts first by
    # name, but the pool-a pod can only go to node-a, so it takes node-a and the other pod node-b.
    busy = [("4g.40gb", 0, True), ("2g.20gb", 4, True)]
    nodes = [mig_node("node-a", [(A100, busy)], labels={"pool": "a"}), mig_node("node-b", [(A100, busy)])]
    pods = [make_pod("any", {"nvidia.com/mig-1g.10gb": 1}),
            make_pod("pinned", {"nvidia.com/mig-1g.10gb": 1}, node_selector={"pool": "a"})]
    baseline = best_static_layout(nodes, pods)
    assert baseline.assignments == {"default/pinned": "node-a", "default/any": "node-b"}


def test_mps_gpus_keep_their_free_slices(make_pod: MakePod, mps_node: Callable[..., NodeInput]) -> None:
    nodes = [mps_node("m1", [(A100, [(20, True), (20, False)])])]
    pods = [make_pod("a", {"nvidia.com/gpu-20gb": 1}), make_pod("b", {"nvidia.com/gpu-20gb": 1})]
    baseline = best_static_layout(nodes, pods)
    assert baseline.layouts == {}
    assert baseline.assignments == {"default/a": "m1"}


@settings(max_examples=12, deadline=None)
@given(seed=st.integers(0, 10_000), gpus=st.integers(1, 6))
def test_never_above_the_exact_optimum(bench: ModuleType, seed: int, gpus: int) -> None:
    case = bench.generate("case", gpus, random.Random(seed))
    score, layouts = bench.best_static(case)
    assert score <= bench.optimum(case) + 1e-9
    models = {g.model_key for n in case.nodes for g in n.gpus}
    assert set(layouts) == models
