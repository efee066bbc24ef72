"""Label and field selectors, parsed once and matched many times: the one matcher every component uses.

Three spellings of one idea reach this module and all end as the same `LabelRequirement`:

- the API server's string syntax (``a=b``, ``a==b``, ``a!=b``, ``a in (x,y)``, ``a notin (x,y)``, ``a`` (exists),
  ``!a`` (does not exist), comma-separated and ANDed; ``!=`` and ``notin`` also match objects without the label, as in
  Kubernetes) — list/watch filters, the operator's upgrade ``podSelector``;
- a ``metav1.LabelSelector`` object (``matchLabels`` plus ``matchExpressions`` with In, NotIn, Exists, DoesNotExist) —
  PodDisruptionBudgets, pod (anti-)affinity terms, topology spread constraints (`label_selector`);
- a ``nodeSelectorTerm`` (``matchExpressions`` that also take Gt and Lt, and ``matchFields`` on ``metadata.name``) —
  required node affinity (`node_selector_terms`).

Field selectors: ``path=value``, ``path==value``, ``path!=value``, ANDed; only the fields the API server indexes for
the kind are accepted (``metadata.name`` and ``metadata.namespace`` everywhere, ``spec.nodeName`` and
``status.phase`` on Pods, ...), so code tested here does not rely on selectors a real server would reject.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kubegpu.errors import ConfigError
from kubegpu.kube.errors import BadRequest

_KEY = r"[A-Za-z0-9][A-Za-z0-9._/-]*"
_VALUE = r"[A-Za-z0-9._-]*"
_NOT_EXISTS = re.compile(rf"^!\s*({_KEY})$")
_SET = re.compile(rf"^({_KEY})\s+(in|notin)\s*\((.*)\)$")
_EQUALITY = re.compile(rf"^({_KEY})\s*(==|=|!=)\s*({_VALUE})$")
_EXISTS = re.compile(rf"^({_KEY})$")
_FIELD = re.compile(r"^([A-Za-z0-9._]+)\s*(==|=|!=)\s*(.*)$")
_INTEGER = re.compile(r"^[+-]?[0-9]+$")

IN, NOT_IN, EXISTS, DOES_NOT_EXIST, GT, LT = "In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"
LABEL_SELECTOR_OPERATORS = frozenset({IN, NOT_IN, EXISTS, DOES_NOT_EXIST})
NODE_SELECTOR_OPERATORS = LABEL_SELECTOR_OPERATORS | {GT, LT}
NODE_FIELD_OPERATORS = frozenset({IN, NOT_IN})

COMMON_FIELDS = frozenset({"metadata.name", "metadata.namespace"})
FIELDS_BY_KIND: dict[str, frozenset[str]] = {
    "Pod": frozenset({"spec.nodeName", "spec.restartPolicy", "spec.schedulerName", "spec.serviceAccountName",
                      "status.phase", "status.podIP", "status.nominatedNodeName"}),
    "Node": frozenset({"spec.unschedulable"}),
    "Event": frozenset({"involvedObject.kind", "involvedObject.namespace", "involvedObject.name",
                        "involvedObject.uid", "involvedObject.apiVersion", "involvedObject.resourceVersion",
                        "involvedObject.fieldPath", "reason", "reportingComponent", "source", "type"}),
}


@dataclass(frozen=True, slots=True)
class LabelRequirement:
    """One requirement on one label, with Kubernetes' operator names (the string syntax maps onto them).

    ``bound`` is the integer of a Gt/Lt requirement. NotIn and DoesNotExist match an absent label; Gt and Lt need a
    present label that is a base-10 integer, as in Kubernetes.
    """

    key: str
    operator: str  # In, NotIn, Exists, DoesNotExist, Gt, Lt
    values: frozenset[str] = frozenset()
    bound: int | None = None

    def matches(self, labels: Mapping[str, str]) -> bool:
        return self.matches_value(labels.get(self.key))

    def matches_value(self, value: str | None) -> bool:
        """Whether the label's value (None: the label is absent) satisfies the requirement."""
        op = self.operator
        if op == IN:
            return value is not None and value in self.values
        if op == NOT_IN:
            return value is None or value not in self.values
        if op == EXISTS:
            return value is not None
        if op == DOES_NOT_EXIST:
            return value is None
        if value is None or self.bound is None:
            return False
        number = _as_int(value)
        if number is None:
            return False
        return number > self.bound if op == GT else number < self.bound


@dataclass(frozen=True, slots=True)
class LabelSelector:
    """Requirements ANDed; no requirements matches everything (an empty ``metav1.LabelSelector``)."""

    requirements: tuple[LabelRequirement, ...]

    def matches(self, labels: Mapping[str, str] | None) -> bool:
        labels = labels or {}
        return all(requirement.matches(labels) for requirement in self.requirements)


@dataclass(frozen=True, slots=True)
class NodeSelectorTerm:
    """A nodeSelectorTerm: its expressions and fields are ANDed; a term with neither matches nothing."""

    expressions: tuple[LabelRequirement, ...]
    fields: tuple[LabelRequirement, ...]  # matchFields; only metadata.name exists

    def matches(self, labels: Mapping[str, str], node_name: str | None) -> bool:
        if not self.expressions and not self.fields:
            return False
        for requirement in self.expressions:
            if not requirement.matches_value(labels.get(requirement.key)):
                return False
        return all(requirement.matches_value(node_name) for requirement in self.fields)


@dataclass(frozen=True, slots=True)
class FieldRequirement:
    path: str
    negated: bool
    value: str

    def matches(self, obj: Mapping[str, Any]) -> bool:
        return (field_value(obj, self.path) == self.value) != self.negated


