"""fits() mirrors kube-scheduler's filter plugins case by case (their *_test.go tables, re-expressed)."""

from __future__ import annotations

from typing import Any

import pytest

from kubegpu.errors import ConfigError, NotFoundError
from kubegpu.scheduling import (
    REASON_AFFINITY,
    REASON_NODE_NAME,
    REASON_TOO_MANY_PODS,
    REASON_UNSCHEDULABLE,
    fits,
    match_node_selector_terms,
    node_info,
    pod_requirements,
    tolerates,
)

GPU_ALLOCATABLE = {
    "cpu": "8", "memory": "32Gi", "pods": "110", "nvidia.com/gpu": "2", "nvidia.com/gpu.shared": "8",
    "nvidia.com/mig-1g.10gb": "7", "nvidia.com/gpu-10gb": "3",
}


def make_node(
    name: str = "n1",
    allocatable: dict[str, Any] | None = None,
    labels: dict[str, str] | None = None,
    taints: list[dict[str, Any]] | None = None,
    unschedulable: bool = False,
) -> dict[str, Any]:
    spec: dict[str, Any] = {}
    if taints:
        spec["taints"] = taints
    if unschedulable:
        spec["unschedulable"] = True
    return {
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": labels or {}},
        "spec": spec,
        "status": {"allocatable": dict(GPU_ALLOCATABLE if allocatable is None else allocatable)},
    }


def make_pod(
    name: str = "p",
    requests: dict[str, Any] | None = None,
    limits: dict[str, Any] | None = None,
    **spec: Any,
) -> dict[str, Any]:
    resources: dict[str, Any] = {}
    if requests:
        resources["requests"] = requests
    if limits:
        resources["limits"] = limits
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "default", "uid": f"uid-{name}"},
        "spec": {"containers": [{"name": "c", "resources": resources}], **spec},
    }


def affinity(*terms: dict[str, Any]) -> dict[str, Any]:
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": list(terms)}}}


def expr(key: str, operator: str, *values: str) -> dict[str, Any]:
    item: dict[str, Any] = {"key": key, "operator": operator}
    if values:
        item["values"] = list(values)
    return item


# ---------------------------------------------------------------- NodeResourcesFit
RESOURCE_CASES = [
    pytest.param({}, {}, [], [], id="no requests fits an empty node"),
    pytest.param({"cpu": "8"}, {}, [], [], id="exactly the allocatable cpu fits"),
    pytest.param({"cpu": "8500m"}, {}, [], ["Insufficient cpu"], id="too much cpu"),
    pytest.param({"memory": "33Gi"}, {}, [], ["Insufficient memory"], id="too much memory"),
    pytest.param({"cpu": "9", "memory": "40Gi"}, {}, [], ["Insufficient cpu", "Insufficient memory"],
                 id="every short resource is listed"),
    pytest.param({"cpu": "5"}, {}, [{"cpu": "4"}], ["Insufficient cpu"], id="existing pods' requests count"),
    pytest.param({"cpu": "4"}, {}, [{"cpu": "4"}], [], id="fits in what the existing pods leave"),
    pytest.param({}, {"nvidia.com/gpu": 2}, [], [], id="whole gpus fit"),
    pytest.param({}, {"nvidia.com/gpu": 3}, [], ["Insufficient nvidia.com/gpu"], id="too many whole gpus"),
    pytest.param({}, {"nvidia.com/gpu": 1}, [{"nvidia.com/gpu": 2}], ["Insufficient nvidia.com/gpu"],
                 id="gpus used by existing pods (limit-only) are not free"),
    pytest.param({}, {"nvidia.com/gpu.shared": 8}, [], [], id="time-sliced replicas fit"),
    pytest.param({}, {"nvidia.com/gpu.shared": 9}, [], ["Insufficient nvidia.com/gpu.shared"],
                 id="too many time-sliced replicas"),
    pytest.param({}, {"nvidia.com/mig-1g.10gb": 1}, [{"nvidia.com/mig-1g.10gb": 6}], [], id="last mig slice fits"),
    pytest.param({}, {"nvidia.com/mig-1g.10gb": 1}, [{"nvidia.com/mig-1g.10gb": 7}],
                 ["Insufficient nvidia.com/mig-1g.10gb"], id="no mig slice left"),
    pytest.param({}, {"nvidia.com/mig-3g.40gb": 1}, [], ["Insufficient nvidia.com/mig-3g.40gb"],
                 id="mig profile the node lacks does not fit"),
    pytest.param({}, {"nvidia.com/gpu-10gb": 3}, [], [], id="mps memory slices fit"),
    pytest.param({}, {"nvidia.com/gpu-20gb": 1}, [], ["Insufficient nvidia.com/gpu-20gb"],
                 id="mps slice size the node lacks does not fit"),
    pytest.param({"example.com/foo": "1"}, {}, [], ["Insufficient example.com/foo"],
                 id="any extended resource the node lacks does not fit"),
    pytest.param({"nvidia.com/gpu": "1"}, {}, [], [], id="extended request without limit is taken as given"),
    pytest.param({"cpu": "100m"}, {}, [{"cpu": "100m"}] * 2, [], id="milli-cpu sums do not drift"),
]


