"""The FGD paper's protocol: inflation to a share of capacity, the seeded shuffle, and the a_i definition."""

from __future__ import annotations

from kubegpu.scheduling.placement import Request, state_from_nodes
from kubegpu.sim.trace.reader import Task
from kubegpu.sim.trace.replay import LEVELS, arrivals, replay

WHOLE = Request(1000, 1, 1, 1000)


def _tasks(n: int, request: Request = WHOLE) -> list[Task]:
    return [Task(f"t{i:03d}", request) for i in range(n)]


def test_inflation_adds_drawn_copies_until_the_next_would_pass_the_target() -> None:
    tasks = _tasks(10)  # 10 GPUs requested
    order = arrivals(tasks, capacity_milli=20_000, seed=1, inflation=1.3)  # target 26 GPUs
    assert len(order) == 26
    assert {t.name for t in order[:10]} == {t.name for t in tasks}  # every task of the file, first
    assert all("-copy-" in t.name for t in order[10:])


def test_a_list_above_the_target_is_thinned_at_random() -> None:
    order = arrivals(_tasks(40), capacity_milli=20_000, seed=1, inflation=1.3)
    assert len(order) == 26 and len({t.name for t in order}) == 26


def test_cpu_only_tasks_arrive_and_do_not_count_toward_inflation() -> None:
    tasks = _tasks(4) + [Task(f"c{i}", Request(500, 1)) for i in range(3)]
    order = arrivals(tasks, capacity_milli=4_000, seed=3, inflation=1.3)
    assert sum(t.request.gpu_total_milli for t in order) == 5_000
    assert {t.name for t in order} >= {"c0", "c1", "c2"}


def test_the_shuffle_depends_on_the_seed_only() -> None:
    tasks = _tasks(50)
    first = [t.name for t in arrivals(tasks, 100_000, seed=42, inflation=0.5)]
    again = [t.name for t in arrivals(list(reversed(tasks)), 100_000, seed=42, inflation=0.5)]
    other = [t.name for t in arrivals(tasks, 100_000, seed=43, inflation=0.5)]
    assert first == again  # sorted by name before the shuffle: the file's order does not matter
    assert first != other and sorted(first) == sorted(other)


def test_levels_read_the_allocation_when_the_arrived_requests_first_reach_each_percent() -> None:
    # two GPUs; 700-thousandth shares: the first two fit (one per GPU), the third does not
    state = state_from_nodes([("n0", "T4", 64_000, 1_000, 2)])
    result = replay(state, _tasks(3, Request(100, 1, 1, 700)), "bestfit", seed=0, inflation=1.3)
    curve = result.allocated_percent
    assert len(curve) == LEVELS and result.total_gpus == 2
    assert curve[0] == 0.0
    assert curve[1] == curve[35] == 35.0  # arrived 700 of 2000 thousandths (35 %): 700 allocated
    assert curve[36] == curve[70] == 70.0  # the second share arrived and fits
    assert curve[71] == curve[105] == 70.0  # the third (at 105 %) is skipped
    assert curve[130] == 70.0  # never reached: the final allocation
    assert result.skipped_pods == 1


def test_the_same_seed_gives_the_same_result() -> None:
    def run(seed: int) -> list[float]:
        state = state_from_nodes([(f"n{i}", "T4", 16_000, 64_000, 2) for i in range(4)])
        tasks = [Task(f"t{i}", Request(1000 * (1 + i % 5), 10, 1, 100 * (1 + i % 9))) for i in range(30)]
        return replay(state, tasks, "kubegpu", seed).allocated_percent

    assert run(7) == run(7)


def test_shares_placed_at_100_counts_what_was_placed_when_the_arrived_workload_first_reached_capacity() -> None:
    # one GPU; shares of 700, 400 and 100 (1,200 thousandths), inflated to 1,300 by copies of the 100
    tasks = [Task(f"t{i}", Request(100, 1, 1, milli)) for i, milli in enumerate((700, 400, 100))]
    expected = {4: ([700, 400, 100, 100], {700: 1}),  # the 400 brings 1,100 and is skipped; both 100s fit after
                7: ([700, 100, 400, 100], {700: 1, 100: 1})}  # the 100 before the 400 counts, the copy after not
    for seed, (sizes, at_100) in expected.items():
        assert [t.request.gpu_milli for t in arrivals(tasks, 1_000, seed, 1.3)] == sizes
        result = replay(state_from_nodes([("n0", "T4", 64_000, 1_000, 1)]), tasks, "kubegpu", seed)
        assert result.shares_placed_at_100 == at_100
        assert result.placed_pods == 3 and result.allocated_percent[100] == 100.0 * sum(
            size * count for size, count in at_100.items()) / 1_000
        assert "sharesPlacedAt100" not in result.to_json() and len(result.to_json()) == 6
    # whole-GPU tasks are not shares; a workload that never reaches 100 % reads what was placed in the end (seed 0
    # draws the whole-GPU task as the first copy, which would pass half of the 4 GPUs: no copy arrives)
    tasks = [Task("w", WHOLE), Task("s", Request(100, 1, 1, 300))]
    assert len(arrivals(tasks, 4_000, 0, 0.5)) == 2
    never = replay(state_from_nodes([("n0", "T4", 64_000, 1_000, 4)]), tasks, "kubegpu", 0, inflation=0.5)
    assert never.allocated_percent[100] == 32.5 and never.shares_placed_at_100 == {300: 1}
