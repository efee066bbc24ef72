"""Our CRDs on the real kube-apiserver: every one under deploy/crds installs (schemas, defaults and CEL rules
compile), every example CR applies and comes back with the server's defaults, and invalid CRs are rejected by the
server with the field named — the same ones our pydantic models reject, so `kubectl apply` and the autoscaler agree."""

from __future__ import annotations

import copy
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml

from kubegpu.autoscaler.api import parse_nodeclaim, parse_nodepool
from kubegpu.errors import ConfigError
from kubegpu.kube import Invalid
from kubegpu.testing.session import RealCluster
from tests.autoscaler.builders import nodepool

pytestmark = pytest.mark.apiserver
ROOT = Path(__file__).resolve().parents[2]
GROUP = "kubegpu.io"


def example_crs() -> list[tuple[str, dict[str, Any]]]:
    found = []
    for path in sorted((ROOT / "examples").glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if isinstance(doc, dict) and str(doc.get("apiVersion", "")).startswith(f"{GROUP}/"):
                found.append((path.name, doc))
    return found


def test_every_shipped_crd_installs_and_is_served(real_cluster: RealCluster, crds: list[str]) -> None:
    shipped = {yaml.safe_load(p.read_text())["metadata"]["name"] for p in (ROOT / "deploy" / "crds").glob("*.yaml")}
    assert set(crds) == shipped and shipped
    cluster = real_cluster.admin
    for kind in ("NodePool", "NodeClaim"):
        assert isinstance(cluster.list(kind), list)  # the server serves the kind at the version we address


def missing_from(given: Any, stored: Any, path: str = "") -> list[str]:
    """Fields of ``given`` the server did not keep as given (pruned by the schema, or changed)."""
    if isinstance(given, dict) and isinstance(stored, dict):
        return [m for key, value in given.items()
                for m in (missing_from(value, stored[key], f"{path}.{key}") if key in stored else [f"{path}.{key}"])]
    if isinstance(given, list) and isinstance(stored, list) and len(given) == len(stored):
        return [m for i, (a, b) in enumerate(zip(given, stored, strict=True))
                for m in missing_from(a, b, f"{path}[{i}]")]
    return [] if given == stored else [path]


@pytest.mark.parametrize(("source", "doc"), example_crs(), ids=lambda v: v if isinstance(v, str) else "")
def test_every_example_cr_applies(real_cluster: RealCluster, crds: list[str], source: str,
                                  doc: dict[str, Any]) -> None:
    cluster = real_cluster.admin
    obj = copy.deepcopy(doc)
    obj["metadata"]["name"] = f"{obj['metadata']['name']}-{uuid.uuid4().hex[:5]}"
    created = cluster.create(obj)
    try:
        assert missing_from(doc["spec"], created["spec"], "spec") == []  # nothing pruned by the schema
        if doc["kind"] == "NodePool":
            defaults = created["spec"]["template"]["spec"]["nodeClassRef"]  # filled in by the schema's defaults
            assert defaults == {"group": GROUP, "kind": "KwokNodeClass", "name": "default"}
            parse_nodepool(created, source)  # what the server stored is what the autoscaler accepts
    finally:
        cluster.delete(obj["kind"], obj["metadata"]["name"])


GPU_REQUIREMENT = {"key": "nvidia.com/gpu.product", "operator": "In", "values": ["NVIDIA-A100-SXM4-80GB"]}
INVALID_NODEPOOLS = [
    ("requirement In without values", {"requirements": [{"key": "team", "operator": "In", "values": []}]},
     "spec.template.spec.requirements[0]", "must have a value"),
    ("Gt with a non-integer", {"requirements": [{"key": "x", "operator": "Gt", "values": ["big"]}]},
     "spec.template.spec.requirements[0]", "single positive integer"),
    ("minValues above the values", {"requirements": [{"key": "x", "operator": "In", "values": ["a"],
                                                      "minValues": 2}]},
     "spec.template.spec.requirements[0]", "minValues"),
    ("restricted requirement key", {"requirements": [{"key": "kubernetes.io/hostname", "operator": "In",
                                                      "values": ["n1"]}]},
     "spec.template.spec.requirements[0].key", "restricted"),
    ("restricted template label", {"labels": {"kubegpu.io/registered": "true"}},
     "spec.template.metadata.labels", "restricted"),
    ("weight out of range", {"weight": 101}, "spec.weight", "101"),
    ("budget over 100%", {"disruption": {"budgets": [{"nodes": "110%"}]}}, "spec.disruption.budgets[0].nodes",
     "110%"),
    ("schedule without duration", {"disruption": {"budgets": [{"nodes": "0", "schedule": "@daily"}]}},
     "spec.disruption.budgets[0]", "'schedule' must be set with 'duration'"),
    ("unknown consolidation policy", {"disruption": {"consolidationPolicy": "Sometimes"}},
     "spec.disruption.consolidationPolicy", "Sometimes"),
    ("bad expireAfter", {"expireAfter": "30 days"}, "spec.template.spec.expireAfter", "30 days"),
]


@pytest.mark.parametrize(("case", "change", "field", "message"), INVALID_NODEPOOLS,
                         ids=[c[0] for c in INVALID_NODEPOOLS])
def test_invalid_nodepool_is_rejected_by_the_server_and_by_our_model(
        real_cluster: RealCluster, crds: list[str], case: str, change: dict[str, Any], field: str,
        message: str) -> None:
    spec = dict(change)
    manifest = nodepool(f"bad-{uuid.uuid4().hex[:6]}", requirements=spec.pop("requirements", [GPU_REQUIREMENT]),
                        **spec)
    with pytest.raises(Invalid) as rejected:
        real_cluster.admin.create(manifest)
    text = str(rejected.value)
    assert field in text and message in text, text
    with pytest.raises(ConfigError):
        parse_nodepool(manifest)


def test_nodeclaim_requirements_and_immutable_spec_are_enforced(real_cluster: RealCluster, crds: list[str]) -> None:
    cluster = real_cluster.admin
    name = f"claim-{uuid.uuid4().hex[:6]}"
    claim = {"apiVersion": f"{GROUP}/v1", "kind": "NodeClaim", "metadata": {"name": name},
             "spec": {"requirements": [{"key": "team", "operator": "In", "values": []}]}}
    with pytest.raises(Invalid, match=r"spec\.requirements\[0\].*must have a value"):
        cluster.create(claim)
    with pytest.raises(ConfigError):
        parse_nodeclaim(claim)
    claim["spec"]["requirements"] = [GPU_REQUIREMENT]
    created = cluster.create(claim)
    try:
        assert created["spec"]["expireAfter"] == "720h"  # schema default
        with pytest.raises(Invalid, match="spec is immutable"):
            cluster.patch("NodeClaim", name, {"spec": {"expireAfter": "1h"}})
    finally:
        cluster.delete("NodeClaim", name)
