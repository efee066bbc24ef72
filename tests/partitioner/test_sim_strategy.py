"""dynamic-mig and dynamic-mps in the simulator: the real partitioner controller on the virtual clock."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest

from kubegpu.errors import ConfigError
from kubegpu.partitionagent import annotations as ann
from kubegpu.partitioner.controller import PartitionerController
from kubegpu.partitioner.sim_strategy import DynamicMig, DynamicMps
from kubegpu.sim.engine import Simulation
from kubegpu.sim.perf import mig_speed
from kubegpu.sim.scenario import Scenario, parse_scenario
from kubegpu.sim.strategies import get_strategy
from kubegpu.sim.workload import Job, scenario_jobs


def scenario(gpus: int = 2) -> Scenario:
    return parse_scenario({
        "name": "tiny", "duration": "3h", "sampleInterval": "10m", "strategies": ["dynamic-mig"],
        "cluster": {"nodeGroups": [{"name": "g", "count": 1, "gpuModel": "A100-SXM4-80GB", "gpusPerNode": gpus,
                                    "pricePerHour": 10.0}]},
        "workload": {"classes": [{"name": "ci", "arrivalsPerHour": 1, "memoryGiB": [1, 8], "compute": [0.1, 0.5],
                                  "runtime": ["5m", "30m"]}]},
    }, "tiny.yaml")


def job(name: str, memory: float, arrival: float = 0.0, runtime: float = 1800.0) -> Job:
    return Job(name=name, arrival=arrival, klass="ci", namespace="default", priority=0, gpus=1,
               memory_gib=memory, compute=0.3, work=runtime, max_retries=0)


@pytest.mark.parametrize("strategy_cls", [DynamicMig, DynamicMps])
def test_pods_get_slices_cut_for_them(strategy_cls: type[DynamicMig] | type[DynamicMps]) -> None:
    jobs = [job("small-a", 8), job("small-b", 8), job("mid", 30), job("big", 70)]
    strategy = strategy_cls("dyn")
    result = Simulation(scenario(), strategy, jobs).run(None)
    assert result.pods_completed == 4
    assert result.oom_kills == 0
    assert strategy.plans >= 1 and strategy.recuts >= 1
    # nothing existed at the start: every pod waited for a batch window (5 s ticks, 10 s idle) plus the re-cut
    assert 10 + strategy.delay <= result.pending_max_s <= 60 + strategy.delay + 10


def test_an_instance_in_use_is_never_destroyed_so_a_whole_gpu_pod_waits() -> None:
    jobs = [job("first", 8), job("later", 70, arrival=600.0)]
    strategy = DynamicMig("dyn")
    result = Simulation(scenario(gpus=1), strategy, jobs).run(None)
    # the one GPU holds a running 1g pod when the 7g-sized pod arrives: it waits until the 1g is free again
    assert result.pods_completed == 2 and result.evictions == 0
    assert result.pending_max_s >= 1800 - 600


def test_a_busy_gpu_is_recut_around_its_running_pod() -> None:
    jobs = [replace(job("first", 8), klass="first"), replace(job("later", 20, arrival=600.0), klass="later")]
    strategy = DynamicMig("dyn")
    result = Simulation(scenario(gpus=1), strategy, jobs).run(None)
    # a 2g.20gb is cut beside the running 1g: the later pod waits for a batch window and the re-cut, not for the
    # first pod to finish, and the first pod runs on undisturbed on its 1g (14 of 108 SMs)
    assert result.pods_completed == 2 and result.evictions == 0
    assert strategy.recuts == 2
    assert result.classes["later"].pending_p95_s <= 60 + strategy.delay + 10
    first = result.classes["first"]
    assert first.jct_p50_s == pytest.approx(first.pending_p95_s + 1800.0 / mig_speed(0.3, 14, 108))


def test_dynamic_mps_reslices_a_busy_gpu_around_its_running_pod() -> None:
    first = replace(job("first", 8), klass="first")
    jobs = [first, replace(job("later", 20, arrival=600.0), klass="later")]
    strategy = DynamicMps("dyn")
    result = Simulation(scenario(gpus=1), strategy, jobs).run(None)
    alone = Simulation(scenario(gpus=1), DynamicMps("dyn"), [first]).run(None)
    # a 20 GB slice is added beside the held 10 GB one: the later pod waits for a batch window and the change, not
    # for the first pod to finish, and the first pod keeps its slice and runs as if it were alone
    assert result.pods_completed == 2 and result.evictions == 0
    assert strategy.recuts == 2 and strategy.refused == 0
    assert result.classes["later"].pending_p95_s <= 60 + strategy.delay + 10
    assert result.classes["first"].jct_p50_s == pytest.approx(alone.classes["first"].jct_p50_s)


def test_a_plan_that_changed_nothing_is_not_repeated_for_the_same_input() -> None:
    wide = replace(job("wide", 70), gpus=2)  # two 7g.80gb on one node: the 1-GPU node can never hold it
    strategy = DynamicMig("dyn")
    result = Simulation(scenario(gpus=1), strategy, [wide]).run(None)
    assert result.pods_completed == 0
    assert strategy.plans == 1 and strategy.skipped > 100  # a window closes every ~15 s for 3 h


def busy_scenario() -> Scenario:
    return parse_scenario({
        "name": "busy", "duration": "4h", "sampleInterval": "10m", "strategies": ["dynamic-mig"], "seed": 3,
        "cluster": {"nodeGroups": [{"name": "g", "count": 2, "gpuModel": "A100-SXM4-80GB", "gpusPerNode": 2,
                                    "pricePerHour": 10.0}]},
        "workload": {"classes": [
            {"name": "small", "arrivalsPerHour": 12, "memoryGiB": [2, 35], "compute": [0.1, 0.6],
             "runtime": ["5m", "40m"]},
            {"name": "wide", "arrivalsPerHour": 1, "gpus": [2, 3], "memoryGiB": [50, 70], "compute": [0.5, 0.9],
             "runtime": ["20m", "1h"]}]},
    }, "busy.yaml")


@pytest.mark.parametrize("strategy_cls", [DynamicMig, DynamicMps])
def test_skipping_futile_plans_changes_no_result(strategy_cls: type[DynamicMig] | type[DynamicMps]) -> None:
    busy = busy_scenario()
    jobs = scenario_jobs(busy)
    skipping, planning = strategy_cls("dyn"), strategy_cls("dyn", skip_futile_plans=False)
    first = Simulation(busy, skipping, jobs).run(None).to_dict()
    again = Simulation(busy, planning, jobs).run(None).to_dict()
    assert json.dumps(first, sort_keys=True) == json.dumps(again, sort_keys=True)
    assert skipping.skipped > 0 and planning.skipped == 0
    assert skipping.plans + skipping.skipped == planning.plans
    assert first["evictions"] == 0


@pytest.mark.parametrize(("strategy_cls", "mode"), [(DynamicMig, "mig"), (DynamicMps, "mps")])
def test_the_real_controller_plans_and_the_strategy_plays_the_agent(
        strategy_cls: type[DynamicMig] | type[DynamicMps], mode: str) -> None:
    strategy = strategy_cls("dyn", batch_idle=30.0)  # options go to the controller
    sim = Simulation(scenario(), strategy, [job("small", 8), job("mid", 30)])
    result = sim.run(None)
    assert isinstance(strategy.controller, PartitionerController) and strategy.controller.batch_idle == 30.0
    node = sim.cluster.get("Node", "g-0")
    assert node["metadata"]["labels"][ann.PARTITIONING_LABEL] == mode  # opted in as it joined
    annotations = node["metadata"]["annotations"]
    assert annotations[ann.SPEC_PLAN] == annotations[ann.STATUS_PLAN]  # the agent reported the plan it applied
    assert "kubegpu.io/spec-gpu-0-layout" in annotations and "kubegpu.io/status-gpu-0-layout" in annotations
    assert result.pods_completed == 2
    assert result.pending_max_s >= 30 + strategy.delay  # the controller's idle window, then the change


def test_registered_and_arguments_rejected() -> None:
    assert get_strategy("dynamic-mig").name == "dynamic-mig"
    assert get_strategy("dynamic-mps").name == "dynamic-mps"
    with pytest.raises(ConfigError, match="dynamic-mig takes no argument"):
        get_strategy("dynamic-mig:fast")


def _whole_report(strategy: DynamicMig | DynamicMps, view: Any) -> list[ann.ReportedGpu]:
    """A node's report built from scratch, GPU by GPU, as the agent reports on a real node."""
    from collections import Counter

    from kubegpu.gpu.geometry import PlacedInstance
    from kubegpu.sharing.names import strip_replica

    gpus = []
    for gpu in view.gpus:
        if isinstance(strategy, DynamicMig):
            gpus.append(ann.ReportedGpu(gpu.index, view.model.key, tuple(
                (PlacedInstance(m.profile_id, m.start), m.uuid in view.held_mig) for m in view.mig.get(gpu.index, ()))))
            continue
        held = {d.rsplit("::", 1)[-1] for d in view.held_mps if strip_replica(d) in (gpu.uuid, str(gpu.index))}
        counters: Counter[int] = Counter()
        slices = []
        for gb in strategy.slices.get(view.name, {}).get(gpu.index, []):
            slices.append((gb, f"mps-{gb}gb-{counters[gb]}" in held))
            counters[gb] += 1
        gpus.append(ann.ReportedGpu(gpu.index, view.model.key, slices=tuple(slices)))
    return gpus


