"""Node requirements as value sets: the algebra Karpenter's scheduler runs on before a node exists.

A requirement on one label key is a set of allowed values — either listed (`In`, `DoesNotExist` = the empty list)
or everything except a list (`NotIn`, `Exists`) — narrowed further by integer bounds (`Gt`, `Lt`, `Gte`, `Lte`).
NodePool requirements, template labels, instance-type labels and a pod's nodeSelector / required node affinity all
become `Requirements`, and "can this pod go on a node from this pool" is an intersection that must not be empty.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from kubegpu.autoscaler import labels as L


@dataclass(frozen=True)
class Requirement:
    """The values one label key may take. `complement` means "any value except `values`"."""

    key: str
    complement: bool
    values: frozenset[str]
    greater_than: int | None = None  # value must be > this (Gt; Gte n is stored as Gt n-1)
    less_than: int | None = None     # value must be < this (Lt; Lte n is stored as Lt n+1)
    min_values: int | None = None

    @classmethod
    def of(cls, key: str, operator: str, values: Iterable[str] = (), min_values: int | None = None) -> Requirement:
        vals = frozenset(str(v) for v in values)
        if operator == "In":
            return cls(key, False, vals, min_values=min_values)
        if operator == "NotIn":
            return cls(key, True, vals)
        if operator == "Exists":
            return cls(key, True, frozenset())
        if operator == "DoesNotExist":
            return cls(key, False, frozenset())
        bound = int(next(iter(vals)))
        if operator == "Gt":
            return cls(key, True, frozenset(), greater_than=bound)
        if operator == "Gte":
            return cls(key, True, frozenset(), greater_than=bound - 1)
        if operator == "Lt":
            return cls(key, True, frozenset(), less_than=bound)
        if operator == "Lte":
            return cls(key, True, frozenset(), less_than=bound + 1)
        raise ValueError(f"unknown operator {operator!r}")

    def _in_bounds(self, value: str) -> bool:
        if self.greater_than is None and self.less_than is None:
            return True
        try:
            number = int(value)
        except ValueError:
            return False
        if self.greater_than is not None and number <= self.greater_than:
            return False
        return self.less_than is None or number < self.less_than

    def has(self, value: str) -> bool:
        """Whether a node whose label has this value satisfies the requirement."""
        member = value not in self.values if self.complement else value in self.values
        return member and self._in_bounds(value)

    def admits(self, value: str | None, *, absent_fails: bool = True) -> bool:
        """Whether a label with `value` (None: the node lacks the label) satisfies the requirement.

        `absent_fails` False: a missing label says nothing (a key the labels being checked never carry, such as an
        offering's zone on an instance type), so only a present value is judged.
        """
        if value is None:
            return not (absent_fails and self.needs_label)
        return self.has(value)

    @property
    def does_not_exist(self) -> bool:
        return not self.complement and not self.values

    @property
    def needs_label(self) -> bool:
        """True when a node without this label cannot satisfy it (In, Exists, Gt, Lt)."""
        if self.complement:
            return self.greater_than is not None or self.less_than is not None or not self.values
        return bool(self.values)

    def intersect(self, other: Requirement) -> Requirement:
        low = max((b for b in (self.greater_than, other.greater_than) if b is not None), default=None)
        high = min((b for b in (self.less_than, other.less_than) if b is not None), default=None)
        mins = [m for m in (self.min_values, other.min_values) if m is not None]
        min_values = max(mins) if mins else None
        if self.complement and other.complement:
            return Requirement(self.key, True, self.values | other.values, low, high, min_values)
        if self.complement:
            kept = {v for v in other.values if v not in self.values}
        elif other.complement:
            kept = {v for v in self.values if v not in other.values}
        else:
            kept = set(self.values & other.values)
        merged = Requirement(self.key, False, frozenset(kept), low, high, min_values)
        return Requirement(self.key, False, frozenset(v for v in kept if merged._in_bounds(v)), None, None, min_values)

    def is_empty(self) -> bool:
        if not self.complement:
            return not self.values
        if self.greater_than is not None and self.less_than is not None:
            return self.less_than - self.greater_than <= 1
        return False

    def describe(self) -> str:
        if self.does_not_exist:
            return f"{self.key} DoesNotExist"
        if not self.complement:
            return f"{self.key} In [{', '.join(sorted(self.values))}]"
        parts = [f"NotIn [{', '.join(sorted(self.values))}]"] if self.values else []
        if self.greater_than is not None:
            parts.append(f"Gt {self.greater_than}")
        if self.less_than is not None:
            parts.append(f"Lt {self.less_than}")
        return f"{self.key} {' '.join(parts) or 'Exists'}"


class Requirements:
    """A set of requirements keyed by label; immutable, hashable, so compatibility checks can be cached."""

    __slots__ = ("_by_key", "_hash")

    def __init__(self, items: Iterable[Requirement] = ()) -> None:
        by_key: dict[str, Requirement] = {}
        for item in items:
            existing = by_key.get(item.key)
            by_key[item.key] = existing.intersect(item) if existing else item
        self._by_key = by_key
        self._hash = hash(frozenset(by_key.values()))

    @classmethod
    def from_api(cls, requirements: Iterable[Mapping[str, Any]]) -> Requirements:
        """From NodeSelectorRequirement dicts (`key`, `operator`, `values`, optional `minValues`)."""
        return cls(
            Requirement.of(r["key"], r["operator"], r.get("values") or (), r.get("minValues"))
            for r in requirements
        )

    @classmethod
    def from_labels(cls, labels: Mapping[str, str]) -> Requirements:
        return cls(Requirement(k, False, frozenset({v})) for k, v in labels.items())

    def __iter__(self) -> Any:
        return iter(self._by_key.values())

    def __len__(self) -> int:
        return len(self._by_key)

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Requirements) and self._by_key == other._by_key

    def get(self, key: str) -> Requirement | None:
        return self._by_key.get(key)

    def keys(self) -> Iterable[str]:
        return self._by_key.keys()

    def merge(self, other: Requirements) -> Requirements:
        return Requirements([*self, *other])

    def conflict(self, pod: Requirements, allow_undefined: frozenset[str] = L.WELL_KNOWN_LABELS) -> str | None:
        """Why a node from these requirements could not satisfy the pod's; None when compatible.

        A key the pod constrains but this side leaves undefined is fine for well-known labels (the instance type
        decides them) and for negative requirements; a positive requirement on an unknown label cannot be met.
        """
        for theirs in pod:
            mine = self._by_key.get(theirs.key)
            if mine is None:
                if theirs.needs_label and theirs.key not in allow_undefined:
                    return f"label {theirs.key} is not set by the NodePool"
                continue
            if mine.does_not_exist and theirs.does_not_exist:
                continue
            if mine.intersect(theirs).is_empty():
                return f"{theirs.describe()} conflicts with {mine.describe()}"
        return None

    def satisfied_by(self, labels: Mapping[str, str]) -> bool:
        """Whether concrete node labels meet every requirement (used for instance types and nodes)."""
        return all(req.admits(labels.get(req.key)) for req in self._by_key.values())

    def to_api(self) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for req in sorted(self._by_key.values(), key=lambda r: r.key):
            out.extend(_api_form(req))
        return out


def _api_form(req: Requirement) -> list[dict[str, Any]]:
    if not req.complement:
        if not req.values:
            return [{"key": req.key, "operator": "DoesNotExist"}]
        entry: dict[str, Any] = {"key": req.key, "operator": "In", "values": sorted(req.values)}
        if req.min_values:
            entry["minValues"] = req.min_values
        return [entry]
    out: list[dict[str, Any]] = []
    if req.values:
        out.append({"key": req.key, "operator": "NotIn", "values": sorted(req.values)})
    if req.greater_than is not None:
        out.append({"key": req.key, "operator": "Gt", "values": [str(req.greater_than)]})
    if req.less_than is not None:
        out.append({"key": req.key, "operator": "Lt", "values": [str(req.less_than)]})
    return out or [{"key": req.key, "operator": "Exists"}]


def pod_requirement_options(pod: Mapping[str, Any]) -> list[Requirements]:
    """The pod's node requirements: nodeSelector plus each required node-affinity term (terms are ORed).

    Karpenter relaxes by dropping the first of several terms and retrying; returning the terms in order and taking
    the first compatible one reaches the same answer.
    """
    spec = pod.get("spec") or {}
    selector = Requirements.from_labels(spec.get("nodeSelector") or {})
    required = (((spec.get("affinity") or {}).get("nodeAffinity") or {})
                .get("requiredDuringSchedulingIgnoredDuringExecution") or {})
    terms = [t.get("matchExpressions") or [] for t in required.get("nodeSelectorTerms") or []]
    if not terms:
        return [selector]
    return [selector.merge(Requirements.from_api(term)) for term in terms]
