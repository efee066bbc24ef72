"""Property-based fuzzing of every file-taking entry point: a hostile file is accepted or one error line, never more.

Fixed seed (`derandomize=True`), so CI runs the same few thousand cases every time; `benchmarks/fuzz.py` runs the
same mutations at ≥ 10,000 per kind. A case slower than `HANG_S` counts as a hang and fails the test. That is timed
here rather than with Hypothesis' `deadline`, whose replay of a case that was only slow because the machine was busy
fails the run as "flaky" instead of judging the input.
"""

from __future__ import annotations

import random
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.fuzz.harness import InputKind, input_kinds, judge, mutate

KINDS = {kind.name: kind for kind in input_kinds()}
CASES_PER_KIND = 200  # 13 kinds → 2,600 cases, plus 300 raw-byte files through every loader
HANG_S = 10.0
FUZZ = settings(max_examples=CASES_PER_KIND, derandomize=True, deadline=None, database=None,
                suppress_health_check=list(HealthCheck))


@pytest.fixture(scope="module")
def workdir() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="kubegpu-fuzz-") as name:
        yield Path(name)


def _check(kind: InputKind, data: bytes, workdir: Path) -> str:
    path = workdir / f"input{kind.suffix}"
    path.write_bytes(data)
    started = time.monotonic()
    outcome = judge(kind, path)
    elapsed = time.monotonic() - started
    assert elapsed < HANG_S, f"{kind.name}: hang ({elapsed:.1f} s)\ninput: {data[:300]!r}"
    assert outcome.verdict != "traceback", f"{kind.name}: {outcome.detail}\ninput: {data[:300]!r}"
    if outcome.verdict == "clean":
        assert str(path) in outcome.detail or path.name in outcome.detail, outcome.detail
    return outcome.verdict


@pytest.mark.parametrize("name", sorted(KINDS))
def test_hostile_files_are_accepted_or_one_line(name: str, workdir: Path) -> None:
    kind = KINDS[name]
    verdicts: list[str] = []

    @FUZZ
    @given(st.integers(min_value=0, max_value=2**32 - 1))
    def run(seed: int) -> None:
        # one drawn integer seeds an ordinary Random: the mutation is a pure function of it, so Hypothesis can replay
        # (and report) a failing case exactly, whatever the loaders did to process state in between
        verdicts.append(_check(kind, mutate(random.Random(seed), kind), workdir))

    run()
    assert len(verdicts) >= CASES_PER_KIND // 2
    assert "clean" in verdicts  # the mutations do reach the error paths


@pytest.mark.parametrize("name", sorted(KINDS))
def test_seeds_are_accepted(name: str, workdir: Path) -> None:
    """The mutations start from valid files: each seed itself loads, so errors above come from the mutation."""
    kind = KINDS[name]
    for seed in kind.seeds:
        assert _check(kind, seed.encode(), workdir) == "accepted"


@settings(max_examples=300, derandomize=True, deadline=None, database=None)
@given(st.binary(max_size=2000))
def test_raw_bytes_through_every_loader(data: bytes) -> None:
    with tempfile.TemporaryDirectory(prefix="kubegpu-fuzz-") as name:
        for kind in KINDS.values():
            _check(kind, data, Path(name))
