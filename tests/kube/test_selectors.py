from __future__ import annotations

from typing import Any

import pytest

from kubegpu.kube import BadRequest
from kubegpu.kube.selectors import field_value, parse_field_selector, parse_label_selector

LABELS = {"gpu": "h100", "mig": "true", "zone": "eu-1"}


@pytest.mark.parametrize(
    ("selector", "matches"),
    [
        ("", True),
        ("gpu=h100", True),
        ("gpu==h100", True),
        ("gpu=a100", False),
        ("gpu!=a100", True),
        ("gpu!=h100", False),
        ("missing!=x", True),
        ("gpu in (a100, h100)", True),
        ("gpu in (a100)", False),
        ("missing in (a100)", False),
        ("gpu notin (a100)", True),
        ("gpu notin (h100,a100)", False),
        ("missing notin (a100)", True),
        ("mig", True),
        ("missing", False),
        ("!missing", True),
        ("!mig", False),
        ("gpu=h100,zone in (eu-1,eu-2),!missing", True),
        ("gpu=h100,zone notin (eu-1)", False),
        ("example.com/pool=", False),
        ("  gpu = h100 ,  mig  ", True),
    ],
)
def test_label_selector(selector: str, matches: bool) -> None:
    assert parse_label_selector(selector).matches(LABELS) is matches


@pytest.mark.parametrize("selector", ["gpu=a=b", "gpu in a100", "=x", "gpu >= 3", "!!gpu"])
def test_bad_label_selector_names_the_part(selector: str) -> None:
    with pytest.raises(BadRequest, match="label selector"):
        parse_label_selector(selector)


POD: dict[str, Any] = {"metadata": {"name": "p", "namespace": "ml"}, "spec": {"nodeName": "n1"},
                       "status": {"phase": "Running"}}


@pytest.mark.parametrize(
    ("selector", "matches"),
    [
        ("metadata.name=p", True),
        ("metadata.name!=p", False),
        ("metadata.namespace==ml", True),
        ("spec.nodeName=n1,status.phase=Running", True),
        ("spec.nodeName=n1,status.phase!=Running", False),
        ("spec.schedulerName=", True),  # a missing field reads as ""
    ],
)
def test_field_selector(selector: str, matches: bool) -> None:
    assert parse_field_selector(selector, "Pod").matches(POD) is matches


def test_field_selector_rejects_fields_the_server_does_not_index() -> None:
    with pytest.raises(BadRequest, match=r"field label 'spec\.nodeName' is not supported for Node"):
        parse_field_selector("spec.nodeName=x", "Node")
    with pytest.raises(BadRequest, match="is not 'field=value'"):
        parse_field_selector("metadata.name", "Pod")


def test_field_value_renders_booleans_like_the_api_server() -> None:
    assert field_value({"spec": {"unschedulable": True}}, "spec.unschedulable") == "true"
    assert parse_field_selector("spec.unschedulable=true", "Node").matches({"spec": {"unschedulable": True}})
