from __future__ import annotations

import pytest

from kubegpu.errors import NotFoundError
from kubegpu.gpu.catalog import CATALOG, get_model, gfd_family

MIG_MODELS = ["A100-SXM4-40GB", "A100-SXM4-80GB", "A30-24GB", "H100-SXM5-80GB", "H100-NVL-94GB", "H200-141GB",
              "B200-180GB"]


def test_catalog_holds_the_required_models() -> None:
    for key in MIG_MODELS:
        assert CATALOG[key].mig_capable, key
    for key in ["L4", "T4", "A10G", "L40S"]:
        assert not CATALOG[key].mig_capable
        assert CATALOG[key].mig_profiles == ()


@pytest.mark.parametrize(
    ("lookup", "key"),
    [
        ("NVIDIA A100-SXM4-80GB", "A100-SXM4-80GB"),
        ("NVIDIA H100 80GB HBM3", "H100-SXM5-80GB"),
        ("NVIDIA H100 NVL", "H100-NVL-94GB"),
        ("NVIDIA H200", "H200-141GB"),
        ("NVIDIA B200", "B200-180GB"),
        ("Tesla T4", "T4"),
        ("NVIDIA L4", "L4"),
        ("NVIDIA A30", "A30-24GB"),
        ("0x20b210de", "A100-SXM4-80GB"),
        ("a30-24gb", "A30-24GB"),
        ("NVIDIA-H100-80GB-HBM3", "H100-SXM5-80GB"),  # GFD's nvidia.com/gpu.product form
    ],
)
def test_get_model_by_product_name_pci_id_or_key(lookup: str, key: str) -> None:
    assert get_model(lookup).key == key


def test_unknown_model_names_it_and_lists_known_keys() -> None:
    with pytest.raises(NotFoundError) as info:
        get_model("V100")
    message = str(info.value)
    assert "'V100'" in message and "A100-SXM4-80GB" in message and "\n" not in message


def test_eight_slot_geometry_matches_reference_table() -> None:
    # §1.2: ids 19/20/15/14/9/5/0, memory positions, SM slices, max counts and starts
    expected = {
        19: (1, 1, 7, (0, 1, 2, 3, 4, 5, 6)),
        20: (1, 1, 1, (0, 1, 2, 3, 4, 5, 6)),
        15: (2, 1, 4, (0, 2, 4, 6)),
        14: (2, 2, 3, (0, 2, 4)),
        9: (4, 3, 2, (0, 4)),
        5: (4, 4, 1, (0,)),
        0: (8, 7, 1, (0,)),
    }
    for key in MIG_MODELS:
        model = CATALOG[key]
        if key == "A30-24GB":
            continue
        assert (model.mig_memory_slots, model.mig_compute_slices) == (8, 7)
        got = {p.profile_id: (p.memory_slots, p.compute_slices, p.max_count, p.starts) for p in model.mig_profiles}
        assert got == expected, key


def test_a30_geometry() -> None:
    model = CATALOG["A30-24GB"]
    assert (model.mig_memory_slots, model.mig_compute_slices) == (4, 4)
    got = {p.profile_id: (p.name, p.memory_slots, p.max_count, p.starts) for p in model.mig_profiles}
    assert got == {
        14: ("1g.6gb", 1, 4, (0, 1, 2, 3)),
        21: ("1g.6gb+me", 1, 1, (0, 1, 2, 3)),
        5: ("2g.12gb", 2, 2, (0, 2)),
        6: ("2g.12gb+me", 2, 1, (0, 2)),
        0: ("4g.24gb", 4, 1, (0,)),
    }


def test_hopper_sm_counts_are_not_g_times_one_slice() -> None:
    h100 = CATALOG["H100-SXM5-80GB"]
    assert [h100.profile(p).multiprocessors for p in (19, 15, 14, 9, 5, 0)] == [16, 26, 32, 60, 64, 132]
    assert CATALOG["A100-SXM4-40GB"].profile("7g.40gb").multiprocessors == 98  # MIG loses 10 of 108 SMs


def test_profile_lookup_by_name_config_name_compute_prefix_and_id() -> None:
    model = CATALOG["A100-SXM4-80GB"]
    assert model.profile("1g.10gb").profile_id == 19
    assert model.profile("1g.10gb+me").profile_id == 20
    assert model.profile("1g.10gb.me").profile_id == 20
    assert model.profile("7c.7g.80gb").profile_id == 0
    assert model.profile(15).name == "1g.20gb"
    # the same name means a different profile on the 40GB part (double-memory 1g)
    assert CATALOG["A100-SXM4-40GB"].profile("1g.10gb").profile_id == 15
    with pytest.raises(NotFoundError, match=r"3g\.20gb"):
        model.profile("3g.20gb")
    with pytest.raises(NotFoundError, match="not MIG-capable"):
        CATALOG["L4"].profile("1g.10gb")


def test_resource_and_engine_data_for_gfd() -> None:
    model = CATALOG["A100-SXM4-80GB"]
    assert model.profile(20).resource_name == "mig-1g.10gb.me"
    assert model.profile(9).resource_name == "mig-3g.40gb"
    full = model.profile(0).engines
    assert (full.copy, full.decoder, full.jpeg, full.ofa) == (7, 5, 1, 1)
    assert model.profile(20).media_extensions and not model.profile(19).media_extensions


def test_confirmed_flags_follow_the_reference() -> None:
    assert CATALOG["H100-NVL-94GB"].confirmed  # full lgip + lgipp quoted (C)
    assert not CATALOG["B200-180GB"].confirmed  # 3g/4g/7g SMs unknown
    assert not CATALOG["B200-180GB"].profile(9).confirmed
    assert CATALOG["A100-SXM4-40GB"].profile(19).confirmed
    assert not CATALOG["A100-SXM4-40GB"].profile(15).confirmed  # SMs inferred


def test_families_and_reset_behaviour() -> None:
    assert gfd_family((8, 9)) == "ada-lovelace"
    assert gfd_family((7, 5)) == "turing"
    assert gfd_family((10, 0)) == "blackwell"
    assert CATALOG["A100-SXM4-80GB"].mig_resets_on_mode_change
    assert not CATALOG["H100-SXM5-80GB"].mig_resets_on_mode_change
    assert [CATALOG[k].architecture for k in ("T4", "L4", "H200-141GB")] == ["turing", "ada-lovelace", "hopper"]
