"""The pure label rules: sanitising, versions, sharing quirks, MIG single/mixed, ownership and node patches."""

from __future__ import annotations

import pytest

from kubegpu.discovery.labels import (
    compute_labels,
    format_features_file,
    is_owned_label,
    node_label_patch,
    sanitise,
    version_labels,
)
from kubegpu.errors import ConfigError
from kubegpu.sharing.devices import devices_by_resource
from kubegpu.sharing.migapply import read_state

from .conftest import NOW, plugin_config, sim_node


def labels_for(backend: object, config: dict[str, object], now: float | None = NOW) -> dict[str, str]:
    state = read_state(backend)  # type: ignore[arg-type]
    return compute_labels(state.gpus, state.mig, plugin_config(config), "550.54.15", (12, 4), "box", now)


def test_sanitise_drops_foreign_characters_and_joins_spaces() -> None:
    assert sanitise("NVIDIA  A100-SXM4-80GB (rev+1)") == "NVIDIA-A100-SXM4-80GB-rev1"
    assert sanitise("  ProLiant DL380 Gen10 ") == "ProLiant-DL380-Gen10"


def test_driver_version_without_revision_and_bad_versions() -> None:
    labels = version_labels("535.104", (12, 2))
    assert labels["nvidia.com/cuda.driver-version.revision"] == ""
    assert labels["nvidia.com/cuda.driver.rev"] == ""
    assert labels["nvidia.com/cuda.runtime-version.full"] == "12.2"
    for bad in ("550", "550.54.15.1", "r550.x"):
        with pytest.raises(ConfigError, match=r"does not match the format X\.Y"):
            version_labels(bad, (12, 4))


def test_timestamp_left_out_without_a_time_or_with_no_timestamp() -> None:
    backend = sim_node("1xL4")
    assert "nvidia.com/gfd.timestamp" in labels_for(backend, {})
    assert "nvidia.com/gfd.timestamp" not in labels_for(backend, {}, now=None)
    assert "nvidia.com/gfd.timestamp" not in labels_for(backend, {"flags": {"gfd": {"noTimestamp": True}}})


def test_time_sliced_mig_profile_gets_replicas_and_shared_product() -> None:
    backend = sim_node("2xA100-SXM4-80GB", "all-balanced")
    config = {"flags": {"migStrategy": "mixed"},
              "sharing": {"timeSlicing": {"resources": [{"name": "nvidia.com/mig-1g.10gb", "replicas": 2}]}}}
    labels = labels_for(backend, config)
    assert labels["nvidia.com/mig-1g.10gb.replicas"] == "2"
    assert labels["nvidia.com/mig-1g.10gb.sharing-strategy"] == "time-slicing"
    assert labels["nvidia.com/mig-1g.10gb.product"] == "NVIDIA-A100-SXM4-80GB-MIG-1g.10gb-SHARED"
    assert labels["nvidia.com/mig-1g.10gb.count"] == "4"  # physical MIG devices, not replicas
    assert labels["nvidia.com/mig-3g.40gb.replicas"] == "1"
    assert labels["nvidia.com/mig-3g.40gb.product"] == "NVIDIA-A100-SXM4-80GB-MIG-3g.40gb"


def test_per_profile_counts_agree_with_the_device_plugin_accounting() -> None:
    backend = sim_node("4xH100-SXM5-80GB", "all-balanced")
    state = read_state(backend)
    shared = [{"name": "nvidia.com/mig-2g.20gb", "replicas": 3}]
    config = plugin_config({"flags": {"migStrategy": "mixed"}, "sharing": {"timeSlicing": {"resources": shared}}})
    labels = compute_labels(state.gpus, state.mig, config, "550.54.15", (12, 4), None, NOW)
    advertised = devices_by_resource(state.gpus, state.mig, config)
    for resource, devices in advertised.items():
        prefix = resource
        count = int(labels[f"{prefix}.count"])
        replicas = int(labels[f"{prefix}.replicas"])
        assert count * replicas == len(devices), resource


def test_mps_capable_only_with_mps_and_no_mig() -> None:
    mps = {"flags": {"mpsRoot": "/run/nvidia/mps"},
           "sharing": {"mps": {"resources": [{"name": "nvidia.com/gpu", "replicas": 2}]}}}
    labels = labels_for(sim_node("2xL4"), mps)
    assert labels["nvidia.com/mps.capable"] == "true"
    assert labels["nvidia.com/gpu.sharing-strategy"] == "mps"
    assert labels["nvidia.com/gpu.product"] == "NVIDIA-L4-SHARED"
    assert labels_for(sim_node("2xL4"), {})["nvidia.com/mps.capable"] == "false"


