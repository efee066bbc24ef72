"""Resource accounting: names, IDs and counts for whole GPUs, MIG strategies, sharing and MPS slices."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kubegpu.errors import ConfigError
from kubegpu.sharing.devices import (
    allocatable,
    devices_by_resource,
    mig_resource_name,
    strip_replica,
)


def cfg(**sections: Any) -> dict[str, Any]:
    return {"version": "v1", **sections}


def time_slicing(*resources: dict[str, Any], **options: Any) -> dict[str, Any]:
    return cfg(sharing={"timeSlicing": {"resources": list(resources), **options}})


def test_whole_gpus_default_to_nvidia_gpu_with_uuid_ids_and_numa(gpus: Any) -> None:
    node = gpus(8)
    result = devices_by_resource(node, {}, cfg())
    assert list(result) == ["nvidia.com/gpu"]
    ids = [d.id for d in result["nvidia.com/gpu"]]
    assert ids == [g.uuid for g in node]
    assert [d.numa_node for d in result["nvidia.com/gpu"]] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert all(d.replica is None and d.replicas == 1 for d in result["nvidia.com/gpu"])


def test_index_id_strategy(gpus: Any, node: Any) -> None:
    plain = devices_by_resource(gpus(2), {}, cfg(flags={"plugin": {"deviceIDStrategy": "index"}}))
    assert [d.id for d in plain["nvidia.com/gpu"]] == ["0", "1"]
    g = node.gpu(0, mig_enabled=True)
    mixed = devices_by_resource([g], {0: node.balanced(g)},
                                cfg(flags={"migStrategy": "mixed", "plugin": {"deviceIDStrategy": "index"}}))
    assert [d.id for d in mixed["nvidia.com/mig-1g.10gb"]] == ["0:2", "0:3"]


def test_time_slicing_8_gpus_x4_gives_32_ids(gpus: Any) -> None:
    node = gpus(8)
    result = devices_by_resource(node, {}, time_slicing({"name": "nvidia.com/gpu", "replicas": 4}))
    devices = result["nvidia.com/gpu"]
    assert len(devices) == 32
    assert devices[0].id == f"{node[0].uuid}::0" and devices[3].id == f"{node[0].uuid}::3"
    assert {strip_replica(d.id) for d in devices} == {g.uuid for g in node}
    assert all(d.sharing == "time-slicing" and d.replicas == 4 for d in devices)
    assert allocatable(node, {}, time_slicing({"name": "gpu", "replicas": 4})) == {"nvidia.com/gpu": 32}


def test_rename_by_default_moves_replicas_to_shared(gpus: Any) -> None:
    config = time_slicing({"name": "nvidia.com/gpu", "replicas": 2}, renameByDefault=True)
    assert allocatable(gpus(4), {}, config) == {"nvidia.com/gpu.shared": 8}


def test_per_gpu_mixed_sharing_with_devices_and_rename(gpus: Any) -> None:
    node = gpus(8)
    config = time_slicing(
        {"name": "nvidia.com/gpu", "replicas": 4, "devices": [0, 1]},
        {"name": "nvidia.com/gpu", "replicas": 2, "devices": [node[2].uuid, "3"], "rename": "gpu-half"},
    )
    result = allocatable(node, {}, config)
    # GPUs 0-1 ×4 stay under nvidia.com/gpu with GPUs 4-7 exclusive; GPUs 2-3 ×2 under the new name.
    assert result == {"nvidia.com/gpu": 4 * 2 + 4, "nvidia.com/gpu-half": 4}
    listing = devices_by_resource(node, {}, config)
    exclusive = [d for d in listing["nvidia.com/gpu"] if d.replica is None]
    assert [d.gpu_index for d in exclusive] == [4, 5, 6, 7]


def test_device_count_selection_and_too_many(gpus: Any) -> None:
    assert allocatable(gpus(4), {}, time_slicing({"name": "gpu", "replicas": 3, "devices": 1})) == {
        "nvidia.com/gpu": 3 + 3
    }
    with pytest.raises(ConfigError, match=r"sharing.timeSlicing.resources\[0\].devices: requested 5 devices"):
        devices_by_resource(gpus(4), {}, time_slicing({"name": "gpu", "replicas": 3, "devices": 5}))
    with pytest.raises(ConfigError, match=r"resources\[0\].devices\[1\]: no device '9' on this node"):
        devices_by_resource(gpus(4), {}, time_slicing({"name": "gpu", "replicas": 3, "devices": [0, "9"]}))
    with pytest.raises(ConfigError, match="only valid string input is 'all'"):
        devices_by_resource(gpus(1), {}, time_slicing({"name": "gpu", "replicas": 3, "devices": "some"}))


def test_resources_patterns_name_gpus_by_product(node: Any) -> None:
    node_gpus = [node.gpu(0), node.gpu(1, product="NVIDIA L4", memory_mib=23034)]
    config = cfg(resources={"gpus": [{"pattern": "*L4*", "name": "l4"}]})
    assert allocatable(node_gpus, {}, config) == {"nvidia.com/gpu": 1, "nvidia.com/l4": 1}
    with pytest.raises(ConfigError, match=r"resources.gpus\[0\]"):
        devices_by_resource(node_gpus, {}, cfg(resources={"gpus": [{"pattern": "*"}]}))


def test_mig_mixed_all_balanced_on_a100_80gb(node: Any) -> None:
    gs = [node.gpu(i, mig_enabled=True) for i in range(8)]
    migs = {g.index: node.balanced(g) for g in gs}
    result = allocatable(gs, migs, cfg(flags={"migStrategy": "mixed"}))
    assert result == {"nvidia.com/mig-3g.40gb": 8, "nvidia.com/mig-2g.20gb": 8, "nvidia.com/mig-1g.10gb": 16}
    listing = devices_by_resource(gs, migs, cfg(flags={"migStrategy": "mixed"}))
    assert listing["nvidia.com/mig-3g.40gb"][0].id == migs[0][0].uuid
    assert listing["nvidia.com/mig-3g.40gb"][0].mig is migs[0][0]


def test_mig_none_lists_mig_gpus_whole_and_single_lists_migs_as_gpu(node: Any) -> None:
    gs = [node.gpu(i, mig_enabled=True) for i in range(2)]
    uniform = {g.index: [node.mig(g, 7 + k, "1g.10gb", 19, k, 1, 9856) for k in range(7)] for g in gs}
    assert allocatable(gs, uniform, cfg()) == {"nvidia.com/gpu": 2}
    assert allocatable(gs, uniform, cfg(flags={"migStrategy": "single"})) == {"nvidia.com/gpu": 14}
    mixed_layout = {g.index: node.balanced(g) for g in gs}
    with pytest.raises(ConfigError, match="more than one MIG device type"):
        devices_by_resource(gs, mixed_layout, cfg(flags={"migStrategy": "single"}))


def test_mig_time_slicing_and_me_profile_name(node: Any) -> None:
    g = node.gpu(0, mig_enabled=True)
    migs = {0: [*node.balanced(g), node.mig(g, 1, "1g.10gb+me", 20, 6, 1, 9856)]}
    config = cfg(flags={"migStrategy": "mixed"},
                 sharing={"timeSlicing": {"resources": [{"name": "nvidia.com/mig-1g.10gb", "replicas": 2}]}})
    result = allocatable([g], migs, config)
    assert result["nvidia.com/mig-1g.10gb"] == 4
    assert result["nvidia.com/mig-1g.10gb.me"] == 1
    assert mig_resource_name("1g.10gb+me") == "nvidia.com/mig-1g.10gb.me"


def test_mps_replicas_carry_per_container_limits(gpus: Any, node: Any) -> None:
    config = cfg(sharing={"mps": {"resources": [{"name": "nvidia.com/gpu", "replicas": 4}]}})
    devices = devices_by_resource(gpus(2), {}, config)["nvidia.com/gpu"]
    assert len(devices) == 8
    assert {(d.sharing, d.mps_memory_mib, d.mps_thread_percentage) for d in devices} == {("mps", 20480, 25)}
    g = node.gpu(0, mig_enabled=True)
    with pytest.raises(ConfigError, match="MPS is not supported for MIG"):
        devices_by_resource([g], {0: node.balanced(g)},
                            cfg(flags={"migStrategy": "mixed"},
                                sharing={"mps": {"resources": [{"name": "mig-1g.10gb", "replicas": 2}]}}))


def test_mps_memory_slices_replace_whole_gpu(gpus: Any) -> None:
    node = gpus(2)
    result = devices_by_resource(node, {}, cfg(), mps_slices={0: [10, 10, 20]})
    uuid = node[0].uuid
    assert [d.id for d in result["nvidia.com/gpu-10gb"]] == [f"{uuid}::mps-10gb-0", f"{uuid}::mps-10gb-1"]
    assert result["nvidia.com/gpu-20gb"][0].mps_memory_mib == 20480
    assert result["nvidia.com/gpu-20gb"][0].mps_thread_percentage == 25
    assert [d.gpu_index for d in result["nvidia.com/gpu"]] == [1]
    with pytest.raises(ConfigError, match="exceed"):
        devices_by_resource(node, {}, cfg(), mps_slices={1: [60, 30]})


def test_bad_names_and_strategies_name_the_field(gpus: Any) -> None:
    with pytest.raises(ConfigError, match=r"flags\.migStrategy"):
        devices_by_resource(gpus(1), {}, cfg(flags={"migStrategy": "weird"}))
    with pytest.raises(ConfigError, match=r"resources\[0\].rename: resource name .* longer than 63"):
        devices_by_resource(gpus(1), {}, time_slicing({"name": "gpu", "replicas": 2, "rename": "x" * 70}))
    with pytest.raises(ConfigError, match=r"resources\[0\].replicas"):
        devices_by_resource(gpus(1), {}, time_slicing({"name": "gpu", "replicas": 0}))


def test_unhealthy_ids_lower_allocatable(gpus: Any) -> None:
    node = gpus(2)
    config = time_slicing({"name": "gpu", "replicas": 2})
    bad = [f"{node[0].uuid}::0", f"{node[0].uuid}::1"]
    assert allocatable(node, {}, config, unhealthy=bad) == {"nvidia.com/gpu": 2}


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(replicas=st.lists(st.one_of(st.none(), st.integers(2, 6)), min_size=1, max_size=6))
def test_every_gpu_is_counted_once_whatever_the_per_gpu_sharing(gpus: Any, replicas: list[int | None]) -> None:
    node = gpus(len(replicas))
    entries = [{"name": "gpu", "replicas": r, "devices": [i], "rename": f"gpu-x{r}"}
               for i, r in enumerate(replicas) if r is not None]
    config = time_slicing(*entries) if entries else cfg()
    listing = devices_by_resource(node, {}, config)
    per_gpu: dict[int, set[str]] = {}
    for name, devices in listing.items():
        for d in devices:
            per_gpu.setdefault(d.gpu_index, set()).add(name)
            assert name == ("nvidia.com/gpu" if d.replica is None else f"nvidia.com/gpu-x{d.replicas}")
    assert all(len(names) == 1 for names in per_gpu.values())
    assert sum(allocatable(node, {}, config).values()) == sum(r or 1 for r in replicas)


def test_the_config_model_is_read_in_nvidia_shape(gpus: Any) -> None:
    from kubegpu.config.deviceplugin import parse_device_plugin_config

    config = parse_device_plugin_config(
        {"version": "v1", "flags": {"mpsRoot": "/run/nvidia/mps"},
         "sharing": {"mps": {"renameByDefault": True,
                             "resources": [{"name": "gpu", "replicas": 4, "devices": [1], "memoryGB": 8}]}}},
        "test.yaml",
    )
    listing = devices_by_resource(gpus(2), {}, config)
    assert {k: len(v) for k, v in listing.items()} == {"nvidia.com/gpu": 1, "nvidia.com/gpu.shared": 4}
    assert {d.mps_memory_mib for d in listing["nvidia.com/gpu.shared"]} == {8192}


def test_device_lists_are_kept_per_gpu_and_follow_changes_in_place(node: Any) -> None:
    # a node's lists are recomputed after every change of one GPU: the other GPUs' devices come back as the same
    # objects, while a GPU or MIG device changed in place (same object, new field value) is listed anew
    gs = [node.gpu(i, mig_enabled=True) for i in range(2)]
    migs = {g.index: node.balanced(g) for g in gs}
    config = cfg(flags={"migStrategy": "mixed"})
    first = devices_by_resource(gs, migs, config)
    again = devices_by_resource(gs, {0: migs[0], 1: migs[1][:1]}, config)
    def on_gpu(listing: dict[str, list[Any]], index: int) -> list[Any]:
        return [d for devices in listing.values() for d in devices if d.gpu_index == index]

    assert len(on_gpu(again, 0)) == 4 and all(a is b for a, b in zip(on_gpu(first, 0), on_gpu(again, 0), strict=True))
    assert [d.mig for d in on_gpu(again, 1)] == [migs[1][0]]
    migs[0][0].profile_name = "4g.40gb"
    gs[1].numa_node = 7
    changed = devices_by_resource(gs, migs, config)
    assert [d.mig is migs[0][0] for d in changed["nvidia.com/mig-4g.40gb"]] == [True]
    assert {d.numa_node for d in changed["nvidia.com/mig-1g.10gb"] if d.gpu_index == 1} == {7}
