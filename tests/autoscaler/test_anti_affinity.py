"""Required pod anti-affinity against pods already on a node, by matchLabels and by matchExpressions.

kube-scheduler never binds a pod next to a pod its required hostname anti-affinity selects; a provisioning pass that
plans it there leaves the pod pending while the autoscaler counts it as served.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from kubegpu.autoscaler.instancetypes import default_instance_types
from kubegpu.autoscaler.provisioner import run_pass
from kubegpu.scheduling import node_info
from tests.autoscaler.builders import nodepool, pod, pool
from tests.autoscaler.test_cli import files, provision

NODE = {"kind": "Node", "metadata": {"name": "n1", "labels": {"kubernetes.io/hostname": "n1"}},
        "status": {"allocatable": {"cpu": "16", "memory": "64Gi", "pods": "110"}}}

BY_EXPRESSION = {"matchExpressions": [{"key": "app", "operator": "In", "values": ["spread"]}]}
BY_LABELS = {"matchLabels": {"app": "spread"}}


def _spread_pod(name: str, selector: dict[str, Any], namespace: str = "default", **term: Any) -> dict[str, Any]:
    anti = {"topologyKey": "kubernetes.io/hostname", "labelSelector": selector, **term}
    return pod(name, namespace=namespace, metadata={"labels": {"app": "spread"}},
               spec={"affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [anti]}}})


def _running(labels: dict[str, str], namespace: str = "default") -> dict[str, Any]:
    return pod("running", namespace=namespace, metadata={"labels": labels}, spec={"nodeName": "n1"})


def _placed_on_existing(pending: list[dict[str, Any]], running: dict[str, Any]) -> list[str]:
    result = run_pass([pool("default")], lambda _p: default_instance_types(), pending, [node_info(NODE, [running])])
    return [p["metadata"]["name"] for p in result.existing.get("n1", [])]


@pytest.mark.parametrize("selector", [BY_EXPRESSION, BY_LABELS,
                                      {"matchExpressions": [{"key": "app", "operator": "Exists"}]},
                                      {"matchExpressions": [{"key": "app", "operator": "NotIn", "values": ["x"]}]}],
                         ids=["In", "matchLabels", "Exists", "NotIn"])
def test_no_pending_pod_lands_next_to_a_pod_its_anti_affinity_selects(selector: dict[str, Any]) -> None:
    pending = [_spread_pod(f"p{i}", selector) for i in range(3)]
    assert _placed_on_existing(pending, _running({"app": "spread"})) == []


@pytest.mark.parametrize("selector", [{"matchExpressions": [{"key": "app", "operator": "In", "values": ["other"]}]},
                                      {"matchExpressions": [{"key": "app", "operator": "DoesNotExist"}]}],
                         ids=["In-other", "DoesNotExist"])
def test_one_pending_pod_may_join_a_node_whose_pods_its_selector_does_not_select(selector: dict[str, Any]) -> None:
    pending = [_spread_pod(f"p{i}", selector) for i in range(3)]
    assert len(_placed_on_existing(pending, _running({"app": "spread"}))) >= 1


def test_anti_affinity_looks_only_at_the_terms_namespaces() -> None:
    pending = [_spread_pod("p0", BY_EXPRESSION)]
    assert _placed_on_existing(pending, _running({"app": "spread"}, namespace="other")) == ["p0"]
    pending = [_spread_pod("p0", BY_EXPRESSION, namespaces=["other"])]
    assert _placed_on_existing(pending, _running({"app": "spread"}, namespace="other")) == []


def test_provision_cli_plans_no_match_expressions_pod_onto_the_node(tmp_path: Path) -> None:
    pending = [_spread_pod(f"p{i}", BY_EXPRESSION) for i in range(3)]
    pools_path, pods_path = files(tmp_path, [nodepool("default")], [*pending, _running({"app": "spread"})])
    nodes_path = tmp_path / "nodes.yaml"
    nodes_path.write_text(yaml.safe_dump({"kind": "List", "items": [NODE]}))
    code, out = provision("--nodepools", str(pools_path), "--pods", str(pods_path), "--nodes", str(nodes_path),
                          "-o", "json")
    assert code == 0, out
    data = json.loads(out)
    assert data["existing"] == {}
    assert sorted(p for claim in data["nodeclaims"] for p in claim["pods"]) == ["p0", "p1", "p2"]
    assert all(len(claim["pods"]) == 1 for claim in data["nodeclaims"]), data["nodeclaims"]


def test_a_malformed_anti_affinity_expression_is_one_line(tmp_path: Path) -> None:
    bad = _spread_pod("p0", {"matchExpressions": [{"key": "app", "operator": "Near", "values": ["x"]}]})
    pools_path, pods_path = files(tmp_path, [nodepool("default")], [bad])
    code, out = provision("--nodepools", str(pools_path), "--pods", str(pods_path))
    assert code == 1
    assert "labelSelector.matchExpressions[0].operator: 'Near' is not one of" in out, out
