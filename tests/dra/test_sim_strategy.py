"""The `dra-dynamic-mig` simulator strategy: the scheduler's allocator cuts MIG for pending pods, instances are
created at the chosen placement and destroyed when no pod needs them; plus the `dra` (whole GPU) strategy."""

from __future__ import annotations

import pytest

from kubegpu.errors import ConfigError
from kubegpu.gpu.catalog import get_model
from kubegpu.gpu.geometry import PlacedInstance, is_legal
from kubegpu.sim.dra_strategy import DraDynamicMig, dra, dra_dynamic_mig
from kubegpu.sim.engine import Simulation
from tests.sim.helpers import job, tiny_scenario


def test_small_pods_share_gpus_through_dynamic_mig() -> None:
    jobs = [job(f"ci-{i}", arrival=60.0 * i, memory=8.0, runtime=1800.0) for i in range(10)]
    strategy = dra_dynamic_mig(None)
    sim = Simulation(tiny_scenario(gpus=1, duration="4h"), strategy, jobs)
    seen_layouts: list[list[PlacedInstance]] = []
    original = sim.set_mig_layout

    def spy(node: str, layout: dict[int, list[PlacedInstance] | None], delay: float | None = None) -> None:
        seen_layouts.extend(list(v) for v in layout.values() if v is not None)
        original(node, layout, delay)

    sim.set_mig_layout = spy  # type: ignore[method-assign]
    result = sim.run()
    assert result.pods_completed == 10 and result.pods_pending_at_end == 0
    assert strategy.claims_allocated >= 7
    model = get_model("A100-SXM4-80GB")
    assert seen_layouts and all(is_legal(model, layout) for layout in seen_layouts)
    assert max(len(layout) for layout in seen_layouts) >= 7  # seven 1g.10gb side by side on one GPU
    assert all(not view.mig.get(0) for view in sim.nodes())  # every instance destroyed once its pod finished
    exclusive = Simulation(tiny_scenario(gpus=1, duration="4h"), dra(None), jobs).run()
    assert result.pending_p95_s < exclusive.pending_p95_s  # one whole GPU serialises the ten pods


def test_arguments_are_refused() -> None:
    with pytest.raises(ConfigError, match="takes no argument"):
        dra_dynamic_mig("x")
    with pytest.raises(ConfigError, match="takes no argument"):
        dra("x")
    assert isinstance(dra_dynamic_mig(None), DraDynamicMig)


class _Forgetful(dict[tuple[str, object], frozenset[object]]):
    """A no-fit memo that remembers nothing: every claim is tried on every node, the scheduler's plain first fit."""

    def __setitem__(self, key: tuple[str, object], value: frozenset[object]) -> None:
        pass


def test_passing_over_full_nodes_changes_no_allocation() -> None:
    # a node where a claim shape found no room is passed over while its devices in use are the same; the day must
    # come out exactly as with every node tried for every claim
    scenario = tiny_scenario(gpus=2, nodes=3, duration="2h")
    jobs = [job(f"ci-{i}", arrival=20.0 * i, memory=float(4 + 9 * (i % 4)), runtime=600.0 + 60 * (i % 7))
            for i in range(80)]
    remembered = dra_dynamic_mig(None)
    plain = dra_dynamic_mig(None)
    plain._no_fit = _Forgetful()
    with_memo = Simulation(scenario, remembered, jobs).run()
    without = Simulation(scenario, plain, jobs).run()
    assert remembered._no_fit  # the memo was used
    assert with_memo.to_dict() == without.to_dict()
    assert (remembered.claims_allocated, remembered.claims_failed) == (plain.claims_allocated, plain.claims_failed)
    assert with_memo.pods_completed > 40


def test_every_free_instance_nobody_wants_is_destroyed_on_every_node() -> None:
    # the driver's unprepare: once the short pods end, their instances go, whatever another node holds (the surplus
    # is counted over every node, not read from the last node's free counts)
    scenario = tiny_scenario(gpus=1, nodes=2, duration="1h")
    short = [job(f"ci-{i}", arrival=0.0, memory=8.0, runtime=600.0) for i in range(7)]  # fill the first GPU
    jobs = [*short, job("notebook-0", arrival=1.0, memory=8.0, runtime=20_000.0)]  # one more on the second node
    sim = Simulation(scenario, dra_dynamic_mig(None), jobs)
    result = sim.run()
    assert result.pods_completed == 7
    held = {view.name: [m for ms in view.mig.values() for m in ms] for view in sim.nodes()}
    assert sorted(len(instances) for instances in held.values()) == [0, 1]  # only the running pod's instance is left
