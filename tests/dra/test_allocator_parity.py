"""Allocator rules found by the differential test against kube-scheduler 1.37 (tests/dra/test_controlplane.py):
which claims are fatal errors (PodScheduled=False, reason SchedulerError) rather than "no fit on this node", and a
pod's claims allocated together with backtracking across claims."""

from __future__ import annotations

from typing import Any

import pytest

from kubegpu.scheduling.dra import Allocator, ClaimError, allocate_in_order, parse_all
from tests.dra.builders import claim, classes, device, first_available, request, slice_

CLASSES = {c.name: c for c in parse_all(classes(), "DeviceClass", "classes")}
PROFILE = "device.attributes['gpu.nvidia.com'].profile == '{}'"


def allocator(*slices: dict[str, Any]) -> Allocator:
    return Allocator(parse_all(list(slices), "ResourceSlice", "slices"), CLASSES)


def claims(*objects: dict[str, Any]) -> list[Any]:
    return parse_all(list(objects), "ResourceClaim", "claims")


def test_all_request_whose_devices_break_a_constraint_is_an_error() -> None:
    mixed = slice_("a", "node-a", [device("gpu-0"), device("gpu-1", product="NVIDIA L4")])
    same = [{"matchAttribute": "gpu.nvidia.com/productName"}]
    with pytest.raises(ClaimError, match="claim constraint would not be satisfied"):
        allocator(mixed).allocate("node-a", claims(claim("c", request("g", mode="All"), constraints=same)))
    # a device of the All request merely in use is no error: the claim may fit once it is free
    uniform = slice_("a", "node-a", [device("gpu-0"), device("gpu-1")])
    busy = {parse_all([uniform], "ResourceSlice", "s")[0].devices[0].id}
    assert allocator(uniform).allocate("node-a", claims(claim("c", request("g", mode="All"), constraints=same)),
                                       busy) is None


def test_claim_needing_more_than_32_devices_is_an_error() -> None:
    many = slice_("a", "node-a", [device(f"gpu-{i}") for i in range(40)])
    with pytest.raises(ClaimError, match="exceeds the claim limit of 32"):
        allocator(many).allocate("node-a", claims(claim("c", request("a", count=20), request("b", count=20))))
    with pytest.raises(ClaimError, match="adding 40 devices"):
        allocator(many).allocate("node-a", claims(claim("c", request("all", mode="All"))))
    # firstAvailable counts its smallest alternative: 40 or 1 is at least 1, so this claim is fine
    fallback = first_available("g", request("big", count=40), request("one"))
    answer = allocator(many).allocate("node-a", claims(claim("c", fallback)))
    assert answer is not None and [r.request for r in answer["default/c"]] == ["g/one"]


def test_unknown_class_in_a_later_claim_fails_the_pod_even_when_an_earlier_claim_cannot_fit() -> None:
    """kube-scheduler checks every claim of the pod before searching."""
    one = slice_("a", "node-a", [device("gpu-0")])
    with pytest.raises(ClaimError, match="DeviceClass 'nope' not found"):
        allocator(one).allocate("node-a", claims(claim("a", request("g", count=2)), claim("b", request("g", "nope"))))


def test_pod_claims_are_allocated_together_with_backtracking() -> None:
    """Any 1g placement, then the placement at start 0: first fit gives the first claim start 0, so one claim after
    the other fails, while the pod's claims together backtrack the first claim to the next placement."""
    migs = [device(f"gpu-0-mig-1g10gb-19-{start}", "mig", memory="10Gi", profile="1g.10gb", start=start)
            for start in range(2)]
    pool = slice_("a", "node-a", migs)
    first = claim("any", request("m", "mig.nvidia.com", selectors=(PROFILE.format("1g.10gb"),)))
    second = claim("zero", request("m", "mig.nvidia.com",
                                   selectors=("device.attributes['gpu.nvidia.com'].start == 0",)))
    together = allocator(pool).allocate("node-a", claims(first, second))
    assert together is not None
    assert [r.device for r in together["default/any"]] == ["gpu-0-mig-1g10gb-19-1"]
    assert [r.device for r in together["default/zero"]] == ["gpu-0-mig-1g10gb-19-0"]
    one_by_one = allocate_in_order(parse_all([pool], "ResourceSlice", "s"), CLASSES, claims(first, second))
    assert one_by_one["default/zero"].results is None


