"""Fuzz every file-taking entry point: hostile files in, and count what comes out.

    python benchmarks/fuzz.py [--quick] [--cases 10000] [--seed 1] [--kind scenario ...]

For each input kind (tests/fuzz/harness.py: device-plugin and mig-parted configs, scenario, trace, partitioner
state, NodePools, Pods, instance types, the `sim:` node file, exporter counters, MPS slices) it writes `--cases`
mutated files (wrong types, huge and non-finite numbers, deep nesting, alias bombs, torn writes, bad bytes) and runs
the same loader the command runs, in-process. Printed per kind: clean errors (one line naming the file), accepted,
tracebacks (anything else) and hangs (over --hang-s seconds, interrupted by SIGALRM), then the slowest case.
Exit status 1 when any traceback or hang was seen. `--quick` runs 300 per kind.
"""

from __future__ import annotations

import argparse
import random
import signal
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from types import FrameType

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.fuzz.harness import Outcome, input_kinds, judge, mutate


class Hang(Exception):
    pass


def _alarm(signum: int, frame: FrameType | None) -> None:
    raise Hang()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=10_000, help="files per input kind (default 10,000)")
    parser.add_argument("--quick", action="store_true", help="300 per kind")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--hang-s", type=float, default=10.0)
    parser.add_argument("--kind", action="append", help="only these kinds (repeatable)")
    args = parser.parse_args()
    cases = 300 if args.quick else args.cases
    signal.signal(signal.SIGALRM, _alarm)
    kinds = [k for k in input_kinds() if not args.kind or k.name in args.kind]
    print(f"{'input kind':<22} {'cases':>7} {'clean':>7} {'accepted':>9} {'tracebacks':>11} {'hangs':>6} "
          f"{'slowest':>9}")
    failures: list[str] = []
    totals: Counter[str] = Counter()
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="kubegpu-fuzz-") as name:
        for kind in kinds:
            rng = random.Random(f"{args.seed}/{kind.name}")
            counts: Counter[str] = Counter()
            slowest = 0.0
            path = Path(name) / f"input{kind.suffix}"
            for _ in range(cases):
                data = mutate(rng, kind)
                path.write_bytes(data)
                t0 = time.perf_counter()
                signal.setitimer(signal.ITIMER_REAL, args.hang_s)
                try:
                    outcome = judge(kind, path)
                except Hang:
                    outcome = Outcome("hang")
                finally:
                    signal.setitimer(signal.ITIMER_REAL, 0)
                slowest = max(slowest, time.perf_counter() - t0)
                counts[outcome.verdict] += 1
                if outcome.verdict in ("traceback", "hang") and len(failures) < 20:
                    failures.append(f"{kind.name}: {outcome.verdict}: {outcome.detail} <- {data[:120]!r}")
            totals.update(counts)
            totals["cases"] += cases
            print(f"{kind.name:<22} {cases:>7} {counts['clean']:>7} {counts['accepted']:>9} "
                  f"{counts['traceback']:>11} {counts['hang']:>6} {slowest * 1000:>7.0f}ms")
    print(f"{'total':<22} {totals['cases']:>7} {totals['clean']:>7} {totals['accepted']:>9} "
          f"{totals['traceback']:>11} {totals['hang']:>6}   ({time.perf_counter() - started:.0f} s)")
    for line in failures:
        print("  " + line)
    ok = totals["traceback"] == 0 and totals["hang"] == 0
    print(f"{'PASS' if ok else 'FAIL'}: 0 tracebacks and 0 hangs required")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
