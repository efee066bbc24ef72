"""The autoscaler killed at every write of a consolidation and of a termination: once a new leader's passes have
run, no orphan taint, no stuck NodeClaim, no leaked instance, no pod lost (`crashes.World.problems`).

Each scenario is run once without a crash to count its writes; then once per write, the process dying right after
that write landed, and a fresh replica (fresh provider, fresh informers, nothing in memory) taking over the Lease.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

from tests.autoscaler.builders import instance_type, nodepool, pod
from tests.reliability.crashes import Crash, World, kwok_instances, kwok_provider

TYPES = [instance_type("small", 2, 8, 0.10), instance_type("medium", 4, 16, 0.20),
         instance_type("large", 8, 32, 0.40)]
SETTLE_S = 400.0
ANTI = {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
    {"topologyKey": "kubernetes.io/hostname", "labelSelector": {"matchLabels": {"app": "web"}}}]}}


@dataclass(frozen=True)
class Scenario:
    name: str
    setup: Callable[[World], None]      # the cluster before the act (no crash while it is built)
    act: Callable[[World], None]        # what sets the autoscaler going (the user's part)
    goal: Callable[[World], bool]       # what the autoscaler must reach


def consolidation_setup(world: World) -> None:
    world.store.create(nodepool("cpu"))
    world.store.create(pod("big", cpu="6"))
    world.add_replicated(pod("small", cpu="500m"))
    assert world.run_until(lambda: len(world.store.list("Node")) == 1 and _running(world) == 2, 60)


def consolidation_goal(world: World) -> bool:
    """The large node replaced by a small one that runs the small pod."""
    nodes = world.store.list("Node")
    return len(nodes) == 1 and nodes[0]["metadata"]["labels"]["node.kubernetes.io/instance-type"] == "small" \
        and _running(world) == 1 and len(world.store.list("NodeClaim")) == 1


def termination_setup(world: World) -> None:
    world.store.create(nodepool("cpu", disruption={"consolidateAfter": "Never"}))
    world.store.create({"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
                        "metadata": {"name": "web", "namespace": "default"},
                        "spec": {"maxUnavailable": 1, "selector": {"matchLabels": {"app": "web"}}}})
    for i in range(3):
        world.add_replicated(pod(f"web{i}", cpu="1", metadata={"labels": {"app": "web"}}, spec={"affinity": ANTI}))
    assert world.run_until(lambda: _running(world) == 3, 60)
    world.doomed = sorted(c["metadata"]["name"] for c in world.store.list("NodeClaim"))[:2]  # type: ignore[attr-defined]


def termination_act(world: World) -> None:
    for name in world.doomed:  # type: ignore[attr-defined]
        world.store.delete("NodeClaim", name)   # a user deletes two NodeClaims at once


def termination_goal(world: World) -> bool:
    """Both deleted claims gone, the three pods running again on three nodes."""
    names = {c["metadata"]["name"] for c in world.store.list("NodeClaim")}
    pods = [p for p in world.store.list("Pod") if p["status"].get("phase") == "Running"]
    return not names & set(world.doomed) and len(names) == 3 and len(pods) == 3 \
        and len({p["spec"]["nodeName"] for p in pods}) == 3  # type: ignore[attr-defined]


def _running(world: World) -> int:
    return sum(1 for p in world.store.list("Pod") if p["status"].get("phase") == "Running")


SCENARIOS = {
    "consolidation": Scenario("consolidation", consolidation_setup, lambda w: w.finish("big"), consolidation_goal),
    "termination": Scenario("termination", termination_setup, termination_act, termination_goal),
}
PROVIDERS: dict[str, tuple[Callable[[Any, Any], Any], Callable[[World], set[str]]]] = {
    "kwok": (kwok_provider(TYPES), kwok_instances),
}


def run(scenario: Scenario, provider: str, crash_at: int | None) -> tuple[World, str | None]:
    """The scenario, the process dying after write `crash_at` (None: never); the write it died after."""
    make, _ = PROVIDERS[provider]
    world = World(make)
    scenario.setup(world)
    world.writes.arm(crash_at)
    scenario.act(world)
    _, instances = PROVIDERS[provider]

    def settled() -> bool:
        return scenario.goal(world) and not world.problems(instances)

    died = None
    try:
        world.run_until(settled, SETTLE_S)
    except Crash as crash:
        died = str(crash)
        world.restart()
        world.run_until(settled, SETTLE_S)
    return world, died


def written(scenario: str, provider: str) -> list[str]:
    world, died = run(SCENARIOS[scenario], provider, None)
    _, instances = PROVIDERS[provider]
    assert died is None and SCENARIOS[scenario].goal(world) and world.problems(instances) == []
    return world.writes.log


MIN_POINTS = 15   # each scenario makes at least this many writes (so the loop below is no formality)


@pytest.mark.parametrize(("scenario", "provider"), [(s, p) for s in SCENARIOS for p in PROVIDERS])
def test_a_new_leader_leaves_nothing_behind_whichever_write_the_old_one_died_after(scenario: str,
                                                                                   provider: str) -> None:
    """One run per write of the uninterrupted scenario (counted first, so every write is a crash point)."""
    points = len(written(scenario, provider))
    assert points >= MIN_POINTS
    _, instances = PROVIDERS[provider]
    failed = []
    for crash_at in range(1, points + 1):
        world, died = run(SCENARIOS[scenario], provider, crash_at)
        assert died is not None
        wrong = world.problems(instances) + ([] if SCENARIOS[scenario].goal(world) else ["goal not reached"])
        if wrong:
            failed.append((crash_at, died, wrong, world.lines[-12:]))
    for each in failed:
        print(*each, sep="\n  ")
    assert failed == []