NUMA = "device.attributes['gpu.nvidia.com'].numa == 0"  # gpu-1 has no `numa`: a run-time error there


def test_selectors_run_only_on_free_devices_the_search_reaches() -> None:
    """kube-scheduler evaluates a request's selectors device by device, after the in-use check: a selector that
    fails on a device it never needs (or that is taken) is no error; one it reaches is fatal; `All` checks all."""
    pool = slice_("a", "node-a", [device("gpu-0", numa=0), device("gpu-1"), device("gpu-2", numa=0)])
    answer = allocator(pool).allocate("node-a", claims(claim("c", request("g", selectors=(NUMA,)))))
    assert answer is not None and [r.device for r in answer["default/c"]] == ["gpu-0"]
    with pytest.raises(ClaimError, match="no such key"):
        allocator(pool).allocate("node-a", claims(claim("c", request("g", count=2, selectors=(NUMA,)))))
    taken = {parse_all([pool], "ResourceSlice", "s")[0].devices[1].id}
    answer = allocator(pool).allocate("node-a", claims(claim("c", request("g", count=2, selectors=(NUMA,)))), taken)
    assert answer is not None and [r.device for r in answer["default/c"]] == ["gpu-0", "gpu-2"]
    with pytest.raises(ClaimError, match="no such key"):
        allocator(pool).allocate("node-a", claims(claim("c", request("g", mode="All", selectors=(NUMA,)))), taken)
    # a later claim whose selector would fail is never searched when an earlier one cannot fit: no fit, no error
    assert allocator(pool).allocate("node-a", claims(claim("a", request("g", count=4)),
                                                     claim("b", request("g", count=2, selectors=(NUMA,))))) is None


def test_a_selector_error_past_the_last_useful_start_is_still_reached() -> None:
    """Two devices wanted, the first taken: too few remain, yet the scheduler still walks to the second device and
    fails on its selector."""
    pool = slice_("a", "node-a", [device("gpu-0", numa=0), device("gpu-1")])
    taken = {parse_all([pool], "ResourceSlice", "s")[0].devices[0].id}
    with pytest.raises(ClaimError, match="no such key"):
        allocator(pool).allocate("node-a", claims(claim("c", request("g", count=2, selectors=(NUMA,)))), taken)


def test_all_request_too_large_for_the_claim_is_skipped_before_its_devices_are_tried() -> None:
    """A firstAvailable `All` alternative that would push the claim past 32 devices is given up before any of its
    devices is tried, so a constraint its first device breaks is no fatal error: the pod is merely unschedulable."""
    pool = slice_("a", "node-a", [device(f"gpu-{i}", product="NVIDIA L4" if i == 0 else "NVIDIA H100 80GB HBM3")
                                  for i in range(31)])
    same = [{"matchAttribute": "gpu.nvidia.com/productName"}]
    h100 = "device.attributes['gpu.nvidia.com'].productName.startsWith('NVIDIA H100')"
    nothing = "device.attributes['gpu.nvidia.com'].productName == 'none'"
    fallback = first_available("g", request("none", selectors=(nothing,)), request("all", mode="All"))
    two_first = claims(claim("c", request("first", count=2, selectors=(h100,)), fallback, constraints=same))
    assert allocator(pool).allocate("node-a", two_first) is None  # 2 + 31 > 32: `all` is never tried
    one_first = claims(claim("c", request("first", selectors=(h100,)), fallback, constraints=same))
    with pytest.raises(ClaimError, match="claim constraint"):  # with room for it, the L4 breaks the constraint
        allocator(pool).allocate("node-a", one_first)