@dataclass(frozen=True, slots=True)
class FieldSelector:
    requirements: tuple[FieldRequirement, ...]

    def matches(self, obj: Mapping[str, Any]) -> bool:
        return all(requirement.matches(obj) for requirement in self.requirements)


# --- metav1.LabelSelector and nodeSelectorTerms -----------------------------------------------------------------------

def label_selector(raw: Any, where: str) -> LabelSelector | None:
    """Compile a ``metav1.LabelSelector`` object; None for a null selector, which selects nothing (the caller says
    what nothing means there). ConfigError naming ``where`` and the field for a selector the API server refuses."""
    if raw is None:
        return None
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{where}: must be a mapping with matchLabels / matchExpressions, got {raw!r}")
    match = raw.get("matchLabels") or {}
    if not isinstance(match, Mapping):
        raise ConfigError(f"{where}.matchLabels: must be a mapping of label to value, got {match!r}")
    requirements = [LabelRequirement(str(key), IN, frozenset({str(value)})) for key, value in sorted(match.items())]
    expressions = raw.get("matchExpressions") or ()
    if not isinstance(expressions, Sequence) or isinstance(expressions, str):
        raise ConfigError(f"{where}.matchExpressions: must be a list, got {expressions!r}")
    for index, item in enumerate(expressions):
        requirements.append(_requirement(item, f"{where}.matchExpressions[{index}]", LABEL_SELECTOR_OPERATORS))
    return LabelSelector(tuple(requirements))


def selects(raw: Any, labels: Mapping[str, str] | None, where: str = "labelSelector") -> bool:
    """One-off match of a ``metav1.LabelSelector`` object against labels; a null selector selects nothing."""
    selector = label_selector(raw, where)
    return selector is not None and selector.matches(labels)


def node_selector_terms(terms: Any, where: str) -> tuple[NodeSelectorTerm, ...]:
    """Compile ``nodeSelectorTerms`` (ORed by the caller: `any(term.matches(...))`); ConfigError naming the field."""
    if not isinstance(terms, Sequence) or isinstance(terms, str):
        raise ConfigError(f"{where}: must be a list of terms, got {terms!r}")
    compiled = []
    for index, term in enumerate(terms):
        if not isinstance(term, Mapping):
            raise ConfigError(f"{where}[{index}]: must be a mapping, got {term!r}")
        expressions = tuple(
            _requirement(item, f"{where}[{index}].matchExpressions[{position}]", NODE_SELECTOR_OPERATORS)
            for position, item in enumerate(term.get("matchExpressions") or ()))
        fields = tuple(
            _requirement(item, f"{where}[{index}].matchFields[{position}]", NODE_FIELD_OPERATORS)
            for position, item in enumerate(term.get("matchFields") or ()))
        for position, requirement in enumerate(fields):
            if requirement.key != "metadata.name":
                raise ConfigError(f"{where}[{index}].matchFields[{position}].key: {requirement.key!r} is not "
                                  "supported (only metadata.name)")
        compiled.append(NodeSelectorTerm(expressions, fields))
    return tuple(compiled)


def _requirement(item: Any, where: str, operators: frozenset[str]) -> LabelRequirement:
    """One matchExpressions entry, validated as the API server validates it."""
    if not isinstance(item, Mapping):
        raise ConfigError(f"{where}: must be a mapping with key, operator and values, got {item!r}")
    operator = item.get("operator")
    if operator not in operators:
        raise ConfigError(f"{where}.operator: {operator!r} is not one of {', '.join(sorted(operators))}")
    key = item.get("key")
    if not isinstance(key, str) or not key:
        raise ConfigError(f"{where}.key: must be a non-empty string, got {key!r}")
    raw_values = item.get("values") or ()
    if isinstance(raw_values, str) or not isinstance(raw_values, Sequence):
        raise ConfigError(f"{where}.values: must be a list of strings, got {raw_values!r}")
    values = [str(value) for value in raw_values]
    if operator in (IN, NOT_IN) and not values:
        raise ConfigError(f"{where}.values: {operator} needs at least one value")
    if operator in (EXISTS, DOES_NOT_EXIST) and values:
        raise ConfigError(f"{where}.values: {operator} takes no values, got {values}")
    bound = None
    if operator in (GT, LT):
        if len(values) != 1:
            raise ConfigError(f"{where}.values: {operator} needs exactly one integer value, got {values}")
        bound = _as_int(values[0])
        if bound is None:
            raise ConfigError(f"{where}.values[0]: {values[0]!r} is not an integer")
    return LabelRequirement(key, operator, frozenset(values), bound)


def _as_int(text: str) -> int | None:
    """A base-10 integer as Go's strconv.ParseInt reads it (no spaces or underscores, unlike Python's int())."""
    return int(text) if _INTEGER.match(text) else None


# --- the API server's string syntax -----------------------------------------------------------------------------------

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
        return LabelRequirement(match.group(1), DOES_NOT_EXIST)
    if match := _SET.match(part):
        values = frozenset(value.strip() for value in match.group(3).split(",") if value.strip())
        return LabelRequirement(match.group(1), IN if match.group(2) == "in" else NOT_IN, values)
    if match := _EQUALITY.match(part):
        key, operator, value = match.groups()
        return LabelRequirement(key, NOT_IN if operator == "!=" else IN, frozenset({value}))
    if match := _EXISTS.match(part):
        return LabelRequirement(match.group(1), EXISTS)
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
