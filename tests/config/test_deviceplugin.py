"""The NVIDIA device-plugin config v1: defaults, validation rules, one-line errors, flag > env > file precedence."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from kubegpu.config import parse_yaml_text
from kubegpu.config.deviceplugin import (
    DevicePluginConfig,
    check_mps_against_gpus,
    effective_device_plugin_config,
    load_device_plugin_config,
    parse_device_plugin_config,
    parse_go_duration,
)
from kubegpu.errors import ConfigError
from kubegpu.gpu.backend import GpuDevice
from kubegpu.sharing.devices import advertised_name

DATA = Path(__file__).parent / "data"
FULL_EXAMPLE = DATA / "dp-full-example.yaml"
NOS_EXAMPLE = DATA / "dp-nos-mps-slices.yaml"


def _parse(text: str) -> DevicePluginConfig:
    return parse_device_plugin_config(parse_yaml_text(text, "cfg.yaml"), "cfg.yaml")


def _error(text: str) -> str:
    with pytest.raises(ConfigError) as info:
        _parse(text)
    message = info.value.message
    assert "\n" not in message
    return message


def test_full_reference_example_keeps_every_value() -> None:
    config = load_device_plugin_config(FULL_EXAMPLE)
    assert config.flags.mig_strategy == "none"
    assert config.flags.mps_root == "/run/nvidia/mps"
    assert config.flags.plugin.device_list_strategy == ["envvar"]
    assert config.flags.plugin.shared_devices_allocation_policy == "distributed"
    assert config.flags.gfd.sleep_interval_seconds == 60.0
    ts = config.sharing.time_slicing
    assert ts is not None and config.sharing.mps is None
    assert [(r.name, r.replicas, r.devices) for r in ts.resources] == [
        ("nvidia.com/gpu", 4, "all"),
        ("nvidia.com/mig-1g.10gb", 2, "all"),
    ]
    assert config.sharing_strategy == "time-slicing"
    assert config.fail_requests_greater_than_one is False
    assert config.imex.channel_ids == []


def test_nos_example_with_rename_devices_and_memory() -> None:
    config = load_device_plugin_config(NOS_EXAMPLE)
    mps = config.sharing.mps
    assert mps is not None
    resource = mps.resources[0]
    assert resource.rename == "nvidia.com/gpu-10gb"  # the domain is prepended, as NVIDIA does
    assert resource.devices == ["0"]
    assert resource.memory_gb == 10
    assert advertised_name(resource.name, resource.rename, mps.rename_by_default) == "nvidia.com/gpu-10gb"
    assert config.sharing_strategy == "mps"


def test_empty_file_and_defaults_are_nvidias() -> None:
    config = parse_device_plugin_config(None, "cfg.yaml")
    assert config.version == "v1"
    assert config.flags.fail_on_init_error is True
    assert config.flags.nvidia_driver_root == "/"
    assert config.flags.dev_root == "/"
    assert config.flags.plugin.device_id_strategy == "uuid"
    assert config.flags.plugin.cdi_annotation_prefix == "cdi.k8s.io/"
    assert config.flags.plugin.nvidia_ctk_path == "/usr/bin/nvidia-ctk"
    assert config.flags.plugin.container_driver_root == "/driver-root"
    assert config.flags.gfd.output_file == "/etc/kubernetes/node-feature-discovery/features.d/gfd"
    assert config.resources is None
    assert config.sharing_strategy == "none"


def test_empty_version_means_v1_and_null_means_default() -> None:
    config = _parse("version: ''\nflags:\n  nvidiaDriverRoot:\n  migStrategy: single\n")
    assert config.version == "v1"
    assert config.flags.nvidia_driver_root == "/"
    assert config.flags.mig_strategy == "single"


def test_mps_defaults_fail_requests_and_explicit_false_is_honoured() -> None:
    mps = "sharing:\n  mps:\n{extra}    resources:\n    - name: nvidia.com/gpu\n      replicas: 4\n"
    assert _parse(mps.format(extra="")).fail_requests_greater_than_one is True
    assert _parse(mps.format(extra="    failRequestsGreaterThanOne: false\n")).fail_requests_greater_than_one is False


def test_rename_by_default_gives_shared_name() -> None:
    config = _parse("sharing:\n  timeSlicing:\n    renameByDefault: true\n    resources:\n"
                    "    - name: gpu\n      replicas: 3\n      devices: 2\n")
    block = config.sharing.time_slicing
    assert block is not None
    entry = block.resources[0]
    assert advertised_name(entry.name, entry.rename, block.rename_by_default) == "nvidia.com/gpu.shared"
    assert block.resources[0].devices == 2


def test_device_list_strategy_string_or_list() -> None:
    assert _parse("flags: {plugin: {deviceListStrategy: cdi-cri}}").flags.plugin.device_list_strategy == ["cdi-cri"]
    both = _parse("flags: {plugin: {deviceListStrategy: [envvar, volume-mounts]}}")
    assert both.flags.plugin.device_list_strategy == ["envvar", "volume-mounts"]


def test_devices_list_accepts_indices_mig_indices_and_uuids() -> None:
    config = _parse("sharing:\n  timeSlicing:\n    resources:\n    - name: nvidia.com/gpu\n      replicas: 2\n"
                    "      devices: [0, '1', '2:1', GPU-8f1c, MIG-GPU-8f1c/1/0]\n")
    block = config.sharing.time_slicing
    assert block is not None
    assert block.resources[0].devices == ["0", "1", "2:1", "GPU-8f1c", "MIG-GPU-8f1c/1/0"]


def test_same_resource_twice_with_disjoint_devices_is_per_gpu_sharing() -> None:
    config = _parse("sharing:\n  timeSlicing:\n    resources:\n"
                    "    - {name: nvidia.com/gpu, replicas: 2, devices: [0]}\n"
                    "    - {name: nvidia.com/gpu, replicas: 4, devices: [1]}\n")
    block = config.sharing.time_slicing
    assert block is not None and [r.replicas for r in block.resources] == [2, 4]


MALFORMED = [
    ("version: v2\n", "cfg.yaml: version: unknown version 'v2'"),
    ("version: 1\n", "cfg.yaml: version: must be a string"),
    ("flags: {migStrategy: both}\n", "cfg.yaml: flags.migStrategy: must be one of 'none', 'single' or 'mixed'"),
    ("flags: {failOnInitError: 'true'}\n", "cfg.yaml: flags.failOnInitError: must be a boolean"),
    ("flags: {plugin: {deviceIDStrategy: serial}}\n", "cfg.yaml: flags.plugin.deviceIDStrategy: must be one of"),
    ("flags: {plugin: {deviceListStrategy: [envvar, tape]}}\n", "cfg.yaml: flags.plugin.deviceListStrategy[1]:"),
    ("flags: {plugin: {deviceListStrategy: []}}\n", "cfg.yaml: flags.plugin.deviceListStrategy: must name at least"),
    ("flags: {plugin: {sharedDevicesAllocationPolicy: random}}\n",
     "cfg.yaml: flags.plugin.sharedDevicesAllocationPolicy: must be one of"),
    ("flags: {gfd: {sleepInterval: 60}}\n", "cfg.yaml: flags.gfd.sleepInterval: must be a string"),
    ("flags: {gfd: {sleepInterval: soon}}\n", "cfg.yaml: flags.gfd.sleepInterval: must be a duration"),
    ("flags: {gfd: {sleepInterval: 0s}}\n", "cfg.yaml: flags.gfd.sleepInterval: must be a positive duration"),
    ("flags: {migStrategy: none, bogus: 1}\n", "cfg.yaml: flags.bogus: unknown field"),
    ("flags: {mig_strategy: mixed}\n", "cfg.yaml: flags.mig_strategy: unknown field"),  # only NVIDIA's spelling
    ("sharing: {timeSlicing: {resources: []}}\n", "cfg.yaml: sharing.timeSlicing.resources: no resources specified"),
    ("sharing: {timeSlicing: {}}\n", "cfg.yaml: sharing.timeSlicing.resources: required field is missing"),
    ("sharing: {timeSlicing: {resources: [{name: gpu}]}}\n",
     "cfg.yaml: sharing.timeSlicing.resources[0].replicas: required field is missing"),
    ("sharing: {timeSlicing: {resources: [{replicas: 2}]}}\n",
     "cfg.yaml: sharing.timeSlicing.resources[0].name: required field is missing"),
    ("sharing: {timeSlicing: {resources: [{name: gpu, replicas: 1}]}}\n",
     "cfg.yaml: sharing.timeSlicing.resources[0].replicas: must be at least 2, got 1"),
    ("sharing: {mps: {resources: [{name: gpu, replicas: 1}]}}\n",
     "cfg.yaml: sharing.mps.resources[0].replicas: must be at least 2, got 1"),
    ("sharing: {timeSlicing: {resources: [{name: gpu, replicas: '4'}]}}\n",
     "cfg.yaml: sharing.timeSlicing.resources[0].replicas: must be an integer, got a string '4'"),
    ("sharing: {timeSlicing: {resources: [{name: gpu, replicas: 2, devices: some}]}}\n",
     "cfg.yaml: sharing.timeSlicing.resources[0].devices: the only valid string is 'all'"),
    ("sharing: {timeSlicing: {resources: [{name: gpu, replicas: 2, devices: 0}]}}\n",
     "cfg.yaml: sharing.timeSlicing.resources[0].devices: a device count must be at least 1"),
    ("sharing: {timeSlicing: {resources: [{name: gpu, replicas: 2, devices: [0, 0]}]}}\n",
     "cfg.yaml: sharing.timeSlicing.resources[0].devices: device 0 is listed more than once"),
    ("sharing: {timeSlicing: {resources: [{name: 'nvidia.com/GPU', replicas: 2}]}}\n",
     "cfg.yaml: sharing.timeSlicing.resources[0].name: invalid resource name"),
    ("sharing: {timeSlicing: {resources: [{name: " + "g" * 60 + ", replicas: 2}]}}\n",
     "cfg.yaml: sharing.timeSlicing.resources[0].name: resource name 'nvidia.com/ggg"),
    ("sharing: {timeSlicing: {resources: [{name: kubernetes.io/gpu, replicas: 2}]}}\n",
     "cfg.yaml: sharing.timeSlicing.resources[0].name: resource name 'kubernetes.io/gpu' must not use"),
    ("sharing: {timeSlicing: {resources: [{name: gpu, replicas: 2}, {name: gpu, replicas: 3}]}}\n",
     "cfg.yaml: sharing.timeSlicing.resources[1].name: nvidia.com/gpu is already shared by resources[0]"),
    ("sharing: {timeSlicing: {resources: [{name: gpu, replicas: 2, devices: [0, 1]}, "
     "{name: gpu, replicas: 3, devices: [1]}]}}\n",
     "cfg.yaml: sharing.timeSlicing.resources[1].devices: device 1 of nvidia.com/gpu is already shared"),
    ("sharing:\n  timeSlicing: {resources: [{name: gpu, replicas: 2}]}\n"
     "  mps: {resources: [{name: gpu, replicas: 2}]}\n",
     "cfg.yaml: sharing: timeSlicing and mps are mutually exclusive"),
    ("flags: {migStrategy: mixed}\nsharing: {mps: {resources: [{name: gpu, replicas: 4}]}}\n",
     "cfg.yaml: sharing.mps: MPS sharing is not supported with flags.migStrategy mixed"),
    ("sharing: {mps: {resources: [{name: mig-1g.10gb, replicas: 2}]}}\n",
     "cfg.yaml: sharing.mps.resources[0].name: sharing using MPS is not supported for MIG devices"),
    ("sharing: {mps: {resources: [{name: gpu, replicas: 2, devices: ['0:1']}]}}\n",
     "cfg.yaml: sharing.mps.resources[0].devices[0]: sharing using MPS is not supported for MIG devices"),
    ("sharing: {mps: {resources: [{name: gpu, replicas: 49}]}}\n",
     "cfg.yaml: sharing.mps.resources[0].replicas: must be at most 48"),
    ("resources: {gpus: [{pattern: '*'}]}\n", "cfg.yaml: resources.gpus[0].name: required field is missing"),
    ("resources: {gpus: [{pattern: '', name: gpu}]}\n", "cfg.yaml: resources.gpus[0].pattern: must not be empty"),
    ("imex: {channelIDs: [1]}\n", "cfg.yaml: imex.channelIDs: only [] or [0] are supported"),
    ("imex: {channelIDs: [0], required: 1}\n", "cfg.yaml: imex.required: must be a boolean"),
    ("flags: [migStrategy]\n", "cfg.yaml: flags: must be a mapping, got a list"),
    ("- 1\n", "cfg.yaml: the top level must be a mapping"),
]


@pytest.mark.parametrize(("text", "expected"), MALFORMED)
def test_malformed_configs_are_one_line_with_field_path(text: str, expected: str) -> None:
    assert _error(text).startswith(expected)


def test_yaml_syntax_error_names_file_and_line() -> None:
    with pytest.raises(ConfigError) as info:
        parse_yaml_text("version: v1\nflags:\n  migStrategy: [none\n", "cfg.yaml")
    assert info.value.message.startswith("cfg.yaml:4:1: invalid YAML:")


def test_duplicate_keys_are_rejected_with_line() -> None:
    with pytest.raises(ConfigError) as info:
        parse_yaml_text("flags:\n  migStrategy: none\n  migStrategy: mixed\n", "cfg.yaml")
    assert info.value.message == "cfg.yaml:3:3: invalid YAML: duplicate key 'migStrategy'"


def test_unreadable_file_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"^.*missing\.yaml: cannot read: No such file"):
        load_device_plugin_config(tmp_path / "missing.yaml")
    binary = tmp_path / "bin.yaml"
    binary.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(ConfigError, match=r"bin\.yaml: not a UTF-8 text file$"):
        load_device_plugin_config(binary)


def test_go_durations() -> None:
    assert parse_go_duration("1m30s") == 90.0
    assert parse_go_duration("500ms") == 0.5
    assert parse_go_duration("2h") == 7200.0
    with pytest.raises(ValueError):
        parse_go_duration("10 seconds")


def test_round_trip_keeps_nvidia_key_names() -> None:
    config = load_device_plugin_config(FULL_EXAMPLE)
    dumped = config.model_dump(by_alias=True, exclude_none=True, mode="json")
    assert dumped["sharing"]["timeSlicing"]["resources"][0] == {"name": "nvidia.com/gpu", "devices": "all",
                                                                  "replicas": 4}
    again = parse_device_plugin_config(yaml.safe_load(yaml.safe_dump(dumped)), "dump")
    assert again == config


# ---------------------------------------------------------------------------------------------- precedence


def test_flag_beats_env_beats_file() -> None:
    env = {"MIG_STRATEGY": "mixed", "PASS_DEVICE_SPECS": "true", "DEVICE_LIST_STRATEGY": "envvar,cdi-cri",
           "GFD_SLEEP_INTERVAL": "30s", "IMEX_CHANNEL_IDS": "0"}
    flags: dict[str, object] = {"mig-strategy": "single", "--fail-on-init-error": False, "device_id_strategy": None}
    config = effective_device_plugin_config(FULL_EXAMPLE, env, flags)
    assert config.flags.mig_strategy == "single"  # flag over env over file ("none")
    assert config.flags.fail_on_init_error is False  # flag over file
    assert config.flags.plugin.pass_device_specs is True  # env over file
    assert config.flags.plugin.device_list_strategy == ["envvar", "cdi-cri"]
    assert config.flags.plugin.device_id_strategy == "uuid"  # None means "not given"
    assert config.flags.gfd.sleep_interval_seconds == 30.0
    assert config.imex.channel_ids == [0]
    ts = config.sharing.time_slicing
    assert ts is not None and ts.resources[0].replicas == 4  # the file's sharing block survives


def test_env_aliases_and_empty_env_means_unset() -> None:
    config = effective_device_plugin_config(None, {"NVIDIA_CTK_PATH": "/opt/ctk", "MIG_STRATEGY": ""}, {})
    assert config.flags.plugin.nvidia_ctk_path == "/opt/ctk"
    assert config.flags.mig_strategy == "none"


def test_config_file_from_env(tmp_path: Path) -> None:
    file = tmp_path / "config.yaml"
    file.write_text("flags: {migStrategy: mixed}\n")
    assert effective_device_plugin_config(None, {"CONFIG_FILE": str(file)}, {}).flags.mig_strategy == "mixed"
    other = tmp_path / "other.yaml"
    other.write_text("flags: {migStrategy: single}\n")
    chosen = effective_device_plugin_config(None, {"CONFIG_FILE": str(file)}, {"config-file": str(other)})
    assert chosen.flags.mig_strategy == "single"


@pytest.mark.parametrize(
    ("env", "flags", "expected"),
    [
        ({"MIG_STRATEGY": "both"}, {}, "$MIG_STRATEGY: flags.migStrategy: must be one of"),
        ({"PASS_DEVICE_SPECS": "maybe"}, {}, "$PASS_DEVICE_SPECS: flags.plugin.passDeviceSpecs: must be true or false"),
        ({}, {"mig-strategy": "both"}, "--mig-strategy: flags.migStrategy: must be one of"),
        ({"IMEX_CHANNEL_IDS": "0,x"}, {}, "$IMEX_CHANNEL_IDS: imex.channelIDs: must be a comma-separated list"),
        ({"IMEX_CHANNEL_IDS": "3"}, {}, "$IMEX_CHANNEL_IDS: imex.channelIDs: only [] or [0]"),
        ({"GFD_SLEEP_INTERVAL": "-5s"}, {}, "$GFD_SLEEP_INTERVAL: flags.gfd.sleepInterval: must be a positive"),
    ],
)
def test_bad_env_or_flag_is_named(env: dict[str, str], flags: dict[str, object], expected: str) -> None:
    with pytest.raises(ConfigError) as info:
        effective_device_plugin_config(FULL_EXAMPLE, env, flags)
    assert info.value.message.startswith(expected)


def test_bad_file_is_named_before_env(tmp_path: Path) -> None:
    file = tmp_path / "bad.yaml"
    file.write_text("flags: {migStrategy: nope}\n")
    with pytest.raises(ConfigError) as info:
        effective_device_plugin_config(file, {"MIG_STRATEGY": "mixed"}, {})
    assert info.value.message.startswith(f"{file}: flags.migStrategy:")


def test_mixed_strategy_from_env_conflicts_with_mps_in_file() -> None:
    with pytest.raises(ConfigError) as info:
        effective_device_plugin_config(NOS_EXAMPLE, {"MIG_STRATEGY": "mixed", "MPS_ROOT": "/run/nvidia/mps"}, {})
    assert "sharing.mps: MPS sharing is not supported with flags.migStrategy mixed" in info.value.message


def test_mps_needs_a_root_only_in_the_effective_config() -> None:
    load_device_plugin_config(NOS_EXAMPLE)  # the file alone is valid: the chart passes MPS_ROOT
    with pytest.raises(ConfigError, match=r"flags\.mpsRoot: using MPS requires an MPS root"):
        effective_device_plugin_config(NOS_EXAMPLE, {}, {})
    config = effective_device_plugin_config(NOS_EXAMPLE, {"MPS_ROOT": "/run/nvidia/mps"}, {})
    assert config.flags.mps_root == "/run/nvidia/mps"


# ---------------------------------------------------------------------------------------------- device-aware rules


def _gpu(index: int, *, mig_enabled: bool = False, cc: tuple[int, int] = (8, 0)) -> GpuDevice:
    return GpuDevice(index=index, uuid=f"GPU-{index}", product_name="NVIDIA A100-SXM4-80GB",
                     model_key="A100-SXM4-80GB", memory_mib=81920, pci_bus_id=f"0000:0{index}:00.0",
                     pci_device_id="0x20B210DE", numa_node=0, compute_capability=cc, multiprocessors=108,
                     mig_capable=True, mig_enabled=mig_enabled, mig_pending=False)


def test_mps_on_a_mig_enabled_gpu_is_rejected_whatever_the_strategy() -> None:
    config = _parse("flags: {migStrategy: single}\nsharing: {mps: {resources: [{name: gpu, replicas: 4}]}}\n")
    check_mps_against_gpus(config, [_gpu(0), _gpu(1)], "cfg.yaml")
    with pytest.raises(ConfigError, match=r"^cfg\.yaml: sharing\.mps: .* GPU 1 has MIG enabled$"):
        check_mps_against_gpus(config, [_gpu(0), _gpu(1, mig_enabled=True)], "cfg.yaml")


def test_mps_client_limit_depends_on_compute_capability() -> None:
    config = _parse("sharing: {mps: {resources: [{name: gpu, replicas: 20}]}}\n")
    check_mps_against_gpus(config, [_gpu(0)], "cfg.yaml")
    with pytest.raises(ConfigError, match=r"replicas: GPU 0 .* at most 16 MPS clients, got 20"):
        check_mps_against_gpus(config, [_gpu(0, cc=(7, 0))], "cfg.yaml")