@pytest.mark.parametrize(("requests", "limits", "existing", "reasons"), RESOURCE_CASES)
def test_node_resources_fit(
    requests: dict[str, Any], limits: dict[str, Any], existing: list[dict[str, Any]], reasons: list[str]
) -> None:
    allocatable = dict(GPU_ALLOCATABLE, cpu="300m") if requests.get("cpu") == "100m" else None
    existing_pods = [
        make_pod(f"e{index}", **({"limits": amounts} if "nvidia.com" in next(iter(amounts)) else {"requests": amounts}))
        for index, amounts in enumerate(existing)
    ]
    info = node_info(make_node(allocatable=allocatable), existing_pods)
    result = fits(make_pod(requests=requests, limits=limits), info)
    assert result.reasons == reasons
    assert result.ok is (not reasons)


def test_too_many_pods() -> None:
    info = node_info(make_node(allocatable={"cpu": "8", "memory": "1Gi", "pods": "2"}), [make_pod("a"), make_pod("b")])
    assert fits(make_pod("c"), info).reasons == [REASON_TOO_MANY_PODS]


def test_node_without_pods_allocatable_takes_no_pods() -> None:
    info = node_info(make_node(allocatable={"cpu": "8"}))
    assert fits(make_pod(), info).reasons == [REASON_TOO_MANY_PODS]


def test_init_container_request_counts_as_max_with_app_sum() -> None:
    pod = make_pod(requests={"cpu": "1"})
    pod["spec"]["initContainers"] = [{"name": "i", "resources": {"limits": {"nvidia.com/gpu": 3}}}]
    info = node_info(make_node())
    assert fits(pod, info).reasons == ["Insufficient nvidia.com/gpu"]


def test_pod_overhead_counts() -> None:
    pod = make_pod(requests={"cpu": "7500m"}, overhead={"cpu": "600m"})
    assert fits(pod, node_info(make_node())).reasons == ["Insufficient cpu"]


def test_finished_pods_hold_no_resources() -> None:
    done = make_pod("done", limits={"nvidia.com/gpu": 2})
    done["status"] = {"phase": "Succeeded"}
    info = node_info(make_node(), [done])
    assert fits(make_pod(limits={"nvidia.com/gpu": 2}), info).ok


def test_add_and_remove_pod_update_requested() -> None:
    info = node_info(make_node())
    first = make_pod("a", requests={"cpu": "100m"}, limits={"nvidia.com/gpu": 2})
    info.add_pod(first)
    assert info.requested["nvidia.com/gpu"] == 2
    assert not fits(make_pod("b", limits={"nvidia.com/gpu": 1}), info).ok
    info.remove_pod({"metadata": {"name": "a", "namespace": "default", "uid": "uid-a"}})
    assert info.requested["nvidia.com/gpu"] == 0
    assert info.requested["cpu"] == 0
    assert info.pods == []
    assert fits(make_pod("b", limits={"nvidia.com/gpu": 2}), info).ok


