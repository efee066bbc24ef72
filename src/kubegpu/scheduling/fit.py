"""Would this pod fit on this node? kube-scheduler's filter plugins for what GPU clusters use.

Filters run in kube-scheduler's default order and, like kube-scheduler, the first failing filter decides a node's
reasons: NodeUnschedulable, NodeName, TaintToleration, NodeAffinity (nodeSelector plus required node affinity),
NodeResourcesFit (every resource the pod requests, extended resources included; all short resources are listed).
Reasons are worded as kube-scheduler words them, so users recognise them from `kubectl describe pod`.

Speed: the simulator asks millions of times, so everything read from a pod is parsed once into a `PodRequirements`
(`pod_requirements(pod)`), which `fits`, the scores and `select_node` accept in place of the pod dict. Passing a dict
works too; it is parsed on every call.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kubegpu.errors import ConfigError, NotFoundError
from kubegpu.kube.selectors import NodeSelectorTerm, node_selector_terms
from kubegpu.scheduling.pods import is_finished
from kubegpu.scheduling.quantity import parse_quantity
from kubegpu.scheduling.requests import pod_requests

UNSCHEDULABLE_TAINT = {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}
FILTERING_EFFECTS = frozenset({"NoSchedule", "NoExecute"})
REASON_UNSCHEDULABLE = "node(s) were unschedulable"
REASON_NODE_NAME = "node(s) didn't match the requested node name"
REASON_AFFINITY = "node(s) didn't match Pod's node affinity/selector"
REASON_TOO_MANY_PODS = "Too many pods"
_FIRST_RESOURCES = ("pods", "cpu", "memory", "ephemeral-storage")


@dataclass(frozen=True, slots=True)
class PodRequirements:
    """Everything the filters and scores read from a pod, parsed once (see the module docstring)."""

    pod: Mapping[str, Any]
    requests: dict[str, float]
    node_name: str | None
    node_selector: tuple[tuple[str, str], ...]
    affinity_terms: tuple[NodeSelectorTerm, ...] | None  # None: the pod has no required node affinity
    tolerations: tuple[Mapping[str, Any], ...]
    tolerates_unschedulable: bool


@dataclass
class FitResult:
    ok: bool
    reasons: list[str] = field(default_factory=list)

    def __bool__(self) -> bool:
        return self.ok


@dataclass
class NodeInfo:
    """A node and what its pods already take: the scheduler's view of one node.

    ``allocatable`` is parsed from ``node.status.allocatable`` once (`node_info`); if the node's allocatable changes
    (a new MIG layout), build a new NodeInfo. Labels, taints and ``spec.unschedulable`` are read from ``node`` live.
    """

    node: dict[str, Any]
    allocatable: dict[str, float]
    requested: dict[str, float] = field(default_factory=dict)
    pods: list[dict[str, Any]] = field(default_factory=list)

    @property
    def name(self) -> str:
        return str((self.node.get("metadata") or {}).get("name", ""))

    def free(self, resource: str) -> float:
        """Allocatable minus requested: what another pod could still get."""
        return self.allocatable.get(resource, 0.0) - self.requested.get(resource, 0.0)

    def add_pod(self, pod: dict[str, Any], requests: Mapping[str, float] | None = None) -> None:
        """Count a pod bound to this node (``requests``: its `pod_requests`, when the caller has them already)."""
        amounts = pod_requests(pod) if requests is None else requests
        used = self.requested
        for name, amount in amounts.items():
            used[name] = used.get(name, 0.0) + amount
        self.pods.append(pod)

    def remove_pod(self, pod: Mapping[str, Any], requests: Mapping[str, float] | None = None) -> None:
        """Stop counting a pod (found by identity, uid, or namespace and name); NotFoundError if it is not here."""
        index = self._index_of(pod)
        stored = self.pods.pop(index)
        amounts = pod_requests(stored) if requests is None else requests
        used = self.requested
        for name, amount in amounts.items():
            left = used.get(name, 0.0) - amount
            # Float sums of milli-cpu drift by ~1e-17; snap to zero so an empty node reads as empty.
            used[name] = 0.0 if abs(left) < 1e-9 else left

    def _index_of(self, pod: Mapping[str, Any]) -> int:
        for index, stored in enumerate(self.pods):
            if stored is pod:
                return index
        uid, namespace, name = _pod_key(pod)
        for index, stored in enumerate(self.pods):
            stored_uid, stored_namespace, stored_name = _pod_key(stored)
            if uid and stored_uid:
                if uid == stored_uid:
                    return index
            elif (namespace, name) == (stored_namespace, stored_name):
                return index
        raise NotFoundError(f"pod {namespace}/{name} is not counted on node {self.name}")


def node_info(node: dict[str, Any], pods: Iterable[dict[str, Any]] = ()) -> NodeInfo:
    """A NodeInfo from a Node object and the pods bound to it.

    Allocatable comes from ``status.allocatable`` — a node that lists no ``pods`` there takes no pods ("Too many
    pods"), exactly as kube-scheduler treats it. Pods that have finished (phase Succeeded or Failed) hold no
    resources, as in kube-scheduler's cache, and are not counted.
    """
    name = (node.get("metadata") or {}).get("name", "<unnamed>")
    raw = (node.get("status") or {}).get("allocatable") or {}
    allocatable: dict[str, float] = {}
    for resource, value in raw.items():
        try:
            allocatable[resource] = parse_quantity(value)
        except ConfigError as exc:
            raise ConfigError(f"node {name}: status.allocatable.{resource}: {exc}") from None
    info = NodeInfo(node=node, allocatable=allocatable)
    for pod in pods:
        if not is_finished(pod):
            info.add_pod(pod)
    return info


def pod_requirements(pod: Mapping[str, Any], requests: Mapping[str, float] | None = None) -> PodRequirements:
    """Parse a pod once for `fits`/scores; ``requests`` skips recomputing `pod_requests`. ConfigError on a bad spec."""
    spec = pod.get("spec") or {}
    amounts = pod_requests(pod) if requests is None else dict(requests)
    ordered = {name: amounts[name] for name in _FIRST_RESOURCES if name in amounts}
    ordered.update((name, amounts[name]) for name in sorted(amounts) if name not in ordered)
    tolerations = tuple(spec.get("tolerations") or ())
    for index, toleration in enumerate(tolerations):
        if not isinstance(toleration, Mapping):
            raise ConfigError(f"{_where(pod)}: spec.tolerations[{index}]: expected a mapping, got {toleration!r}")
    selector = spec.get("nodeSelector") or {}
    if not isinstance(selector, Mapping):
        raise ConfigError(f"{_where(pod)}: spec.nodeSelector: expected a mapping of label to value, got {selector!r}")
    return PodRequirements(
        pod=pod,
        requests=ordered,
        node_name=spec.get("nodeName") or None,
        node_selector=tuple((str(key), str(value)) for key, value in selector.items()),
        affinity_terms=_required_affinity(spec, _where(pod)),
        tolerations=tolerations,
        tolerates_unschedulable=tolerates(tolerations, UNSCHEDULABLE_TAINT),
    )


def fits(
    pod: Mapping[str, Any] | PodRequirements, info: NodeInfo, requests: Mapping[str, float] | None = None
) -> FitResult:
    """kube-scheduler's verdict for one pod on one node, with its reasons when it does not fit."""
    need = pod if isinstance(pod, PodRequirements) else pod_requirements(pod, requests)
    node = info.node
    spec = node.get("spec") or {}
    if spec.get("unschedulable") and not need.tolerates_unschedulable:
        return FitResult(False, [REASON_UNSCHEDULABLE])
    metadata = node.get("metadata") or {}
    if need.node_name is not None and need.node_name != metadata.get("name"):
        return FitResult(False, [REASON_NODE_NAME])
    taints = spec.get("taints")
    if taints:
        untolerated = _first_untolerated(need.tolerations, taints)
        if untolerated is not None:
            return FitResult(False, [untolerated_taint_reason(untolerated)])
    if need.node_selector or need.affinity_terms is not None:
        labels = metadata.get("labels") or {}
        if not _matches_affinity(need, labels, metadata.get("name")):
            return FitResult(False, [REASON_AFFINITY])
    short = insufficient_resources(need.requests, info)
    if short:
        return FitResult(False, short)
    return FitResult(True, [])


def untolerated_taint_reason(taint: Mapping[str, Any]) -> str:
    """TaintToleration's reason, e.g. ``node(s) had untolerated taint {nvidia.com/gpu: present}``."""
    return f"node(s) had untolerated taint {{{taint.get('key', '')}: {taint.get('value', '')}}}"


def insufficient_resources(requests: Mapping[str, float], info: NodeInfo) -> list[str]:
    """NodeResourcesFit's reasons: one per resource the node cannot supply ([] when everything fits)."""
    allocatable = info.allocatable
    used = info.requested
    short: list[str] = []
    for name, amount in requests.items():
        free = allocatable.get(name, 0.0) - used.get(name, 0.0)
        # Relative slack absorbs float drift in sums like 3 x 0.1 cpu against 0.3 allocatable.
        if amount > free + 1e-9 * (amount + 1.0):
            short.append(REASON_TOO_MANY_PODS if name == "pods" else f"Insufficient {name}")
    return short


def match_node_selector_terms(
    terms: Sequence[Mapping[str, Any]], labels: Mapping[str, str], node_name: str | None = None
) -> bool:
    """True when any term matches (terms are ORed; a term's expressions and fields are ANDed).

    ``node_name`` is what ``matchFields`` on ``metadata.name`` compares; an empty list of terms matches nothing.
    """
    compiled = node_selector_terms(terms, "nodeSelectorTerms")
    return any(term.matches(labels, node_name) for term in compiled)


def tolerates(tolerations: Iterable[Mapping[str, Any]], taint: Mapping[str, Any]) -> bool:
    """True when some toleration tolerates the taint (k8s Toleration.ToleratesTaint semantics).

    An empty effect matches every effect; an empty key with operator Exists matches every key; operator Equal (or
    none) also needs equal values.
    """
    return any(_tolerates_one(toleration, taint) for toleration in tolerations)


def _tolerates_one(toleration: Mapping[str, Any], taint: Mapping[str, Any]) -> bool:
    effect = toleration.get("effect") or ""
    if effect and effect != taint.get("effect", ""):
        return False
    key = toleration.get("key") or ""
    if key and key != taint.get("key", ""):
        return False
    operator = toleration.get("operator") or "Equal"
    if operator == "Exists":
        return True
    if operator == "Equal":
        return (toleration.get("value") or "") == (taint.get("value") or "")
    return False


def _first_untolerated(
    tolerations: Sequence[Mapping[str, Any]], taints: Iterable[Mapping[str, Any]]
) -> Mapping[str, Any] | None:
    for taint in taints:
        if taint.get("effect") in FILTERING_EFFECTS and not tolerates(tolerations, taint):
            return taint
    return None


def _matches_affinity(need: PodRequirements, labels: Mapping[str, str], node_name: str | None) -> bool:
    for key, value in need.node_selector:
        if labels.get(key) != value:
            return False
    terms = need.affinity_terms
    if terms is None:
        return True
    return any(term.matches(labels, node_name) for term in terms)


def _required_affinity(spec: Mapping[str, Any], where: str) -> tuple[NodeSelectorTerm, ...] | None:
    node_affinity = (spec.get("affinity") or {}).get("nodeAffinity") or {}
    required = node_affinity.get("requiredDuringSchedulingIgnoredDuringExecution")
    if required is None:
        return None
    path = f"{where}: spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms"
    return node_selector_terms(required.get("nodeSelectorTerms") or [], path)


def _pod_key(pod: Mapping[str, Any]) -> tuple[str, str, str]:
    metadata = pod.get("metadata") or {}
    return (metadata.get("uid") or "", metadata.get("namespace") or "default", metadata.get("name") or "")


def _where(pod: Mapping[str, Any]) -> str:
    metadata = pod.get("metadata") or {}
    name = metadata.get("name") or "<unnamed>"
    namespace = metadata.get("namespace")
    return f"pod {namespace}/{name}" if namespace else f"pod {name}"
