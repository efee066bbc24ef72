from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kubegpu.errors import ConfigError, NotFoundError
from kubegpu.gpu.catalog import CATALOG, GpuModel
from kubegpu.gpu.geometry import (
    PlacedInstance,
    feasible_multisets,
    fits,
    format_layout,
    free_slots,
    is_legal,
    layout_errors,
    maximal_multisets,
    parse_layout,
    place,
)

A100 = CATALOG["A100-SXM4-80GB"]
A30 = CATALOG["A30-24GB"]
EIGHT_SLOT = [k for k, m in CATALOG.items() if m.mig_memory_slots == 8]


@pytest.mark.parametrize("key", EIGHT_SLOT)
def test_eight_slot_counts_77_feasible_28_maximal(key: str) -> None:
    model = CATALOG[key]
    feasible = feasible_multisets(model)
    assert len(feasible) == 77  # non-empty multisets (§1.4); the empty GPU is not counted
    assert () not in feasible
    assert len(set(feasible)) == 77
    assert len(maximal_multisets(model)) == 28


def test_a30_has_4_maximal_geometries() -> None:
    names = {tuple(sorted(A30.profile(p).name for p in m)) for m in maximal_multisets(A30)}
    assert names == {("4g.24gb",), ("2g.12gb", "2g.12gb"), ("1g.6gb", "1g.6gb", "2g.12gb"), ("1g.6gb",) * 4}


def test_maximal_set_without_double_memory_is_the_reference_twelve() -> None:
    without_1d = [m for m in maximal_multisets(A100) if 15 not in m]
    got = sorted(tuple(sorted(m)) for m in without_1d)
    # 7 | 4+2+1 | 4+1+1+1 | 3+4 | 3+3 | 3+2+2 | 3+2+1+1 | 3+1+1+1+1 | 2+2+2+1 | 2+2+1+1+1 | 2+1x5 | 1x7
    expected = sorted(tuple(sorted(x)) for x in [
        (0,), (5, 14, 19), (5, 19, 19, 19), (9, 5), (9, 9), (9, 14, 14), (9, 14, 19, 19), (9, 19, 19, 19, 19),
        (14, 14, 14, 19), (14, 14, 19, 19, 19), (14, 19, 19, 19, 19, 19), (19,) * 7,
    ])
    assert got == expected


def test_media_extension_enumeration_allows_at_most_one() -> None:
    with_me = feasible_multisets(A100, include_media_extensions=True)
    assert all(m.count(20) <= 1 for m in with_me)
    assert (19, 19, 19, 19, 19, 19, 20) in with_me
    assert len(with_me) > 77
    # +me has one instance at most even on A30 with two +me profiles
    assert all(sum(p in (21, 6) for p in m) <= 1 for m in feasible_multisets(A30, include_media_extensions=True))


def test_layout_errors_name_each_problem() -> None:
    assert layout_errors(A100, [PlacedInstance(9, 0), PlacedInstance(5, 0)]) == [
        "4g.40gb@0 overlaps 3g.40gb@0 at memory slot 0"
    ]
    assert "not a legal placement" in layout_errors(A100, [PlacedInstance(9, 2)])[0]
    assert "no MIG profile id 99" in layout_errors(A100, [PlacedInstance(99, 0)])[0]
    too_many = [PlacedInstance(20, 0), PlacedInstance(20, 1)]
    errors = layout_errors(A100, too_many)
    assert any("exceeds its maximum of 1" in e for e in errors)
    assert any("+me" in e for e in layout_errors(A30, [PlacedInstance(21, 0), PlacedInstance(6, 2)]))
    slices = [PlacedInstance(15, s) for s in (0, 2, 4)] + [PlacedInstance(14, 6)]  # memory fits; 2g@6 is illegal
    assert not is_legal(A100, slices)
    # 4 compute slices left after 4g; 1d@4 + 1d@6 + ... fine, but 4g + 3g + 1g would need 8 slices
    assert any("compute slices" in e for e in layout_errors(A100, [PlacedInstance(5, 0), PlacedInstance(9, 4),
                                                                    PlacedInstance(19, 4)]))
    assert layout_errors(CATALOG["L4"], [PlacedInstance(0, 0)]) == ["GPU model L4 is not MIG-capable"]
    assert is_legal(A100, [PlacedInstance(9, 4), PlacedInstance(5, 0)])


def test_place_prefers_large_free_blocks() -> None:
    assert place(A100, [9]) == [PlacedInstance(9, 4)]  # keeps 0..3 for a 4g
    assert place(A100, [19]) == [PlacedInstance(19, 6)]  # small ones pack from the edge
    fixed = [PlacedInstance(19, 1)]
    assert place(A100, [9], fixed) == [PlacedInstance(19, 1), PlacedInstance(9, 4)]
    assert place(A100, [5], [PlacedInstance(9, 0)]) is None  # 4g only fits at 0
    assert place(A100, [0], [PlacedInstance(19, 6)]) is None
    assert place(A100, [19] * 8) is None
    assert place(A100, [5, 9]) == [PlacedInstance(5, 0), PlacedInstance(9, 4)]


