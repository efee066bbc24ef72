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
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from kubegpu.errors import KubegpuError, NotFoundError
from kubegpu.gpu.catalog import get_model
from kubegpu.kube import Cluster, record_event
from kubegpu.kube.batching import Batcher
from kubegpu.kube.leader import LeaderElector
from kubegpu.metrics import PartitionerMetrics
from kubegpu.partitionagent import annotations as ann
from kubegpu.partitionagent.annotations import node_mode
from kubegpu.partitioner.planner import (
    DEFAULT_PLANNER,
    DEFAULT_TIME_LIMIT_S,
    CurrentInstance,
    GpuInput,
    Mode,
    MpsSlice,
    NodeInput,
    Plan,
    Planner,
    is_partition_resource,
)
from kubegpu.partitioner.snapshot import optimality_line
from kubegpu.scheduling import is_finished, is_scheduling_gated, pod_key, pod_requests

log = logging.getLogger("kubegpu.partitioner")
T = TypeVar("T")
COMPONENT = "kubegpu-partitioner"
LEASE_NAME = "kubegpu-partitioner"


# --- pods and nodes -------------------------------------------------------------------------------------------


def could_help(pod: Mapping[str, Any]) -> bool:
    """A pending, unbound pod asking for a MIG or MPS slice, not owned by a DaemonSet, not nominated anywhere."""
    spec, status = pod.get("spec") or {}, pod.get("status") or {}
    if spec.get("nodeName") or status.get("nominatedNodeName"):
        return False
    if (status.get("phase") or "Pending") != "Pending" or is_scheduling_gated(pod):
        return False
    owners = (pod.get("metadata") or {}).get("ownerReferences") or []
    if any(o.get("kind") == "DaemonSet" for o in owners):
        return False
    for cond in status.get("conditions") or []:
        if cond.get("type") == "PodScheduled" and cond.get("status") == "True":
            return False
    try:
        return any(is_partition_resource(r) for r in pod_requests(pod))
    except KubegpuError:
        return False


def in_flight(node: Mapping[str, Any]) -> bool:
    """The node has been given a plan its agent has not reported yet."""
    annotations = (node.get("metadata") or {}).get("annotations") or {}
    spec = annotations.get(ann.SPEC_PLAN)
    return spec is not None and annotations.get(ann.STATUS_PLAN) != spec


def node_input(node: dict[str, Any], pods: Iterable[dict[str, Any]]) -> tuple[NodeInput | None, list[str]]:
    """The planner's view of a node, rebuilt from the agent's status annotations (None until it has reported)."""
    mode = node_mode(node)
    if mode is None:
        return None, []
    gpus, errors = reported_gpus(node, mode)
    if not gpus:
        return None, errors
    return NodeInput(name=node["metadata"]["name"], mode=mode, node=node, gpus=gpus, pods=tuple(pods)), errors


def reported_gpus(node: Mapping[str, Any], mode: str) -> tuple[tuple[GpuInput, ...], list[str]]:
    """The GPUs the agent reported in the node's status annotations, and the lines it could not read."""
    annotations = (node.get("metadata") or {}).get("annotations") or {}
    reported, errors = ann.parse_status(annotations, mode)
    gpus = []
    for gpu in reported:
        try:
            model = get_model(gpu.model_key)
        except NotFoundError:
            model = None
        gpus.append(GpuInput(
            index=gpu.index, model_key=gpu.model_key, model=model,
            instances=tuple(CurrentInstance(i.profile_id, i.start, used) for i, used in gpu.instances),
            slices=tuple(MpsSlice(gb, used) for gb, used in gpu.slices),
        ))
    return tuple(gpus), errors


class VersionMemo(Generic[T]):
    """What a pass derives from each object, kept until the object's resourceVersion changes.

    Every pass re-reads every Node and Pod; between two passes (5 s) only a few change, so deriving each one's facts
    (is the pod one a re-cut could help, where is it bound; what did the node's agent report) once per version
    saves the controller most of its work at fleet scale. Objects are told apart by uid (by namespace and name
    without one); an object without a resourceVersion (hand-built in a test) is derived afresh each time."""

    def __init__(self, derive: Callable[[dict[str, Any]], T]) -> None:
        self._derive = derive
        self._seen: dict[Any, tuple[str, T]] = {}
        self._same: dict[int, tuple[dict[str, Any], T]] = {}  # id → the very object last seen, and its facts

    def of(self, objects: list[dict[str, Any]]) -> list[T]:
        """Each object's facts, in order; what the memo keeps is exactly these objects' (the rest are gone).

        An informer that hands out its cached objects without copying (`InformedCluster(copy=False)`) gives the
        very same dict again until the object changes: that is recognised first, by identity, at the cost of one
        lookup; a copy is recognised by its uid and resourceVersion."""
        seen, same, derive = self._seen, self._same, self._derive
        kept: dict[Any, tuple[str, T]] = {}
        kept_same: dict[int, tuple[dict[str, Any], T]] = {}
        out = []
        for obj in objects:
            hit = same.get(id(obj))
            if hit is not None and hit[0] is obj:
                kept_same[id(obj)] = hit
                out.append(hit[1])
                continue
            meta = obj.get("metadata") or {}
            version = meta.get("resourceVersion")
            if version is None:
                out.append(derive(obj))
                continue
            key = meta.get("uid") or (meta.get("namespace"), meta.get("name"))
            found = seen.get(key)
            if found is None or found[0] != version:
                found = (version, derive(obj))
            kept[key] = found
            kept_same[id(obj)] = (obj, found[1])
            out.append(found[1])
        self._seen, self._same = kept, kept_same
        return out


