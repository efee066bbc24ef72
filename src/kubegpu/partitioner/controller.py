"""The partitioner controller: batches pending pods, plans on a snapshot, writes desired layouts to nodes.

Driven by `tick(now)` on a `Cluster`, so the same code runs against a real API server (the `kubegpu partitioner`
loop), the in-memory store in tests, and the simulator's virtual clock. Differences from nos (reference §3.3):
a node whose last plan is not applied yet is left out of the next plan instead of blocking every node, and pods
the in-flight plan already serves are not planned twice; unknown GPU models and impossible requests become Events,
never crashes.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

from kubegpu.errors import KubegpuError
from kubegpu.kube import Cluster, record_event
from kubegpu.kube.batching import Batcher
from kubegpu.kube.informer import cache_trusted
from kubegpu.kube.leader import LeaderElector
from kubegpu.metrics import PartitionerMetrics
from kubegpu.partitionagent import annotations as ann
from kubegpu.partitioner.facts import (
    Key,
    NodeFacts,
    ObjectIndex,
    PodFacts,
    ReportMemo,
    VersionMemo,
    could_help,
    in_flight,
    node_input,
    pod_facts,
    reported_gpus,
)
from kubegpu.partitioner.planner import DEFAULT_PLANNER, DEFAULT_TIME_LIMIT_S, NodeInput, Plan, Planner
from kubegpu.partitioner.snapshot import optimality_line
from kubegpu.scheduling import pod_key

__all__ = ["COMPONENT", "LEASE_NAME", "NodeFacts", "PartitionerController", "PodFacts", "TickResult", "VersionMemo",
           "could_help", "in_flight", "node_input", "reported_gpus"]

log = logging.getLogger("kubegpu.partitioner")
COMPONENT = "kubegpu-partitioner"
LEASE_NAME = "kubegpu-partitioner"


# --- the controller -------------------------------------------------------------------------------------------


@dataclass
class TickResult:
    leader: bool
    planned: bool = False
    plan_id: str | None = None
    written: list[str] = field(default_factory=list)  # nodes given a new desired layout
    plan: Plan | None = None
    skipped: bool = False  # the window closed on the same input as the last plan, which changed nothing


@dataclass
class PartitionerController:
    cluster: Cluster
    identity: str = "partitioner"
    batch_timeout: float = 60.0
    batch_idle: float = 10.0
    lease_duration: float = 15.0
    elector: LeaderElector | None = None
    metrics: PartitionerMetrics | None = None
    planner: str = DEFAULT_PLANNER  # "exact" (HiGHS) or "greedy"
    time_limit: float = DEFAULT_TIME_LIMIT_S  # seconds the exact planner may search per plan
    skip_futile_plans: bool = False  # the simulator's shortcut, see the note after next_deadline
    batcher: Batcher = field(init=False)
    _planner: Planner = field(init=False)  # what it remembers between plans is this controller's
    _futile: tuple[Any, ...] | None = None  # the input of the last plan, when it changed nothing
    _last_plan_id: int = 0
    _serving: dict[str, str] = field(default_factory=dict)  # pod key → node whose in-flight plan serves it
    _reported: set[tuple[str, str]] = field(default_factory=set)  # (object, reason) already turned into an Event
    _pods: ObjectIndex[PodFacts] = field(default_factory=lambda: ObjectIndex("Pod", pod_facts))
    _nodes: ObjectIndex[NodeFacts] = field(default_factory=lambda: ObjectIndex("Node", NodeFacts))
    # kept from the two indexes, change by change: what a pass reads without looking at every object
    _opted_in: dict[Key, tuple[dict[str, Any], NodeFacts]] = field(default_factory=dict)
    _bad_labels: dict[Key, tuple[dict[str, Any], str]] = field(default_factory=dict)
    _helping: dict[Key, tuple[dict[str, Any], PodFacts]] = field(default_factory=dict)  # pods a re-cut could help
    _bound: dict[str, dict[Key, dict[str, Any]]] = field(default_factory=dict)  # node → pods bound there
    _report_memo: ReportMemo = field(default_factory=ReportMemo)

    def __post_init__(self) -> None:
        self._planner = Planner(self.planner, self.time_limit)
        self.batcher = Batcher(window=self.batch_timeout, idle=self.batch_idle)
        if self.elector is None:
            self.elector = LeaderElector(self.cluster, self.identity, LEASE_NAME, lease_duration=self.lease_duration)

    def tick(self, now: float) -> TickResult:
        """One reconcile pass: keep the lease, feed the batch, and plan when the window closes."""
        assert self.elector is not None
        if not self.elector.try_acquire(now):
            self.batcher.reset()
            return TickResult(leader=False)
        if not cache_trusted(self.cluster):  # watches broken too long: no plan on a view that may be minutes old
            return TickResult(leader=True)
        self._read_nodes()
        self._read_pods()
        for key in sorted(self._bad_labels):  # a typo would otherwise leave the node silently out
            node, message = self._bad_labels[key]
            self._event_once(node, "PartitioningSkipped", message)
        self._forget_served()
        pending_keys = {facts.key for _, facts in self._helping.values()} - self._serving.keys()
        self.batcher.discard(self.batcher.items - pending_keys)
        self.batcher.add(pending_keys, now)
        if not self.batcher.ready(now):
            return TickResult(leader=True)
        self.batcher.reset()
        return self._plan_and_write(now)

    def _read_nodes(self) -> None:
        """Bring the opted-in nodes (and those with a bad opt-in label) up to date with the cluster."""
        changed = self._nodes.refresh(self.cluster)
        items = self._nodes.items
        if changed is None:
            self._opted_in, self._bad_labels = {}, {}
            keys: Any = sorted(items)
        else:
            keys = [key for key, _ in changed]
        for key in keys:
            self._opted_in.pop(key, None)
            self._bad_labels.pop(key, None)
            entry = items.get(key)
            if entry is None:
                continue
            node, facts = entry
            if facts.mode is not None:
                self._opted_in[key] = entry
            elif facts.bad_label is not None:
                self._bad_labels[key] = (node, facts.bad_label)

    def _read_pods(self) -> None:
        """Bring the pods a re-cut could help, and each node's bound pods, up to date with the cluster."""
        changed = self._pods.refresh(self.cluster)
        items = self._pods.items
        if changed is None:
            self._helping, self._bound = {}, {}
            updates: Any = [(key, None) for key in items]
        else:
            updates = changed
        helping, bound = self._helping, self._bound
        for key, before in updates:
            if before is not None:
                helping.pop(key, None)
                if before.bound_to is not None:
                    on_node = bound.get(before.bound_to)
                    if on_node is not None:
                        on_node.pop(key, None)
                        if not on_node:
                            del bound[before.bound_to]
            entry = items.get(key)
            if entry is None:
                continue
            pod, facts = entry
            if facts.helps:
                helping[key] = entry
            if facts.bound_to is not None:
                bound.setdefault(facts.bound_to, {})[key] = pod

    def next_deadline(self) -> float | None:
        return self.batcher.deadline()

    # With `skip_futile_plans`, a window that closes on exactly the input of the last plan (same pending pods, same
    # nodes, layouts, usage and bound pods) when that plan changed nothing is not planned again: a deterministic
    # planner would change nothing again, and every Event it could raise has been raised. It matters in the
    # simulator, where pods can stay unservable for simulated hours and a window closes every few seconds; a real
    # cluster keeps it off, so every window counts in kubegpu_partitioner_plans_total.

    def _forget_served(self) -> None:
        if self._serving:
            busy = {node["metadata"]["name"] for node, facts in self._opted_in.values() if facts.in_flight}
            self._serving = {k: v for k, v in self._serving.items() if v in busy}

    def _plan_and_write(self, now: float) -> TickResult:
        """Plan for the pods waiting (in namespace/name order, as listed) on the nodes not in flight (by name)."""
        bound = self._bound
        inputs = []
        for node, node_seen in sorted(self._opted_in.values(), key=lambda n: n[0]["metadata"]["name"]):
            if node_seen.in_flight or node_seen.mode is None:
                continue
            gpus, errors = node_seen.report(self._report_memo)
            for error in errors:
                self._event_once(node, "PartitioningStatusInvalid", error)
            if gpus:
                name = node["metadata"]["name"]
                on_node = bound.get(name, {})
                inputs.append(NodeInput(name=name, mode=node_seen.mode, node=node, gpus=gpus,
                                        pods=tuple(on_node[key] for key in sorted(on_node))))
        pending_facts = [self._helping[key] for key in sorted(self._helping)
                         if self._helping[key][1].key not in self._serving]
        pending = [pod for pod, _ in pending_facts]
        signature = (tuple(facts.key for _, facts in pending_facts), tuple(inputs))
        if self.skip_futile_plans and signature == self._futile:
            return TickResult(leader=True, skipped=True)
        started = time.perf_counter()
        result = self._planner.plan(inputs, pending)
        plan_seconds = time.perf_counter() - started
        self._futile = None if any(n.changed for n in result.nodes.values()) else signature
        plan_id = self._next_plan_id(now)
        written = []
        for view in inputs:
            self._report_gpu_errors(view, result)
            node_plan = result.nodes[view.name]
            if not node_plan.changed:
                continue
            self._write_spec(view, result, plan_id)
            self._plan_event(view, result, plan_id)
            written.append(view.name)
        for key, where in result.assignments.items():
            if where in written:
                self._serving[key] = where
        self._report_unschedulable(pending, result)
        self._record_metrics(result, written, plan_seconds)
        if written:
            log.info("plan %s: %d pods fit, re-cut %s", plan_id, len(result.assignments), ", ".join(written))
        return TickResult(leader=True, planned=True, plan_id=plan_id, written=written, plan=result)

    def _plan_event(self, view: NodeInput, result: Plan, plan_id: str) -> None:
        """An Event on each re-cut node: which planner made the plan and whether it is proven optimal."""
        message = f"plan {plan_id}: {len(result.assignments)} pods fit; {optimality_line(result)}"
        try:
            record_event(self.cluster, view.node, "PartitioningPlanned", message, component=COMPONENT)
        except KubegpuError as exc:  # an Event is a courtesy; failing to write one must not stop planning
            log.warning("cannot record event on node %s: %s", view.name, exc)

    def _record_metrics(self, result: Plan, written: list[str], plan_seconds: float) -> None:
        if self.metrics is None:
            return
        self.metrics.plans.labels(result="applied" if written else "nothing-to-do").inc()
        self.metrics.pods_made_schedulable.inc(sum(1 for where in result.assignments.values() if where in written))
        self.metrics.plan_seconds.set(plan_seconds)

    def _next_plan_id(self, now: float) -> str:
        self._last_plan_id = max(self._last_plan_id + 1, int(now * 1000))
        return str(self._last_plan_id)

    def _write_spec(self, view: NodeInput, result: Plan, plan_id: str) -> None:
        node_plan = result.nodes[view.name]
        models = {g.index: g.model for g in view.gpus}
        gpus = []
        for gpu in node_plan.gpus:
            model = models.get(gpu.index)
            if gpu.error or model is None:
                continue
            gpus.append((gpu.index, model, list(gpu.slices) if view.mode == "mps" else list(gpu.instances)))
        current = (view.node.get("metadata") or {}).get("annotations") or {}
        patch = ann.replace_family(current, ann.spec_annotations(view.mode, gpus, plan_id), "spec")
        self.cluster.patch("Node", view.name, {"metadata": {"annotations": patch}})

    def _report_gpu_errors(self, view: NodeInput, result: Plan) -> None:
        for gpu in result.nodes[view.name].gpus:
            if gpu.error:
                self._event_once(view.node, "PartitioningSkipped", f"GPU {gpu.index}: {gpu.error}")

    def _report_unschedulable(self, pending: list[dict[str, Any]], result: Plan) -> None:
        """An Event once per pod and reason: what no re-cut can fix is worth telling the user about."""
        for pod in pending:
            key = pod_key(pod)
            if key in result.impossible:
                self._event_once(pod, "PartitioningImpossible", result.unschedulable[key])

    def _event_once(self, obj: dict[str, Any], reason: str, message: str) -> None:
        meta = obj.get("metadata") or {}
        key = (f"{obj.get('kind')}/{meta.get('namespace')}/{meta.get('name')}", message)
        if key in self._reported:
            return
        self._reported.add(key)
        log.warning("%s: %s", key[0], message)
        try:
            record_event(self.cluster, obj, reason, message, component=COMPONENT)
        except KubegpuError as exc:  # an Event is a courtesy; failing to write one must not stop planning
            log.warning("cannot record event on %s: %s", key[0], exc)

