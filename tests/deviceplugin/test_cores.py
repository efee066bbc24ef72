"""Pure cores: Allocate responses, preferred allocation policies, health policy and tracker, CDI spec, MPS plans."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from kubegpu.deviceplugin.allocate import AllocateOptions, AllocationError, allocate_container
from kubegpu.deviceplugin.health import DEFAULT_IGNORED_XIDS, HealthPolicy, HealthTracker, policy_from_env
from kubegpu.deviceplugin.manager import allocate_options
from kubegpu.deviceplugin.preferred import PreferenceError, link_pair_score, preferred_allocation
from kubegpu.sharing.cdi import cdi_spec, mig_cap_minors
from kubegpu.sharing.devices import devices_by_resource
from kubegpu.sharing.mps import mps_plans


def listing(gpus: Any, count: int, config: dict[str, Any] | None = None) -> dict[str, Any]:
    return devices_by_resource(gpus(count), {}, config or {"version": "v1"})


def by_id(devices: list[Any]) -> dict[str, Any]:
    return {d.id: d for d in devices}


# ---------------------------------------------------------------------------------------------- allocate


def test_index_ids_dedupe_and_extra_envs(gpus: Any) -> None:
    config = {"version": "v1", "flags": {"gdsEnabled": True, "plugin": {"deviceIDStrategy": "index"}},
              "imex": {"channelIDs": [0]},
              "sharing": {"timeSlicing": {"resources": [{"name": "gpu", "replicas": 2}]}}}
    devices = listing(gpus, 2, config)["nvidia.com/gpu"]
    response = allocate_container("nvidia.com/gpu", ["1::0", "1::1", "0::1"], by_id(devices), allocate_options(config))
    assert response.envs["NVIDIA_VISIBLE_DEVICES"] == "1,0"
    assert response.envs["NVIDIA_GDS"] == "enabled" and response.envs["NVIDIA_IMEX_CHANNELS"] == "0"


def test_device_specs_use_dev_root_and_minor(gpus: Any) -> None:
    devices = listing(gpus, 4)["nvidia.com/gpu"]
    options = AllocateOptions(pass_device_specs=True, dev_root="/run/nvidia/driver",
                              control_devices=("/dev/nvidiactl",))
    response = allocate_container("nvidia.com/gpu", [devices[2].id], by_id(devices), options)
    assert [(d.container_path, d.host_path, d.permissions) for d in response.devices] == [
        ("/dev/nvidiactl", "/run/nvidia/driver/dev/nvidiactl", "rw"),
        ("/dev/nvidia2", "/run/nvidia/driver/dev/nvidia2", "rw"),
    ]


def test_mig_device_specs_and_cdi_carry_the_capability_nodes(node: Any) -> None:
    gpus = [node.gpu(0, mig_enabled=True), node.gpu(3, mig_enabled=True)]
    devices = devices_by_resource(gpus, {0: node.balanced(gpus[0]), 3: node.balanced(gpus[1])},
                                  {"version": "v1", "flags": {"migStrategy": "mixed"}})["nvidia.com/mig-3g.40gb"]
    options = AllocateOptions(pass_device_specs=True, control_devices=())
    response = allocate_container("nvidia.com/mig-3g.40gb", [devices[1].id], by_id(devices), options)
    # GPU 3, GI 2, CI 0 in the driver's table: 3 + (3 * 15 + 2) * 9 = 426 for the GI, 427 for its CI 0
    assert [d.container_path for d in response.devices] == [
        "/dev/nvidia3", "/dev/nvidia-caps/nvidia-cap426", "/dev/nvidia-caps/nvidia-cap427"]
    assert mig_cap_minors(31, 14, 7) == (4314, 4322)  # the last entry: gpu31/gi14/ci7/access 4322
    spec = cdi_spec(devices, dev_root="/run/nvidia/driver")
    assert spec["devices"][0]["containerEdits"]["deviceNodes"] == [
        {"path": p, "hostPath": f"/run/nvidia/driver{p}"}
        for p in ("/dev/nvidia0", "/dev/nvidia-caps/nvidia-cap21", "/dev/nvidia-caps/nvidia-cap22")]


def test_unknown_and_oversized_shared_requests(gpus: Any) -> None:
    devices = by_id(listing(gpus, 1, {"version": "v1", "sharing": {"timeSlicing": {
        "resources": [{"name": "gpu", "replicas": 3}]}}})["nvidia.com/gpu"])
    with pytest.raises(AllocationError, match="unknown device: nope"):
        allocate_container("nvidia.com/gpu", ["nope"], devices, AllocateOptions())
    with pytest.raises(AllocationError, match="found 3"):
        allocate_container("nvidia.com/gpu", list(devices), devices,
                           AllocateOptions(fail_requests_greater_than_one=True))


# ---------------------------------------------------------------------------------------------- preferred


def test_nvlink_scoring_prefers_linked_pairs_and_keeps_leftovers_connected(gpus: Any) -> None:
    devices = listing(gpus, 4)["nvidia.com/gpu"]
    ids = [d.id for d in devices]
    # 0-1 and 2-3 joined by NVLink; 0-2 by a single link. A greedy "best pair with 0" would still pick 0-1.
    links = {(0, 1): 12, (2, 3): 12, (0, 2): 1}
    score = link_pair_score(links)
    assert sorted(preferred_allocation(devices, ids, [], 2, pair_score=score)) in (sorted(ids[:2]), sorted(ids[2:]))
    assert sorted(preferred_allocation(devices, ids, [ids[3]], 2, pair_score=score)) == sorted([ids[2], ids[3]])
    with pytest.raises(PreferenceError):
        preferred_allocation(devices, ids, [], 5)


def test_distributed_spreads_and_packed_fills(gpus: Any) -> None:
    devices = listing(gpus, 3, {"version": "v1", "sharing": {"timeSlicing": {
        "resources": [{"name": "gpu", "replicas": 4}]}}})["nvidia.com/gpu"]
    # GPU 0 already has 2 replicas in use, GPU 1 one, GPU 2 none
    in_use = {devices[0].id, devices[1].id, devices[4].id}
    available = [d.id for d in devices if d.id not in in_use]
    distributed = preferred_allocation(devices, available, [], 3, policy="distributed")
    assert [devices_by_id_gpu(devices, i) for i in distributed] == [2, 1, 2]
    packed = preferred_allocation(devices, available, [], 2, policy="packed")
    assert [devices_by_id_gpu(devices, i) for i in packed] == [0, 0]


def test_mig_picks_take_the_lowest_free_start_whatever_the_kubelets_order(node: Any) -> None:
    gpu = node.gpu(0, mig_enabled=True)
    migs = [node.mig(gpu, 7 + start, "1g.10gb", 19, start, 1, 9856) for start in range(7)]
    devices = devices_by_resource([gpu], {0: migs}, {"version": "v1", "flags": {"migStrategy": "mixed"}})[
        "nvidia.com/mig-1g.10gb"]
    start_of = {d.id: d.mig.start for d in devices}
    for order in (list(start_of), list(reversed(start_of)), [list(start_of)[i] for i in (5, 1, 6, 3, 0, 4, 2)]):
        # three pods, one at a time, each from what the previous left: starts 0, 1, 2 held, so 4-5 stays a 2g.20gb
        held: list[str] = []
        for _ in range(3):
            held += preferred_allocation(devices, [i for i in order if i not in held], [], 1)
        assert [start_of[i] for i in held] == [0, 1, 2]


def devices_by_id_gpu(devices: list[Any], device_id: str) -> int:
    return int(next(d.gpu_index for d in devices if d.id == device_id))


# ---------------------------------------------------------------------------------------------- health


def test_health_env_rules() -> None:
    default, _ = policy_from_env({})
    assert all(not default.is_critical(x) for x in DEFAULT_IGNORED_XIDS) and default.is_critical(79)
    off, _ = policy_from_env({"DP_DISABLE_HEALTHCHECKS": "xids"})
    assert not off.is_critical(79)
    extra, warnings = policy_from_env({"DP_DISABLE_HEALTHCHECKS": "79, bogus"})
    assert not extra.is_critical(79) and extra.is_critical(48) and warnings == [
        "DP_DISABLE_HEALTHCHECKS: ignoring malformed XID 'bogus'"]
    forced, _ = policy_from_env({"DP_DISABLE_HEALTHCHECKS": "all", "DP_ENABLE_HEALTHCHECKS": "13"})
    assert forced.is_critical(13) and forced.is_critical(79) and not forced.is_critical(31)
    everything, _ = policy_from_env({"DP_ENABLE_HEALTHCHECKS": "all"})
    assert all(everything.is_critical(x) for x in DEFAULT_IGNORED_XIDS)


def test_tracker_recovers_only_after_quiet_period_and_successful_probe() -> None:
    tracker = HealthTracker(HealthPolicy(quiet_period_s=10))
    xid = SimpleNamespace(gpu_index=1, xid=79)
    assert tracker.observe([xid], now=100) == {1}
    assert tracker.observe([xid], now=105) == set()  # still unhealthy; the quiet period restarts
    assert tracker.recover(now=114, probe=lambda i: True) == set()
    assert tracker.recover(now=115, probe=lambda i: False) == set()
    assert tracker.recover(now=116, probe=lambda i: True) == {1}
    assert tracker.unhealthy == frozenset()


# ---------------------------------------------------------------------------------------------- CDI, MPS


def test_cdi_spec_has_one_device_per_physical_gpu(gpus: Any) -> None:
    devices = listing(gpus, 2, {"version": "v1", "sharing": {"timeSlicing": {
        "resources": [{"name": "gpu", "replicas": 4}]}}})["nvidia.com/gpu"]
    spec = cdi_spec(devices)
    assert [d["name"] for d in spec["devices"]] == [devices[0].gpu_uuid, devices[4].gpu_uuid]
    assert spec["devices"][1]["containerEdits"]["deviceNodes"] == [{"path": "/dev/nvidia1", "hostPath": "/dev/nvidia1"}]


def test_mps_plans_follow_nvidia_defaults(gpus: Any) -> None:
    config = {"version": "v1", "sharing": {"mps": {"resources": [{"name": "gpu", "replicas": 10, "devices": [1]}]}}}
    [plan] = mps_plans(listing(gpus, 2, config), "/run/nvidia/mps")
    assert plan.pipe_dir == "/run/nvidia/mps/nvidia.com/gpu/pipe"
    assert plan.commands == ["set_default_active_thread_percentage 10", "set_default_device_pinned_mem_limit 1 8192M"]
