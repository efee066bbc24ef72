"""The charge core (`kubegpu.sharing.charges`): every resource kind, every catalogue GPU, and the property that what
fills a GPU is charged its memory whatever the cut."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kubegpu.errors import ConfigError
from kubegpu.gpu.catalog import CATALOG, GpuModel
from kubegpu.gpu.geometry import feasible_multisets
from kubegpu.sharing.capacity import GpuSharing, gpu_allocatable
from kubegpu.sharing.charges import (
    GIB,
    ChargeTable,
    model_memory_bytes,
    node_gpu_memory,
    pod_charge,
    product_label,
    quantity_of_bytes,
    replicas_of_config,
    table_data,
)
from kubegpu.sharing.names import mig_resource_name, mps_slice_resource_name

MODELS = list(CATALOG.values())
A100_CLUSTER = ChargeTable.for_models(["A100-SXM4-80GB"])
MIG_MODELS = [m for m in MODELS if m.mig_capable]
EVEN_NAMES = {"A100-SXM4-40GB", "A100-SXM4-80GB", "A30-24GB", "H100-SXM5-80GB"}
"""Models whose MIG names divide their memory evenly by memory slot; NVIDIA rounds the others' names (1g.12gb on a
94 GB H100 NVL), so a MIG cut of those is charged within that rounding."""


def pod(limits: dict[str, Any], *, selector: str | None = None, name: str = "p", namespace: str = "team-a",
        **spec: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"containers": [{"name": "main", "resources": {"limits": limits}}], **spec}
    if selector:
        body["nodeSelector"] = {"nvidia.com/gpu.product": selector}
    return {"metadata": {"name": name, "namespace": namespace}, "spec": body}


def charged(limits: dict[str, Any], table: ChargeTable | None = None, **kwargs: Any) -> int:
    return pod_charge(pod(limits, **kwargs), table).gpu_memory_bytes


@pytest.mark.parametrize("model", MODELS, ids=lambda m: m.key)
def test_a_whole_gpu_charges_the_memory_of_the_model_the_pod_selects(model: GpuModel) -> None:
    expected = model_memory_bytes(model)
    assert charged({"nvidia.com/gpu": 2}, selector=product_label(model)) == 2 * expected
    assert charged({"nvidia.com/gpu": 1}, selector=product_label(model) + "-SHARED") == expected
    assert model.memory_mib // 1024 * GIB <= expected <= model.memory_mib * (1 << 20) + GIB


def test_the_memory_of_each_model_is_what_its_names_say() -> None:
    sizes = {m.key: model_memory_bytes(m) // GIB for m in MODELS}
    assert sizes == {"A100-SXM4-40GB": 40, "A100-SXM4-80GB": 80, "A30-24GB": 24, "H100-SXM5-80GB": 80,
                     "H100-NVL-94GB": 94, "H200-141GB": 141, "B200-180GB": 180, "L4": 22, "T4": 15, "A10G": 22,
                     "L40S": 44}


@pytest.mark.parametrize("model", MIG_MODELS, ids=lambda m: m.key)
def test_every_mig_profile_charges_the_gib_in_its_name(model: GpuModel) -> None:
    for profile in model.mig_profiles:
        size = int(profile.name.split(".")[1].split("gb")[0])
        assert charged({mig_resource_name(profile.name): 3}) == 3 * size * GIB, profile.name


def test_mig_names_do_not_depend_on_the_model_or_the_selector() -> None:
    assert charged({"nvidia.com/mig-1g.10gb": 1}, selector="NVIDIA-H100-80GB-HBM3") == 10 * GIB
    assert charged({"nvidia.com/mig-1g.10gb": 8}) == 80 * GIB


def test_mps_slices_charge_their_size() -> None:
    for size in (1, 10, 20, 47, 141):
        assert charged({mps_slice_resource_name(size): 2}) == 2 * size * GIB


def test_time_slicing_replicas_divide_the_gpu_by_the_configured_replicas() -> None:
    config = {"version": "v1", "sharing": {"timeSlicing": {"renameByDefault": True,
                                                           "resources": [{"name": "nvidia.com/gpu", "replicas": 4}]}}}
    table = ChargeTable.from_device_plugin_config(config, A100_CLUSTER.shapes)
    assert table.replicas == {"nvidia.com/gpu.shared": 4}
    assert charged({"nvidia.com/gpu.shared": 1}, table) == 20 * GIB
    assert charged({"nvidia.com/gpu": 1}, table) == 80 * GIB  # the unreplicated name stays whole
    shipped = ChargeTable.from_device_plugin_config(config)
    assert charged({"nvidia.com/gpu.shared": 1}, shipped, selector="NVIDIA-L4") == 22 * GIB // 4
    assert charged({"nvidia.com/gpu.shared": 1}, shipped) == 180 * GIB // 4  # unpinned: the largest, a B200


def test_replicas_without_rename_and_of_mig_devices_and_mps() -> None:
    config = {"version": "v1", "sharing": {"mps": {"resources": [
        {"name": "nvidia.com/gpu", "replicas": 3}, {"name": "mig-3g.40gb", "replicas": 2, "rename": "half-3g"}]}}}
    assert replicas_of_config(config) == {"nvidia.com/gpu": 3, "nvidia.com/half-3g": 2}
    table = ChargeTable.from_device_plugin_config(config, A100_CLUSTER.shapes)
    assert charged({"nvidia.com/gpu": 3}, table) == 3 * (80 * GIB // 3)
    timeslice = {"version": "v1", "sharing": {"timeSlicing": {"renameByDefault": True, "resources": [
        {"name": "nvidia.com/mig-1g.20gb", "replicas": 2}]}}}
    assert charged({"nvidia.com/mig-1g.20gb.shared": 1}, ChargeTable.from_device_plugin_config(timeslice)) == 10 * GIB


def test_the_shipped_table_charges_an_unpinned_gpu_the_largest_of_the_catalog() -> None:
    assert charged({"nvidia.com/gpu.shared": 4}) == 180 * GIB
    assert charged({"nvidia.com/gpu": 1}) == 180 * GIB
    assert charged({"nvidia.com/gpu.shared": 4}, A100_CLUSTER) == 80 * GIB


def test_the_model_comes_from_required_affinity_the_largest_possible_wins() -> None:
    affinity = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "nvidia.com/gpu.product", "operator": "In", "values": ["NVIDIA-L4"]}]},
        {"matchExpressions": [{"key": "nvidia.com/gpu.product", "operator": "In", "values": ["Tesla-T4"]},
                              {"key": "nvidia.com/gpu.product", "operator": "NotIn", "values": ["NVIDIA-H200"]}]},
    ]}}}
    assert charged({"nvidia.com/gpu": 1}, affinity=affinity) == 22 * GIB
    # an H200 by selector and an L4 or T4 by affinity: no node is both, so nothing narrows the charge
    assert charged({"nvidia.com/gpu": 1}, selector="NVIDIA-H200", affinity=affinity) == 180 * GIB


def test_an_unknown_product_and_no_selector_charge_the_largest_model_of_the_cluster() -> None:
    assert charged({"nvidia.com/gpu": 1}, selector="ACME-Accelerator") == 180 * GIB
    # only GFD's label value names a model (a catalog key such as `L4` is not what nodes carry): as the policy's table
    assert charged({"nvidia.com/gpu": 1}, selector="L4") == 180 * GIB
    assert charged({"nvidia.com/gpu": 1}, selector="NVIDIA-L4") == 22 * GIB
    assert charged({"nvidia.com/gpu": 1}, ChargeTable.for_models(["L40S", "NVIDIA-L4"])) == 44 * GIB
    with pytest.raises(ConfigError, match="ACME"):
        ChargeTable.for_models(["ACME"])


def test_lines_per_container_init_containers_and_non_gpu_resources() -> None:
    body = pod({"nvidia.com/mig-1g.10gb": 2, "cpu": "2", "memory": "1Gi"}, name="train")
    body["spec"]["initContainers"] = [{"name": "warm", "resources": {"requests": {"nvidia.com/gpu-20gb": "1"}}}]
    body["spec"]["containers"].append({"name": "side", "resources": {"requests": {"cpu": "1"}}})
    charge = pod_charge(body)
    assert charge.as_json() == {"pod": "team-a/train", "gpuMemoryBytes": 40 * GIB, "lines": [
        {"container": "warm", "resource": "nvidia.com/gpu-20gb", "count": 1, "bytesEach": 20 * GIB},
        {"container": "main", "resource": "nvidia.com/mig-1g.10gb", "count": 2, "bytesEach": 10 * GIB}]}
    assert charge.containers == {"warm": 20 * GIB, "main": 20 * GIB}
    assert pod_charge(pod({"cpu": 1})).lines == ()


def test_bad_counts_and_replicas_are_one_line_errors() -> None:
    with pytest.raises(ConfigError, match=r"team-a/p: spec.containers\[0\].resources.nvidia.com/gpu: .*whole"):
        charged({"nvidia.com/gpu": "500m"})
    with pytest.raises(ConfigError, match="replicas"):
        replicas_of_config({"version": "v1", "sharing": {"timeSlicing": {"resources": [{"name": "gpu"}]}}})
    with pytest.raises(ConfigError, match=r"replicas of nvidia\.com/gpu"):
        ChargeTable(replicas={"nvidia.com/gpu": 0})


def test_quantities_and_table() -> None:
    assert [quantity_of_bytes(v) for v in (10 * GIB, 512 << 20, 5)] == ["10Gi", "512Mi", "5"]
    data = table_data()
    assert data["default"] == str(180 * GIB)
    shapes = data["shapes"].split(",")
    products = {data[f"shape.{s}.nvidia.com_gpu.product"]: int(data[f"shape.{s}.bytes"]) for s in shapes}
    assert products["NVIDIA-H100-NVL"] == 94 * GIB
    assert products["NVIDIA-A100-SXM4-80GB-SHARED"] == 80 * GIB
    h200 = {data[f"shape.{s}.node.kubernetes.io_instance-type"] for s in shapes
            if data.get(f"shape.{s}.karpenter.k8s.aws_instance-gpu-name") == "h200"}
    assert h200 == {"p5e.48xlarge", "p5en.48xlarge"}
    assert "karpenter.k8s.aws/instance-gpu-memory" in data["keys"].split(",")
    assert data["replicas.nvidia.com_gpu.shared"] == "4"
    assert all("/" not in key for key in data)


# ------------------------------------------------------------------------------------------ what fills a GPU


@settings(max_examples=60, deadline=None)
@given(model=st.sampled_from(MODELS), replicas=st.integers(1, 64))
def test_replicas_that_fill_a_gpu_charge_its_memory(model: GpuModel, replicas: int) -> None:
    """Rounded down to a byte each, so the replicas never charge more than the GPU (a quota of one GPU's memory admits
    all of them) and less by under one byte per replica."""
    table = ChargeTable(replicas={"nvidia.com/gpu.shared": replicas})
    total = charged({"nvidia.com/gpu.shared": replicas}, table, selector=product_label(model))
    assert model_memory_bytes(model) - replicas < total <= model_memory_bytes(model)
    if model_memory_bytes(model) % replicas == 0:
        assert total == model_memory_bytes(model)


@settings(max_examples=60, deadline=None)
@given(data=st.data(), model=st.sampled_from(MODELS))
def test_mps_slices_that_fill_a_gpu_charge_its_memory(data: st.DataObject, model: GpuModel) -> None:
    memory_gib = model_memory_bytes(model) // GIB
    cuts = sorted(data.draw(st.sets(st.integers(1, memory_gib - 1), max_size=12)))
    sizes = [b - a for a, b in zip([0, *cuts], [*cuts, memory_gib], strict=True)]
    limits: dict[str, int] = {}
    for size in sizes:
        limits[mps_slice_resource_name(size)] = limits.get(mps_slice_resource_name(size), 0) + 1
    assert charged(limits) == model_memory_bytes(model)


def _filling_mig_layouts(model: GpuModel) -> list[tuple[int, ...]]:
    by_id = model.profile_by_id()
    return [ids for ids in feasible_multisets(model)
            if sum(by_id[i].memory_slots for i in ids) == model.mig_memory_slots]


@settings(max_examples=80, deadline=None)
@given(data=st.data(), model=st.sampled_from(MIG_MODELS))
def test_mig_cuts_that_fill_a_gpu_charge_its_memory(data: st.DataObject, model: GpuModel) -> None:
    """Every layout that uses all memory slots: exactly the GPU's memory where NVIDIA's names divide it evenly, and
    within their rounding (under 3%) where they do not."""
    layouts = _filling_mig_layouts(model)
    assert layouts
    ids = data.draw(st.sampled_from(layouts))
    by_id = model.profile_by_id()
    limits: dict[str, int] = {}
    for profile_id in ids:
        name = mig_resource_name(by_id[profile_id].name)
        limits[name] = limits.get(name, 0) + 1
    total = charged(limits)
    if model.key in EVEN_NAMES:
        assert total == model_memory_bytes(model)
    else:
        assert abs(total - model_memory_bytes(model)) <= 0.03 * model_memory_bytes(model)


@pytest.mark.parametrize(("model", "mig", "plugin", "expected_gib"), [
    ("A100-SXM4-80GB", None, {"version": "v1"}, 4 * 180),  # a whole GPU may go to an unpinned pod: the largest
    ("A100-SXM4-80GB", "all-1g.10gb", None, 4 * 7 * 10),
    ("A100-SXM4-80GB", "all-balanced", None, 4 * (2 * 10 + 20 + 40)),
    ("L4", None, {"version": "v1", "sharing": {"timeSlicing": {"renameByDefault": True, "resources": [
        {"name": "nvidia.com/gpu", "replicas": 4}]}}}, 4 * 180),
])
def test_a_nodes_capacity_is_what_its_allocatable_is_charged(model: str, mig: str | None, plugin: Any,
                                                             expected_gib: int) -> None:
    import json

    plugin = plugin or {"version": "v1", "flags": {"migStrategy": "mixed"}}
    allocatable = gpu_allocatable(model, 4, GpuSharing(mig, json.dumps(plugin, sort_keys=True)))
    table = ChargeTable.from_device_plugin_config(plugin)
    assert node_gpu_memory(allocatable, product_label(CATALOG[model]), table) == expected_gib * GIB
