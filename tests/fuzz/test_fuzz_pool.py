"""benchmarks/fuzz.py's worker pool: many cases per worker process, and still every hang and crash is counted.

The full run (10,000 cases per kind) once never finished; the pool runs cases in long-lived workers and must still
see a hang the in-worker alarm breaks, one it cannot break (the parent kills the worker) and a worker that dies,
each as one counted case, with every other case still run.
"""

from __future__ import annotations

import argparse
import os
import signal
import time
from pathlib import Path

import pytest

from benchmarks import fuzz
from tests.fuzz.harness import InputKind, Outcome, input_kinds


def _judge(kind: InputKind, path: Path) -> Outcome:
    index = int(path.read_text())
    if index == 3:  # a loop the alarm cannot interrupt (SIGALRM blocked, as inside some C code)
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})
        time.sleep(60)
    if index == 5:  # a Python-level hang: the worker's alarm breaks it
        time.sleep(60)
    if index == 7:  # a crash that takes the worker down
        os._exit(3)
    return Outcome("clean" if index % 2 else "accepted", "x")


def test_pool_counts_hangs_and_crashes_and_runs_every_other_case(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fuzz, "case_data", lambda seed, kind, index: str(index).encode())
    monkeypatch.setattr(fuzz, "judge", _judge)
    monkeypatch.setattr(fuzz, "CHUNK", 4)
    monkeypatch.setattr(fuzz, "KILL_GRACE_S", 1.0)
    kind = next(k for k in input_kinds() if k.name == "mps-slices")
    args = argparse.Namespace(jobs=2, seed=1, hang_s=1.0, memory_mib=0, progress=0)
    started = time.monotonic()
    tallies, failures = fuzz.run([kind], 12, args)
    tally = tallies["mps-slices"]
    assert tally.done == 12 and tally.counts == {"hang": 2, "traceback": 1, "accepted": 6, "clean": 3}
    assert sorted(line.split(": ")[:2] for line in failures) == [
        ["mps-slices:3", "hang"], ["mps-slices:5", "hang"], ["mps-slices:7", "traceback"]]
    assert time.monotonic() - started < 20  # the stuck worker was killed, not waited for


def test_case_data_is_a_pure_function_of_its_coordinates() -> None:
    kind = next(k for k in input_kinds() if k.name == "device-plugin-config")
    first = [fuzz.case_data(1, kind, i) for i in range(30)]
    assert [fuzz.case_data(1, kind, i) for i in reversed(range(30))] == first[::-1]  # order does not matter
    assert first != [fuzz.case_data(2, kind, i) for i in range(30)]
