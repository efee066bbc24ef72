"""The sharing performance model's rules, and its calibration against nos' published measurements."""

from __future__ import annotations

import pytest

from kubegpu.sim.perf import (
    DEFAULT_PARAMS,
    MemoryUse,
    Overflow,
    allocating_pod,
    calibration,
    exceeds,
    first_overflow,
    mig_speed,
    mps_speeds,
    time_slicing_speeds,
)

CALIBRATION_TOLERANCE = 0.10  # stated in docs/simulator.md


def test_time_slicing_without_contention_runs_everyone_at_full_speed() -> None:
    assert time_slicing_speeds([0.3, 0.4, 0.2]) == [1.0, 1.0, 1.0]


def test_time_slicing_contention_stretches_by_summed_need_plus_switch_overhead() -> None:
    speeds = time_slicing_speeds([1.0, 1.0])
    expected = 1.0 / (2.0 * (1.0 + DEFAULT_PARAMS.context_switch_overhead))
    assert speeds == pytest.approx([expected, expected])


def test_a_lone_pod_pays_no_switch_overhead() -> None:
    assert time_slicing_speeds([1.0]) == [1.0]


def test_mig_speed_is_slice_sms_over_what_the_pod_keeps_busy() -> None:
    # a busy pod on 14 of 108 SMs: limited by the slice
    assert mig_speed(1.0, 14, 108) == pytest.approx(14 / (DEFAULT_PARAMS.sm_occupancy * 108))
    # a light pod fits in the slice and runs at full speed
    assert mig_speed(0.1, 14, 108) == 1.0
    # a 7g slice (98 of 108 SMs) costs a typical job nothing
    assert mig_speed(1.0, 98, 108) == 1.0


def test_mps_clients_slow_each_other_less_than_time_slicing() -> None:
    mps = mps_speeds([1.0] * 4, [1.0] * 4)
    sliced = time_slicing_speeds([1.0] * 4)
    assert all(m > s for m, s in zip(mps, sliced, strict=True))


def test_mps_thread_percentage_caps_a_client() -> None:
    capped = mps_speeds([1.0], [0.25])[0]
    assert capped == pytest.approx(0.25 / DEFAULT_PARAMS.sm_occupancy)
    assert mps_speeds([1.0], [1.0])[0] == 1.0


def test_the_first_allocation_that_does_not_fit_is_the_newest_pods() -> None:
    pods = [MemoryUse(30.0, 0.0, 0.0), MemoryUse(30.0, 0.0, 10.0), MemoryUse(30.0, 0.0, 20.0)]
    assert first_overflow(pods, 80.0, 0.0) == Overflow(20.0, 2)
    assert first_overflow(pods[:2], 80.0, 0.0) is None


def test_creeping_use_fills_the_device_and_the_next_allocation_is_anyones() -> None:
    hour = 3600.0
    leaker, neighbour = MemoryUse(10.0, 4.0 / hour, 0.0), MemoryUse(15.0, 0.0, 0.0)
    over = first_overflow([leaker, neighbour], 40.0, 0.0)
    assert over is not None and over.victim is None and over.at == pytest.approx(3.75 * hour)
    # a pod that arrives later steps the use up: the crossing comes sooner, and is still nobody's in particular
    late = MemoryUse(5.0, 0.0, hour)
    over = first_overflow([leaker, neighbour, late], 40.0, 0.0)
    assert over is not None and over.victim is None and over.at == pytest.approx(2.5 * hour)
    # whoever allocates most often is the likeliest to hit the full device
    assert [allocating_pod([0.05, 0.45], draw) for draw in (0.05, 0.5, 0.95)] == [0, 1, 1]


def test_isolated_partitions_kill_a_pod_bigger_than_the_partition() -> None:
    assert exceeds(10.5, 9.75)
    assert not exceeds(9.75, 9.75)


def test_calibration_reproduces_nos_measurements_within_tolerance() -> None:
    rows = calibration()
    assert {row.mode for row in rows} == {"time-slicing", "mps", "mig-1g.10gb"}
    for row in rows:
        assert abs(row.error) <= CALIBRATION_TOLERANCE, row


def test_calibration_keeps_the_measured_ordering() -> None:
    """The trends nos showed: MPS beats time-slicing at every load; MIG is flat and loses alone, wins at 7."""
    by = {(row.mode, row.pods): row.modelled_s for row in calibration()}
    for pods in (3, 5, 7):
        assert by[("mps", pods)] < by[("time-slicing", pods)]
    assert by[("mig-1g.10gb", 1)] == by[("mig-1g.10gb", 7)]
    assert by[("mig-1g.10gb", 1)] > by[("time-slicing", 1)]
    assert by[("mig-1g.10gb", 7)] < by[("time-slicing", 7)]


def test_calibration_depends_on_the_parameters() -> None:
    from dataclasses import replace

    skewed = replace(DEFAULT_PARAMS, context_switch_overhead=0.5)
    worst = max(abs(row.error) for row in calibration(skewed) if row.mode == "time-slicing")
    assert worst > CALIBRATION_TOLERANCE
