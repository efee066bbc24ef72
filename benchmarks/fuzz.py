"""Fuzz every file-taking entry point: hostile files in, and count what comes out.

    python benchmarks/fuzz.py [--quick] [--cases 10000] [--seed 1] [--jobs 2] [--kind scenario ...]
    python benchmarks/fuzz.py --replay sim-node:1234      # re-run one case in this process, with its traceback

For each input kind (tests/fuzz/harness.py: device-plugin and mig-parted configs, scenario, trace, partitioner
state, NodePools, Pods, instance types, the `sim:` node file, exporter counters, MPS slices, NFD labels, MPS limits)
it writes `--cases` mutated files (wrong types, huge and non-finite numbers, deep nesting, alias bombs, torn writes,
bad bytes) and runs the same loader the command runs. Printed per kind: clean errors (one line naming the file),
accepted, tracebacks (anything else, MemoryError and crashed workers included) and hangs, then the slowest case.
Exit status 1 when any traceback or hang was seen. `--quick` runs 300 per kind.

How it stays fast and still catches hangs: case `i` of a kind is a pure function of (seed, kind, i), so `--jobs`
long-lived worker processes each take chunks of cases and run them in-process (imports paid once, not per case).
A Python-level hang is interrupted inside the worker by SIGALRM after `--hang-s`; a hang the alarm cannot break (a
loop inside C code) is caught by the parent, which watches each worker's current case and SIGKILLs a worker stuck
for `--hang-s` + 5 s, counts a hang and restarts the rest of the chunk in a fresh worker. Each worker runs under an
address-space limit (`--memory-mib`), so a memory blow-up is a MemoryError (a traceback), not the OOM killer.
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing
import multiprocessing.connection
import os
import random
import resource
import signal
import sys
import tempfile
import time
import traceback
from collections import Counter, deque
from dataclasses import dataclass, field
from multiprocessing.sharedctypes import Synchronized
from pathlib import Path
from types import FrameType
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.fuzz.harness import InputKind, Outcome, input_kinds, judge, mutate

CHUNK = 250  # cases per work item: large enough to amortise messages, small enough to spread work evenly
KILL_GRACE_S = 5.0


class Hang(Exception):
    pass


def _alarm(signum: int, frame: FrameType | None) -> None:
    raise Hang()


def case_data(seed: int, kind: InputKind, index: int) -> bytes:
    """The hostile file of case `index`: a pure function of its coordinates, so any worker can make (or replay) it."""
    return mutate(random.Random(f"{seed}/{kind.name}/{index}"), kind)


def run_case(kind: InputKind, path: Path, data: bytes, hang_s: float) -> tuple[Outcome, float]:
    path.write_bytes(data)
    started = time.perf_counter()
    signal.setitimer(signal.ITIMER_REAL, hang_s)
    try:
        outcome = judge(kind, path)
    except Hang:
        outcome = Outcome("hang", f"over {hang_s:.0f} s (interrupted)")
    except MemoryError:  # judge catches Exception; this is the backstop if it escapes anyway
        outcome = Outcome("traceback", "MemoryError")
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
    return outcome, time.perf_counter() - started


# ---------------------------------------------------------------------------------------------- worker


def _worker(conn: multiprocessing.connection.Connection, current: Synchronized[int], seed: int, hang_s: float,
            memory_mib: int, inherited: list[multiprocessing.connection.Connection]) -> None:
    """Run chunks `(kind, start, stop)` sent by the parent; one message per case back; `current` = case running."""
    for other in inherited:  # the parent's ends of every pipe: held here, the parent's death would never read as EOF
        other.close()
    os.setpgrp()  # a SIGINT to the parent's terminal does not tear workers down mid-message
    if memory_mib > 0:
        limit = memory_mib * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    signal.signal(signal.SIGALRM, _alarm)
    kinds = {k.name: k for k in input_kinds()}
    with tempfile.TemporaryDirectory(prefix="kubegpu-fuzz-") as name:
        while True:
            item = conn.recv()
            if item is None:
                return
            kind_name, start, stop = item
            kind = kinds[kind_name]
            path = Path(name) / f"input{kind.suffix}"
            for index in range(start, stop):
                current.value = index
                data = case_data(seed, kind, index)
                outcome, elapsed = run_case(kind, path, data, hang_s)
                detail = f"{outcome.detail} <- {data[:120]!r}" if outcome.verdict in ("traceback", "hang") else ""
                conn.send((kind_name, index, outcome.verdict, elapsed, detail))
            current.value = -1
            conn.send(("done", kind_name, start, stop))


# ---------------------------------------------------------------------------------------------- parent


@dataclass
class Worker:
    process: multiprocessing.process.BaseProcess
    conn: multiprocessing.connection.Connection
    current: Synchronized[int]
    chunk: tuple[str, int, int] | None = None
    last_index: int = -1
    since: float = field(default_factory=time.monotonic)


@dataclass
class Tally:
    counts: Counter[str] = field(default_factory=Counter)
    slowest: float = 0.0
    slowest_case: int = -1
    done: int = 0


class Pool:
    def __init__(self, jobs: int, seed: int, hang_s: float, memory_mib: int) -> None:
        self.ctx = multiprocessing.get_context("fork")
        self.seed, self.hang_s, self.memory_mib = seed, hang_s, memory_mib
        self.workers: list[Worker] = []
        for _ in range(jobs):  # one by one: each new worker closes the parent ends of the ones before it
            self.workers.append(self._spawn())

    def _spawn(self) -> Worker:
        parent, child = self.ctx.Pipe()
        current = self.ctx.Value("q", -1, lock=False)
        inherited = [parent, *(w.conn for w in self.workers)]
        process = self.ctx.Process(target=_worker, daemon=True,
                                   args=(child, current, self.seed, self.hang_s, self.memory_mib, inherited))
        process.start()
        child.close()
        return Worker(process, parent, current)  # type: ignore[arg-type]

    def replace(self, worker: Worker) -> Worker:
        if worker.process.is_alive():
            os.kill(worker.process.pid or 0, signal.SIGKILL)
        worker.process.join()
        worker.conn.close()
        fresh = self._spawn()
        self.workers[self.workers.index(worker)] = fresh
        return fresh

    def close(self, *, kill: bool = False) -> None:
        """Stop the workers: politely after the last chunk, at once (`kill`) when the run was interrupted."""
        for worker in self.workers:
            with contextlib.suppress(OSError):
                worker.conn.send(None)
        for worker in self.workers:
            worker.process.join(timeout=0 if kill else 5)
            if worker.process.is_alive():
                worker.process.kill()
                worker.process.join()


def run(kinds: list[InputKind], cases: int, args: argparse.Namespace) -> tuple[dict[str, Tally], list[str]]:
    """Every (kind, case) through the pool; per-kind tallies and the first failures (with the case to replay)."""
    queue: deque[tuple[str, int, int]] = deque(
        (k.name, start, min(start + CHUNK, cases)) for k in kinds for start in range(0, cases, CHUNK))
    tallies = {k.name: Tally() for k in kinds}
    failures: list[str] = []
    pool = Pool(args.jobs, args.seed, args.hang_s, args.memory_mib)
    total, finished, started, last_progress = len(kinds) * cases, 0, time.monotonic(), time.monotonic()
    printed: set[str] = set()

    def record(kind_name: str, index: int, verdict: str, elapsed: float, detail: str) -> None:
        nonlocal finished
        tally = tallies[kind_name]
        tally.counts[verdict] += 1
        tally.done += 1
        if elapsed > tally.slowest:
            tally.slowest, tally.slowest_case = elapsed, index
        finished += 1
        if verdict in ("traceback", "hang") and len(failures) < 40:
            failures.append(f"{kind_name}:{index}: {verdict}: {detail}")

    def give(worker: Worker) -> None:
        worker.chunk = queue.popleft() if queue else None
        if worker.chunk is not None:
            worker.conn.send(worker.chunk)
            worker.last_index, worker.since = worker.chunk[1] - 1, time.monotonic()

    try:
        for worker in pool.workers:
            give(worker)
        while any(w.chunk is not None for w in pool.workers):
            busy = [w for w in pool.workers if w.chunk is not None]
            for conn in multiprocessing.connection.wait([w.conn for w in busy], timeout=0.5):
                worker = next(w for w in busy if w.conn is conn)
                try:
                    message = conn.recv()
                except (EOFError, OSError):
                    _crashed(pool, worker, queue, record)
                    continue
                if message[0] == "done":
                    give(worker)
                    continue
                record(*message)
                worker.last_index, worker.since = message[1], time.monotonic()
            for worker in list(pool.workers):
                if worker.chunk is None:
                    continue
                if not worker.process.is_alive() and not worker.conn.poll():
                    _crashed(pool, worker, queue, record)
                elif time.monotonic() - worker.since > args.hang_s + KILL_GRACE_S:
                    _stuck(pool, worker, queue, record)
            for kind in kinds:
                tally = tallies[kind.name]
                if tally.done == cases and kind.name not in printed:
                    printed.add(kind.name)
                    print(_row(kind.name, cases, tally), flush=True)
            if args.progress and time.monotonic() - last_progress >= args.progress:
                last_progress = time.monotonic()
                rate = finished / max(time.monotonic() - started, 1e-9)
                print(f"  ... {finished}/{total} cases, {rate:.0f} cases/s, "
                      f"{sum(t.counts['traceback'] for t in tallies.values())} tracebacks, "
                      f"{sum(t.counts['hang'] for t in tallies.values())} hangs", flush=True)
    except BaseException:
        pool.close(kill=True)
        raise
    pool.close()
    return tallies, failures


def _restart(pool: Pool, worker: Worker, queue: deque[tuple[str, int, int]], next_index: int) -> None:
    assert worker.chunk is not None
    kind_name, _, stop = worker.chunk
    fresh = pool.replace(worker)
    if next_index < stop:
        queue.appendleft((kind_name, next_index, stop))
    fresh.chunk = queue.popleft() if queue else None
    if fresh.chunk is not None:
        fresh.conn.send(fresh.chunk)
        fresh.last_index, fresh.since = fresh.chunk[1] - 1, time.monotonic()


def _stuck(pool: Pool, worker: Worker, queue: deque[tuple[str, int, int]], record: Any) -> None:
    """A case the in-worker alarm could not interrupt: kill the worker, count a hang, go on after that case."""
    assert worker.chunk is not None
    index = worker.current.value if worker.current.value >= 0 else worker.last_index + 1
    record(worker.chunk[0], index, "hang", time.monotonic() - worker.since,
           f"not interruptible, worker killed after {pool.hang_s + KILL_GRACE_S:.0f} s")
    _restart(pool, worker, queue, index + 1)


def _crashed(pool: Pool, worker: Worker, queue: deque[tuple[str, int, int]], record: Any) -> None:
    """A worker that died mid-case (segfault, OOM kill): that case is a traceback; the rest of its chunk goes on."""
    assert worker.chunk is not None
    index = worker.last_index + 1
    worker.process.join(timeout=1)
    code = worker.process.exitcode
    record(worker.chunk[0], index, "traceback", 0.0, f"worker died (exit {code}) on this case")
    _restart(pool, worker, queue, index + 1)


def _row(name: str, cases: int, tally: Tally) -> str:
    c = tally.counts
    return (f"{name:<22} {cases:>7} {c['clean']:>7} {c['accepted']:>9} {c['traceback']:>11} {c['hang']:>6} "
            f"{tally.slowest * 1000:>7.0f}ms  (--replay {name}:{tally.slowest_case})")


def replay(spec: str, seed: int, hang_s: float) -> int:
    """Run one case in this process and print its full traceback: the way to debug what the pool reported."""
    name, _, index = spec.partition(":")
    kind = {k.name: k for k in input_kinds()}[name]
    data = case_data(seed, kind, int(index))
    print(f"input ({len(data)} bytes): {data[:400]!r}")
    with tempfile.TemporaryDirectory(prefix="kubegpu-fuzz-") as directory:
        path = Path(directory) / f"input{kind.suffix}"
        path.write_bytes(data)
        signal.signal(signal.SIGALRM, _alarm)
        signal.setitimer(signal.ITIMER_REAL, hang_s)
        try:
            kind.load(path)
            print("accepted")
        except Exception:
            traceback.print_exc()
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--cases", type=int, default=10_000, help="files per input kind (default 10,000)")
    parser.add_argument("--quick", action="store_true", help="300 per kind")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1), help="worker processes")
    parser.add_argument("--hang-s", type=float, default=10.0)
    parser.add_argument("--memory-mib", type=int, default=2048, help="address-space limit per worker (0: none)")
    parser.add_argument("--progress", type=float, default=0.0, help="print a progress line every N seconds")
    parser.add_argument("--kind", action="append", help="only these kinds (repeatable)")
    parser.add_argument("--replay", metavar="KIND:INDEX", help="run one case here and print its traceback")
    args = parser.parse_args()
    if args.replay:
        return replay(args.replay, args.seed, args.hang_s)
    cases = 300 if args.quick else args.cases
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(143))  # workers are stopped on the way out
    kinds = [k for k in input_kinds() if not args.kind or k.name in args.kind]
    print(f"{'input kind':<22} {'cases':>7} {'clean':>7} {'accepted':>9} {'tracebacks':>11} {'hangs':>6} "
          f"{'slowest':>9}", flush=True)
    started, cpu0 = time.perf_counter(), time.process_time()
    tallies, failures = run(kinds, cases, args)
    totals: Counter[str] = Counter()
    for tally in tallies.values():
        totals.update(tally.counts)
    wall = time.perf_counter() - started
    done = sum(t.done for t in tallies.values())
    print(f"{'total':<22} {done:>7} {totals['clean']:>7} {totals['accepted']:>9} {totals['traceback']:>11} "
          f"{totals['hang']:>6}   ({wall:.0f} s wall, {done / max(wall, 1e-9):.0f} cases/s, {args.jobs} workers; "
          f"parent CPU {time.process_time() - cpu0:.0f} s; load {os.getloadavg()[0]:.1f})")
    for line in failures:
        print("  " + line)
    ok = totals["traceback"] == 0 and totals["hang"] == 0 and done == len(kinds) * cases
    print(f"{'PASS' if ok else 'FAIL'}: 0 tracebacks and 0 hangs required")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
