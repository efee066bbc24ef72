"""A nomination is kept only while kube-scheduler could still honour it: a pod its required hostname anti-affinity
repels (or that repels it) landed on the node meanwhile sends it back to planning, or it would stay pending for good
with the autoscaler believing it served (found by the crash-point test)."""

from __future__ import annotations

from typing import Any

import pytest

from kubegpu.autoscaler.replan import keep_nominated
from kubegpu.scheduling import node_info
from tests.autoscaler.builders import pod

NODE = {"metadata": {"name": "n1", "labels": {}}, "spec": {},
        "status": {"allocatable": {"cpu": "8", "memory": "64Gi", "pods": "110"}}}
ANTI = {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
    {"topologyKey": "kubernetes.io/hostname", "labelSelector": {"matchLabels": {"app": "web"}}}]}}


def web(name: str, anti: bool, **spec: Any) -> dict[str, Any]:
    return pod(name, cpu="1", metadata={"labels": {"app": "web"}},
               spec={**({"affinity": ANTI} if anti else {}), **spec})


@pytest.mark.parametrize(("pending_repels", "landed_repels"), [(True, False), (False, True), (True, True)])
def test_a_nomination_anti_affinity_now_forbids_is_planned_again(pending_repels: bool, landed_repels: bool) -> None:
    landed = web("web0", landed_repels, nodeName="n1")
    infos = [node_info(NODE, [landed])]
    kept, rest = keep_nominated(infos, [web("web1", pending_repels)], {"n1": {"default/web1"}}, {"n1": "n1"})
    assert kept == {} and [p["metadata"]["name"] for p in rest] == ["web1"]


def test_a_nomination_without_anti_affinity_is_kept() -> None:
    infos = [node_info(NODE, [web("web0", False, nodeName="n1")])]
    kept, rest = keep_nominated(infos, [web("web1", False)], {"n1": {"default/web1"}}, {"n1": "n1"})
    assert list(kept) == ["n1"] and rest == []
