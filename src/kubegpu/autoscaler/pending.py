"""Pending pods as the provisioning simulation reads them: parsed once, keyed, ordered the way Karpenter orders them.

Split from scheduler.py so the solver reads as the placement logic alone; a pod whose spec cannot be read is
refused here with one line naming it, before any placement starts.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kubegpu.autoscaler import labels as L
from kubegpu.autoscaler.claims import PodClaims, uses_claims
from kubegpu.autoscaler.requirements import Requirements, pod_requirement_options
from kubegpu.autoscaler.topology import PodTopology, pod_topology
from kubegpu.errors import ConfigError, KubegpuError
from kubegpu.kube.selectors import LabelSelector, label_selector
from kubegpu.scheduling import NodeInfo, container_requests, pod_key, pod_requests

GPU_PREFIX = "nvidia.com/"


@dataclass
class PendingPod:
    pod: dict[str, Any]
    requests: dict[str, float]
    options: list[Requirements]
    tolerations: list[dict[str, Any]]
    anti_key: str | None
    shape: str
    topo: PodTopology | None = None
    rule_key: str = ""   # what decides placement besides the requests (pods with topology terms only)
    anti_terms: tuple[AntiTerm, ...] = ()  # required hostname anti-affinity, compiled
    claims: PodClaims | None = None  # DRA claims to allocate (set by the scheduler when the pod has any)


@dataclass(frozen=True)
class AntiTerm:
    """One required hostname anti-affinity term: pods it selects (namespaces None: in any namespace) repel the pod."""

    selector: LabelSelector
    namespaces: frozenset[str] | None


def _anti_affinity_terms(pod: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The pod's required anti-affinity terms on the hostname (other topology keys are not modelled here)."""
    terms = (((pod.get("spec") or {}).get("affinity") or {}).get("podAntiAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution") or []
    return [t for t in terms if t.get("topologyKey") == L.HOSTNAME_LABEL]


def _anti_affinity_key(terms: list[Mapping[str, Any]]) -> str | None:
    """Required hostname anti-affinity: pods sharing this key never share a node."""
    keys = [json.dumps(t.get("labelSelector") or {}, sort_keys=True) for t in terms]
    return "|".join(sorted(keys)) or None


def _anti_affinity(pod: Mapping[str, Any], terms: list[Mapping[str, Any]]) -> tuple[AntiTerm, ...]:
    """Each term's selector (the one matcher, matchExpressions included) and the namespaces it looks at: `namespaces`,
    else the pod's own; any `namespaceSelector` is read as every namespace — the safe side, since a pod planned onto
    a node kube-scheduler then refuses stays pending while the autoscaler thinks it is served."""
    own = str((pod.get("metadata") or {}).get("namespace", "default"))
    out = []
    for index, term in enumerate(terms):
        where = f"pod {pod_key(pod)}: spec.affinity.podAntiAffinity.requiredDuringSchedulingIgnoredDuringExecution"
        selector = label_selector(term.get("labelSelector"), f"{where}[{index}].labelSelector")
        if selector is None:  # a null selector selects no pod
            continue
        namespaces = None if term.get("namespaceSelector") is not None else \
            frozenset(str(n) for n in term.get("namespaces") or ()) or frozenset({own})
        out.append(AntiTerm(selector, namespaces))
    return tuple(out)


def repels(item: PendingPod, other: Mapping[str, Any]) -> bool:
    """Whether `item`'s required hostname anti-affinity forbids sharing a node with pod `other`."""
    meta = other.get("metadata") or {}
    namespace = str(meta.get("namespace", "default"))
    labels = meta.get("labels") or {}
    return any((term.namespaces is None or namespace in term.namespaces) and term.selector.matches(labels)
               for term in item.anti_terms)


def prepare_pod(pod: dict[str, Any]) -> PendingPod:
    """Parse a pod once; ConfigError naming the pod when its resources or node affinity cannot be read."""
    spec = pod.get("spec") or {}
    try:
        requests = pod_requests(pod)
        _reject_negative(pod)
    except (TypeError, AttributeError, ValueError) as exc:  # a spec of the wrong shape, not a bad quantity
        raise ConfigError(f"pod {pod_key(pod)}: spec / containers / resources: cannot be read "
                          f"({type(exc).__name__}: {exc})") from None
    try:
        tolerations = list(spec.get("tolerations") or [])
        if not all(isinstance(t, dict) for t in tolerations):
            raise TypeError("every toleration must be a mapping")
        anti_raw = _anti_affinity_terms(pod)
        anti = _anti_affinity_key(anti_raw)
        anti_terms = _anti_affinity(pod, anti_raw)
        options = pod_requirement_options(pod)
        shape = json.dumps([sorted(requests.items()), spec.get("nodeSelector"), spec.get("affinity"), tolerations,
                            anti, spec.get("resourceClaims")], sort_keys=True, default=str)
        topo = pod_topology(pod)
        rule_key = ""
        if topo is not None:
            rule_key = json.dumps([spec.get("nodeSelector"), spec.get("affinity"), tolerations, anti],
                                  sort_keys=True, default=str) + topo.signature()
            shape += rule_key
    except (ValueError, KeyError, TypeError, AttributeError, StopIteration) as exc:
        raise ConfigError(f"pod {pod_key(pod)}: spec.affinity / nodeSelector / tolerations: cannot be read "
                          f"({type(exc).__name__}: {exc})") from None
    return PendingPod(pod, requests, options, tolerations, anti, shape, topo, rule_key, anti_terms)


def _reject_negative(pod: dict[str, Any]) -> None:
    """The API server refuses negative quantities; a summed total could hide one, so look per container."""
    spec = pod.get("spec") or {}
    for kind in ("containers", "initContainers"):
        for index, container in enumerate(spec.get(kind) or ()):
            for name, amount in container_requests(container).items():
                if amount < 0:
                    raise ConfigError(f"pod {pod_key(pod)}: spec.{kind}[{index}].resources.{name}: "
                                      f"must not be negative")


def pod_problem(pod: dict[str, Any]) -> str | None:
    """Why the provisioner cannot read this pod (one line), or None."""
    try:
        prepare_pod(pod)
    except KubegpuError as exc:
        return str(exc)
    return None


def queue_order(item: PendingPod) -> tuple[Any, ...]:
    gpu = sum(v for k, v in item.requests.items() if k.startswith(GPU_PREFIX))
    meta = item.pod.get("metadata") or {}
    return (-(gpu > 0 or uses_claims(item.pod)), -item.requests.get("cpu", 0.0), -item.requests.get("memory", 0.0),
            str(meta.get("creationTimestamp", "")), str(meta.get("uid", "")), pod_key(item.pod))



def node_zone(info: NodeInfo) -> str | None:
    zone = ((info.node.get("metadata") or {}).get("labels") or {}).get(L.ZONE_LABEL)
    return str(zone) if zone is not None else None


def pod_zones(item: PendingPod) -> set[str] | None:
    """The zones the pod's own node affinity allows (its first option), for the spread minimum; None: all."""
    zone = item.options[0].get(L.ZONE_LABEL) if item.options else None
    if zone is None or zone.complement:
        return None
    return set(zone.values)

