"""The CRD manifests under deploy/crds: valid CustomResourceDefinitions whose schema agrees with the models."""

from __future__ import annotations

from pathlib import Path
from typing import Any, get_args

import jsonschema
import kubernetes_validate
import pytest
import yaml

from kubegpu.autoscaler.api import Operator, parse_nodepool
from kubegpu.errors import ConfigError
from tests.autoscaler.builders import nodepool

CRDS = Path(__file__).resolve().parents[2] / "deploy" / "crds"


def load(name: str) -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load((CRDS / name).read_text())
    return data


def schema(name: str) -> dict[str, Any]:
    result: dict[str, Any] = load(name)["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return result


@pytest.mark.parametrize("name", ["nodepools.kubegpu.io.yaml", "nodeclaims.kubegpu.io.yaml"])
def test_crd_manifests_validate_as_kubernetes_objects(name: str) -> None:
    crd = load(name)
    assert kubernetes_validate.validate(crd, "1.30", strict=True)
    assert crd["spec"]["group"] == "kubegpu.io" and crd["spec"]["scope"] == "Cluster"
    assert crd["metadata"]["name"] == f"{crd['spec']['names']['plural']}.kubegpu.io"


def test_nodepool_schema_defaults_match_the_model() -> None:
    spec = schema("nodepools.kubegpu.io.yaml")["properties"]["spec"]["properties"]
    disruption = spec["disruption"]["properties"]
    model = parse_nodepool(nodepool("x")).spec
    assert disruption["consolidationPolicy"]["default"] == model.disruption.consolidationPolicy
    assert disruption["consolidateAfter"]["default"] == model.disruption.consolidateAfter
    assert disruption["budgets"]["default"] == [b.model_dump(exclude_none=True) for b in model.disruption.budgets]
    template_spec = spec["template"]["properties"]["spec"]["properties"]
    assert template_spec["expireAfter"]["default"] == model.template.spec.expireAfter
    operators = template_spec["requirements"]["items"]["properties"]["operator"]["enum"]
    assert set(operators) == set(get_args(Operator))


@pytest.mark.parametrize(
    ("change", "valid"),
    [
        ({}, True),
        ({"weight": 101}, False),
        ({"disruption": {"budgets": [{"nodes": "110%"}]}}, False),
        ({"disruption": {"consolidationPolicy": "Sometimes"}}, False),
        ({"limits": {"nvidia.com/gpu": "16", "cpu": "1k"}}, True),
    ],
)
def test_schema_and_model_agree_on_examples(change: dict[str, Any], valid: bool) -> None:
    manifest = nodepool("x", requirements=[{"key": "kubegpu.io/capacity-type", "operator": "In",
                                            "values": ["spot"]}])
    manifest["spec"].update(change)
    validator = jsonschema.Draft7Validator(schema("nodepools.kubegpu.io.yaml"))
    assert validator.is_valid(manifest) is valid
    if valid:
        parse_nodepool(manifest)
    else:
        with pytest.raises(ConfigError):
            parse_nodepool(manifest)
