"""Allocator properties on dynamic-MIG slices: counters hold, placements never overlap, constraints hold, and the
same input gives the same answer; plus the counter model being exactly MIG legality on every catalog GPU."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kubegpu.dra.devices import NodeGpus, gpu_offers, placements_by_name
from kubegpu.dra.slices import build_slices
from kubegpu.gpu.catalog import CATALOG
from kubegpu.gpu.geometry import PlacedInstance, is_legal
from kubegpu.gpu.simulated import SimulatedBackend
from kubegpu.scheduling.dra import Allocator, allocate_in_order, parse_all, parse_slice
from kubegpu.scheduling.quantity import parse_quantity
from tests.dra.builders import claim, classes, first_available, request

MIG_MODELS = [key for key, model in CATALOG.items() if model.mig_capable]


def node_slices(node: str, gpus: str) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    backend = SimulatedBackend(None, gpus=gpus, node_name=node)
    inventory = NodeGpus(backend.driver_version(), backend.cuda_driver_version(), tuple(backend.devices()), {})
    offers = gpu_offers(inventory, dynamic_mig=True)
    return build_slices(node, offers), placements_by_name(offers)


@pytest.mark.parametrize("model_key", MIG_MODELS)
def test_counters_admit_exactly_the_legal_layouts(model_key: str) -> None:
    """Walk every set of placements the counters admit (adding devices in a fixed order): at each step the
    counters accept a placement exactly when the layout stays legal for the MIG geometry."""
    model = CATALOG[model_key]
    slices, placements = node_slices("n", f"1x{model_key}")
    parsed = [parse_slice(s) for s in slices]
    pool = Allocator(parsed, {}).pools[0]
    capacity = dict(pool.counters)
    migs = [d for d in pool.devices if placements[d.id.device].profile_id is not None]

    def amounts(device: Any) -> dict[tuple[str, str], float]:
        return {(s, c): a for s, counters in device.consumes for c, a in counters}

    visited = 0

    def walk(start: int, used: dict[tuple[str, str], float], layout: list[PlacedInstance]) -> None:
        nonlocal visited
        visited += 1
        for i in range(start, len(migs)):
            need = amounts(migs[i])
            fits = all(used.get(k, 0.0) + a <= capacity[k] for k, a in need.items())
            p = placements[migs[i].id.device]
            assert p.profile_id is not None and p.start is not None
            candidate = [*layout, PlacedInstance(p.profile_id, p.start)]
            assert fits == is_legal(model, candidate), (model_key, candidate)
            if fits:
                walk(i + 1, {k: used.get(k, 0.0) + need.get(k, 0.0) for k in capacity}, candidate)

    walk(0, {}, [])
    assert visited > len(migs)
    whole = next(d for d in pool.devices if placements[d.id.device].profile_id is None)
    assert amounts(whole) == capacity  # the whole GPU takes everything


SLICES = node_slices("node-a", "2xA100-SXM4-40GB")[0] + node_slices("node-b", "1xH100-SXM5-80GB,1xA30-24GB")[0]
PLACEMENTS = {**node_slices("node-a", "2xA100-SXM4-40GB")[1]}
PARSED_SLICES = parse_all(SLICES, "ResourceSlice", "slices")
CLASSES = {c.name: c for c in parse_all(classes(), "DeviceClass", "classes")}

PROFILE_SELECTORS = [f"device.attributes['gpu.nvidia.com'].profile == '{p}'"
                     for p in ("1g.5gb", "2g.10gb", "3g.20gb", "1g.12gb", "2g.12gb", "1g.10gb", "3g.40gb",
                               "1g.6gb+me", "7g.40gb")]
MEMORY_SELECTORS = [f"device.capacity['gpu.nvidia.com'].memory.compareTo(quantity('{q}')) >= 0"
                    for q in ("5Gi", "10Gi", "20Gi")]


@st.composite
def claims(draw: st.DrawFn) -> list[dict[str, Any]]:
    out = []
    for i in range(draw(st.integers(1, 14))):
        kind = draw(st.sampled_from(["mig", "memory", "gpu", "first", "pair"]))
        if kind == "mig":
            reqs = [request("r", "mig.nvidia.com", count=draw(st.integers(1, 2)),
                            selectors=(draw(st.sampled_from(PROFILE_SELECTORS)),))]
        elif kind == "memory":
            reqs = [request("r", "mig.nvidia.com", selectors=(draw(st.sampled_from(MEMORY_SELECTORS)),))]
        elif kind == "gpu":
            reqs = [request("r", count=draw(st.integers(1, 2)))]
        elif kind == "first":
            reqs = [first_available("r", request("small", "mig.nvidia.com",
                                                 selectors=(draw(st.sampled_from(PROFILE_SELECTORS)),)),
                                    request("whole"))]
        else:
            reqs = [request("a", "mig.nvidia.com"), request("b", "mig.nvidia.com")]
        constraints = [{"matchAttribute": "gpu.nvidia.com/parentUUID"}] if kind == "pair" else None
        out.append(claim(f"c{i}", *reqs, constraints=constraints))
    return out


def allocate(claim_objects: list[dict[str, Any]]) -> dict[str, Any]:
    return allocate_in_order(PARSED_SLICES, CLASSES, parse_all(claim_objects, "ResourceClaim", "claims"))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(claims())
def test_allocations_respect_counters_geometry_and_constraints(claim_objects: list[dict[str, Any]]) -> None:
    outcomes = allocate(claim_objects)
    allocator = Allocator(PARSED_SLICES, CLASSES)
    taken = [r for o in outcomes.values() if o.results for r in o.results]
    assert len({r.id for r in taken}) == len(taken)  # no device twice
    # counters: per pool, what allocated devices consume never exceeds the shared amount
    for pool in allocator.pools:
        used: dict[tuple[str, str], float] = defaultdict(float)
        for result in taken:
            if (result.driver, result.pool) == (pool.driver, pool.name):
                device = allocator.device(result.id)
                assert device is not None
                for set_name, counters in device.consumes:
                    for counter, amount in counters:
                        used[(set_name, counter)] += amount
        assert all(amount <= pool.counters[key] for key, amount in used.items())
    # geometry: per physical GPU, the allocated MIG placements form a legal layout, and a whole GPU is alone
    by_gpu: dict[str, list[Any]] = defaultdict(list)
    for result in taken:
        device = allocator.device(result.id)
        assert device is not None
        parent = device.attribute("gpu.nvidia.com/parentUUID") or device.attribute("gpu.nvidia.com/uuid")
        assert parent is not None
        by_gpu[parent[1]].append(device)
    for devices in by_gpu.values():
        if any(d.attribute("gpu.nvidia.com/type") == ("string", "gpu") for d in devices):
            assert len(devices) == 1
            continue
        product = devices[0].attribute("gpu.nvidia.com/productName")
        assert product is not None
        model = next(m for m in CATALOG.values() if m.product_name == product[1])
        layout = []
        for d in devices:
            _, _, _, profile_id, start = d.id.device.rsplit("-", 4)
            layout.append(PlacedInstance(int(profile_id), int(start)))
        assert is_legal(model, layout), layout
    # constraints: a pair's two devices share a parent GPU; results name their requests as the API does
    for claim_object in claim_objects:
        key = f"default/{claim_object['metadata']['name']}"
        outcome = outcomes[key]
        if outcome.results is None:
            continue
        names = {r.request for r in outcome.results}
        requests = claim_object["spec"]["devices"]["requests"]
        assert len(names & {"r/small", "r/whole"}) <= 1
        if claim_object["spec"]["devices"].get("constraints"):
            parents = {allocator.device(r.id).attribute("gpu.nvidia.com/parentUUID")  # type: ignore[union-attr]
                       for r in outcome.results}
            assert len(parents) == 1
        assert {n.split("/")[0] for n in names} == {r["name"] for r in requests}
    # determinism
    assert allocate(claim_objects) == outcomes


def test_memory_counter_in_bytes() -> None:
    assert parse_quantity("81559Mi") == 81559 * 1024 * 1024