def test_one_at_a_time_placement_keeps_room_for_big_instances() -> None:
    # first-fit would put the 1g instances at 0 and 1 and leave no room for a 4g (it only starts at 0)
    layout: list[PlacedInstance] = []
    for profile_id in (19, 19, 5):
        placed = place(A100, [profile_id], layout)
        assert placed is not None, (profile_id, layout)
        layout = placed
    assert sorted(layout) == [PlacedInstance(5, 0), PlacedInstance(19, 5), PlacedInstance(19, 6)]
    assert is_legal(A100, layout)


def test_place_returns_fixed_first_then_wanted_in_order() -> None:
    fixed = [PlacedInstance(14, 2)]
    layout = place(A100, [19, 9, 19], fixed)
    assert layout is not None
    assert layout[0] == fixed[0]
    assert [i.profile_id for i in layout[1:]] == [19, 9, 19]
    assert is_legal(A100, layout)


def test_place_rejects_an_illegal_fixed_layout_and_unknown_profiles() -> None:
    assert place(A100, [19], [PlacedInstance(9, 2)]) is None
    with pytest.raises(NotFoundError):
        place(A100, [42])


def test_free_slots_and_fits() -> None:
    assert free_slots(A100, [PlacedInstance(9, 4), PlacedInstance(19, 1)]) == (0, 2, 3)
    assert fits(A100, [14], [PlacedInstance(9, 4), PlacedInstance(19, 1)])  # 2g@2
    assert not fits(A100, [14, 19, 19], [PlacedInstance(9, 4), PlacedInstance(19, 1)])


def test_layout_text_round_trip_and_errors() -> None:
    layout = [PlacedInstance(9, 4), PlacedInstance(19, 0)]
    text = format_layout(A100, layout)
    assert text == "3g.40gb@4,1g.10gb@0"
    assert parse_layout(A100, text) == layout
    assert parse_layout(A100, "9@0") == [PlacedInstance(9, 0)]
    with pytest.raises(ConfigError, match=r"anno: '3g\.40gb' is not"):
        parse_layout(A100, "3g.40gb", source="anno")
    with pytest.raises(ConfigError, match=r"anno: .*9g\.1gb"):
        parse_layout(A100, "9g.1gb@0", source="anno")


MIG_MODELS = [m for m in CATALOG.values() if m.mig_capable]


@st.composite
def placement_requests(draw: st.DrawFn) -> tuple[GpuModel, list[PlacedInstance], list[int]]:
    model = draw(st.sampled_from(MIG_MODELS))
    ids = [p.profile_id for p in model.mig_profiles]
    fixed: list[PlacedInstance] = []
    for _ in range(draw(st.integers(0, 4))):
        candidate = PlacedInstance(draw(st.sampled_from(ids)), draw(st.integers(0, model.mig_memory_slots - 1)))
        if is_legal(model, [*fixed, candidate]):
            fixed.append(candidate)
    wanted = draw(st.lists(st.sampled_from(ids), max_size=4))
    return model, fixed, wanted


@settings(max_examples=150, deadline=None)
@given(placement_requests())
def test_place_never_returns_an_illegal_layout_or_moves_fixed(request: tuple[GpuModel, list[PlacedInstance],
                                                                             list[int]]) -> None:
    model, fixed, wanted = request
    layout = place(model, wanted, fixed)
    if layout is None:
        assert not _brute_force_fits(model, wanted, fixed)
        return
    assert layout_errors(model, layout) == []
    assert layout[: len(fixed)] == fixed
    assert [i.profile_id for i in layout[len(fixed):]] == wanted
    assert fits(model, wanted, fixed)


def _brute_force_fits(model: GpuModel, wanted: list[int], fixed: list[PlacedInstance]) -> bool:
    """Independent check: try every combination of legal starts."""
    choices = [model.profile(p).starts for p in wanted]
    return any(
        is_legal(model, [*fixed, *(PlacedInstance(p, s) for p, s in zip(wanted, starts, strict=True))])
        for starts in itertools.product(*choices)
    )


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(MIG_MODELS), st.data())
def test_every_feasible_multiset_places_legally(model: GpuModel, data: st.DataObject) -> None:
    multiset = data.draw(st.sampled_from(feasible_multisets(model, include_media_extensions=True)))
    layout = place(model, list(multiset))
    assert layout is not None and is_legal(model, layout)