def test_remove_unknown_pod_names_it() -> None:
    with pytest.raises(NotFoundError, match="pod default/ghost is not counted on node n1"):
        node_info(make_node()).remove_pod(make_pod("ghost"))


def test_bad_allocatable_names_node_and_field() -> None:
    with pytest.raises(ConfigError, match=r"node n1: status\.allocatable\.cpu"):
        node_info(make_node(allocatable={"cpu": "lots"}))


def test_precomputed_requests_are_used() -> None:
    info = node_info(make_node())
    pod = make_pod(limits={"nvidia.com/gpu": 1})
    assert fits(pod, info, requests={"nvidia.com/gpu": 5, "pods": 1}).reasons == ["Insufficient nvidia.com/gpu"]
    need = pod_requirements(pod)
    assert fits(need, info).ok
    info.add_pod(pod, need.requests)
    info.add_pod(make_pod("b", limits={"nvidia.com/gpu": 1}), None)
    assert not fits(need, info).ok


# ---------------------------------------------------------------- NodeName
@pytest.mark.parametrize(
    ("pod_node_name", "ok"), [(None, True), ("n1", True), ("n2", False)], ids=["unset", "same", "other"]
)
def test_node_name(pod_node_name: str | None, ok: bool) -> None:
    pod = make_pod(nodeName=pod_node_name) if pod_node_name else make_pod()
    result = fits(pod, node_info(make_node("n1")))
    assert result.ok is ok
    assert result.reasons == ([] if ok else [REASON_NODE_NAME])


# ---------------------------------------------------------------- NodeSelector + NodeAffinity
LABELS = {"gpu": "a100", "zone": "z1", "gpus": "8", "mig": "true", "underscored": "1_000"}

AFFINITY_CASES = [
    pytest.param({}, None, True, id="no selector no affinity"),
    pytest.param({"gpu": "a100"}, None, True, id="nodeSelector matches"),
    pytest.param({"gpu": "h100"}, None, False, id="nodeSelector value differs"),
    pytest.param({"missing": "x"}, None, False, id="nodeSelector key missing"),
    pytest.param({"gpu": "a100", "zone": "z2"}, None, False, id="nodeSelector entries are ANDed"),
    pytest.param({}, [{"matchExpressions": [expr("gpu", "In", "h100", "a100")]}], True, id="In matches"),
    pytest.param({}, [{"matchExpressions": [expr("gpu", "In", "h100")]}], False, id="In value absent"),
    pytest.param({}, [{"matchExpressions": [expr("nokey", "In", "x")]}], False, id="In key missing"),
    pytest.param({}, [{"matchExpressions": [expr("gpu", "NotIn", "h100")]}], True, id="NotIn matches"),
    pytest.param({}, [{"matchExpressions": [expr("gpu", "NotIn", "a100")]}], False, id="NotIn value present"),
    pytest.param({}, [{"matchExpressions": [expr("nokey", "NotIn", "x")]}], True, id="NotIn key missing matches"),
    pytest.param({}, [{"matchExpressions": [expr("mig", "Exists")]}], True, id="Exists present"),
    pytest.param({}, [{"matchExpressions": [expr("nokey", "Exists")]}], False, id="Exists absent"),
    pytest.param({}, [{"matchExpressions": [expr("nokey", "DoesNotExist")]}], True, id="DoesNotExist absent"),
    pytest.param({}, [{"matchExpressions": [expr("mig", "DoesNotExist")]}], False, id="DoesNotExist present"),
    pytest.param({}, [{"matchExpressions": [expr("gpus", "Gt", "4")]}], True, id="Gt greater"),
    pytest.param({}, [{"matchExpressions": [expr("gpus", "Gt", "8")]}], False, id="Gt equal is not greater"),
    pytest.param({}, [{"matchExpressions": [expr("gpus", "Lt", "9")]}], True, id="Lt less"),
    pytest.param({}, [{"matchExpressions": [expr("gpus", "Lt", "8")]}], False, id="Lt equal is not less"),
    pytest.param({}, [{"matchExpressions": [expr("gpu", "Gt", "1")]}], False, id="Gt on non-integer label"),
    pytest.param({}, [{"matchExpressions": [expr("underscored", "Gt", "1")]}], False,
                 id="Gt parses labels like Go, not Python"),
    pytest.param({}, [{"matchExpressions": [expr("nokey", "Lt", "1")]}], False, id="Lt on missing label"),
    pytest.param({}, [{"matchExpressions": [expr("gpu", "In", "a100"), expr("zone", "In", "z2")]}], False,
                 id="expressions in one term are ANDed"),
    pytest.param({}, [{"matchExpressions": [expr("gpu", "In", "h100")]},
                      {"matchExpressions": [expr("zone", "In", "z1")]}], True, id="terms are ORed"),
    pytest.param({}, [], False, id="empty term list matches nothing"),
    pytest.param({}, [{}], False, id="empty term matches nothing"),
    pytest.param({}, [{"matchFields": [expr("metadata.name", "In", "n1")]}], True, id="matchFields name In"),
    pytest.param({}, [{"matchFields": [expr("metadata.name", "In", "n2")]}], False, id="matchFields name In other"),
    pytest.param({}, [{"matchFields": [expr("metadata.name", "NotIn", "n1")]}], False, id="matchFields name NotIn"),
    pytest.param({}, [{"matchExpressions": [expr("gpu", "In", "a100")],
                       "matchFields": [expr("metadata.name", "In", "n2")]}], False,
                 id="fields ANDed with expressions"),
    pytest.param({"gpu": "h100"}, [{"matchExpressions": [expr("gpu", "Exists")]}], False,
                 id="nodeSelector and affinity must both match"),
]


