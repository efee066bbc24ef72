"""The engine: scheduling order, the sharing rules applied to running pods, controllers, determinism."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import pytest

from kubegpu.errors import ConfigError
from kubegpu.gpu.geometry import PlacedInstance
from kubegpu.sim.engine import InstanceInUseError, Simulation
from kubegpu.sim.metrics import StrategyResult
from kubegpu.sim.perf import DEFAULT_PARAMS, mig_speed
from kubegpu.sim.runner import run_scenario
from kubegpu.sim.strategies import (
    BaseStrategy,
    GpuRequest,
    NodeSetup,
    NodeView,
    SimControl,
    get_strategy,
    register_strategy,
)
from kubegpu.sim.workload import Job
from tests.sim.helpers import job, tiny_scenario

HOUR = 3600.0


def simulate(strategy: str | BaseStrategy, jobs: Sequence[Job], gpus: int = 1, **scenario: Any) -> StrategyResult:
    chosen = get_strategy(strategy) if isinstance(strategy, str) else strategy
    return Simulation(tiny_scenario(gpus=gpus, **scenario), chosen, jobs).run()


def test_exclusive_gpu_makes_the_second_pod_wait_for_the_first() -> None:
    result = simulate("exclusive", [job("a-1"), job("b-1", arrival=10.0)])
    assert result.pods_completed == 2
    assert result.pending_max_s == pytest.approx(HOUR - 10.0)
    assert result.jct_p95_s == pytest.approx(2 * HOUR - 10.0)
    assert result.allocation_pct == pytest.approx(100 * 2 * HOUR / (6 * HOUR))


def test_time_slicing_contention_stretches_both_pods() -> None:
    result = simulate("time-slicing:4", [job("a-1"), job("b-1")])
    stretched = 2 * (1 + DEFAULT_PARAMS.context_switch_overhead) * HOUR
    assert result.pending_max_s == 0.0
    assert result.jct_p50_s == pytest.approx(stretched)
    assert result.jct_p95_s == pytest.approx(stretched)


def test_time_slicing_without_contention_costs_nothing() -> None:
    result = simulate("time-slicing:4", [job("a-1", compute=0.3), job("b-1", compute=0.4)])
    assert result.jct_p95_s == pytest.approx(HOUR)
    assert result.compute_util_pct == pytest.approx(100 * 0.7 * HOUR / (6 * HOUR))


def test_time_slicing_oom_kills_the_newest_pod_only() -> None:
    jobs = [job("old-1", memory=50, compute=0.4), job("new-1", arrival=60.0, memory=40, compute=0.4)]
    result = simulate("time-slicing:4", jobs)
    assert result.oom_kills == 1
    assert result.classes["new"].oom_kills == 1 and result.classes["new"].completed == 0
    assert result.classes["old"].completed == 1
    assert result.classes["old"].jct_p50_s == pytest.approx(HOUR)
    assert result.jobs_failed == 1


def test_an_oom_killed_pod_is_retried_until_its_limit() -> None:
    jobs = [job("old-1", memory=50, compute=0.4), job("new-1", arrival=60.0, memory=40, compute=0.4, retries=2)]
    result = simulate("time-slicing:4", jobs)
    assert result.oom_kills == 3  # first try + 2 retries, all while the old pod holds 50 GiB
    assert result.jobs_failed == 1


def test_mig_slice_kills_a_pod_that_needs_more_memory_than_the_slice() -> None:
    result = simulate("static-mig:all-1g.10gb", [job("big-1", memory=12.0)])
    assert result.oom_kills == 1 and result.pods_completed == 0


def test_mig_slice_limits_speed_by_its_sms() -> None:
    result = simulate("static-mig:all-1g.10gb", [job("small-1", memory=8.0, compute=1.0)])
    speed = mig_speed(1.0, 14, 108)
    assert speed < 1.0
    assert result.jct_p50_s == pytest.approx(HOUR / speed)


def test_higher_priority_pods_are_bound_first_then_fifo() -> None:
    jobs = [job("run-1"), job("low-1", arrival=10.0), job("high-1", arrival=20.0, priority=10)]
    result = simulate("exclusive", jobs, duration="4h")
    assert result.classes["high"].pending_p95_s == pytest.approx(HOUR - 20.0)
    assert result.classes["low"].pending_p95_s == pytest.approx(2 * HOUR - 10.0)


def test_shared_multi_gpu_pods_spread_over_distinct_gpus() -> None:
    seen: list[frozenset[int]] = []

    class Watcher(BaseStrategy):
        tick_interval = 600.0

        def on_tick(self, sim: SimControl) -> None:
            seen.append(sim.nodes()[0].busy_gpus)

    watcher = Watcher("watch")
    ts = get_strategy("time-slicing:2")
    watcher.node_setup = ts.node_setup  # type: ignore[method-assign]
    watcher.request_for = ts.request_for  # type: ignore[method-assign]
    simulate(watcher, [job("wide-1", gpus=2, compute=0.5)], gpus=2, duration="1h")
    assert seen[0] == frozenset({0, 1})


class Reshaper(BaseStrategy):
    """A controller: at start, turns GPU 0 of the first node into two 3g.40gb slices after 100 s."""

    tick_interval = 50.0

    def __init__(self) -> None:
        super().__init__("reshaper")
        self.views: list[dict[str, int]] = []

    def node_setup(self, group: Any, model: Any, gpus: Any) -> NodeSetup:
        return NodeSetup(device_plugin_config={"version": "v1", "flags": {"migStrategy": "mixed"}})

    def on_start(self, sim: SimControl) -> None:
        name = sim.nodes()[0].name
        sim.set_mig_layout(name, {0: [PlacedInstance(9, 0), PlacedInstance(9, 4)]}, delay=100.0)

    def on_tick(self, sim: SimControl) -> None:
        self.views.append(dict(sim.nodes()[0].allocatable))


def test_a_controller_reconfigures_mig_with_a_delay() -> None:
    strategy = Reshaper()
    simulate(strategy, [], gpus=2, duration="5m")
    at_50, at_150 = strategy.views[0], strategy.views[2]
    assert at_50 == {"nvidia.com/gpu": 1}  # GPU 0 is out while the MIG manager works
    assert at_150 == {"nvidia.com/gpu": 1, "nvidia.com/mig-3g.40gb": 2}


class Recutter(BaseStrategy):
    """A controller: GPU 0 starts as two 1g.10gb slices; at 600 s it swaps the one the running pod does not hold for
    a 2g.20gb (after 100 s), or, with `destroy_used`, tries to drop the one the pod holds."""

    tick_interval = 50.0

    def __init__(self, destroy_used: bool = False) -> None:
        super().__init__("recutter")
        self.destroy_used = destroy_used
        self.views: dict[float, NodeView] = {}
        self.refused: list[str] = []

    def node_setup(self, group: Any, model: Any, gpus: Any) -> NodeSetup:
        return NodeSetup(device_plugin_config={"version": "v1", "flags": {"migStrategy": "mixed"}},
                         mig_layout={0: [19, 19]})  # 1g.10gb at slots 4 and 5

    def request_for(self, job: Job, models: Any) -> GpuRequest:
        return GpuRequest("nvidia.com/mig-1g.10gb", job.gpus)

    def on_tick(self, sim: SimControl) -> None:
        now = sim.clock.now()
        view = self.views[now] = sim.nodes()[0]
        if now != 600.0:
            return
        used = [m for m in view.mig[0] if m.uuid in view.held_mig]
        free = [m for m in view.mig[0] if m.uuid not in view.held_mig]
        keep = free if self.destroy_used else used
        layout = [*(PlacedInstance(m.profile_id, m.start) for m in keep), PlacedInstance(14, 0)]
        try:
            sim.set_mig_layout(view.name, {0: layout}, delay=100.0)
        except InstanceInUseError as exc:
            self.refused.append(str(exc))


def test_a_running_pod_keeps_its_mig_device_when_a_slice_is_added_beside_it() -> None:
    strategy = Recutter()
    result = simulate(strategy, [job("small-1", memory=8.0, compute=1.0)])
    before, during, after = strategy.views[550.0], strategy.views[650.0], strategy.views[750.0]
    assert len(before.held_mig) == 1 and before.held_mig == during.held_mig == after.held_mig  # same device
    assert before.held_mig <= {m.uuid for m in after.mig[0]}
    assert before.allocatable == {"nvidia.com/mig-1g.10gb": 2}
    assert during.allocatable == {"nvidia.com/mig-1g.10gb": 1}  # the free 1g went at once, the 2g is coming
    assert during.reconfiguring == frozenset({0}) and during.busy_gpus == frozenset({0})
    assert after.allocatable == {"nvidia.com/mig-1g.10gb": 1, "nvidia.com/mig-2g.20gb": 1}
    assert after.reconfiguring == frozenset()
    assert result.evictions == 0 and result.pods_completed == 1
    assert result.jct_p50_s == pytest.approx(HOUR / mig_speed(1.0, 14, 108))  # as if nothing had happened


def test_a_mig_change_that_would_destroy_a_used_instance_is_refused_and_changes_nothing() -> None:
    strategy = Recutter(destroy_used=True)
    result = simulate(strategy, [job("small-1", memory=8.0, compute=1.0)])
    assert len(strategy.refused) == 1
    assert "would destroy MIG device(s) in use by running pods: MIG-" in strategy.refused[0]
    assert strategy.views[650.0].mig == strategy.views[550.0].mig
    assert strategy.views[650.0].allocatable == {"nvidia.com/mig-1g.10gb": 2}
    assert result.evictions == 0 and result.pods_completed == 1


def test_mig_mode_changes_on_a_busy_gpu_and_changes_on_a_reconfiguring_gpu_are_refused() -> None:
    refused: list[str] = []

    class Toggler(BaseStrategy):
        tick_interval = 600.0

        def on_tick(self, sim: SimControl) -> None:
            name = sim.nodes()[0].name
            for index in (0, 1, 1):  # GPU 0 runs the pod; GPU 1 is idle, then still being changed
                try:
                    sim.set_mig_layout(name, {index: [PlacedInstance(0, 0)]}, delay=100.0)
                except InstanceInUseError as exc:
                    refused.append(str(exc))

    result = simulate(Toggler("toggler"), [job("a-1", runtime=1000.0)], gpus=2, duration="11m")
    assert refused == ["node g-0: GPU 0: MIG mode cannot change while 1 device(s) are in use",
                       "node g-0: GPU 1: still being reconfigured; change it once its layout is in place"]
    assert result.evictions == 0


def test_an_illegal_mig_layout_names_the_node_and_gpu() -> None:
    from kubegpu.errors import ConfigError, NotFoundError

    sim = Simulation(tiny_scenario(), get_strategy("exclusive"), [])
    sim.run()
    with pytest.raises(ConfigError, match=r"node g-0: GPU 0: illegal MIG layout"):
        sim.set_mig_layout("g-0", {0: [PlacedInstance(0, 0), PlacedInstance(19, 0)]})
    with pytest.raises(NotFoundError, match="node g-0 has no GPU 3"):
        sim.set_mig_layout("g-0", {3: []})


class Grower(BaseStrategy):
    def on_start(self, sim: SimControl) -> None:
        sim.add_node("g", delay=1800.0)


def test_a_controller_adds_a_node_that_takes_pods_once_ready() -> None:
    jobs = [job("a-1"), job("b-1", arrival=60.0)]
    result = simulate(Grower("grower"), jobs, duration="2h")
    assert result.pending_max_s == pytest.approx(1800.0 - 60.0)
    assert result.gpus_provisioned_hours == pytest.approx(4.0)  # the new node is paid for from the request
    assert result.cost == pytest.approx(40.0)


class GrowerAtDefault(BaseStrategy):
    def on_start(self, sim: SimControl) -> None:
        sim.add_node("g")  # no delay given: the scenario's node bring-up


def test_a_new_node_is_usable_only_after_the_operators_bring_up_stages() -> None:
    """boot → driver → toolkit → cuda → plugin validation: the pod waits for the whole chain, not a flat delay."""
    stages = {"boot": "60s", "driver": "10m", "toolkit": "45s", "cuda": "30s", "plugin": "15s"}
    jobs = [job("a-1"), job("b-1", arrival=60.0)]
    result = simulate(GrowerAtDefault("grower"), jobs, duration="2h", nodeBringUp=stages)
    assert result.pending_max_s == pytest.approx(60 + 600 + 45 + 30 + 15 - 60.0)
    default = simulate(GrowerAtDefault("grower"), jobs, duration="2h")
    assert default.pending_max_s == pytest.approx(300.0 - 60.0)  # the default chain adds up to five minutes


def test_a_negative_bring_up_stage_names_the_field() -> None:
    with pytest.raises(ConfigError, match=r"nodeBringUp\.driver"):
        tiny_scenario(nodeBringUp={"driver": "-5s"})


def test_time_slicing_allocatable_comes_from_the_device_plugin_accounting() -> None:
    views: list[dict[str, int]] = []

    class Peek(BaseStrategy):
        def on_start(self, sim: SimControl) -> None:
            views.append(dict(sim.nodes()[0].allocatable))

    peek = Peek("peek")
    ts = get_strategy("time-slicing:4")
    peek.node_setup = ts.node_setup  # type: ignore[method-assign]
    simulate(peek, [], gpus=2, duration="1h")
    assert views == [{"nvidia.com/gpu.shared": 8}]


def test_unknown_strategy_is_a_one_line_error() -> None:
    from kubegpu.errors import ConfigError

    with pytest.raises(ConfigError, match=r"unknown strategy 'sharing-magic'; available: .*exclusive"):
        get_strategy("sharing-magic")
    with pytest.raises(ConfigError, match="replicas must be a whole number"):
        get_strategy("time-slicing:x")


def test_registered_plugins_are_found_by_name(monkeypatch: pytest.MonkeyPatch) -> None:
    from kubegpu.sim import strategies

    monkeypatch.setattr(strategies, "_REGISTRY", dict(strategies._REGISTRY))  # leave no plug-in behind
    register_strategy("test-plugin", lambda argument: BaseStrategy(f"test-plugin:{argument}"))
    assert get_strategy("test-plugin:7").name == "test-plugin:7"


def test_same_seed_gives_identical_json_and_another_seed_differs() -> None:
    scenario = tiny_scenario(gpus=2, strategies=["exclusive", "time-slicing:2"], duration="3h")
    first = json.dumps(run_scenario(scenario).to_dict(), sort_keys=True)
    again = json.dumps(run_scenario(scenario).to_dict(), sort_keys=True)
    other = json.dumps(run_scenario(scenario.model_copy(update={"seed": 2})).to_dict(), sort_keys=True)
    assert first == again
    assert first != other


def test_controllers_see_nodes_and_pods_in_the_cluster_store() -> None:
    seen: list[tuple[list[str], dict[str, str], list[tuple[str, str]]]] = []

    class Reader(BaseStrategy):
        tick_interval = 30.0

        def on_tick(self, sim: SimControl) -> None:
            if seen:
                return
            nodes = sim.cluster.list("Node")
            pods = sim.cluster.list("Pod")
            seen.append((
                [n["metadata"]["name"] for n in nodes],
                nodes[0]["status"]["allocatable"],
                sorted((p["metadata"]["name"], p["spec"].get("nodeName", "")) for p in pods),
            ))

    simulate(Reader("reader"), [job("a-1"), job("b-1", arrival=10.0)], duration="1h")
    names, allocatable, pods = seen[0]
    assert names == ["g-0"]
    assert allocatable["nvidia.com/gpu"] == "1"
    assert pods == [("a-1", "g-0"), ("b-1", "")]  # b is pending: no node yet


def test_mps_pins_memory_per_client_and_kills_a_pod_over_its_limit() -> None:
    # mps:4 on an 80 GB A100: each client may use a quarter of the memory (about 20 GiB)
    result = simulate("mps:4", [job("fits-1", memory=15.0, compute=0.2), job("over-1", memory=25.0, compute=0.2)])
    assert result.classes["over"].oom_kills == 1
    assert result.classes["fits"].completed == 1 and result.classes["fits"].oom_kills == 0


def test_mps_thread_percentage_slows_a_busy_client() -> None:
    result = simulate("mps:4", [job("busy-1", memory=10.0, compute=1.0)])
    assert result.jct_p50_s == pytest.approx(HOUR / (0.25 / DEFAULT_PARAMS.sm_occupancy))


def test_mps_rejects_a_pod_asking_for_more_than_one_shared_gpu() -> None:
    result = simulate("mps:2", [job("wide-1", gpus=2, memory=10.0, compute=0.2)], gpus=2)
    assert result.rejected == 1 and result.jobs_failed == 1 and result.pods_completed == 0
    sliced = simulate("time-slicing:2", [job("wide-1", gpus=2, memory=10.0, compute=0.2)], gpus=2)
    assert sliced.rejected == 0 and sliced.pods_completed == 1


class Resharer(BaseStrategy):
    """A controller: at start, cuts GPU 1 of the first node into MPS memory slices of 20 and 40 GiB after 60 s."""

    tick_interval = 30.0

    def __init__(self) -> None:
        super().__init__("resharer")
        self.views: list[dict[str, int]] = []

    def on_start(self, sim: SimControl) -> None:
        sim.set_sharing(sim.nodes()[0].name, {"version": "v1"}, mps_slices={1: [20, 40]}, delay=60.0)

    def on_tick(self, sim: SimControl) -> None:
        self.views.append(dict(sim.nodes()[0].allocatable))


def test_a_controller_cuts_mps_slices_after_a_delay() -> None:
    strategy = Resharer()
    simulate(strategy, [], gpus=2, duration="2m")
    # GPU 1 is handed out as slices only; the new slices are advertised once the change is applied
    assert strategy.views[0] == {"nvidia.com/gpu": 1, "nvidia.com/gpu-20gb": 0, "nvidia.com/gpu-40gb": 0}
    assert strategy.views[2] == {"nvidia.com/gpu": 1, "nvidia.com/gpu-20gb": 1, "nvidia.com/gpu-40gb": 1}


class Reslicer(BaseStrategy):
    """A controller: GPU 0 starts as MPS slices of 10 and 20 GiB, the pod runs on the 10; at 600 s it sets
    `new_slices` (after 100 s), or nothing when that is None."""

    tick_interval = 50.0

    def __init__(self, new_slices: list[int] | None) -> None:
        super().__init__("reslicer")
        self.new_slices = new_slices
        self.views: dict[float, NodeView] = {}
        self.refused: list[str] = []

    def node_setup(self, group: Any, model: Any, gpus: Any) -> NodeSetup:
        return NodeSetup(device_plugin_config={"version": "v1"}, mps_slices={0: [10, 20]})

    def request_for(self, job: Job, models: Any) -> GpuRequest:
        return GpuRequest("nvidia.com/gpu-10gb", job.gpus)

    def on_tick(self, sim: SimControl) -> None:
        now = sim.clock.now()
        view = self.views[now] = sim.nodes()[0]
        if now != 600.0 or self.new_slices is None:
            return
        try:
            sim.set_sharing(view.name, {"version": "v1"}, mps_slices={0: self.new_slices}, delay=100.0)
        except InstanceInUseError as exc:
            self.refused.append(str(exc))


def test_a_running_pod_keeps_its_mps_slice_when_free_slices_are_replaced_beside_it() -> None:
    strategy = Reslicer([10, 30])
    result = simulate(strategy, [job("small-1", memory=8.0, compute=1.0)])
    untouched = simulate(Reslicer(None), [job("small-1", memory=8.0, compute=1.0)])
    before, during, after = strategy.views[550.0], strategy.views[650.0], strategy.views[750.0]
    assert len(before.held_mps) == 1 and before.held_mps == during.held_mps == after.held_mps  # same device ID
    assert next(iter(before.held_mps)).endswith("::mps-10gb-0")
    assert before.allocatable == {"nvidia.com/gpu-10gb": 1, "nvidia.com/gpu-20gb": 1}
    assert during.allocatable == {"nvidia.com/gpu-10gb": 1, "nvidia.com/gpu-30gb": 0}  # the 20 went, the 30 comes
    assert during.reconfiguring == frozenset({0}) and during.busy_gpus == frozenset({0})
    assert after.allocatable == {"nvidia.com/gpu-10gb": 1, "nvidia.com/gpu-30gb": 1}
    assert after.reconfiguring == frozenset()
    assert strategy.refused == [] and result.evictions == 0 and result.pods_completed == 1
    assert result.jct_p50_s == pytest.approx(untouched.jct_p50_s)  # as if nothing had happened


def test_an_mps_change_that_would_drop_a_held_slice_is_refused_and_changes_nothing() -> None:
    strategy = Reslicer([20, 30])
    result = simulate(strategy, [job("small-1", memory=8.0, compute=1.0)])
    assert len(strategy.refused) == 1
    assert strategy.refused[0].startswith("node g-0: GPU 0: the new MPS slices would drop device(s) in use by "
                                          "running pods: GPU-")
    assert strategy.refused[0].endswith("::mps-10gb-0") and "\n" not in strategy.refused[0]
    assert strategy.views[650.0].allocatable == strategy.views[550.0].allocatable
    assert strategy.views[650.0].reconfiguring == frozenset()
    assert result.evictions == 0 and result.pods_completed == 1


def test_slicing_a_gpu_a_pod_holds_whole_is_refused() -> None:
    refused: list[str] = []

    class WholeSlicer(BaseStrategy):
        tick_interval = 600.0

        def on_tick(self, sim: SimControl) -> None:
            try:
                sim.set_sharing(sim.nodes()[0].name, {"version": "v1"}, mps_slices={0: [10]}, delay=100.0)
            except InstanceInUseError as exc:
                refused.append(str(exc))

    result = simulate(WholeSlicer("whole-slicer"), [job("a-1", runtime=1000.0)], duration="11m")
    assert len(refused) == 1 and "would drop device(s) in use by running pods: GPU-" in refused[0]
    assert result.evictions == 0


class Shrinker(BaseStrategy):
    """A controller: after 10 minutes, removes the node the pod runs on."""

    tick_interval = 600.0

    def on_tick(self, sim: SimControl) -> None:
        busy = [view.name for view in sim.nodes() if view.busy_gpus]
        if sim.clock.now() == 600.0 and busy:
            sim.remove_node(busy[0])


def test_removing_a_node_evicts_its_pods_which_restart_elsewhere() -> None:
    result = simulate(Shrinker("shrinker"), [job("a-1")], nodes=2, duration="3h")
    assert result.evictions == 1
    assert result.pods_completed == 1
    assert result.jct_p50_s == pytest.approx(600.0 + HOUR)  # the work starts again on the other node
    assert result.gpus_provisioned_hours == pytest.approx(3.0 + 600.0 / HOUR)


def test_asking_one_node_per_class_of_identical_nodes_picks_what_the_full_list_would() -> None:
    from kubegpu.scheduling import select_node
    from kubegpu.sim.engine import Attempt, SimNode

    checked: list[str] = []

    class Checked(Simulation):
        def _choose_node(self, run: Attempt) -> SimNode | None:
            chosen = super()._choose_node(run)
            request = run.request
            every = [n.info for n in self._nodes.values()
                     if n.ready and len(n.free.get(request.resource, ())) >= request.count]
            full = select_node(run.need, every, self.scoring)
            assert (chosen.name if chosen else None) == (full.name if full else None)
            checked.append(run.name)
            return chosen

    for scoring in ("least-allocated", "most-allocated"):
        scenario = tiny_scenario(gpus=4, nodes=5, duration="4h",
                                 cluster={"scoring": scoring, "nodeGroups": [
                                     {"name": "a", "count": 3, "gpuModel": "A100-SXM4-80GB", "gpusPerNode": 4,
                                      "pricePerHour": 1.0},
                                     {"name": "h", "count": 2, "gpuModel": "H100-SXM5-80GB", "gpusPerNode": 4,
                                      "pricePerHour": 2.0}]},
                                 workload={"classes": [{"name": "w", "arrivalsPerHour": 40, "gpus": [1, 2, 3],
                                                        "memoryGiB": [1, 30], "compute": [0.1, 0.9],
                                                        "runtime": ["5m", "40m"]}]})
        from kubegpu.sim.workload import scenario_jobs

        for strategy in ("exclusive", "time-slicing:3"):
            Checked(scenario, get_strategy(strategy), scenario_jobs(scenario)).run()
    assert len(checked) > 100


def test_simulated_nodes_carry_the_labels_discovery_would_write() -> None:
    """Issue 5: the label computation is one pure function, and the simulator's Nodes are labelled by it."""
    from kubegpu.discovery.labels import compute_labels

    sim = Simulation(tiny_scenario(gpus=2), get_strategy("static-mig:all-balanced"), [])
    sim.run()
    node = sim.cluster.get("Node", "g-0")
    labels = node["metadata"]["labels"]
    engine_node = sim._nodes["g-0"]
    backend = engine_node.hardware.backend
    expected = compute_labels(engine_node.gpus, engine_node.mig, engine_node.config, backend.driver_version(),
                              backend.cuda_driver_version(), machine=None, now=None)
    assert {k: v for k, v in labels.items() if k.startswith("nvidia.com/")} == expected
    assert labels["nvidia.com/gpu.product"] == "NVIDIA-A100-SXM4-80GB"
    assert labels["nvidia.com/mig-2g.20gb.count"] == "2"  # all-balanced: one 2g per GPU, two GPUs
    assert labels["kubernetes.io/hostname"] == "g-0"


