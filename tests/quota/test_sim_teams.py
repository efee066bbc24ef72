"""Teams in the simulator: `teams:` in a scenario, plain namespace quotas by default, elastic ones with `+quota`."""

from __future__ import annotations

from pathlib import Path

import pytest

from kubegpu.errors import ConfigError
from kubegpu.scheduling import QUOTA_GATE
from kubegpu.sim.engine import Simulation
from kubegpu.sim.scenario import load_scenario, parse_scenario
from kubegpu.sim.strategies import get_strategy, split_spec
from kubegpu.sim.workload import scenario_jobs

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "scenario-teams.yaml"


def test_quota_modifier_is_parsed_with_the_others() -> None:
    assert split_spec("dynamic-mig+quota") == ("dynamic-mig", None, ["quota"])
    assert split_spec("time-slicing:4+guard+quota") == ("time-slicing", "4", ["guard", "quota"])
    assert get_strategy("time-slicing:4+guard+quota").team_admission is not None  # type: ignore[attr-defined]


def test_noisy_neighbour_waits_less_with_elastic_quotas() -> None:
    scenario = load_scenario(EXAMPLE)
    jobs = scenario_jobs(scenario, 12 * 3600)
    assert {job.namespace for job in jobs} == {"research", "product"}
    assert sum(job.namespace == "research" for job in jobs) > 2 * sum(job.namespace == "product" for job in jobs)
    plain = Simulation(scenario, get_strategy("exclusive"), jobs, duration=12 * 3600).run()
    elastic = Simulation(scenario, get_strategy("exclusive+quota"), jobs, duration=12 * 3600).run()
    assert plain.teams["research"].reclaims == 0 and elastic.teams["research"].reclaims > 0
    assert elastic.teams["product"].reclaims == 0
    assert elastic.teams["product"].pending_p50_s < plain.teams["product"].pending_p50_s / 2
    assert elastic.teams["product"].gpu_hours > plain.teams["product"].gpu_hours
    for result in (plain, elastic):  # every GPU-hour is some team's
        total = sum(t.gpu_hours for t in result.teams.values())
        assert total == pytest.approx(result.gpu_hours_allocated, rel=1e-6)


ONE_A100_NODE = {"nodeGroups": [{"name": "a", "count": 1, "gpuModel": "A100-SXM4-80GB", "gpusPerNode": 8,
                                "pricePerHour": 1.0}]}

def test_plain_quota_caps_a_team_at_its_max() -> None:
    data = {"cluster": ONE_A100_NODE,
            "workload": {"classes": [{"name": "t", "arrivalsPerHour": 30, "gpus": [1], "memoryGiB": [10, 20],
                                      "compute": [0.5, 0.6], "runtime": ["1h", "2h"]}]},
            "teams": [{"name": "capped", "min": "0", "max": "160Gi", "share": 1.0}], "duration": "4h"}
    scenario = parse_scenario(data, "inline")
    result = Simulation(scenario, get_strategy("exclusive"), scenario_jobs(scenario)).run()
    assert max(s.running for s in result.samples) == 2  # 2 x 80Gi, though 8 GPUs are there
    assert result.teams["capped"].gpu_hours <= 2 * 4 + 1e-6


def test_bad_teams_and_quota_without_teams_are_one_line_errors() -> None:
    base = {"cluster": ONE_A100_NODE,
            "workload": {"classes": [{"name": "t", "arrivalsPerHour": 1, "memoryGiB": [1, 2], "compute": [0.1, 0.2],
                                      "runtime": ["1h", "2h"]}]}}
    for teams, message in (([{"name": "a", "share": 1.5}], r"teams\[0\]\.share: must be in"),
                           ([{"name": "a", "share": 0.5, "min": "lots"}], r"teams\[0\]\.min"),
                           ([{"name": "a", "share": 0.6}, {"name": "a", "share": 0.3}], "unique"),
                           ([{"name": "a", "share": 0.6}, {"name": "b", "share": 0.6}], "more than 1")):
        with pytest.raises(ConfigError, match=message):
            parse_scenario({**base, "teams": teams}, "inline")
    with pytest.raises(ConfigError, match="quotas need the scenario's teams"):
        Simulation(parse_scenario(base, "inline"), get_strategy("exclusive+quota"), [])


@pytest.mark.parametrize("strategy", ["exclusive", "exclusive+quota"])
def test_held_pods_wait_behind_the_quota_gate_so_no_controller_acts_for_them(strategy: str) -> None:
    # a held pod is in the cluster gated, as the quota's admission policy creates it (a plain ResourceQuota refuses
    # it outright): the partitioner and the autoscaler pass over gated pods (test_elastic), so they never re-cut a
    # GPU or buy a node for a pod its team's quota holds back; a pod let through has no gate left
    data = {"cluster": ONE_A100_NODE,
            "workload": {"classes": [{"name": "t", "arrivalsPerHour": 30, "gpus": [1], "memoryGiB": [10, 20],
                                      "compute": [0.5, 0.6], "runtime": ["1h", "2h"]}]},
            "teams": [{"name": "capped", "min": "80Gi", "max": "160Gi", "share": 1.0}], "duration": "4h"}
    scenario = parse_scenario(data, "inline")
    simulation = Simulation(scenario, get_strategy(strategy), scenario_jobs(scenario))
    simulation.run()
    held = {run.name for run in simulation._teams.held.values()}
    pods = {p["metadata"]["name"]: p for p in simulation.cluster.list("Pod")}
    assert len(held) > 50
    assert all(pods[name]["spec"]["schedulingGates"] == [{"name": QUOTA_GATE}] for name in held)
    assert [name for name, pod in pods.items() if name not in held and pod["spec"].get("schedulingGates")] == []
    assert len(pods) - len(held) == 2  # the two the quota lets run