@dataclass(frozen=True)
class PodFacts:
    """What a pass needs of a pod: its key, whether a re-cut could help it, and the node it holds resources on."""

    key: str
    helps: bool
    bound_to: str | None  # its node while it is bound and not finished


def pod_facts(pod: dict[str, Any]) -> PodFacts:
    where = (pod.get("spec") or {}).get("nodeName")
    return PodFacts(pod_key(pod), could_help(pod), where if where and not is_finished(pod) else None)


class NodeFacts:
    """What a pass needs of a node: how it opted in, a bad opt-in label, a plan in flight, and (read only when a
    plan is made, then kept) the agent's report."""

    def __init__(self, node: dict[str, Any]) -> None:
        self.node = node
        self.mode: Mode | None = node_mode(node)
        value = ((node.get("metadata") or {}).get("labels") or {}).get(ann.PARTITIONING_LABEL)
        self.bad_label = (f"label {ann.PARTITIONING_LABEL}: must be mig or mps, not {value!r}; node left alone"
                          if value is not None and self.mode is None else None)
        self.in_flight = in_flight(node)
        self._report: tuple[tuple[GpuInput, ...], list[str]] | None = None

    def report(self) -> tuple[tuple[GpuInput, ...], list[str]]:
        """The GPUs the agent reported and the lines it could not read (`reported_gpus`)."""
        if self._report is None:
            self._report = reported_gpus(self.node, self.mode) if self.mode is not None else ((), [])
        return self._report


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
    _pod_facts: VersionMemo[PodFacts] = field(default_factory=lambda: VersionMemo(pod_facts))
    _node_facts: VersionMemo[NodeFacts] = field(default_factory=lambda: VersionMemo(NodeFacts))

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
        all_nodes = self.cluster.list("Node")
        nodes = []
        for node, facts in zip(all_nodes, self._node_facts.of(all_nodes), strict=True):
            if facts.mode is not None:
                nodes.append((node, facts))
            elif facts.bad_label is not None:  # a typo would otherwise leave the node silently out
                self._event_once(node, "PartitioningSkipped", facts.bad_label)
        all_pods = self.cluster.list("Pod")
        pods = list(zip(all_pods, self._pod_facts.of(all_pods), strict=True))
        self._forget_served(nodes)
        pending = [(pod, facts) for pod, facts in pods if facts.helps and facts.key not in self._serving]
        pending_keys = {facts.key for _, facts in pending}
        self.batcher.discard(self.batcher.items - pending_keys)
        self.batcher.add(sorted(pending_keys), now)
        if not self.batcher.ready(now):
            return TickResult(leader=True)
        self.batcher.reset()
        return self._plan_and_write(now, nodes, pods, pending)

    def next_deadline(self) -> float | None:
        return self.batcher.deadline()

    # With `skip_futile_plans`, a window that closes on exactly the input of the last plan (same pending pods, same
    # nodes, layouts, usage and bound pods) when that plan changed nothing is not planned again: a deterministic
    # planner would change nothing again, and every Event it could raise has been raised. It matters in the
    # simulator, where pods can stay unservable for simulated hours and a window closes every few seconds; a real
    # cluster keeps it off, so every window counts in kubegpu_partitioner_plans_total.

    def _forget_served(self, nodes: list[tuple[dict[str, Any], NodeFacts]]) -> None:
        if self._serving:
            busy = {node["metadata"]["name"] for node, facts in nodes if facts.in_flight}
            self._serving = {k: v for k, v in self._serving.items() if v in busy}

    def _plan_and_write(self, now: float, nodes: list[tuple[dict[str, Any], NodeFacts]],
                        pods: list[tuple[dict[str, Any], PodFacts]],
                        pending_facts: list[tuple[dict[str, Any], PodFacts]]) -> TickResult:
        bound: dict[str, list[dict[str, Any]]] = {}
        for pod, facts in pods:
            if facts.bound_to is not None:
                bound.setdefault(facts.bound_to, []).append(pod)
        inputs = []
        for node, node_seen in sorted(nodes, key=lambda n: n[0]["metadata"]["name"]):
            if node_seen.in_flight or node_seen.mode is None:
                continue
            gpus, errors = node_seen.report()
            for error in errors:
                self._event_once(node, "PartitioningStatusInvalid", error)
            if gpus:
                name = node["metadata"]["name"]
                inputs.append(NodeInput(name=name, mode=node_seen.mode, node=node, gpus=gpus,
                                        pods=tuple(bound.get(name, ()))))
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

