"""The one label-selector matcher for selector objects: matchLabels, matchExpressions, node selector terms.

Every operator is checked against a label that is present with a matching value, present with another value, and
absent, since NotIn / DoesNotExist / Gt / Lt differ exactly there.
"""

from __future__ import annotations

import re
from typing import Any

import pytest

from kubegpu.errors import ConfigError
from kubegpu.kube.selectors import label_selector, node_selector_terms, parse_label_selector, selects

PRESENT = {"app": "spread", "gpus": "8"}
OTHER = {"app": "batch", "gpus": "2"}
ABSENT: dict[str, str] = {}


def _expr(operator: str, *values: str, key: str = "app") -> dict[str, Any]:
    item: dict[str, Any] = {"key": key, "operator": operator}
    if values:
        item["values"] = list(values)
    return item


@pytest.mark.parametrize(("expression", "present", "other", "absent"), [
    (_expr("In", "spread"), True, False, False),
    (_expr("In", "spread", "batch"), True, True, False),
    (_expr("NotIn", "spread"), False, True, True),
    (_expr("Exists"), True, True, False),
    (_expr("DoesNotExist"), False, False, True),
], ids=["In", "In-two", "NotIn", "Exists", "DoesNotExist"])
def test_every_label_selector_operator(expression: dict[str, Any], present: bool, other: bool, absent: bool) -> None:
    selector = label_selector({"matchExpressions": [expression]}, "s")
    assert selector is not None
    assert [selector.matches(PRESENT), selector.matches(OTHER), selector.matches(ABSENT)] == [present, other, absent]


def test_match_labels_and_expressions_are_anded() -> None:
    raw = {"matchLabels": {"app": "spread"}, "matchExpressions": [_expr("Exists", key="gpus")]}
    assert selects(raw, PRESENT)
    assert not selects(raw, {"app": "spread"})
    assert not selects(raw, OTHER)


def test_empty_selects_everything_null_selects_nothing() -> None:
    assert selects({}, ABSENT) and selects({}, PRESENT)
    assert not selects(None, PRESENT)


def test_string_syntax_and_objects_agree() -> None:
    as_text = parse_label_selector("app in (spread),gpus notin (2),!zone")
    as_object = label_selector({"matchExpressions": [_expr("In", "spread"), _expr("NotIn", "2", key="gpus"),
                                                     _expr("DoesNotExist", key="zone")]}, "s")
    assert as_text == as_object


@pytest.mark.parametrize(("expression", "present", "other", "absent"), [
    (_expr("Gt", "4", key="gpus"), True, False, False),
    (_expr("Lt", "4", key="gpus"), False, True, False),
    (_expr("Gt", "4", key="app"), False, False, False),  # a value that is no integer never matches
    (_expr("In", "8", key="gpus"), True, False, False),
    (_expr("NotIn", "8", key="gpus"), False, True, True),
    (_expr("Exists", key="gpus"), True, True, False),
    (_expr("DoesNotExist", key="gpus"), False, False, True),
], ids=["Gt", "Lt", "Gt-not-integer", "In", "NotIn", "Exists", "DoesNotExist"])
def test_every_node_selector_operator(expression: dict[str, Any], present: bool, other: bool, absent: bool) -> None:
    [term] = node_selector_terms([{"matchExpressions": [expression]}], "terms")
    assert [term.matches(PRESENT, "n1"), term.matches(OTHER, "n1"), term.matches(ABSENT, "n1")] == [
        present, other, absent]


def test_node_selector_terms_fields_and_empty_terms() -> None:
    [by_name, empty] = node_selector_terms([{"matchFields": [{"key": "metadata.name", "operator": "In",
                                                              "values": ["n1"]}]}, {}], "terms")
    assert by_name.matches(ABSENT, "n1") and not by_name.matches(ABSENT, "n2")
    assert not empty.matches(PRESENT, "n1")


@pytest.mark.parametrize(("raw", "fragment"), [
    ({"matchExpressions": [_expr("Near", "x")]}, "s.matchExpressions[0].operator: 'Near' is not one of"),
    ({"matchExpressions": [_expr("Gt", "1")]}, "s.matchExpressions[0].operator: 'Gt' is not one of"),
    ({"matchExpressions": [_expr("In")]}, "s.matchExpressions[0].values: In needs at least one value"),
    ({"matchExpressions": [_expr("Exists", "x")]}, "s.matchExpressions[0].values: Exists takes no values"),
    ({"matchExpressions": [{"operator": "Exists"}]}, "s.matchExpressions[0].key: must be a non-empty string"),
    ({"matchLabels": ["app"]}, "s.matchLabels: must be a mapping"),
    ("app=x", "s: must be a mapping"),
])
def test_bad_selector_objects_name_the_field(raw: Any, fragment: str) -> None:
    with pytest.raises(ConfigError, match="^" + re.escape(fragment)):
        label_selector(raw, "s")


@pytest.mark.parametrize(("term", "fragment"), [
    ({"matchExpressions": [_expr("Gt", "4", "5", key="gpus")]}, "Gt needs exactly one integer value"),
    ({"matchExpressions": [_expr("Lt", "four", key="gpus")]}, "'four' is not an integer"),
    ({"matchFields": [{"key": "metadata.uid", "operator": "In", "values": ["x"]}]}, "is not supported"),
    ({"matchFields": [_expr("Exists", key="metadata.name")]}, "'Exists' is not one of In, NotIn"),
])
def test_bad_node_selector_terms_name_the_field(term: dict[str, Any], fragment: str) -> None:
    with pytest.raises(ConfigError, match=fragment):
        node_selector_terms([term], "terms")


# --- the call sites: PodDisruptionBudgets, topology terms, the operator's upgrade podSelector -------------------------

def test_pdbs_select_by_match_expressions() -> None:
    from kubegpu.autoscaler.termination import matching_pdbs

    pdb = {"metadata": {"name": "not-batch", "namespace": "default"},
           "spec": {"selector": {"matchExpressions": [_expr("NotIn", "batch")]}}}
    null = {"metadata": {"name": "null", "namespace": "default"}, "spec": {}}
    pod = {"metadata": {"namespace": "default", "labels": PRESENT}}
    assert matching_pdbs(pod, [pdb, null]) == [pdb]
    assert matching_pdbs({"metadata": {"namespace": "default", "labels": OTHER}}, [pdb]) == []


def test_topology_terms_select_by_match_expressions() -> None:
    from kubegpu.autoscaler.topology import pod_topology

    spread = {"maxSkew": 1, "topologyKey": "kubernetes.io/hostname",
              "labelSelector": {"matchExpressions": [_expr("DoesNotExist", key="gpus")]}}
    topo = pod_topology({"metadata": {"name": "p", "labels": {"app": "x"}},
                         "spec": {"topologySpreadConstraints": [spread]}})
    assert topo is not None
    [term] = topo.terms
    assert term.selects("default", {"app": "x"}) and not term.selects("default", PRESENT)


def test_operator_pod_selector_takes_set_syntax_and_refuses_garbage() -> None:
    from kubegpu.operator.passes import _matches
    from kubegpu.operator.policy import Drain

    assert _matches({"metadata": {"labels": PRESENT}}, "app in (spread),gpus")
    assert not _matches({"metadata": {"labels": OTHER}}, "app in (spread),gpus")
    assert _matches({"metadata": {}}, "")
    with pytest.raises(ValueError, match="cannot parse requirement"):
        Drain(podSelector="app in (")
