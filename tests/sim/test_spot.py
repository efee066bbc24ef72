"""Spot interruptions (`spotInterruptions`): bought nodes are taken back after a seeded lifetime plus the notice."""

from __future__ import annotations

from typing import Any

import pytest

from kubegpu.errors import ConfigError
from kubegpu.sim.effects import spot_lifetime
from kubegpu.sim.engine import Simulation
from kubegpu.sim.metrics import StrategyResult
from kubegpu.sim.strategies import BaseStrategy, SimControl
from tests.sim.helpers import job, tiny_scenario

SPOT = {"perNodeHour": 1.0, "notice": "2m"}


class Buyer(BaseStrategy):
    """Buys one node at the start (ready at once) and never another."""

    def on_start(self, sim: SimControl) -> None:
        sim.add_node("g", delay=0.0)


def run(strategy: BaseStrategy, nodes: int, **extra: Any) -> StrategyResult:
    scenario = tiny_scenario(nodes=nodes, duration="6h", **extra)
    return Simulation(scenario, strategy, [job("train-1", runtime=5 * 3600.0)]).run()


def test_a_bought_node_is_interrupted_after_its_lifetime_and_notice() -> None:
    lifetime = spot_lifetime(7, "g-0", 1.0)
    assert lifetime + 120 < 5 * 3600  # the premise: the cloud takes the node back while the job runs
    result = run(Buyer("buyer"), nodes=0, seed=7, spotInterruptions=SPOT)
    assert result.spot_interruptions == 1
    assert result.evictions == 1            # the running pod was evicted ...
    assert result.pods_pending_at_end == 1  # ... and requeued; nobody buys a replacement here
    assert result.pods_completed == 0
    assert result.cost == pytest.approx(10.0 * (lifetime + 120) / 3600)  # the bill stops at removal
    assert result.pending_max_s == pytest.approx(6 * 3600 - (lifetime + 120))


def test_without_the_field_the_bought_node_runs_to_the_end() -> None:
    result = run(Buyer("buyer"), nodes=0, seed=7)
    assert (result.spot_interruptions, result.evictions, result.pods_completed) == (0, 0, 1)
    assert result.cost == pytest.approx(60.0)


def test_the_scenarios_own_nodes_are_on_demand() -> None:
    with_spot = run(BaseStrategy("none"), nodes=1, seed=7, spotInterruptions=SPOT)
    without = run(BaseStrategy("none"), nodes=1, seed=7)
    assert with_spot.spot_interruptions == 0
    assert with_spot.to_dict() == without.to_dict()


def test_the_same_seed_replays_the_same_interruptions() -> None:
    first = run(Buyer("buyer"), nodes=0, seed=7, spotInterruptions=SPOT)
    again = run(Buyer("buyer"), nodes=0, seed=7, spotInterruptions=SPOT)
    other = run(Buyer("buyer"), nodes=0, seed=8, spotInterruptions=SPOT)
    assert first.to_dict() == again.to_dict()
    assert other.cost == pytest.approx(10.0 * (min(spot_lifetime(8, "g-0", 1.0), 6 * 3600 - 120) + 120) / 3600)
    assert other.cost != pytest.approx(first.cost)


@pytest.mark.parametrize(("spot", "message"), [
    ({"perNodeHour": -0.1}, r"tiny\.yaml: spotInterruptions\.perNodeHour: .*greater than or equal to 0"),
    ({"perNodeHour": 5}, r"spotInterruptions\.perNodeHour: .*less than or equal to 1"),
    ({"perNodeHour": 0.1, "notice": "soon"}, r"spotInterruptions\.notice: expected a duration"),
    ({"perNodeHour": 0.1, "notice": "2h"}, r"spotInterruptions\.notice: must be at most 3600s"),
    ({"notice": "2m"}, r"spotInterruptions\.perNodeHour: required field is missing"),
    ({"perNodeHour": 0.1, "every": "1h"}, r"spotInterruptions\.every: unknown field"),
])
def test_a_bad_field_is_one_line_naming_it(spot: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message) as caught:
        tiny_scenario(spotInterruptions=spot)
    assert "\n" not in str(caught.value)
