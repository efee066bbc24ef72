"""The partitioning planner: pending pods in, a placement-exact layout per GPU out. Pure and deterministic.

One entry point, a `Planner` (or the one-shot `plan(nodes, pods, planner=..., time_limit=...)`), behind which two
planners share every input, output and check, so the controller, the agent, the simulator and `kubegpu plan` do
not care which one runs:

* `exact` (the default): a mixed-integer model solved by HiGHS (`exact`, driven by `solver`, bounded by `bounds`),
  never worse than the greedy; `time_limit` is the wall-clock budget for the whole plan, and the plan says whether
  it is proven optimal (`Plan.optimal`, `Plan.bound`).
* `greedy`: the fast heuristic (`greedy`): four pod orders, the best plan wins.

Both work on the vocabulary in `model` (inputs, `Plan`, `plan_violations`), the pods' eligibility in `pods` and the
per-GPU working states in `gpus`; the exact planner's columns come from `layouts`, its plan per GPU from `disagg`.
What is remembered between plans (layout universes, GPU classes' options, placements, the HiGHS loader) belongs to
the `Planner` object, so a controller keeps one and a one-shot `plan` starts clean. The exceptions are two bounded
memos in `model` (`bound_requests`, `base_view`) of what the caller's own Pod and Node objects parse to, keyed on
their identity and resourceVersion: they can change no plan, only skip re-parsing (to move into the `Planner`).

Objective, lexicographic, for both: (1) pods made schedulable, priority level by priority level, (2) fewest
instances created plus destroyed, (3) least fragmentation. Instances in use are never moved; layouts are placed
exactly (`kubegpu.gpu.geometry`); node selectors, affinity and taints go through `kubegpu.scheduling.fits`.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Sequence
from typing import Any

from kubegpu.errors import ConfigError
from kubegpu.partitioner.planner.gpus import GpuCache
from kubegpu.partitioner.planner.greedy import greedy_plan, greedy_solve, prepare
from kubegpu.partitioner.planner.layouts import LayoutCache
from kubegpu.partitioner.planner.model import (
    UNLIMITED,
    CurrentInstance,
    GpuInput,
    GpuPlan,
    Mode,
    MpsSlice,
    NodeInput,
    NodePlan,
    Plan,
    is_partition_resource,
    mig_resource,
    mps_resource,
    plan_violations,
    pod_priority,
    scheduling_view,
)
from kubegpu.scheduling import pod_key

PLANNERS = ("exact", "greedy")
DEFAULT_PLANNER = "exact"
DEFAULT_TIME_LIMIT_S = 1.0

__all__ = [
    "DEFAULT_PLANNER",
    "DEFAULT_TIME_LIMIT_S",
    "PLANNERS",
    "UNLIMITED",
    "CurrentInstance",
    "GpuInput",
    "GpuPlan",
    "Mode",
    "MpsSlice",
    "NodeInput",
    "NodePlan",
    "Plan",
    "Planner",
    "check_planner",
    "greedy_plan",
    "is_partition_resource",
    "mig_resource",
    "mps_resource",
    "plan",
    "plan_violations",
    "pod_key",
    "pod_priority",
    "scheduling_view",
]


def check_planner(planner: str, time_limit: float, planner_field: str = "planner",
                  limit_field: str = "time_limit") -> None:
    """ConfigError naming the field for an unknown planner or a time limit that is not a positive number."""
    if planner not in PLANNERS:
        raise ConfigError(f"{planner_field}: must be one of {', '.join(PLANNERS)}, not {planner!r}")
    if not time_limit > 0 or time_limit == float("inf"):  # also rejects NaN
        raise ConfigError(f"{limit_field}: must be a number of seconds > 0, got {time_limit}")


class Planner:
    """A planner and what it remembers between its plans (see module doc): one per controller, so successive
    plans of a cluster reuse the layout options of GPUs that kept their shape; nothing is shared between two."""

    def __init__(self, planner: str = DEFAULT_PLANNER, time_limit: float = DEFAULT_TIME_LIMIT_S) -> None:
        check_planner(planner, time_limit)
        self.planner = planner
        self.time_limit = time_limit
        self.gpus = GpuCache()
        self.layouts = LayoutCache()
        self._loader: Any = None  # the HiGHS loader, made when the exact planner first runs (imports highspy)

    def plan(self, nodes: Sequence[NodeInput], pods: Sequence[dict[str, Any]]) -> Plan:
        """Choose new layouts for `nodes` so that as many of the pending `pods` as possible fit (see module doc)."""
        # The cyclic garbage collector is paused for the plan: a plan allocates hundreds of thousands of small,
        # short-lived objects (freed by reference counting), and on a fleet the collections they trigger walked the
        # caller's whole heap (every node and pod) over and over: a tenth or more of a plan's time.
        collecting = gc.isenabled()
        gc.disable()
        try:
            if self.planner == "greedy":
                return greedy_solve(prepare(nodes, pods, self.gpus))
            from kubegpu.highs import HighsLoader
            from kubegpu.partitioner.planner.exact import exact_solve  # imports highspy: only the exact one needs it

            if self._loader is None:
                self._loader = HighsLoader()
            self._loader.warm_up()  # loading HiGHS is once per process, not part of a plan's budget
            started = time.perf_counter()  # the budget covers everything from here: parsing, model, solver, plans
            return exact_solve(prepare(nodes, pods, self.gpus), self.time_limit, started, self.layouts, self._loader)
        finally:
            if collecting:
                gc.enable()


def plan(nodes: Sequence[NodeInput], pods: Sequence[dict[str, Any]], planner: str = DEFAULT_PLANNER,
         time_limit: float = DEFAULT_TIME_LIMIT_S) -> Plan:
    """One plan by a fresh `Planner` (see module doc): nothing is remembered from or for other plans."""
    return Planner(planner, time_limit).plan(nodes, pods)
