"""Topology spread and required pod affinity in the provisioning simulation, case by case as Karpenter's
topology suite checks them: counts per zone or node over existing nodes and this pass's NodeClaims."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

import pytest

from kubegpu.autoscaler.provisioner import run_pass
from kubegpu.autoscaler.scheduler import SchedulingResult, pod_problem
from kubegpu.autoscaler.topology import TopologyCounts, Verdict, pod_topology
from kubegpu.errors import ConfigError
from kubegpu.scheduling import NodeInfo, node_info
from tests.autoscaler.builders import instance_type, pod, pool

ZONE = "topology.kubernetes.io/zone"
HOST = "kubernetes.io/hostname"
ZONES = ("zone-a", "zone-b", "zone-c")
TYPES = [instance_type("small", 2, 8, 0.10, zones=ZONES), instance_type("large", 8, 32, 0.40, zones=ZONES)]


def solve(pods: list[dict[str, Any]], existing: Sequence[NodeInfo] = (), **pool_spec: Any) -> SchedulingResult:
    return run_pass([pool(**pool_spec)], lambda _p: TYPES, pods, existing=existing)


def spread(key: str, skew: int = 1, app: str = "web", when: str = "DoNotSchedule") -> dict[str, Any]:
    return {"topologySpreadConstraints": [{"maxSkew": skew, "topologyKey": key, "whenUnsatisfiable": when,
                                           "labelSelector": {"matchLabels": {"app": app}}}]}


def affinity(key: str, app: str, kind: str = "podAffinity") -> dict[str, Any]:
    return {"affinity": {kind: {"requiredDuringSchedulingIgnoredDuringExecution": [
        {"topologyKey": key, "labelSelector": {"matchLabels": {"app": app}}}]}}}


def pods_with(count: int, spec: dict[str, Any], app: str = "web", cpu: str = "500m", prefix: str = "p",
              zones: list[str] | None = None) -> list[dict[str, Any]]:
    extra = dict(spec)
    if zones:  # the pod's own node affinity limits its zones
        extra["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": ZONE, "operator": "In", "values": zones}]}]}}}
    return [pod(f"{prefix}{i}", cpu=cpu, memory="256Mi", metadata={"labels": {"app": app}}, spec=extra)
            for i in range(count)]


def node(name: str, zone: str, cpu: str = "2") -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": {ZONE: zone, HOST: name}}, "spec": {},
            "status": {"allocatable": {"cpu": cpu, "memory": "8Gi", "pods": "110"}}}


def holding(name: str, zone: str, count: int, app: str = "web", cpu: str = "1") -> NodeInfo:
    """An existing node in `zone` holding `count` pods labelled app=`app`, with no room left for more."""
    return node_info(node(name, zone, cpu=str(count * float(cpu))),
                     pods_with(count, {}, app=app, prefix=f"{name}-", cpu=cpu))


def zone_counts(result: SchedulingResult, app: str = "web") -> dict[str, int]:
    """Pods with label app=`app` per zone, over the new claims (each such claim pinned to the zone it launches in)."""
    out: Counter[str] = Counter()
    for claim in result.claims:
        matching = sum((p["metadata"].get("labels") or {}).get("app") == app for p in claim.pods)
        if matching:
            zone = claim.requirements.get(ZONE)
            assert zone is not None and zone.values == {claim.offering.zone}, "a constrained claim pins its zone"
            out[claim.offering.zone] += matching
    return dict(out)


def per_node(result: SchedulingResult, app: str = "web") -> list[int]:
    return sorted((sum((p["metadata"].get("labels") or {}).get("app") == app for p in c.pods)
                   for c in result.claims), reverse=True)


# -- zonal topology spread ---------------------------------------------------------------------------------------
ZONAL_CASES = [
    # (case, new pods, maxSkew, matching pods already on a full node per zone, pod's own zones,
    #  expected sorted totals per zone (existing + new) over the pod's zones)
    ("balances across every zone", 6, 1, {}, None, [2, 2, 2]),
    ("fills the emptiest zones first", 4, 1, {"zone-a": 2}, None, [2, 2, 2]),
    ("skew counted over the pod's own zones", 3, 1, {}, ["zone-a", "zone-b"], [1, 2]),
    ("existing pods outside the pod's zones do not count", 2, 1, {"zone-c": 3}, ["zone-a", "zone-b"], [1, 1]),
    ("larger skew allows uneven zones", 5, 2, {"zone-c": 1}, None, None),
    ("a new claim opens in the emptiest zone", 1, 2, {"zone-a": 1}, None, [0, 1, 1]),
    ("skew 1 with many pods", 31, 1, {}, None, [10, 10, 11]),
]


@pytest.mark.parametrize(("case", "count", "skew", "existing", "zones", "expected"), ZONAL_CASES,
                         ids=[c[0] for c in ZONAL_CASES])
def test_zonal_spread(case: str, count: int, skew: int, existing: dict[str, int], zones: list[str] | None,
                      expected: list[int] | None) -> None:
    infos = [holding(f"full-{zone}", zone, matching) for zone, matching in existing.items()]
    result = solve(pods_with(count, spread(ZONE, skew), zones=zones), existing=infos)
    assert not result.unschedulable
    new = zone_counts(result)
    assert sum(new.values()) == count and set(new) <= set(zones or ZONES)
    totals = sorted(new.get(z, 0) + existing.get(z, 0) for z in zones or ZONES)
    assert totals[-1] - totals[0] <= skew
    if expected is not None:
        assert totals == expected


def test_zonal_spread_counts_only_selected_pods() -> None:
    """Pods that do not match the selector (generic ones, other apps) never move the counts."""
    generic = [pod(f"g{i}", cpu="500m") for i in range(6)]
    others = pods_with(3, {}, app="other", prefix="o")
    result = solve([*generic, *others, *pods_with(3, spread(ZONE))])
    assert zone_counts(result) == {"zone-a": 1, "zone-b": 1, "zone-c": 1}


def test_zonal_spread_on_pods_that_do_not_select_themselves() -> None:
    """A spread on someone else's pods sends every pod to the zone where they are fewest; its own don't count."""
    result = solve(pods_with(4, spread(ZONE, app="db")), existing=[holding("db-a", "zone-a", 1, app="db")])
    assert zone_counts(result) == {"zone-b": 4}


def test_schedule_anyway_is_a_preference_and_ignored() -> None:
    result = solve(pods_with(4, spread(ZONE, when="ScheduleAnyway"), cpu="250m"))
    assert len(result.claims) == 1


def test_nodepool_zone_requirement_bounds_the_domains() -> None:
    result = solve(pods_with(4, spread(ZONE)), requirements=[{"key": ZONE, "operator": "In", "values": ["zone-b"]}])
    assert not result.unschedulable and zone_counts(result) == {"zone-b": 4}


# -- hostname topology spread and anti-affinity ----------------------------------------------------------------------
@pytest.mark.parametrize(("count", "skew", "nodes", "most"), [(4, 1, 4, 1), (5, 2, 3, 2), (3, 3, 1, 3)])
def test_hostname_spread_caps_matching_pods_per_node(count: int, skew: int, nodes: int, most: int) -> None:
    result = solve(pods_with(count, spread(HOST, skew), cpu="250m"))
    assert len(result.claims) == nodes and per_node(result)[0] == most


def test_hostname_spread_avoids_an_existing_node_that_holds_one() -> None:
    holder = node_info(node("n1", "zone-a", cpu="4"), pods_with(1, {}, prefix="old", cpu="1"))   # room for more
    result = solve(pods_with(2, spread(HOST)), existing=[holder])
    assert "n1" not in result.existing and len(result.claims) == 2


def test_hostname_spread_and_anti_affinity_share_a_node_one_each() -> None:
    """Karpenter's mix: a node can hold one pod of each hostname-constrained group, never two of one."""
    pods = [*pods_with(3, spread(HOST, app="tsc"), app="tsc", prefix="t"),
            *pods_with(3, affinity(HOST, "anti", "podAntiAffinity"), app="anti", prefix="a")]
    result = solve(pods)
    assert not result.unschedulable
    assert max(per_node(result, "tsc")) == 1 and max(per_node(result, "anti")) == 1
    assert len(result.claims) == 3


