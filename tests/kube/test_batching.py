"""The one batch window both controllers use: idle or window, whichever closes first."""

from __future__ import annotations

from kubegpu.kube.batching import Batcher


def test_fires_on_idle_or_window_whichever_first() -> None:
    batch = Batcher(window=60, idle=10)
    batch.add("a", 0)
    assert not batch.ready(9)
    assert batch.ready(10)
    batch.reset()
    for t in range(0, 70, 5):  # a pod every 5 s keeps the idle timer from firing
        batch.add(f"p{t}", t)
        assert batch.ready(t) == (t >= 60)
    assert batch.deadline() == 60


def test_only_new_keys_extend_the_window() -> None:
    batch = Batcher(window=10, idle=1)
    batch.add(["a", "b"], 0.0)
    batch.add(["a", "b"], 0.5)  # seen again: the idle deadline stays at 1 s
    assert batch.deadline() == 1.0 and batch.ready(1.0)
    batch.add("c", 0.9)
    assert batch.deadline() == 1.9 and not batch.ready(1.5)


def test_a_window_left_empty_closes_without_firing() -> None:
    batch = Batcher(window=60, idle=10)
    assert batch.deadline() is None and not batch.ready(1e9)
    batch.add(["a", "b"], 0)
    batch.discard(["a"])
    assert batch.items == {"b"} and batch.deadline() == 10
    batch.discard(["b"])
    assert batch.items == set() and batch.deadline() is None and not batch.ready(100)
    batch.add("c", 200)  # the next item opens a fresh window
    assert batch.first_at == 200 and not batch.ready(209) and batch.ready(210)
