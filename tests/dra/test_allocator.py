"""The DRA allocator, one rule at a time, on hand-computed cases (reference/dra.md §4)."""

from __future__ import annotations

from typing import Any

import pytest

from kubegpu.scheduling.dra import allocate_in_order, parse_all
from tests.dra.builders import (
    GPU_SEL,
    claim,
    classes,
    device,
    device_class,
    first_available,
    request,
    slice_,
)


def run(slices: list[dict[str, Any]], claims: list[dict[str, Any]],
        device_classes: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    parsed_classes = parse_all(device_classes or classes(), "DeviceClass", "classes")
    outcomes = allocate_in_order(parse_all(slices, "ResourceSlice", "slices"),
                                 {c.name: c for c in parsed_classes}, parse_all(claims, "ResourceClaim", "claims"))
    return {key: outcome.to_json() for key, outcome in outcomes.items()}


def devices_of(answer: dict[str, Any], key: str) -> list[str]:
    return [r["device"] for r in answer[key]["results"]]


NODE_A = slice_("a", "node-a", [device("gpu-0"), device("gpu-1"), device("gpu-0-mig-1g10gb-19-0", "mig", memory="10Gi"),
                                device("gpu-0-mig-3g40gb-9-4", "mig", memory="40Gi")])


def test_class_selector_picks_type_and_first_fit_order() -> None:
    answer = run([NODE_A], [claim("g", request("gpu")), claim("m", request("mig", "mig.nvidia.com")),
                            claim("g2", request("gpu"))])
    assert answer["default/g"] == {"results": [{"request": "gpu", "driver": "gpu.nvidia.com", "pool": "node-a",
                                                "device": "gpu-0"}]}
    assert devices_of(answer, "default/m") == ["gpu-0-mig-1g10gb-19-0"]
    assert devices_of(answer, "default/g2") == ["gpu-1"]  # gpu-0 is taken by the earlier claim


def test_request_selector_with_quantity_compare() -> None:
    big = "device.capacity['gpu.nvidia.com'].memory.compareTo(quantity('20Gi')) >= 0"
    answer = run([NODE_A], [claim("m", request("mig", "mig.nvidia.com", selectors=(big,)))])
    assert devices_of(answer, "default/m") == ["gpu-0-mig-3g40gb-9-4"]


def test_exact_count_and_exhaustion() -> None:
    answer = run([NODE_A], [claim("two", request("gpu", count=2)), claim("more", request("gpu"))])
    assert devices_of(answer, "default/two") == ["gpu-0", "gpu-1"]
    assert "unschedulable" in answer["default/more"]
    assert "'gpu'" in answer["default/more"]["unschedulable"]


def test_all_mode_takes_every_matching_device_or_none() -> None:
    answer = run([NODE_A], [claim("all", request("migs", "mig.nvidia.com", mode="All"))])
    assert devices_of(answer, "default/all") == ["gpu-0-mig-1g10gb-19-0", "gpu-0-mig-3g40gb-9-4"]
    answer = run([NODE_A], [claim("one", request("mig", "mig.nvidia.com")),
                            claim("all", request("migs", "mig.nvidia.com", mode="All"))])
    assert "unschedulable" in answer["default/all"]  # one of the MIG devices is held by claim "one"


def test_first_available_falls_back_and_names_the_subrequest() -> None:
    h200 = "device.attributes['gpu.nvidia.com'].productName == 'NVIDIA H200'"
    answer = run([NODE_A], [claim("c", first_available("acc", request("h200", selectors=(h200,)),
                                                       request("mig", "mig.nvidia.com")))])
    assert answer["default/c"]["results"][0]["request"] == "acc/mig"
    assert devices_of(answer, "default/c") == ["gpu-0-mig-1g10gb-19-0"]


def test_match_attribute_backtracks_to_a_consistent_pair() -> None:
    mixed = slice_("a", "node-a", [device("gpu-0", product="NVIDIA L4"), device("gpu-1", product="NVIDIA H100"),
                                   device("gpu-2", product="NVIDIA H100")])
    same = [{"requests": [], "matchAttribute": "gpu.nvidia.com/productName"}]
    answer = run([mixed], [claim("pair", request("a"), request("b"), constraints=same)])
    # first fit would give a=gpu-0 (L4), but b then has no L4: the search backtracks to a=gpu-1
    assert devices_of(answer, "default/pair") == ["gpu-1", "gpu-2"]
    distinct = [{"requests": ["a", "b"], "distinctAttribute": "gpu.nvidia.com/productName"}]
    answer = run([mixed], [claim("diff", request("a"), request("b"), constraints=distinct)])
    assert devices_of(answer, "default/diff") == ["gpu-0", "gpu-1"]


def test_match_attribute_rejects_devices_without_the_attribute() -> None:
    pool = slice_("a", "node-a", [device("gpu-0"), device("gpu-1", numa=1), device("gpu-2", numa=1)])
    numa = [{"matchAttribute": "gpu.nvidia.com/numa"}]
    answer = run([pool], [claim("c", request("g", count=2), constraints=numa)])
    assert devices_of(answer, "default/c") == ["gpu-1", "gpu-2"]


def _partitioned() -> dict[str, Any]:
    counters = {"gpu-0-cs": {"memory-slice-0": "1", "memory-slice-1": "1", "memory": "80Gi"}}
    whole = device("gpu-0", consumes={"gpu-0-cs": {"memory-slice-0": "1", "memory-slice-1": "1", "memory": "80Gi"}})
    low = device("gpu-0-mig-a-0", "mig", consumes={"gpu-0-cs": {"memory-slice-0": "1", "memory": "40Gi"}})
    high = device("gpu-0-mig-a-1", "mig", consumes={"gpu-0-cs": {"memory-slice-1": "1", "memory": "40Gi"}})
    span = device("gpu-0-mig-b-0", "mig", consumes={"gpu-0-cs": {"memory-slice-0": "1", "memory-slice-1": "1",
                                                                 "memory": "80Gi"}})
    return slice_("a", "node-a", [whole, low, high, span], counters=counters)


def test_shared_counters_never_over_consumed() -> None:
    answer = run([_partitioned()], [claim("g", request("gpu")), claim("m", request("mig", "mig.nvidia.com"))])
    assert devices_of(answer, "default/g") == ["gpu-0"]
    assert "unschedulable" in answer["default/m"]  # the whole GPU consumed every counter
    answer = run([_partitioned()], [claim("m1", request("mig", "mig.nvidia.com")),
                                    claim("m2", request("mig", "mig.nvidia.com")),
                                    claim("m3", request("mig", "mig.nvidia.com")), claim("g", request("gpu"))])
    assert devices_of(answer, "default/m1") == ["gpu-0-mig-a-0"]
    assert devices_of(answer, "default/m2") == ["gpu-0-mig-a-1"]
    assert "unschedulable" in answer["default/m3"] and "unschedulable" in answer["default/g"]


def test_counter_set_missing_from_pool_makes_device_unallocatable() -> None:
    orphan = device("gpu-0", consumes={"nowhere": {"x": "1"}})
    answer = run([slice_("a", "node-a", [orphan])], [claim("g", request("gpu"))])
    assert "unschedulable" in answer["default/g"]


def test_taints_block_unless_tolerated() -> None:
    tainted = slice_("a", "node-a", [
        device("gpu-0", taints=[{"key": "gpu.nvidia.com/xid", "value": "79", "effect": "NoExecute"}]),
        device("gpu-1", taints=[{"key": "info", "value": "x", "effect": "None"}]),
        device("gpu-2", taints=[{"key": "gpu.nvidia.com/xid", "value": "48", "effect": "NoSchedule"}]),
    ])
    answer = run([tainted], [claim("a", request("g")), claim("b", request("g"))])
    assert devices_of(answer, "default/a") == ["gpu-1"]  # effect None never blocks
    assert "unschedulable" in answer["default/b"]
    tolerate_79 = [{"key": "gpu.nvidia.com/xid", "operator": "Equal", "value": "79", "effect": "NoExecute"}]
    tolerate_any = [{"key": "gpu.nvidia.com/xid", "operator": "Exists"}]
    answer = run([tainted], [claim("a", request("g", tolerations=tolerate_79)),
                             claim("b", request("g", count=2, tolerations=tolerate_any))])
    assert devices_of(answer, "default/a") == ["gpu-0"]
    assert devices_of(answer, "default/b") == ["gpu-1", "gpu-2"]


def test_allocated_and_shared_claims_keep_their_devices() -> None:
    held = [{"request": "gpu", "driver": "gpu.nvidia.com", "pool": "node-a", "device": "gpu-0"}]
    claims = [claim("new", request("gpu")), claim("old", request("gpu"), allocation=held), claim("new", request("gpu"))]
    answer = run([NODE_A], claims)
    assert list(answer) == ["default/new", "default/old"]
    assert devices_of(answer, "default/old") == ["gpu-0"]
    assert devices_of(answer, "default/new") == ["gpu-1"]  # gpu-0 is held even though "old" comes later


def test_claim_needs_one_node() -> None:
    small = slice_("a", "node-a", [device("gpu-0")])
    large = slice_("b", "node-b", [device("gpu-0"), device("gpu-1")])
    answer = run([small, large], [claim("two", request("g", count=2)), claim("one", request("g"))])
    assert answer["default/two"]["results"][0]["pool"] == "node-b"
    assert answer["default/one"]["results"] == [{"request": "g", "driver": "gpu.nvidia.com", "pool": "node-a",
                                                 "device": "gpu-0"}]


def test_only_the_newest_pool_generation_counts() -> None:
    old = slice_("old", "node-a", [device("gpu-9")], generation=1)
    new = slice_("new", "node-a", [device("gpu-0")], generation=2)
    answer = run([old, new], [claim("c", request("g"))])
    assert devices_of(answer, "default/c") == ["gpu-0"]


def test_incomplete_pool_is_never_allocated_from() -> None:
    """kube-scheduler skips a pool whose slices are still being published (an `All` request over it is an error):
    found by the differential test against the real scheduler (tests/dra/test_controlplane.py)."""
    partial = slice_("a", "node-a", [device("gpu-0")], count=2)
    complete = slice_("b", "node-b", [device("gpu-0")])
    answer = run([partial], [claim("all", request("g", mode="All")), claim("one", request("g"))])
    assert "incomplete" in answer["default/all"]["unschedulable"]
    assert "unschedulable" in answer["default/one"]
    answer = run([partial, complete], [claim("one", request("g"))])
    assert answer["default/one"]["results"][0]["pool"] == "node-b"


def test_unknown_class_and_runtime_cel_error_fail_only_that_claim() -> None:
    missing = "device.attributes['gpu.nvidia.com'].numa == 0"  # no such key on these devices: a runtime error
    answer = run([NODE_A], [claim("bad", request("g", "no-such-class")),
                            claim("err", request("g", selectors=(missing,))), claim("ok", request("g"))])
    assert "DeviceClass 'no-such-class' not found" in answer["default/bad"]["unschedulable"]
    assert "no such key" in answer["default/err"]["unschedulable"]
    assert devices_of(answer, "default/ok") == ["gpu-0"]


def test_cel_bind_semver_and_unknown_domain() -> None:
    pool = slice_("a", "node-a", [device("gpu-0"), {**device("gpu-1"), "attributes": {
        **device("gpu-1")["attributes"], "driverVersion": {"version": "580.65.6"}}}])
    newer = "device.attributes['gpu.nvidia.com'].driverVersion.isGreaterThan(semver('550.0.0'))"
    bound = "cel.bind(g, device.attributes['gpu.nvidia.com'], g.type == 'gpu' && has(g.driverVersion))"
    other = "!has(device.attributes['example.com'].x)"
    answer = run([pool], [claim("b", request("g", selectors=(bound, other)))])
    assert devices_of(answer, "default/b") == ["gpu-1"]
    answer = run([pool], [claim("v", request("g", selectors=("has(device.attributes['gpu.nvidia.com'].driverVersion)",
                                                             newer)))])
    assert devices_of(answer, "default/v") == ["gpu-1"]


def test_class_with_two_selectors_needs_both() -> None:
    l4_only = device_class("l4", GPU_SEL, "device.attributes['gpu.nvidia.com'].productName == 'NVIDIA L4'")
    pool = slice_("a", "node-a", [device("gpu-0"), device("gpu-1", product="NVIDIA L4")])
    answer = run([pool], [claim("c", request("g", "l4"))], [*classes(), l4_only])
    assert devices_of(answer, "default/c") == ["gpu-1"]


def test_same_input_same_answer() -> None:
    claims = [claim(f"c{i}", request("g"), first_available("x", request("m", "mig.nvidia.com"), request("g")))
              for i in range(3)]
    assert run([NODE_A], claims) == run([NODE_A], claims)


@pytest.mark.parametrize(("obj", "message"), [
    (claim("c", request("g", selectors=("device.driver ==",))),
     "ResourceClaim default/c: spec.devices.requests[0].exactly.selectors[0].cel.expression: CEL expression does not"),
    (claim("c", request("g", selectors=("nope(device)",))), "undeclared function(s): nope"),
    (claim("c", {"name": "g"}), "spec.devices.requests[0]: exactly one of exactly, firstAvailable"),
    (claim("c", request("g", mode="Some")), "spec.devices.requests[0].exactly.allocationMode"),
    (claim("c", request("g", count=0)), "spec.devices.requests[0].exactly.count"),
    (claim("c", request("g"), constraints=[{"requests": ["zz"], "matchAttribute": "a/b"}]),
     "spec.devices.constraints[0].requests[0]: unknown request 'zz'"),
])
def test_bad_claims_are_one_line_naming_object_and_field(obj: dict[str, Any], message: str) -> None:
    from kubegpu.errors import ConfigError

    with pytest.raises(ConfigError) as err:
        parse_all([obj], "ResourceClaim", "claims.yaml")
    assert message in str(err.value)
    assert str(err.value).startswith("claims.yaml: ResourceClaim")
    assert "\n" not in str(err.value)


def test_bad_slice_field_is_named() -> None:
    from kubegpu.errors import ConfigError

    bad = slice_("a", "node-a", [device("gpu-0", memory="lots")])
    with pytest.raises(ConfigError, match=r"ResourceSlice a: spec.devices\[0\].capacity.memory.value"):
        parse_all([bad], "ResourceSlice", "s")


def test_admin_access_may_use_a_device_in_use() -> None:
    held = [{"request": "gpu", "driver": "gpu.nvidia.com", "pool": "node-a", "device": "gpu-0"}]
    monitor = claim("monitor", request("g"))
    monitor["spec"]["devices"]["requests"][0]["exactly"]["adminAccess"] = True
    answer = run([slice_("a", "node-a", [device("gpu-0"), device("gpu-1")])],
                 [claim("job", request("gpu"), allocation=held), monitor, claim("other", request("g"))])
    assert devices_of(answer, "default/monitor") == ["gpu-0"]
    assert devices_of(answer, "default/other") == ["gpu-1"]
    # an admin-access allocation does not hold its device: the next claim may still take it
    answer = run([slice_("a", "node-a", [device("gpu-0")])], [monitor, claim("other", request("g"))])
    assert devices_of(answer, "default/monitor") == devices_of(answer, "default/other") == ["gpu-0"]


def test_step_budget_bounds_the_search() -> None:
    from kubegpu.scheduling.dra import Allocator, allocate_one

    # 12 devices, 6 requests that must all match one productName that only 5 devices share: exhaustive search
    pool = slice_("a", "node-a", [device(f"gpu-{i}", product="A" if i < 5 else f"B{i}") for i in range(12)])
    same = [{"matchAttribute": "gpu.nvidia.com/productName"}]
    hard = parse_all([claim("hard", *(request(f"r{i}") for i in range(6)), constraints=same)], "ResourceClaim", "c")
    classes_by_name = {c.name: c for c in parse_all(classes(), "DeviceClass", "classes")}
    small = Allocator(parse_all([pool], "ResourceSlice", "s"), classes_by_name, step_budget=50)
    outcome = allocate_one(small, hard[0], set())
    assert outcome.unschedulable is not None and "exceeded 50 steps" in outcome.unschedulable
    roomy = Allocator(parse_all([pool], "ResourceSlice", "s"), classes_by_name)
    assert allocate_one(roomy, hard[0], set()).results is None  # exhausted honestly: no six alike
