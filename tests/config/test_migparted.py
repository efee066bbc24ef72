"""mig-parted config v1: structure rules, layouts checked against exact MIG geometry, NVIDIA's default names."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from kubegpu.config import parse_yaml_text
from kubegpu.config.migparted import (
    MigPartedConfig,
    check_layouts,
    default_mig_parted_config,
    load_mig_parted_config,
    parse_mig_parted_config,
    resolve_layout,
)
from kubegpu.errors import ConfigError, NotFoundError
from kubegpu.gpu.backend import GpuDevice
from kubegpu.gpu.catalog import CATALOG, get_model
from kubegpu.gpu.geometry import place

DATA = Path(__file__).parent / "data"
DEFAULTS = DATA / "mig-parted-defaults.yaml"
FORMAT_EXAMPLE = DATA / "mig-parted-format-example.yaml"


def _parse(text: str) -> MigPartedConfig:
    return parse_mig_parted_config(parse_yaml_text(text, "mig.yaml"), "mig.yaml")


def _gpu(index: int, model_key: str, *, mig_enabled: bool = False) -> GpuDevice:
    model = get_model(model_key)
    return GpuDevice(index=index, uuid=f"GPU-{index}", product_name=model.product_name, model_key=model.key,
                     memory_mib=model.memory_mib, pci_bus_id=f"0000:{index:02x}:00.0",
                     pci_device_id=model.pci_device_id, numa_node=0, compute_capability=model.compute_capability,
                     multiprocessors=model.multiprocessors, mig_capable=model.mig_capable, mig_enabled=mig_enabled,
                     mig_pending=False)


def _ids(model_key: str, *names: str) -> list[int]:
    model = get_model(model_key)
    return [model.profile(name).profile_id for name in names]


MIXED_NODE = [_gpu(0, "A100-SXM4-80GB"), _gpu(1, "A100-SXM4-80GB"), _gpu(2, "A100-SXM4-40GB"), _gpu(3, "L4")]


def test_reference_examples_parse() -> None:
    example = load_mig_parted_config(FORMAT_EXAMPLE)
    entry = example.mig_configs["custom-config"][0]
    assert entry.device_filter == ["0x20B210DE", "0x20B510DE"]
    assert entry.devices == "all" and entry.mig_enabled
    assert entry.mig_devices == {"1g.10gb": 2, "2g.20gb": 1}
    defaults = load_mig_parted_config(DEFAULTS)
    assert {"all-disabled", "all-enabled", "all-balanced", "all-1g.10gb.me", "all-7g.180gb"} <= set(
        defaults.mig_configs
    )


def test_reference_examples_fit_their_gpus() -> None:
    assert "A100-SXM4-80GB" in check_layouts(load_mig_parted_config(FORMAT_EXAMPLE))
    summary = check_layouts(load_mig_parted_config(DEFAULTS))
    for key in ("A100-SXM4-40GB", "A100-SXM4-80GB", "A30-24GB", "H100-SXM5-80GB", "H100-NVL-94GB", "H200-141GB",
                "B200-180GB"):
        assert key in summary


def test_resolve_layout_follows_device_filter_and_skips_non_mig_gpus() -> None:
    config = load_mig_parted_config(DEFAULTS)
    balanced = resolve_layout(config, "all-balanced", MIXED_NODE)
    assert balanced == {
        0: _ids("A100-SXM4-80GB", "1g.10gb", "1g.10gb", "2g.20gb", "3g.40gb"),
        1: _ids("A100-SXM4-80GB", "1g.10gb", "1g.10gb", "2g.20gb", "3g.40gb"),
        2: _ids("A100-SXM4-40GB", "1g.5gb", "1g.5gb", "2g.10gb", "3g.20gb"),
    }  # the L4 is not MIG-capable: `devices: all` leaves it alone
    assert resolve_layout(config, "all-disabled", MIXED_NODE) == {0: None, 1: None, 2: None}
    assert resolve_layout(config, "all-enabled", MIXED_NODE) == {0: [], 1: [], 2: []}


def test_same_profile_name_means_different_profiles_per_model() -> None:
    layout = resolve_layout(load_mig_parted_config(DEFAULTS), "all-1g.10gb", MIXED_NODE)
    assert layout[0] == [19] * 7  # A100-80GB: the 1-slot 1g.10gb
    assert layout[2] == [15] * 4  # A100-40GB: 1g.10gb is the double-memory profile, four of them


def test_explicit_indices_and_disabled_entries() -> None:
    layout = resolve_layout(load_mig_parted_config(FORMAT_EXAMPLE), "custom-config-indices",
                            [_gpu(i, "A100-SXM4-80GB") for i in range(4)])
    wanted = _ids("A100-SXM4-80GB", "1g.10gb", "1g.10gb", "2g.20gb")
    assert layout == {0: wanted, 1: wanted, 2: wanted, 3: None}


def test_explicit_index_on_non_mig_gpu_is_an_error() -> None:
    config = _parse("version: v1\nmig-configs:\n  x:\n  - devices: [3]\n    mig-enabled: true\n    mig-devices: {}\n")
    with pytest.raises(ConfigError) as info:
        resolve_layout(config, "x", MIXED_NODE)
    assert info.value.message == 'mig.yaml: mig-configs.x[0].devices: GPU 3 (NVIDIA L4) is not MIG-capable'
    disabled = _parse("version: v1\nmig-configs:\n  x:\n  - devices: [3]\n    mig-enabled: false\n")
    assert resolve_layout(disabled, "x", MIXED_NODE) == {3: None}


def test_missing_gpu_index_overlap_and_unknown_name() -> None:
    config = _parse("version: v1\nmig-configs:\n  x:\n  - devices: [7]\n    mig-enabled: false\n"
                    "  y:\n  - devices: all\n    mig-enabled: false\n  - devices: [1]\n    mig-enabled: false\n")
    with pytest.raises(ConfigError, match=r"mig-configs\.x\[0\]\.devices: GPU 7 does not exist"):
        resolve_layout(config, "x", MIXED_NODE)
    with pytest.raises(ConfigError, match=r"mig-configs\.y\[1\]: GPU 1 is already selected by entry 0"):
        resolve_layout(config, "y", MIXED_NODE)
    with pytest.raises(NotFoundError, match=r"no config named 'z' \(known: x, y\)"):
        resolve_layout(config, "z", MIXED_NODE)


def test_unknown_profile_names_config_entry_and_profile() -> None:
    config = _parse('version: v1\nmig-configs:\n  all-big:\n  - devices: all\n    mig-enabled: true\n'
                    '    mig-devices: {"3g.40gb": 1, "3g.71gb": 1}\n')
    with pytest.raises(ConfigError) as info:
        resolve_layout(config, "all-big", [_gpu(0, "H100-SXM5-80GB")])
    assert info.value.message.startswith(
        'mig.yaml: mig-configs.all-big[0].mig-devices["3g.71gb"]: GPU model H100-SXM5-80GB has no MIG profile'
    )


def test_layout_that_does_not_fit_names_the_profile() -> None:
    config = _parse('version: v1\nmig-configs:\n  x:\n  - devices: all\n    mig-enabled: true\n'
                    '    mig-devices: {"4g.40gb": 1, "3g.40gb": 1, "1g.10gb": 1}\n')
    with pytest.raises(ConfigError) as info:
        resolve_layout(config, "x", [_gpu(0, "A100-SXM4-80GB")])
    assert info.value.message.startswith('mig.yaml: mig-configs.x[0].mig-devices["1g.10gb"]: 1 x 1g.10gb does not '
                                         "fit on A100-SXM4-80GB")
    too_many = _parse('version: v1\nmig-configs:\n  x:\n  - devices: all\n    mig-enabled: true\n'
                      '    mig-devices: {"1g.6gb+me": 2}\n')
    with pytest.raises(ConfigError, match=r"2 x 1g\.6gb\+me requested, at most 1 fit on A30-24GB"):
        resolve_layout(too_many, "x", [_gpu(0, "A30-24GB")])


def test_partial_compute_instance_profiles_are_refused_clearly() -> None:
    config = _parse('version: v1\nmig-configs:\n  x:\n  - devices: all\n    mig-enabled: true\n'
                    '    mig-devices: {"1c.2g.20gb": 1}\n')
    with pytest.raises(ConfigError, match=r'\["1c\.2g\.20gb"\]: compute-instance profiles are not supported'):
        resolve_layout(config, "x", [_gpu(0, "A100-SXM4-80GB")])
    full = _parse('version: v1\nmig-configs:\n  x:\n  - devices: all\n    mig-enabled: true\n'
                  '    mig-devices: {"2c.2g.20gb": 1}\n')
    assert resolve_layout(full, "x", [_gpu(0, "A100-SXM4-80GB")]) == {0: [14]}


def test_check_layouts_against_named_models() -> None:
    config = _parse('version: v1\nmig-configs:\n  x:\n  - devices: all\n    mig-enabled: true\n'
                    '    mig-devices: {"1g.10gb": 7}\n')
    assert "A100-SXM4-80GB" in check_layouts(config)  # no filter: fits one catalog model, enough
    with pytest.raises(ConfigError, match=r"at most 4 fit on A100-SXM4-40GB"):
        check_layouts(config, [get_model("A100-SXM4-40GB")])
    with pytest.raises(ConfigError, match=r"mig-configs\.x\[0\]\.mig-enabled: GPU model L4 is not MIG-capable"):
        check_layouts(_parse("version: v1\nmig-configs:\n  x:\n  - devices: [0]\n    mig-enabled: true\n"
                             "    mig-devices: {1g.10gb: 1}\n"), [get_model("L4")])


def test_filterless_entry_that_fits_no_model_is_rejected() -> None:
    config = _parse('version: v1\nmig-configs:\n  x:\n  - devices: all\n    mig-enabled: true\n'
                    '    mig-devices: {"1g.10gb": 8}\n')
    with pytest.raises(ConfigError, match=r"no other MIG model in the catalog fits this entry"):
        check_layouts(config)


MALFORMED = [
    ("mig-configs: {}\n", "mig.yaml: version: required field is missing"),
    ("version: v2\nmig-configs: {x: [{devices: all, mig-enabled: false}]}\n", "mig.yaml: version: unknown version"),
    ("version: v1\nmig-configs: {}\n", "mig.yaml: mig-configs: must name at least one config"),
    ("version: v1\nmig-configs: {x: []}\n", "mig.yaml: mig-configs.x: must list at least one entry"),
    ("version: v1\nmig-configs: {x: [{mig-enabled: false}]}\n", "mig.yaml: mig-configs.x[0].devices: required"),
    ("version: v1\nmig-configs: {x: [{devices: all}]}\n", "mig.yaml: mig-configs.x[0].mig-enabled: required"),
    ("version: v1\nmig-configs: {x: [{devices: all, mig-enabled: 'yes'}]}\n",
     "mig.yaml: mig-configs.x[0].mig-enabled: must be a boolean"),
    ("version: v1\nmig-configs: {x: [{devices: some, mig-enabled: false}]}\n",
     "mig.yaml: mig-configs.x[0].devices: must be 'all' or a non-empty list"),
    ("version: v1\nmig-configs: {x: [{devices: [0, -1], mig-enabled: false}]}\n",
     "mig.yaml: mig-configs.x[0].devices: GPU indices must be integers >= 0"),
    ("version: v1\nmig-configs: {x: [{devices: all, mig-enabled: true}]}\n",
     "mig.yaml: mig-configs.x[0].mig-devices: required when 'mig-enabled' is true"),
    ("version: v1\nmig-configs: {x: [{devices: all, mig-enabled: false, mig-devices: {1g.10gb: 1}}]}\n",
     "mig.yaml: mig-configs.x[0].mig-devices: MIG devices included when 'mig-enabled' is false"),
    ("version: v1\nmig-configs: {x: [{devices: all, mig-enabled: true, mig-devices: {big: 1}}]}\n",
     "mig.yaml: mig-configs.x[0].mig-devices: 'big' is not a MIG profile name"),
    ("version: v1\nmig-configs: {x: [{devices: all, mig-enabled: true, mig-devices: {1g.10gb: -1}}]}\n",
     "mig.yaml: mig-configs.x[0].mig-devices: the count of 1g.10gb must be at least 0"),
    ("version: v1\nmig-configs: {x: [{devices: all, mig-enabled: true, mig-devices: {1g.10gb: two}}]}\n",
     'mig.yaml: mig-configs.x[0].mig-devices["1g.10gb"]: must be an integer'),
    ("version: v1\nmig-configs: {x: [{device-filter: 20B2, devices: all, mig-enabled: false}]}\n",
     "mig.yaml: mig-configs.x[0].device-filter: must be PCI device ids like '0x20B210DE'"),
    ("version: v1\nmig-configs: {x: [{devices: all, mig-enabled: false, mig_enabled: true}]}\n",
     "mig.yaml: mig-configs.x[0].mig_enabled: unknown field"),
    ("version: v1\nmig-configs: {x: [{devices: all, mig-enabled: false}]}\nextra: 1\n",
     "mig.yaml: extra: unknown field"),
]


@pytest.mark.parametrize(("text", "expected"), MALFORMED)
def test_malformed_configs_are_one_line_with_field_path(text: str, expected: str) -> None:
    with pytest.raises(ConfigError) as info:
        _parse(text)
    assert info.value.message.startswith(expected)
    assert "\n" not in info.value.message


# ---------------------------------------------------------------------------------------------- defaults


def _by_filter(config: MigPartedConfig, name: str) -> dict[str, dict[str, int] | None]:
    """{PCI id: mig-devices} of one named layout (filter-less entries under "*")."""
    out: dict[str, dict[str, int] | None] = {}
    for entry in config.mig_configs[name]:
        for pci in entry.device_filter or ["*"]:
            out[pci] = entry.mig_devices if entry.mig_enabled else None
    return out


def test_generated_defaults_match_nvidias_names_and_counts() -> None:
    """The generator reproduces the reference's default config for each model the catalog and reference share."""
    reference = load_mig_parted_config(DEFAULTS)
    models = [get_model(k) for k in ("A100-SXM4-40GB", "A100-SXM4-80GB", "A30-24GB", "H100-SXM5-80GB",
                                     "H100-NVL-94GB", "H200-141GB", "B200-180GB")]
    generated = default_mig_parted_config([*models, get_model("L4")])
    assert set(generated.mig_configs) == set(reference.mig_configs)
    for name in reference.mig_configs:
        expected = _by_filter(reference, name)
        actual = _by_filter(generated, name)
        for model in models:
            if model.pci_device_id in expected or "*" in expected:
                key = model.pci_device_id if model.pci_device_id in expected else "*"
                assert actual.get(key) == expected[key], (name, model.key)
            else:
                assert model.pci_device_id not in actual, (name, model.key)


