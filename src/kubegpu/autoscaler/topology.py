"""Pod topology for the provisioning simulation: topology spread constraints and required pod affinity.

Karpenter's semantics, required terms only. A constraint names a topology key (zone or hostname) and a label
selector; the pods it selects are counted per domain (zone, or node / in-flight NodeClaim) over the existing nodes
and the NodeClaims opened in this pass. A `DoNotSchedule` spread term lets a pod into a domain only while
count + (1 if the pod matches its own selector) − the minimum count over the pod's domains ≤ maxSkew; among the
allowed zones it picks the emptiest, and a new NodeClaim's zone is pinned to it. A hostname domain's minimum is
always 0 (a new node can always be made), so hostname spread caps matching pods per node at maxSkew. Required pod
affinity admits only domains that already hold a selected pod; the first pod of a self-selecting group may go
anywhere, which co-locates the rest in its zone. `ScheduleAnyway` and preferred terms are preferences, ignored
here; topology keys other than zone and hostname are ignored too. Pure: the caller records placements.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from kubegpu.autoscaler import labels as L
from kubegpu.errors import ConfigError
from kubegpu.kube.selectors import LabelSelector, label_selector

SUPPORTED_KEYS = (L.ZONE_LABEL, L.HOSTNAME_LABEL)


class Verdict(Enum):
    """Whether a domain takes the pod: yes, not now (counts elsewhere may change that), or never in this pass."""

    OK = "ok"
    RETRY = "retry"
    NEVER = "never"


@dataclass(frozen=True)
class Term:
    """One constraint: spread (max_skew set) or affinity (max_skew None), over pods of `namespaces`."""

    key: str
    selector: LabelSelector
    namespaces: frozenset[str]
    max_skew: int | None = None

    @property
    def group(self) -> tuple[str, LabelSelector, frozenset[str]]:
        return (self.key, self.selector, self.namespaces)

    def selects(self, namespace: str, labels: Mapping[str, str]) -> bool:
        return namespace in self.namespaces and self.selector.matches(labels)


@dataclass(frozen=True)
class PodTopology:
    """A pod's required topology terms plus what other terms need to know about it."""

    terms: tuple[Term, ...]
    namespace: str
    labels: tuple[tuple[str, str], ...]

    def selects_self(self, term: Term) -> bool:
        return term.selects(self.namespace, dict(self.labels))

    @property
    def zonal(self) -> bool:
        return any(t.key == L.ZONE_LABEL for t in self.terms)

    @property
    def per_host_limit(self) -> int | None:
        """The most pods of this group one node can take (hostname spread), or None when unbounded."""
        skews = [t.max_skew for t in self.terms if t.key == L.HOSTNAME_LABEL and t.max_skew is not None
                 and self.selects_self(t)]
        return min(skews) if skews else None

    def signature(self) -> str:
        return json.dumps([repr(self.terms), self.namespace, self.labels])


def _selector(raw: Any, where: str) -> LabelSelector | None:
    """The term's labelSelector; None (a null selector selects nothing) drops the term."""
    return label_selector(raw, f"{where}.labelSelector")


def _spread_terms(spec: Mapping[str, Any], name: str, namespace: str) -> list[Term]:
    out = []
    for i, tsc in enumerate(spec.get("topologySpreadConstraints") or ()):
        where = f"pod {name}: spec.topologySpreadConstraints[{i}]"
        if not isinstance(tsc, Mapping):
            raise ConfigError(f"{where}: must be a mapping")
        skew = tsc.get("maxSkew")
        if not isinstance(skew, int) or isinstance(skew, bool) or skew < 1:
            raise ConfigError(f"{where}.maxSkew: must be an integer ≥ 1, got {skew!r}")
        if tsc.get("whenUnsatisfiable", "DoNotSchedule") not in ("DoNotSchedule", "ScheduleAnyway"):
            raise ConfigError(f"{where}.whenUnsatisfiable: must be DoNotSchedule or ScheduleAnyway")
        selector = _selector(tsc.get("labelSelector"), where)
        if (tsc.get("whenUnsatisfiable", "DoNotSchedule") == "DoNotSchedule" and selector is not None
                and tsc.get("topologyKey") in SUPPORTED_KEYS):
            out.append(Term(tsc["topologyKey"], selector, frozenset({namespace}), skew))
    return out


