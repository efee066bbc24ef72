"""What a leftover is worth to the expected shares (kubegpu.scheduling.placement.leftovers) and how the kubegpu policy
ranks a share by it. The workloads are chosen so that the cutting-stock LP's best packing uses as many patterns as
there are sizes: its dual prices are then unique and can be worked out by hand."""

from __future__ import annotations

import numpy as np
import pytest

from kubegpu.scheduling.placement import (
    ClusterState,
    Placement,
    PolicyContext,
    Request,
    choose,
    leftovers,
    make_policy,
    state_from_nodes,
)
from kubegpu.scheduling.placement.leftovers import PRICED_SIZES, best_pattern, leftover_prices, share_prices


def _shares(*sized: tuple[int, int]) -> list[Request]:
    return [Request(1_000, 1, 1, size) for size, n in sized for _ in range(n)]


def test_best_pattern_takes_no_more_copies_than_arrived() -> None:
    # 250s are worth most per thousandth but only two arrived: two of them, then five 100s
    value, pattern = best_pattern(np.array([300.0, 90.0]), np.array([250, 100]), np.array([2, 9]))
    assert pattern.tolist() == [2, 5] and value == 1050.0


def test_prices_are_the_fraction_of_a_gpu_a_share_is_worth_in_the_best_packing() -> None:
    # ten 700s each beside a 300 (10 GPUs), the twenty other 300s three to a GPU (20/3 GPUs): both patterns are
    # used, so y700 + y300 = 1 and 3 y300 = 1
    prices = share_prices({300: 30, 700: 10})
    assert prices == pytest.approx({300: 1 / 3, 700: 2 / 3})
    # 500s two to a GPU and 300s three to a GPU: mixing them wastes 200, so each is priced alone
    assert share_prices({500: 10, 300: 10}) == pytest.approx({500: 0.5, 300: 1 / 3})
    assert share_prices({}) == {}
    with pytest.raises(ValueError, match="share size 1000"):
        share_prices({1000: 1})


def test_a_placement_inside_a_best_packing_loses_nothing_and_a_wasteful_one_loses_its_waste() -> None:
    prices = leftover_prices(_shares((500, 10), (300, 10)))
    # V(900) = 1 (three 300s), V(850) = 5/6 (500 + 300), V(400) = V(350) = 1/3 (one 300)
    assert prices.value[[900, 850, 400, 350, 299]] == pytest.approx([1, 5 / 6, 1 / 3, 1 / 3, 0])
    loss = prices.loss(500, np.array([1000, 900, 850, 500]))
    # 1000 -> 500: the 500 pair; 900 -> 400 spoils three 300s for 500 + 300; 850 -> 350 keeps 500 + 300; 500 -> 0
    assert loss == pytest.approx([0, 1 / 6, 0, 0])
    assert prices.loss_rank(500, np.array([1000, 900, 850])).tolist() == [0, 1, 0]
    with pytest.raises(ValueError, match="free thousandths"):
        prices.loss(500, np.array([400]))
    with pytest.raises(ValueError, match="free thousandths"):
        prices.loss_rank(500, np.array([400]))


def test_a_size_the_workload_never_asked_for_is_priced_by_what_it_displaces() -> None:
    prices = leftover_prices(_shares((300, 30), (700, 10)))
    # a 200 share is worth V(200) = 0: on a fresh GPU it spoils the 700 + 300 (V(800) = 2/3), on a GPU with 500
    # free it leaves 300, still a 300 share's worth
    assert prices.price[200] == 0.0
    assert prices.loss(200, np.array([1000, 500])) == pytest.approx([1 / 3, 0])


def test_only_the_most_common_sizes_are_priced_so_a_learned_workload_of_many_sizes_stays_cheap(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # the 300/700 pair a hundred times each, then 199 sizes asked once: the LP prices the 64 most common sizes, the
    # rest are priced like a size never asked for, V(s)
    rare = [Request(1_000, 1, 1, size) for size in range(101, 998, 4) if size not in (300, 700)][:199]
    seen: list[set[int]] = []
    real = leftovers.share_prices
    monkeypatch.setattr(leftovers, "share_prices", lambda counts: seen.append(set(counts)) or real(counts))
    prices = leftover_prices(_shares((300, 100), (700, 100)) + rare)
    assert len(rare) == 199 and len(seen) == 1
    assert len(seen[0]) == PRICED_SIZES and {300, 700} <= seen[0]
    unpriced = sorted({r.gpu_milli for r in rare} - seen[0])
    assert len(unpriced) == 199 - (PRICED_SIZES - 2)
    assert prices.price[unpriced].tolist() == pytest.approx(prices.value[unpriced].tolist())


def test_no_shares_no_losses() -> None:
    prices = leftover_prices([Request(1_000, 1, 1, 1000), Request(1_000, 1)])
    assert prices.loss(300, np.array([300, 650, 1000])).tolist() == [0.0, 0.0, 0.0]


def _two_gpus_with_850_and_650_free() -> ClusterState:
    state = state_from_nodes([("a", "T4", 64_000, 64_000, 2)])
    state.apply(Request(1_000, 1, 1, 150), Placement(0, (0,)))
    state.apply(Request(1_000, 1, 1, 350), Placement(0, (1,)))
    return state


def test_kubegpu_puts_a_share_where_the_leftovers_keep_their_worth() -> None:
    # a 500 share on GPU 0 leaves 350 (a 300's worth, 1/3) beside GPU 1's 650 (two 300s, 2/3): 1 GPU's worth; on
    # GPU 1 it leaves 150 (nothing) beside 850 (a 500 and a 300, 5/6). FGD sees a smaller fragment for the 500s
    # in 150 than in 350 and takes GPU 1; kubegpu takes GPU 0, where the loss is 0 against 1/6 of a GPU
    state = _two_gpus_with_850_and_650_free()
    workload = _shares((500, 10), (300, 10))
    share = Request(1_000, 1, 1, 500)
    assert choose(share, state, make_policy("fgd", PolicyContext(seed=0, workload=workload))) == Placement(0, (1,))
    assert choose(share, state, make_policy("kubegpu", PolicyContext(seed=0, workload=workload))) == Placement(0, (0,))


def test_kubegpu_learns_the_prices_from_the_requests_it_is_asked_about() -> None:
    state = _two_gpus_with_850_and_650_free()
    share = Request(1_000, 1, 1, 500)
    first = make_policy("kubegpu")  # no expected workload: only the 500 it is asked about, which fits alike
    assert choose(share, state, first) == Placement(0, (1,))
    learning = make_policy("kubegpu")
    for _ in range(128):  # asked about, not placed; the 256th request rebuilds the model from all of them
        choose(Request(1_000, 1, 1, 300), state, learning)
    for _ in range(127):
        choose(share, state, learning)
    assert choose(share, state, learning) == Placement(0, (0,))
