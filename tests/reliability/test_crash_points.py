"""The autoscaler killed at every write of a consolidation and of a termination, on the kwok provider and on the
AWS provider against moto (behind EC2's post-launch NotFound): once a new leader's passes have run, no orphan taint,
no stuck NodeClaim, no leaked instance, no pod lost (`crashes.World.problems`).

Each scenario is run once without a crash to count its writes; then once per write, the process dying right after
that write landed, and a fresh replica (fresh provider, fresh informers, nothing in memory) taking over the Lease.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from kubegpu.clock import VirtualClock
from tests.autoscaler.builders import instance_type, nodepool, pod
from tests.reliability.crashes import Crash, World, kwok_instances, kwok_provider

TYPES = [instance_type("small", 2, 8, 0.10), instance_type("medium", 4, 16, 0.20),
         instance_type("large", 8, 32, 0.40)]
SETTLE_S = 400.0
MIN_POINTS = 15   # each scenario makes at least this many writes (so the loop over them is no formality)
ANTI = {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
    {"topologyKey": "kubernetes.io/hostname", "labelSelector": {"matchLabels": {"app": "web"}}}]}}


@dataclass
class Profile:
    """What differs between providers: the NodePool, the pod that needs the big node, the cheaper type."""

    pool: Callable[[dict[str, Any]], dict[str, Any]]
    big: dict[str, Any]
    cheaper: str
    world: Callable[[], World]
    instances: Callable[[World], set[str]]
    doomed: list[str] = field(default_factory=list)


def consolidation_setup(world: World, profile: Profile) -> None:
    world.store.create(profile.pool({}))
    world.store.create(profile.big)
    world.add_replicated(pod("small", cpu="500m"))
    assert world.run_until(lambda: len(world.store.list("Node")) == 1 and _running(world) == 2, 60)


def consolidation_act(world: World, profile: Profile) -> None:
    world.finish("big")


def consolidation_goal(world: World, profile: Profile) -> bool:
    """The big node replaced by a cheaper one that runs the small pod."""
    nodes = world.store.list("Node")
    return len(nodes) == 1 and nodes[0]["metadata"]["labels"]["node.kubernetes.io/instance-type"] == \
        profile.cheaper and _running(world) == 1 and len(world.store.list("NodeClaim")) == 1


def termination_setup(world: World, profile: Profile) -> None:
    world.store.create(profile.pool({"consolidateAfter": "Never"}))
    world.store.create({"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
                        "metadata": {"name": "web", "namespace": "default"},
                        "spec": {"maxUnavailable": 1, "selector": {"matchLabels": {"app": "web"}}}})
    for i in range(3):
        world.add_replicated(pod(f"web{i}", cpu="1", metadata={"labels": {"app": "web"}}, spec={"affinity": ANTI}))
    assert world.run_until(lambda: _running(world) == 3, 60)
    profile.doomed = sorted(c["metadata"]["name"] for c in world.store.list("NodeClaim"))[:2]


def termination_act(world: World, profile: Profile) -> None:
    for name in profile.doomed:
        world.store.delete("NodeClaim", name)   # a user deletes two NodeClaims at once


def termination_goal(world: World, profile: Profile) -> bool:
    """Both deleted claims gone, the three pods running again on three nodes."""
    names = {c["metadata"]["name"] for c in world.store.list("NodeClaim")}
    pods = [p for p in world.store.list("Pod") if p["status"].get("phase") == "Running"]
    return not names & set(profile.doomed) and len(names) == 3 and len(pods) == 3 \
        and len({p["spec"]["nodeName"] for p in pods}) == 3


def _running(world: World) -> int:
    return sum(1 for p in world.store.list("Pod") if p["status"].get("phase") == "Running")


Step = Callable[[World, Profile], Any]
SCENARIOS: dict[str, tuple[Step, Step, Step]] = {
    "consolidation": (consolidation_setup, consolidation_act, consolidation_goal),
    "termination": (termination_setup, termination_act, termination_goal),
}


def kwok_profile() -> Profile:
    return Profile(lambda disruption: nodepool("cpu", disruption=disruption), pod("big", cpu="6"), "small",
                   lambda: World(kwok_provider(TYPES)), kwok_instances)


def aws_profile(account: Any) -> Profile:
    from tests.autoscaler.aws.test_provider import GPU_NAME, ON_DEMAND
    from tests.reliability.crash_aws import AwsCloud

    def pool(disruption: dict[str, Any]) -> dict[str, Any]:
        manifest = nodepool("gpu", [GPU_NAME, ON_DEMAND], disruption=disruption)
        manifest["spec"]["template"]["spec"]["nodeClassRef"] = {"group": "kubegpu.io", "kind": "EC2NodeClass",
                                                                "name": "gpu"}
        return manifest

    clouds: list[AwsCloud] = []

    def world() -> World:
        clock = VirtualClock(time.time())
        cloud = AwsCloud(account, clock)
        cloud.clear()   # the account is built once: what earlier runs launched goes first
        clouds[:] = [cloud]
        return World(cloud.provider, clock, kubelet=cloud.kubelet, make_upkeep=cloud.upkeep)

    return Profile(pool, pod("big", cpu="6", limits={"nvidia.com/gpu": "1"}), "g5.xlarge", world,
                   lambda w: clouds[0].instances(w))


@pytest.fixture(scope="module")
def moto_account() -> Iterator[Any]:
    """One moto server and account for the module (building one costs seconds; each run clears its instances)."""
    from tests.autoscaler.aws.moto_env import build_account, clients, moto_server, reset

    with moto_server() as url:
        reset(url)
        yield build_account(clients())


PROVIDERS = ["kwok", pytest.param("aws", marks=[pytest.mark.slow, pytest.mark.integration])]


def run(scenario: str, profile: Profile, crash_at: int | None) -> tuple[World, str | None]:
    """The scenario, the process dying after write `crash_at` (None: never); the write it died after."""
    setup, act, goal = SCENARIOS[scenario]
    world = profile.world()
    setup(world, profile)
    world.writes.arm(crash_at)
    act(world, profile)

    def settled() -> bool:
        return bool(goal(world, profile)) and not world.problems(profile.instances)

    died = None
    try:
        world.run_until(settled, SETTLE_S)
    except Crash as crash:
        died = str(crash)
        world.restart()
        world.run_until(settled, SETTLE_S)
    return world, died


@pytest.mark.timeout(900)
@pytest.mark.parametrize("provider", PROVIDERS)
@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_a_new_leader_leaves_nothing_behind_whichever_write_the_old_one_died_after(
        scenario: str, provider: str, request: pytest.FixtureRequest) -> None:
    """One run per write of the uninterrupted scenario (counted first, so every write is a crash point)."""
    profile = kwok_profile() if provider == "kwok" else aws_profile(request.getfixturevalue("moto_account"))
    world, died = run(scenario, profile, None)
    assert died is None and world.problems(profile.instances) == [] and SCENARIOS[scenario][2](world, profile)
    points = len(world.writes.log)
    assert points >= MIN_POINTS, world.writes.log
    failed = []
    for crash_at in range(1, points + 1):
        world, died = run(scenario, profile, crash_at)
        assert died is not None
        wrong = world.problems(profile.instances)
        if not SCENARIOS[scenario][2](world, profile):
            wrong.append("goal not reached")
        if wrong:
            failed.append((crash_at, died, wrong, world.lines[-12:]))
    for each in failed:
        print(*each, sep="\n  ")
    assert failed == []
