"""The placement core: the state's bookkeeping and each policy's defining choice on tiny clusters."""

from __future__ import annotations

import pytest

from kubegpu.errors import ConfigError
from kubegpu.scheduling.placement import (
    ClusterState,
    Placement,
    PolicyContext,
    Request,
    choose,
    make_policy,
    policy_names,
    state_from_nodes,
)


def _state() -> ClusterState:
    return state_from_nodes([("t4", "T4", 32_000, 65_536, 2), ("v100", "V100M16", 64_000, 131_072, 8)])


def test_apply_and_release_move_exactly_the_request() -> None:
    state = _state()
    share = Request(4_000, 8_192, 1, 300)
    state.apply(share, Placement(0, (1,)))
    assert state.gpu_free[0, :2].tolist() == [1000, 700]
    assert (state.cpu_free[0], state.memory_free[0]) == (28_000, 57_344)
    assert state.allocated_gpu_milli == 300
    state.release(share, Placement(0, (1,)))
    assert state.gpu_free[0, :2].tolist() == [1000, 1000] and state.allocated_gpu_milli == 0
    assert state.version[0] == 2


def test_apply_refuses_what_does_not_fit() -> None:
    state = _state()
    with pytest.raises(ConfigError, match="does not fit"):
        state.apply(Request(1_000, 1, 4, 1000), Placement(0, (0, 1, 2, 3)))  # the T4 node has two GPUs
    with pytest.raises(ConfigError, match="more than node"):
        state.release(Request(1_000, 1, 1, 500), Placement(0, (0,)))


def test_requests_are_validated() -> None:
    with pytest.raises(ConfigError, match="whole GPUs"):
        Request(1, 1, 2, 500)
    with pytest.raises(ConfigError, match="gpu_milli"):
        Request(1, 1, 1, 0)


def test_model_pins_restrict_feasibility() -> None:
    state = _state()
    pinned = Request(1_000, 1, 1, 1000, frozenset({"V100M16"}))
    assert state.feasible(pinned).tolist() == [False, True]
    for name in policy_names():
        placement = choose(pinned, state, make_policy(name, PolicyContext(seed=3, workload=[pinned])))
        assert placement is not None and placement.node == 1, name


def test_nothing_fits_gives_none() -> None:
    state = _state()
    for name in policy_names():
        assert choose(Request(1_000, 1, 16, 1000), state, make_policy(name)) is None


def test_unknown_policy_names_the_choices() -> None:
    with pytest.raises(ConfigError, match="fgd"):
        make_policy("nope")
