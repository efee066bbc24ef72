"""The `+guard` modifier: the GPU-memory guard's own decisions in the simulator, and the one modifier parser."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from kubegpu.errors import ConfigError
from kubegpu.sim.engine import Simulation
from kubegpu.sim.metrics import StrategyResult
from kubegpu.sim.runner import run_scenario
from kubegpu.sim.scenario import default_scenario
from kubegpu.sim.strategies import StaticMig, get_strategy, split_spec
from kubegpu.sim.workload import Job
from tests.sim.helpers import job, tiny_scenario


def simulate(spec: str, jobs: Sequence[Job]) -> StrategyResult:
    return Simulation(tiny_scenario(), get_strategy(spec), jobs).run()


def test_modifiers_are_parsed_in_one_place() -> None:
    assert split_spec("time-slicing:4+guard") == ("time-slicing", "4", ["guard"])
    assert split_spec("static-mig:all-balanced@a100+l40s") == ("static-mig", "all-balanced@a100+l40s", [])
    guarded = get_strategy("time-slicing:4+guard")
    assert guarded.name == "time-slicing:4+guard" and guarded.guard is not None  # type: ignore[attr-defined]
    assert get_strategy("mps:2+guard").name == "mps:2+guard"
    static = get_strategy("static-mig:all-balanced@a100+l40s")
    assert isinstance(static, StaticMig) and static.groups == frozenset({"a100", "l40s"})
    with pytest.raises(ConfigError, match=r"unknown modifier '\+nope'; available: \+guard"):
        get_strategy("time-slicing:4+nope")
    for unshared in ("exclusive+guard", "static-mig:all-balanced+guard"):
        with pytest.raises(ConfigError, match=r"\+guard: the GPU-memory guard protects pods sharing"):
            get_strategy(unshared)


def test_a_neighbour_within_its_share_is_oom_killed_without_the_guard_and_safe_with_it() -> None:
    # a 50 GiB pod on a quarter of an 80 GiB GPU (20 GiB share), then pods within their share: the third of them
    # makes the driver fail the newest allocation — an innocent pod
    jobs = [job("big-1", memory=50, compute=0.2), job("small-1", arrival=60, memory=10, compute=0.2),
            job("small-2", arrival=120, memory=15, compute=0.2), job("small-3", arrival=180, memory=12, compute=0.2)]
    plain = simulate("time-slicing:4", jobs)
    assert plain.oom_kills == 1 and plain.innocent_oom_kills == 1 and plain.guard_actions == 0
    assert plain.classes["small"].oom_kills == 1
    guarded = simulate("time-slicing:4+guard", jobs)
    assert guarded.oom_kills == 0 and guarded.innocent_oom_kills == 0
    assert guarded.guard_actions == 1  # the pod over its share, and only it
    assert guarded.classes["small"].completed == 3 and guarded.classes["big"].completed == 0


def test_with_grace_a_pod_over_its_share_on_a_quiet_gpu_is_left_alone() -> None:
    result = simulate("time-slicing:4+guard", [job("big-1", memory=50, compute=0.2),
                                               job("small-1", arrival=60, memory=10, compute=0.2)])
    assert result.guard_actions == 0 and result.oom_kills == 0 and result.pods_completed == 2


def test_mps_limits_are_enforced_so_the_guard_changes_nothing() -> None:
    jobs = [job("big-1", memory=30, compute=0.2), job("small-1", arrival=60, memory=10, compute=0.2)]
    plain, guarded = simulate("mps:4", jobs), simulate("mps:4+guard", jobs)
    assert plain.oom_kills == guarded.oom_kills == 1 and plain.innocent_oom_kills == guarded.innocent_oom_kills == 0
    assert guarded.guard_actions == 0


@pytest.mark.slow
def test_default_scenario_time_slicing_with_the_guard_has_no_innocent_oom_kills() -> None:
    report = run_scenario(default_scenario(), ["time-slicing:4", "time-slicing:4+guard"])
    plain, guarded = report.results
    assert plain.oom_kills > 0
    assert guarded.innocent_oom_kills == 0 and guarded.oom_kills == 0
    assert guarded.guard_actions > 0


def test_a_shared_claim_divides_the_gpu_among_the_pods_sharing_it_now() -> None:
    # dra-shared:4: two pods share the claim, so each may use 40 GiB; a third joins and the share drops to 26.6 GiB
    jobs = [job("big-1", memory=35, compute=0.2), job("small-1", arrival=60, memory=10, compute=0.2)]
    assert simulate("dra-shared:4+guard", jobs).guard_actions == 0  # 35 GiB is within half a GPU
    crowded = [*jobs, job("small-2", arrival=120, memory=20, compute=0.2), job("small-3", arrival=180, memory=16,
                                                                                compute=0.2)]
    plain = simulate("dra-shared:4", crowded)
    assert plain.oom_kills == 1 and plain.innocent_oom_kills == 1  # the newest, within its 20 GiB, dies
    guarded = simulate("dra-shared:4+guard", crowded)
    assert guarded.oom_kills == 0 and guarded.guard_actions == 1
    assert guarded.classes["small"].completed == 3
