"""Alibaba's GPU trace (cluster-trace-gpu-v2023, "openb") as published: the node list and a pod list, read into the
placement core's types. Bad rows end as one line naming the file, the line and the column.

Files may be plain CSV or gzip-compressed (a name ending in .gz), so a small sample can ship inside the repository.
"""

from __future__ import annotations

import csv
import gzip
import io
from dataclasses import dataclass
from pathlib import Path

from kubegpu.errors import ConfigError
from kubegpu.scheduling.placement import MILLI, ClusterState, Request, state_from_nodes

NODE_COLUMNS = ("sn", "cpu_milli", "memory_mib", "gpu", "model")
POD_COLUMNS = ("name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli")
"""The pod list's columns the replay needs; `gpu_spec` (allowed models) is read when present (the multigpu variants
omit it), the others (qos, phase, times) are accepted and ignored."""


@dataclass(frozen=True)
class Task:
    """One pod of the trace: its name (the protocol sorts by it) and what it asks."""

    name: str
    request: Request


def _rows(path: Path, required: tuple[str, ...]) -> list[tuple[int, dict[str, str]]]:
    """(line number, row) pairs; ConfigError when the file cannot be read or lacks a column."""
    try:
        raw = path.read_bytes()
        text = gzip.decompress(raw).decode() if path.name.endswith(".gz") else raw.decode()
    except (OSError, EOFError, UnicodeDecodeError, gzip.BadGzipFile) as exc:
        raise ConfigError(f"{path}: cannot read: {exc}") from None
    reader = csv.DictReader(io.StringIO(text))
    missing = [c for c in required if c not in (reader.fieldnames or [])]
    if missing:
        raise ConfigError(f"{path}:1: missing column(s) {', '.join(missing)} (expected {','.join(required)})")
    rows = []
    for row in reader:
        if None in row or any(v is None for v in row.values()):
            raise ConfigError(f"{path}:{reader.line_num}: has {len(reader.fieldnames or [])} columns in the header "
                              "but a different number in this row")
        rows.append((reader.line_num, row))
    if not rows:
        raise ConfigError(f"{path}: no rows")
    return rows


def _int(path: Path, line: int, row: dict[str, str], column: str, low: int, high: int | None = None) -> int:
    text = row[column].strip()
    try:
        value = int(text)
    except ValueError:
        raise ConfigError(f"{path}:{line}: column {column}: {text!r} is not an integer") from None
    if value < low or (high is not None and value > high):
        bound = f">= {low}" if high is None else f"{low}..{high}"
        raise ConfigError(f"{path}:{line}: column {column}: {value} is out of range ({bound})")
    return value


def read_nodes(path: Path) -> ClusterState:
    """The node list (`sn,cpu_milli,memory_mib,gpu,model`) as a cluster state with everything free."""
    rows = []
    seen: set[str] = set()
    for line, row in _rows(path, NODE_COLUMNS):
        name = row["sn"].strip()
        if not name or name in seen:
            raise ConfigError(f"{path}:{line}: column sn: {'empty' if not name else f'{name!r} repeats'}")
        seen.add(name)
        gpus = _int(path, line, row, "gpu", 0, 64)
        model = row["model"].strip()
        if gpus and not model:
            raise ConfigError(f"{path}:{line}: column model: empty on a node with {gpus} GPU(s)")
        rows.append((name, model, _int(path, line, row, "cpu_milli", 0), _int(path, line, row, "memory_mib", 0), gpus))
    return state_from_nodes(rows)


def read_pods(path: Path) -> list[Task]:
    """The pod list as tasks, in file order. `gpu_milli` counts per GPU: below 1000 only for one GPU (a share)."""
    tasks = []
    for line, row in _rows(path, POD_COLUMNS):
        name = row["name"].strip()
        if not name:
            raise ConfigError(f"{path}:{line}: column name: empty")
        count = _int(path, line, row, "num_gpu", 0, 64)
        milli = _int(path, line, row, "gpu_milli", 0, MILLI)
        if count == 0 and milli:
            raise ConfigError(f"{path}:{line}: column gpu_milli: {milli} on a task with num_gpu 0")
        if count == 1 and milli == 0:
            raise ConfigError(f"{path}:{line}: column gpu_milli: 0 on a task with num_gpu 1")
        if count > 1 and milli != MILLI:
            raise ConfigError(f"{path}:{line}: column gpu_milli: {milli} on a task with num_gpu {count} "
                              f"(multi-GPU tasks take whole GPUs: {MILLI})")
        models = frozenset(m.strip() for m in (row.get("gpu_spec") or "").split("|") if m.strip())
        request = Request(_int(path, line, row, "cpu_milli", 0), _int(path, line, row, "memory_mib", 0),
                          count, milli if count else 0, models)
        tasks.append(Task(name, request))
    return tasks