def _affinity_terms(spec: Mapping[str, Any], name: str, namespace: str) -> list[Term]:
    affinity = ((spec.get("affinity") or {}).get("podAffinity") or {})
    out = []
    for i, term in enumerate(affinity.get("requiredDuringSchedulingIgnoredDuringExecution") or ()):
        where = f"pod {name}: spec.affinity.podAffinity.requiredDuringSchedulingIgnoredDuringExecution[{i}]"
        if not isinstance(term, Mapping) or not isinstance(term.get("topologyKey"), str):
            raise ConfigError(f"{where}.topologyKey: must be a string")
        selector = _selector(term.get("labelSelector"), where)
        namespaces = frozenset(str(n) for n in term.get("namespaces") or ()) or frozenset({namespace})
        if selector is not None and term["topologyKey"] in SUPPORTED_KEYS:
            out.append(Term(term["topologyKey"], selector, namespaces))
    return out


def pod_topology(pod: Mapping[str, Any]) -> PodTopology | None:
    """The pod's required spread and affinity terms on zone/hostname; None when it has none."""
    meta = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    namespace = str(meta.get("namespace", "default"))
    name = f"{namespace}/{meta.get('name', '?')}"
    terms = [*_spread_terms(spec, name, namespace), *_affinity_terms(spec, name, namespace)]
    if not terms:
        return None
    labels = tuple(sorted((str(k), str(v)) for k, v in (meta.get("labels") or {}).items()))
    return PodTopology(tuple(terms), namespace, labels)


@dataclass
class TopologyCounts:
    """Selected pods per domain, for every constraint group of the pods in the pass."""

    zones: frozenset[str]
    counts: dict[tuple[str, LabelSelector, frozenset[str]], dict[str, int]] = field(default_factory=dict)

    @classmethod
    def for_pods(cls, zones: Iterable[str], topologies: Iterable[PodTopology | None]) -> TopologyCounts:
        out = cls(frozenset(zones))
        for topo in topologies:
            for term in topo.terms if topo else ():
                out.counts.setdefault(term.group, {})
        return out

    def record(self, pod: Mapping[str, Any], zone: str | None, host: str) -> None:
        """Count a placed pod in its zone (when known) and on its node, for each group that selects it."""
        if not self.counts:
            return
        meta = pod.get("metadata") or {}
        labels = meta.get("labels") or {}
        namespace = str(meta.get("namespace", "default"))
        for (key, selector, namespaces), per_domain in self.counts.items():
            if namespace not in namespaces or not selector.matches(labels):
                continue
            domain = zone if key == L.ZONE_LABEL else host
            if domain is not None:
                per_domain[domain] = per_domain.get(domain, 0) + 1

    def host_verdict(self, topo: PodTopology, host: str) -> Verdict:
        """Whether node/claim `host` may take the pod under its hostname terms."""
        for term in topo.terms:
            if term.key != L.HOSTNAME_LABEL:
                continue
            per_host = self.counts[term.group]
            here = per_host.get(host, 0)
            if term.max_skew is not None:
                if here + int(topo.selects_self(term)) > term.max_skew:
                    return Verdict.NEVER
            elif here == 0 and (any(per_host.values()) or not topo.selects_self(term)):
                return Verdict.NEVER
        return Verdict.OK

    def zone_choice(self, topo: PodTopology, allowed: Iterable[str], pod_zones: Iterable[str] | None = None,
                    ) -> tuple[str | None, Verdict]:
        """The zone to pin the pod to among `allowed` (None: no zonal term), or why there is none."""
        if not topo.zonal:
            return None, Verdict.OK
        choices = set(allowed) & self.zones
        domains = self.zones if pod_zones is None else self.zones & set(pod_zones)
        for term in topo.terms:
            if term.key != L.ZONE_LABEL:
                continue
            per_zone = self.counts[term.group]
            if term.max_skew is not None:
                floor = min((per_zone.get(z, 0) for z in domains), default=0)
                extra = int(topo.selects_self(term))
                ok = [z for z in choices if per_zone.get(z, 0) + extra - floor <= term.max_skew]
                if not ok:
                    return None, Verdict.RETRY if choices else Verdict.NEVER
                choices = {min(ok, key=lambda z: (per_zone.get(z, 0), z))}
            else:
                occupied = {z for z, n in per_zone.items() if n > 0}
                if occupied:
                    choices &= occupied
                elif not topo.selects_self(term):
                    return None, Verdict.NEVER
                if not choices:
                    return None, Verdict.NEVER
        return min(choices), Verdict.OK