@pytest.mark.parametrize(("selector", "terms", "ok"), AFFINITY_CASES)
def test_node_affinity(selector: dict[str, str], terms: list[dict[str, Any]] | None, ok: bool) -> None:
    spec: dict[str, Any] = {"nodeSelector": selector}
    if terms is not None:
        spec["affinity"] = affinity(*terms)
    result = fits(make_pod(**spec), node_info(make_node("n1", labels=LABELS)))
    assert result.ok is ok
    assert result.reasons == ([] if ok else [REASON_AFFINITY])
    if terms is not None:
        assert match_node_selector_terms(terms, LABELS, "n1") is (ok or bool(selector))


@pytest.mark.parametrize(
    ("item", "field"),
    [
        (expr("gpu", "Like", "a"), r"matchExpressions\[0\].operator"),
        (expr("gpus", "Gt", "many"), r"matchExpressions\[0\].values\[0\]"),
        (expr("gpus", "Lt", "1", "2"), r"matchExpressions\[0\].values"),
    ],
)
def test_bad_affinity_names_the_field(item: dict[str, Any], field: str) -> None:
    with pytest.raises(ConfigError, match=r"pod default/p: spec.affinity.*nodeSelectorTerms\[0\]." + field):
        fits(make_pod(affinity=affinity({"matchExpressions": [item]})), node_info(make_node()))


def test_match_fields_only_on_metadata_name() -> None:
    with pytest.raises(ConfigError, match=r"matchFields\[0\].key: 'metadata.uid'"):
        match_node_selector_terms([{"matchFields": [expr("metadata.uid", "In", "x")]}], {})


# ---------------------------------------------------------------- TaintToleration
GPU_TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}