@pytest.mark.parametrize("strategy_cls", [DynamicMig, DynamicMps])
def test_each_report_written_only_where_it_changed_is_the_whole_report(
        strategy_cls: type[DynamicMig] | type[DynamicMps]) -> None:
    """The agents write only the GPUs whose part of the report changed, and skip unchanged nodes: after every
    pass, each node not being re-cut carries exactly the report built afresh from its GPUs."""
    checked = []

    class Checking(strategy_cls):  # type: ignore[valid-type,misc]
        def on_tick(self, sim: Any) -> None:
            super().on_tick(sim)
            for view in sim.nodes():
                if view.name in self.applying:
                    continue
                status = {k: v for k, v in (sim.cluster.get("Node", view.name)["metadata"].get("annotations")
                                           or {}).items() if ann.is_status_key(k)}
                assert status == ann.status_annotations(self.mode, _whole_report(self, view),
                                                        self.handled.get(view.name))
                checked.append(view.name)

    jobs = [job(f"ci-{i}", memory=4.0 + (i * 7) % 60, arrival=i * 150.0, runtime=900.0 + (i * 311) % 2400)
            for i in range(40)]
    strategy = Checking("dyn")
    result = Simulation(scenario(gpus=4), strategy, jobs).run(None)
    assert result.pods_completed >= 30 and strategy.recuts >= 3 and len(checked) > 1000