# -- required pod affinity ---------------------------------------------------------------------------------------------
def test_zonal_self_affinity_colocates_in_one_zone() -> None:
    result = solve(pods_with(10, affinity(ZONE, "web"), cpu="1500m"))
    assert len(result.claims) > 1 and len(zone_counts(result)) == 1 and sum(zone_counts(result).values()) == 10


def test_zonal_affinity_follows_existing_pods() -> None:
    result = solve(pods_with(3, affinity(ZONE, "db")), existing=[holding("db-b", "zone-b", 1, app="db")])
    assert zone_counts(result) == {"zone-b": 3}


def test_affinity_to_pods_that_do_not_exist_is_unschedulable() -> None:
    result = solve(pods_with(2, affinity(ZONE, "db")))
    assert not result.claims and set(result.unschedulable) == {"default/p0", "default/p1"}
    assert "allows no zone" in result.unschedulable["default/p0"]


def test_hostname_self_affinity_packs_one_node() -> None:
    result = solve(pods_with(4, affinity(HOST, "web"), cpu="250m"))
    assert len(result.claims) == 1 and per_node(result) == [4]
    overflow = solve(pods_with(5, affinity(HOST, "web"), cpu="500m"))   # a small node takes three
    assert per_node(overflow) == [3] and len(overflow.unschedulable) == 2