TAINT_CASES = [
    pytest.param([], [], True, id="no taints"),
    pytest.param([GPU_TAINT], [], False, id="NoSchedule filters"),
    pytest.param([dict(GPU_TAINT, effect="NoExecute")], [], False, id="NoExecute filters"),
    pytest.param([dict(GPU_TAINT, effect="PreferNoSchedule")], [], True, id="PreferNoSchedule does not filter"),
    pytest.param([GPU_TAINT], [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}], True,
                 id="Exists with key"),
    pytest.param([GPU_TAINT], [{"key": "nvidia.com/gpu", "operator": "Equal", "value": "present"}], True,
                 id="Equal with value, any effect"),
    pytest.param([GPU_TAINT], [{"key": "nvidia.com/gpu", "value": "present"}], True, id="operator defaults to Equal"),
    pytest.param([GPU_TAINT], [{"key": "nvidia.com/gpu", "operator": "Equal", "value": "absent"}], False,
                 id="Equal with other value"),
    pytest.param([GPU_TAINT], [{"key": "other", "operator": "Exists"}], False, id="other key"),
    pytest.param([GPU_TAINT], [{"operator": "Exists"}], True, id="empty key with Exists tolerates everything"),
    pytest.param([GPU_TAINT], [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoExecute"}], False,
                 id="effect must match"),
    pytest.param([GPU_TAINT, {"key": "b", "value": "1", "effect": "NoExecute"}],
                 [{"key": "nvidia.com/gpu", "operator": "Exists"}], False,
                 id="every filtering taint needs a toleration"),
    pytest.param([GPU_TAINT, {"key": "b", "value": "1", "effect": "PreferNoSchedule"}],
                 [{"key": "nvidia.com/gpu", "operator": "Exists"}], True, id="untolerated PreferNoSchedule is fine"),
]


@pytest.mark.parametrize(("taints", "tolerations", "ok"), TAINT_CASES)
def test_taint_toleration(taints: list[dict[str, Any]], tolerations: list[dict[str, Any]], ok: bool) -> None:
    result = fits(make_pod(tolerations=tolerations), node_info(make_node(taints=taints)))
    assert result.ok is ok
    if not ok:
        untolerated = next(t for t in taints if t["effect"] != "PreferNoSchedule" and not tolerates(tolerations, t))
        assert result.reasons == [f"node(s) had untolerated taint {{{untolerated['key']}: {untolerated['value']}}}"]


def test_taint_reason_wording() -> None:
    result = fits(make_pod(), node_info(make_node(taints=[GPU_TAINT])))
    assert result.reasons == ["node(s) had untolerated taint {nvidia.com/gpu: present}"]


def test_unknown_toleration_operator_tolerates_nothing() -> None:
    assert not tolerates([{"key": "nvidia.com/gpu", "operator": "Gte"}], GPU_TAINT)


# ---------------------------------------------------------------- NodeUnschedulable
@pytest.mark.parametrize(
    ("tolerations", "ok"),
    [
        ([], False),
        ([{"key": "node.kubernetes.io/unschedulable", "operator": "Exists", "effect": "NoSchedule"}], True),
        ([{"operator": "Exists"}], True),
        ([{"key": "node.kubernetes.io/unschedulable", "operator": "Exists", "effect": "NoExecute"}], False),
    ],
    ids=["no toleration", "tolerates the unschedulable taint", "tolerates everything", "wrong effect"],
)
def test_node_unschedulable(tolerations: list[dict[str, Any]], ok: bool) -> None:
    result = fits(make_pod(tolerations=tolerations), node_info(make_node(unschedulable=True)))
    assert result.ok is ok
    assert result.reasons == ([] if ok else [REASON_UNSCHEDULABLE])


def test_first_failing_filter_decides_like_kube_scheduler() -> None:
    node = make_node(unschedulable=True, taints=[GPU_TAINT], labels={})
    pod = make_pod(limits={"nvidia.com/gpu": 5}, nodeSelector={"x": "y"})
    assert fits(pod, node_info(node)).reasons == [REASON_UNSCHEDULABLE]
    node["spec"].pop("unschedulable")
    assert fits(pod, node_info(node)).reasons == ["node(s) had untolerated taint {nvidia.com/gpu: present}"]
    node["spec"].pop("taints")
    assert fits(pod, node_info(node)).reasons == [REASON_AFFINITY]
    node["metadata"]["labels"]["x"] = "y"
    assert fits(pod, node_info(node)).reasons == ["Insufficient nvidia.com/gpu"]


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        ({"tolerations": ["nvidia.com/gpu"]}, r"spec\.tolerations\[0\]"),
        ({"nodeSelector": ["gpu"]}, r"spec\.nodeSelector"),
    ],
)
def test_malformed_pod_fields_are_named(spec: dict[str, Any], field: str) -> None:
    with pytest.raises(ConfigError, match=r"pod default/p: " + field):
        fits(make_pod(**spec), node_info(make_node()))
