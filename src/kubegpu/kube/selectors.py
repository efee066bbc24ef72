"""Label and field selectors in the API server's string syntax, parsed once and matched many times.

Label selectors: ``a=b``, ``a==b``, ``a!=b``, ``a in (x,y)``, ``a notin (x,y)``, ``a`` (exists), ``!a`` (does not
exist), comma-separated and ANDed; ``!=`` and ``notin`` also match objects without the label, as in Kubernetes.
Field selectors: ``path=value``, ``path==value``, ``path!=value``, ANDed; only the fields the API server indexes for
the kind are accepted (``metadata.name`` and ``metadata.namespace`` everywhere, ``spec.nodeName`` and
``status.phase`` on Pods, ...), so code tested here does not rely on selectors a real server would reject.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kubegpu.kube.errors import BadRequest

_KEY = r"[A-Za-z0-9][A-Za-z0-9._/-]*"
_VALUE = r"[A-Za-z0-9._-]*"
_NOT_EXISTS = re.compile(rf"^!\s*({_KEY})$")
_SET = re.compile(rf"^({_KEY})\s+(in|notin)\s*\((.*)\)$")
_EQUALITY = re.compile(rf"^({_KEY})\s*(==|=|!=)\s*({_VALUE})$")
_EXISTS = re.compile(rf"^({_KEY})$")
_FIELD = re.compile(r"^([A-Za-z0-9._]+)\s*(==|=|!=)\s*(.*)$")

COMMON_FIELDS = frozenset({"metadata.name", "metadata.namespace"})
FIELDS_BY_KIND: dict[str, frozenset[str]] = {
    "Pod": frozenset({"spec.nodeName", "spec.restartPolicy", "spec.schedulerName", "spec.serviceAccountName",
                      "status.phase", "status.podIP", "status.nominatedNodeName"}),
    "Node": frozenset({"spec.unschedulable"}),
    "Event": frozenset({"involvedObject.kind", "involvedObject.namespace", "involvedObject.name",
                        "involvedObject.uid", "involvedObject.apiVersion", "involvedObject.resourceVersion",
                        "involvedObject.fieldPath", "reason", "reportingComponent", "source", "type"}),
}


@dataclass(frozen=True)
class LabelRequirement:
    key: str
    operator: str  # "=", "!=", "in", "notin", "exists", "!"
    values: frozenset[str] = frozenset()

    def matches(self, labels: Mapping[str, str]) -> bool:
        value = labels.get(self.key)
        op = self.operator
        if op == "exists":
            return value is not None
        if op == "!":
            return value is None
        if op in ("=", "in"):
            return value is not None and value in self.values
        return value is None or value not in self.values  # "!=", "notin"


@dataclass(frozen=True)
class LabelSelector:
    requirements: tuple[LabelRequirement, ...]

    def matches(self, labels: Mapping[str, str] | None) -> bool:
        labels = labels or {}
        return all(requirement.matches(labels) for requirement in self.requirements)


@dataclass(frozen=True)
class FieldRequirement:
    path: str
    negated: bool
    value: str

    def matches(self, obj: Mapping[str, Any]) -> bool:
        return (field_value(obj, self.path) == self.value) != self.negated


@dataclass(frozen=True)
class FieldSelector:
    requirements: tuple[FieldRequirement, ...]

    def matches(self, obj: Mapping[str, Any]) -> bool:
        return all(requirement.matches(obj) for requirement in self.requirements)


def parse_label_selector(text: str | None) -> LabelSelector:
    """Parse a label selector string; BadRequest (400) naming the part that is not a requirement."""
    requirements = []
    for part in _split_top_level(text or ""):
        requirements.append(_parse_label_requirement(part, text or ""))
    return LabelSelector(tuple(requirements))


def parse_field_selector(text: str | None, kind: str) -> FieldSelector:
    """Parse a field selector for ``kind``; BadRequest naming a malformed part or a field the server does not index."""
    allowed = COMMON_FIELDS | FIELDS_BY_KIND.get(kind, frozenset())
    requirements = []
    for part in _split_top_level(text or ""):
        match = _FIELD.match(part)
        if match is None:
            raise BadRequest(f"field selector {text!r}: {part!r} is not 'field=value' or 'field!=value'")
        path, operator, value = match.groups()
        if path not in allowed:
            raise BadRequest(f"field selector {text!r}: field label {path!r} is not supported for {kind}")
        requirements.append(FieldRequirement(path, operator == "!=", value.strip()))
    return FieldSelector(tuple(requirements))


def field_value(obj: Mapping[str, Any], path: str) -> str:
    """The string a field selector compares: missing fields read as "", booleans as "true"/"false"."""
    value: Any = obj
    for part in path.split("."):
        if not isinstance(value, Mapping):
            return ""
        value = value.get(part)
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _parse_label_requirement(part: str, text: str) -> LabelRequirement:
    if match := _NOT_EXISTS.match(part):
        return LabelRequirement(match.group(1), "!")
    if match := _SET.match(part):
        values = frozenset(value.strip() for value in match.group(3).split(",") if value.strip())
        return LabelRequirement(match.group(1), match.group(2), values)
    if match := _EQUALITY.match(part):
        key, operator, value = match.groups()
        return LabelRequirement(key, "!=" if operator == "!=" else "=", frozenset({value}))
    if match := _EXISTS.match(part):
        return LabelRequirement(match.group(1), "exists")
    raise BadRequest(f"label selector {text!r}: cannot parse requirement {part!r}")


def _split_top_level(text: str) -> list[str]:
    """Split on commas outside parentheses ("a in (x,y),b" → ["a in (x,y)", "b"]), dropping empty parts."""
    parts: list[str] = []
    depth = 0
    current: list[str] = []
    for char in text:
        if char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
        if char == "," and depth == 0:
            parts.append("".join(current).strip())
            current = []
        else:
            current.append(char)
    parts.append("".join(current).strip())
    return [part for part in parts if part]