# -- the counts on their own, and bad input ------------------------------------------------------------------------
def test_zone_choice_and_host_verdict() -> None:
    tsc = pod_topology(pods_with(1, spread(ZONE))[0])
    host = pod_topology(pods_with(1, spread(HOST))[0])
    assert tsc is not None and host is not None
    counts = TopologyCounts.for_pods(ZONES, [tsc, host])
    for zone in ("zone-a", "zone-a", "zone-b"):
        counts.record(pods_with(1, {})[0], zone, "n1")
    assert counts.zone_choice(tsc, ZONES) == ("zone-c", Verdict.OK)
    assert counts.zone_choice(tsc, ["zone-a"]) == (None, Verdict.RETRY)
    assert counts.zone_choice(tsc, []) == (None, Verdict.NEVER)
    assert counts.host_verdict(host, "n1") is Verdict.NEVER and counts.host_verdict(host, "n2") is Verdict.OK
    assert pod_topology(pod("plain")) is None


@pytest.mark.parametrize(("spec", "field"), [
    ({"topologySpreadConstraints": [{"maxSkew": 0, "topologyKey": ZONE}]},
     "spec.topologySpreadConstraints[0].maxSkew"),
    ({"topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": ZONE, "whenUnsatisfiable": "Sometimes"}]},
     "spec.topologySpreadConstraints[0].whenUnsatisfiable"),
    ({"topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": ZONE, "labelSelector": {
        "matchExpressions": [{"key": "app", "operator": "Near"}]}}]},
     "spec.topologySpreadConstraints[0].labelSelector.matchExpressions[0]"),
    ({"affinity": {"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [{"labelSelector": {}}]}}},
     "requiredDuringSchedulingIgnoredDuringExecution[0].topologyKey"),
])
def test_bad_topology_terms_name_the_field(spec: dict[str, Any], field: str) -> None:
    bad = pod("bad", spec=spec)
    problem = pod_problem(bad)
    assert problem is not None and "pod default/bad" in problem and field in problem
    with pytest.raises(ConfigError, match="default/bad"):
        solve([bad])
