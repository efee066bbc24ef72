from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kubegpu.errors import ConfigError
from kubegpu.scheduling import (
    SCORERS,
    fits,
    node_info,
    pod_requirements,
    score_least_allocated,
    score_most_allocated,
    select_node,
)


def node(name: str, cpu: str = "10", memory: str = "10Gi", gpus: int = 0) -> dict[str, Any]:
    allocatable = {"cpu": cpu, "memory": memory, "pods": "110"}
    if gpus:
        allocatable["nvidia.com/gpu"] = str(gpus)
    return {"metadata": {"name": name, "labels": {}}, "spec": {}, "status": {"allocatable": allocatable}}


def pod(name: str = "p", cpu: str = "0", memory: str = "0", gpus: int = 0) -> dict[str, Any]:
    resources: dict[str, Any] = {"requests": {"cpu": cpu, "memory": memory}}
    if gpus:
        resources["limits"] = {"nvidia.com/gpu": gpus}
    containers = [{"name": "c", "resources": resources}]
    return {"metadata": {"name": name, "namespace": "d"}, "spec": {"containers": containers}}


@pytest.mark.parametrize(
    ("cpu", "memory", "least", "most"),
    [
        ("0", "0", 100.0, 0.0),
        ("5", "5Gi", 50.0, 50.0),
        ("10", "10Gi", 0.0, 100.0),
        ("2", "8Gi", 50.0, 50.0),  # (80 + 20) / 2 and (20 + 80) / 2
        ("1", "0", 95.0, 5.0),
    ],
)
def test_scores_average_cpu_and_memory(cpu: str, memory: str, least: float, most: float) -> None:
    info = node_info(node("n"))
    assert score_least_allocated(pod(cpu=cpu, memory=memory), info) == pytest.approx(least)
    assert score_most_allocated(pod(cpu=cpu, memory=memory), info) == pytest.approx(most)


def test_existing_requests_count_in_scores() -> None:
    info = node_info(node("n"), [pod("e", cpu="4", memory="4Gi")])
    assert score_least_allocated(pod(cpu="1", memory="1Gi"), info) == pytest.approx(50.0)
    assert score_most_allocated(pod(cpu="1", memory="1Gi"), info) == pytest.approx(50.0)


def test_requested_extended_resource_is_scored_with_equal_weight() -> None:
    info = node_info(node("n", gpus=8))
    # cpu 100, memory 100, gpu (8-2)/8*100 = 75 → 275 / 3
    assert score_least_allocated(pod(gpus=2), info) == pytest.approx(275 / 3)
    assert score_most_allocated(pod(gpus=2), info) == pytest.approx(25 / 3)


def test_overcommitted_resource_scores_zero_least_and_full_most() -> None:
    info = node_info(node("n", cpu="1"))
    assert score_least_allocated(pod(cpu="2"), info) == pytest.approx(50.0)  # cpu 0, memory 100
    assert score_most_allocated(pod(cpu="2"), info) == pytest.approx(50.0)  # cpu capped at 100, memory 0


def test_select_node_spreads_or_packs_gpu_pods() -> None:
    busy = node_info(node("busy", gpus=8), [pod("e", gpus=4)])
    idle = node_info(node("idle", gpus=8))
    assert select_node(pod(gpus=2), [busy, idle], "least-allocated") is idle
    assert select_node(pod(gpus=2), [busy, idle], "most-allocated") is busy


def test_select_node_skips_nodes_that_do_not_fit() -> None:
    full = node_info(node("full", gpus=8), [pod("e", gpus=8)])
    small = node_info(node("small", gpus=1))
    assert select_node(pod(gpus=2), [full, small]) is None
    assert select_node(pod_requirements(pod(gpus=1)), [full, small], "most-allocated") is small


def test_select_node_breaks_ties_by_order() -> None:
    first, second = node_info(node("a")), node_info(node("b"))
    assert select_node(pod(cpu="1"), [first, second]) is first
    assert select_node(pod(cpu="1"), [second, first]) is second


def test_unknown_policy_names_it() -> None:
    with pytest.raises(ConfigError, match="scoring policy 'spread'"):
        select_node(pod(), [], "spread")


AMOUNTS = st.integers(min_value=0, max_value=8)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(AMOUNTS, AMOUNTS), min_size=1, max_size=5),
       st.lists(st.tuples(AMOUNTS, AMOUNTS), max_size=12), st.sampled_from(sorted(SCORERS)))
def test_select_node_places_only_where_pods_fit_and_accounting_returns_to_zero(
    nodes: list[tuple[int, int]], pods: list[tuple[int, int]], policy: str
) -> None:
    infos = [node_info(node(f"n{index}", cpu=str(cpu), gpus=gpus)) for index, (cpu, gpus) in enumerate(nodes)]
    placed = []
    for index, (cpu, gpus) in enumerate(pods):
        candidate = pod(f"p{index}", cpu=str(cpu), gpus=gpus)
        chosen = select_node(candidate, infos, policy)
        if chosen is None:
            assert not any(fits(candidate, info).ok for info in infos)
            continue
        assert fits(candidate, chosen).ok
        chosen.add_pod(candidate)
        placed.append((candidate, chosen))
        assert chosen.requested.get("nvidia.com/gpu", 0) <= chosen.allocatable.get("nvidia.com/gpu", 0)
    for candidate, chosen in placed:
        chosen.remove_pod(candidate)
    assert all(value == 0 for info in infos for value in info.requested.values())