def test_generated_defaults_have_no_filter_for_one_model_and_all_fit() -> None:
    for model in CATALOG.values():
        config = default_mig_parted_config([model])
        assert all(e.device_filter is None for entries in config.mig_configs.values() for e in entries)
        if not model.mig_capable:
            assert set(config.mig_configs) == {"all-disabled", "all-enabled"}
            continue
        gpu = _gpu(0, model.key)
        for name in config.mig_configs:
            wanted = resolve_layout(config, name, [gpu])[0]
            assert wanted is None or place(model, wanted) is not None, (model.key, name)
        assert len(config.mig_configs) == 3 + len(model.mig_profiles)


def test_generated_config_round_trips_through_yaml() -> None:
    config = default_mig_parted_config([get_model("A30-24GB")])
    text = config.to_yaml()
    assert "all-1g.6gb.me" in text and "1g.6gb+me: 1" in text
    again = parse_mig_parted_config(yaml.safe_load(text), "again")
    assert again.mig_configs == config.mig_configs
    assert again.mig_configs["all-balanced"][0].mig_devices == {"1g.6gb": 2, "2g.12gb": 1}


def test_two_media_extension_instances_do_not_fit() -> None:
    config = _parse('version: v1\nmig-configs:\n  x:\n  - devices: all\n    mig-enabled: true\n'
                    '    mig-devices: {"1g.6gb+me": 1, "2g.12gb+me": 1}\n')
    with pytest.raises(ConfigError, match=r'\["2g\.12gb\+me"\]: 1 x 2g\.12gb\+me .* at most one \+me instance per GPU'):
        resolve_layout(config, "x", [_gpu(0, "A30-24GB")])