def test_mig_single_with_two_profiles_is_reported_invalid() -> None:
    backend = sim_node("1xH100-SXM5-80GB", "all-balanced")  # 1g.10gb, 2g.20gb and 3g.40gb on one GPU
    labels = labels_for(backend, {"flags": {"migStrategy": "single"}})
    assert labels["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3-MIG-INVALID"
    assert (labels["nvidia.com/gpu.count"], labels["nvidia.com/gpu.replicas"], labels["nvidia.com/gpu.memory"]) == (
        "0", "0", "0")
    assert labels["nvidia.com/mig.strategy"] == "single"


def test_mig_single_without_mig_enabled_labels_whole_gpus() -> None:
    labels = labels_for(sim_node("2xA100-SXM4-80GB"), {"flags": {"migStrategy": "single"}})
    assert labels["nvidia.com/gpu.product"] == "NVIDIA-A100-SXM4-80GB"
    assert labels["nvidia.com/gpu.count"] == "2"
    assert labels["nvidia.com/gpu.replicas"] == "1"


def test_mig_strategy_none_keeps_sharing_on_mig_enabled_gpus() -> None:
    backend = sim_node("2xH100-SXM5-80GB", "all-enabled")
    shared = [{"name": "nvidia.com/gpu", "replicas": 2}]
    labels = labels_for(backend, {"sharing": {"timeSlicing": {"resources": shared}}})
    assert labels["nvidia.com/gpu.replicas"] == "2"
    assert "nvidia.com/mig.strategy" not in labels
    assert not any(k.startswith("nvidia.com/mig-") for k in labels)


def test_media_extension_profile_labels_use_the_resource_form() -> None:
    backend = sim_node("1xH100-SXM5-80GB", "all-1g.10gb.me")
    labels = labels_for(backend, {"flags": {"migStrategy": "mixed"}})
    assert labels["nvidia.com/mig-1g.10gb.me.count"] == "1"
    assert labels["nvidia.com/mig-1g.10gb.me.engines.ofa"] == "1"
    assert labels["nvidia.com/mig-1g.10gb.me.product"] == "NVIDIA-H100-80GB-HBM3-MIG-1g.10gbme"  # '+' is dropped


def test_ownership_covers_gfd_labels_and_nothing_else() -> None:
    owned = ["nvidia.com/gpu.count", "nvidia.com/gpu.product", "nvidia.com/gpu.engines.ofa",
             "nvidia.com/cuda.driver.rev",
             "nvidia.com/mig-1g.10gb.count", "nvidia.com/mig-1g.10gb.me.slices.gi", "nvidia.com/mig.strategy",
             "nvidia.com/mig.capable", "nvidia.com/mps.capable", "nvidia.com/gfd.timestamp", "nvidia.com/vgpu.present",
             "nvidia.com/gpu.machine"]
    foreign = ["nvidia.com/gpu.deploy.device-plugin", "nvidia.com/gpu.present", "nvidia.com/mig.config",
               "nvidia.com/mig.config.state", "nvidia.com/device-plugin.config", "nvidia.com/gpu-driver-upgrade-state",
               "nvidia.com/gpu.workload.config", "kubernetes.io/hostname", "example.com/gpu.count"]
    assert [k for k in owned if not is_owned_label(k)] == []
    assert [k for k in foreign if is_owned_label(k)] == []


def test_node_patch_sets_changes_and_removes_only_stale_owned_labels() -> None:
    current = {
        "nvidia.com/gpu.count": "8",
        "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB",
        "nvidia.com/mig-1g.10gb.count": "16",  # the layout changed: this profile is gone
        "nvidia.com/mig.config": "all-balanced",
        "nvidia.com/gpu.deploy.device-plugin": "true",
        "team": "ml",
    }
    desired = {"nvidia.com/gpu.count": "8", "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB-SHARED",
               "nvidia.com/mig-7g.80gb.count": "8"}
    assert node_label_patch(current, desired) == {
        "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB-SHARED",
        "nvidia.com/mig-7g.80gb.count": "8",
        "nvidia.com/mig-1g.10gb.count": None,
    }
    assert node_label_patch(desired, desired) == {}


def test_features_file_is_sorted_key_value_lines() -> None:
    assert format_features_file({"b": "2", "a": "1"}) == "a=1\nb=2\n"


def test_bad_mig_strategy_is_one_config_error() -> None:
    state = read_state(sim_node("1xL4"))
    with pytest.raises(ConfigError, match=r"flags\.migStrategy"):
        compute_labels(state.gpus, state.mig, {"flags": {"migStrategy": "both"}}, "550.54.15", (12, 4), None, NOW)


def test_gpu_outside_the_catalog_gets_labels_from_what_the_driver_reports() -> None:
    from kubegpu.gpu.backend import GpuDevice, MigDevice

    gpu = GpuDevice(index=0, uuid="GPU-x", product_name="NVIDIA Future GPU 300GB", model_key=None, memory_mib=307200,
                    pci_bus_id="00000000:07:00.0", pci_device_id="0x99990DE", numa_node=0, compute_capability=(0, 0),
                    multiprocessors=200, mig_capable=True, mig_enabled=True, mig_pending=False)
    gpu.pci_class = 0x0300  # type: ignore[attr-defined]  # a backend that reports a VGA controller
    mig = MigDevice(gpu_index=0, gpu_uuid="GPU-x", uuid="MIG-y", gi_id=1, ci_id=0, profile_id=9,
                    profile_name="3g.150gb", start=0, size=4, memory_mib=150000, multiprocessors=90)
    labels = compute_labels([gpu], {0: [mig]}, {"flags": {"migStrategy": "mixed"}}, "580.1.2", (13, 0), None, NOW)
    assert labels["nvidia.com/mig-3g.150gb.slices.gi"] == "3"
    assert labels["nvidia.com/mig-3g.150gb.memory"] == "150000"
    assert not any(".engines." in key for key in labels)  # engine counts are unknown, so left out
    assert "nvidia.com/gpu.family" not in labels  # compute major 0: GFD leaves the architecture out
    assert labels["nvidia.com/gpu.mode"] == "graphics"