def test_a_run_makes_no_full_garbage_collection_and_restores_the_collector_after() -> None:
    import gc

    seen: list[tuple[int, int, int]] = []

    class Watching(BaseStrategy):
        tick_interval = 600.0

        def on_tick(self, sim: SimControl) -> None:
            seen.append(gc.get_threshold())

    before = gc.get_threshold()
    simulate(Watching("watching"), [job("ci-1", runtime=1800.0)], duration="1h")
    assert seen and all(t[:2] == before[:2] and t[2] > 10**6 for t in seen)  # young collections as usual
    assert gc.get_threshold() == before


@pytest.mark.parametrize("scoring", ["least-allocated", "most-allocated"])
def test_remembered_scores_choose_the_nodes_select_node_chooses(scoring: str, monkeypatch: pytest.MonkeyPatch
                                                                 ) -> None:
    """The engine scores each (node state, request) once; a day on mixed nodes binds exactly as asking
    `select_node` of every class of nodes for every pod does."""
    from kubegpu.scheduling import select_node
    from kubegpu.sim.accounting import Accounting

    scenario = dict(gpus=4, nodes=3, duration="4h", cluster={"scoring": scoring, "nodeGroups": [
        {"name": "a", "count": 2, "gpuModel": "A100-SXM4-80GB", "gpusPerNode": 4, "pricePerHour": 10.0},
        {"name": "h", "count": 2, "gpuModel": "H100-SXM5-80GB", "gpusPerNode": 2, "pricePerHour": 20.0}]})
    jobs = [job(f"ci-{i}", arrival=i * 97.0 % 7200, runtime=600.0 + i * 131 % 3000, gpus=1 + i % 3,
                memory=5.0 + i % 30) for i in range(120)]
    remembered = simulate("time-slicing:2", jobs, **scenario)

    def asked_every_time(self: Any, resource: str, count: int, need: Any, representatives: Any) -> Any:
        return select_node(need, representatives.values(), scoring)

    monkeypatch.setattr(Accounting, "_best", asked_every_time)
    assert simulate("time-slicing:2", jobs, **scenario) == remembered
    assert remembered.pods_completed > 30