MIG_MODELS = sorted(k for k, m in CATALOG.items() if m.mig_capable)


@settings(max_examples=60, deadline=None)
@given(model_key=st.sampled_from(MIG_MODELS), data=st.data())
def test_resolved_layouts_always_place_and_rejections_are_one_line(model_key: str, data: st.DataObject) -> None:
    """Any profile → count mapping either resolves to ids the geometry can place, or is one ConfigError line."""
    model = get_model(model_key)
    names = data.draw(st.lists(st.sampled_from([p.name for p in model.mig_profiles]), unique=True, max_size=4))
    counts = {name: data.draw(st.integers(min_value=0, max_value=8)) for name in names}
    config = parse_mig_parted_config(
        {"version": "v1", "mig-configs": {"x": [{"devices": "all", "mig-enabled": True, "mig-devices": counts}]}},
        "prop.yaml",
    )
    try:
        wanted = resolve_layout(config, "x", [_gpu(0, model_key)])[0]
    except ConfigError as exc:
        assert exc.message.startswith("prop.yaml: mig-configs.x[0].mig-devices[")
        assert "\n" not in exc.message
        assert place(model, [model.profile(n).profile_id for n, c in counts.items() for _ in range(c)]) is None
    else:
        assert wanted is not None and sorted(wanted) == sorted(
            model.profile(n).profile_id for n, c in counts.items() for _ in range(c)
        )
        assert place(model, wanted) is not None
