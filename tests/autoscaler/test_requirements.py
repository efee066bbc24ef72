"""Requirement algebra: Karpenter's operators, intersection and pod/NodePool compatibility."""

from __future__ import annotations

from kubegpu.autoscaler.requirements import Requirement, Requirements, pod_requirement_options


def reqs(*items: tuple[str, str, list[str]]) -> Requirements:
    return Requirements.from_api([{"key": k, "operator": op, "values": v} for k, op, v in items])


def test_operators_membership() -> None:
    assert Requirement.of("a", "In", ["x"]).has("x")
    assert not Requirement.of("a", "In", ["x"]).has("y")
    assert Requirement.of("a", "NotIn", ["x"]).has("y")
    assert not Requirement.of("a", "NotIn", ["x"]).has("x")
    assert Requirement.of("a", "Exists").has("anything")
    assert Requirement.of("cpu", "Gt", ["4"]).has("8")
    assert not Requirement.of("cpu", "Gt", ["4"]).has("4")
    assert Requirement.of("cpu", "Lt", ["4"]).has("2")
    assert not Requirement.of("cpu", "Lt", ["4"]).has("x")
    assert Requirement.of("cpu", "Gte", ["4"]).has("4")
    assert Requirement.of("cpu", "Lte", ["4"]).has("4")



def test_a_missing_label_fails_positive_requirements_unless_it_is_not_the_checked_labels_business() -> None:
    assert not Requirement.of("a", "In", ["x"]).admits(None)
    assert not Requirement.of("a", "Exists").admits(None)
    assert not Requirement.of("cpu", "Gt", ["4"]).admits(None)
    assert Requirement.of("a", "NotIn", ["x"]).admits(None)
    assert Requirement.of("a", "DoesNotExist").admits(None)
    assert Requirement.of("a", "In", ["x"]).admits(None, absent_fails=False)
    assert Requirement.of("a", "In", ["x"]).admits("x") and not Requirement.of("a", "In", ["x"]).admits("y")
    assert not Requirement.of("a", "DoesNotExist").admits("x")
    labels = {"a": "x"}
    assert reqs(("a", "In", ["x"]), ("b", "NotIn", ["y"])).satisfied_by(labels)
    assert not reqs(("a", "In", ["x"]), ("b", "In", ["y"])).satisfied_by(labels)

def test_intersection_and_emptiness() -> None:
    both = Requirement.of("z", "In", ["a", "b"]).intersect(Requirement.of("z", "NotIn", ["a"]))
    assert both.values == frozenset({"b"}) and not both.complement
    assert Requirement.of("z", "In", ["a"]).intersect(Requirement.of("z", "In", ["b"])).is_empty()
    assert Requirement.of("n", "Gt", ["4"]).intersect(Requirement.of("n", "Lt", ["5"])).is_empty()
    assert not Requirement.of("n", "Gt", ["4"]).intersect(Requirement.of("n", "Lt", ["6"])).is_empty()
    bounded = Requirement.of("n", "In", ["2", "8"]).intersect(Requirement.of("n", "Gt", ["4"]))
    assert bounded.values == frozenset({"8"})


def test_conflict_rules() -> None:
    pool = reqs(("kubegpu.io/capacity-type", "In", ["on-demand"]), ("team", "In", ["ml"]))
    assert pool.conflict(reqs(("team", "In", ["ml", "web"]))) is None
    assert "conflicts" in (pool.conflict(reqs(("kubegpu.io/capacity-type", "In", ["spot"]))) or "")
    # a well-known label the pool leaves open is decided by the instance type
    assert pool.conflict(reqs(("topology.kubernetes.io/zone", "In", ["zone-a"]))) is None
    # a custom label the pool does not set cannot be satisfied positively, but may be excluded
    assert "not set by the NodePool" in (pool.conflict(reqs(("gpu-team", "In", ["x"]))) or "")
    assert pool.conflict(reqs(("gpu-team", "DoesNotExist", []))) is None
    assert pool.conflict(reqs(("gpu-team", "NotIn", ["x"]))) is None


def test_satisfied_by_labels() -> None:
    want = reqs(("kubernetes.io/arch", "In", ["amd64"]), ("kubegpu.io/instance-cpu", "Gt", ["4"]))
    assert want.satisfied_by({"kubernetes.io/arch": "amd64", "kubegpu.io/instance-cpu": "8"})
    assert not want.satisfied_by({"kubernetes.io/arch": "amd64", "kubegpu.io/instance-cpu": "4"})
    assert not want.satisfied_by({"kubernetes.io/arch": "amd64"})


def test_round_trip_to_api() -> None:
    original = reqs(("a", "In", ["x", "y"]), ("b", "NotIn", ["z"]), ("c", "Exists", []), ("d", "DoesNotExist", []),
                    ("e", "Gt", ["3"]))
    assert Requirements.from_api(original.to_api()) == original


def test_pod_options_or_terms() -> None:
    pod = {"spec": {"nodeSelector": {"team": "ml"}, "affinity": {"nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]},
            {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["b"]}]}]}}}}}
    options = pod_requirement_options(pod)
    assert len(options) == 2
    assert all(o.get("team") is not None for o in options)
    assert options[1].get("zone").values == frozenset({"b"})  # type: ignore[union-attr]
