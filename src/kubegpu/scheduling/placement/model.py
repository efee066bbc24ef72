"""The state placement decides on: nodes with free CPU, memory and per-GPU free thousandths, and the requests.

Pure data, no I/O, so the very same code decides in the trace simulator and beside kube-scheduler in a real cluster
(the adapter there builds a `ClusterState` from nodes and their allocations). Arrays are numpy so a policy scores
every node of a 1,000-node cluster in one vectorised step.

Units: CPU in millicores, memory in MiB, a GPU's capacity in thousandths (1000 = one whole GPU). A sharing request
asks for `gpu_milli` < 1000 of one GPU; a whole or multi-GPU request asks for `gpu_count` GPUs of 1000 each.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from kubegpu.errors import ConfigError

MILLI = 1000
"""Thousandths in one whole GPU."""

IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]


@dataclass(frozen=True)
class Request:
    """What one pod asks of one node.

    `gpu_milli` is per GPU: below 1000 only with `gpu_count == 1` (a sharing task, on one GPU with that much free);
    1000 for whole GPUs; 0 when `gpu_count` is 0. `models` lists the GPU models the pod may run on (empty: any).
    """

    cpu_milli: int
    memory_mib: int
    gpu_count: int = 0
    gpu_milli: int = 0
    models: frozenset[str] = field(default_factory=frozenset)

    def __post_init__(self) -> None:
        if self.cpu_milli < 0 or self.memory_mib < 0 or self.gpu_count < 0:
            raise ConfigError(f"request {self}: cpu_milli, memory_mib and gpu_count must be >= 0")
        if self.gpu_count == 0 and self.gpu_milli != 0:
            raise ConfigError(f"request {self}: gpu_milli needs gpu_count >= 1")
        if self.gpu_count > 0 and not 0 < self.gpu_milli <= MILLI:
            raise ConfigError(f"request {self}: gpu_milli must be 1..{MILLI} thousandths per GPU")
        if self.gpu_count > 1 and self.gpu_milli != MILLI:
            raise ConfigError(f"request {self}: a multi-GPU request takes whole GPUs (gpu_milli {MILLI})")

    @property
    def shares(self) -> bool:
        """True for a sharing task: part of one GPU."""
        return self.gpu_count == 1 and self.gpu_milli < MILLI

    @property
    def gpu_total_milli(self) -> int:
        """The GPU thousandths this request allocates in all (what the allocation ratio counts)."""
        return self.gpu_count * self.gpu_milli


@dataclass(frozen=True)
class Placement:
    """Where a request goes: a node index into the state and the indexes of the GPUs it takes on that node."""

    node: int
    gpus: tuple[int, ...] = ()


class ClusterState:
    """Free resources of every node, mutated only by `apply` and `release`.

    `gpu_free[n, g]` is GPU g's free thousandths on node n; rows are padded with 0 past `gpu_count[n]`, and a padded
    slot never satisfies a request because every GPU request asks for at least one thousandth. `version[n]` grows on
    every change to node n, so a policy may cache per-node work and redo only what changed.
    """

    def __init__(self, names: Sequence[str], models: Sequence[str], cpu_milli: Sequence[int],
                 memory_mib: Sequence[int], gpu_count: Sequence[int]) -> None:
        if not len(names) == len(models) == len(cpu_milli) == len(memory_mib) == len(gpu_count):
            raise ConfigError("cluster state: names, models, cpu, memory and gpu counts differ in length")
        self.names = list(names)
        self.model_names: list[str] = sorted({m for m in models})
        index = {m: i for i, m in enumerate(self.model_names)}
        self.model: IntArray = np.array([index[m] for m in models], dtype=np.int64)
        self.cpu_capacity: IntArray = np.array(cpu_milli, dtype=np.int64)
        self.memory_capacity: IntArray = np.array(memory_mib, dtype=np.int64)
        self.gpu_count: IntArray = np.array(gpu_count, dtype=np.int64)
        width = int(self.gpu_count.max()) if len(names) else 0
        self.gpu_capacity: IntArray = np.where(np.arange(max(width, 1))[None, :] < self.gpu_count[:, None], MILLI, 0)
        self.cpu_free: IntArray = self.cpu_capacity.copy()
        self.memory_free: IntArray = self.memory_capacity.copy()
        self.gpu_free: IntArray = self.gpu_capacity.copy()
        self.version: IntArray = np.zeros(len(names), dtype=np.int64)
        self.name_rank: IntArray = np.argsort(np.argsort(np.array(self.names, dtype=object), kind="stable"))
        """Each node's position in name order: the tie-break kube-scheduler's patched selectHost uses."""

    def __len__(self) -> int:
        return len(self.names)

    @property
    def total_gpu_milli(self) -> int:
        """The cluster's GPU capacity in thousandths."""
        return int(self.gpu_count.sum()) * MILLI

    @property
    def allocated_gpu_milli(self) -> int:
        """GPU thousandths allocated now (sharing tasks counted by their thousandths)."""
        return int(self.gpu_capacity.sum() - self.gpu_free.sum())

    def allowed_models(self, request: Request) -> BoolArray:
        """Per model index: may the request run on it (all True when it names none)."""
        if not request.models:
            return np.ones(len(self.model_names), dtype=bool)
        return np.array([m in request.models for m in self.model_names], dtype=bool)

    def feasible(self, request: Request) -> BoolArray:
        """Per node: does the request fit there now (CPU, memory, the model, enough GPUs with enough free)."""
        ok = (self.cpu_free >= request.cpu_milli) & (self.memory_free >= request.memory_mib)
        if request.gpu_count:
            ok &= self.allowed_models(request)[self.model]
            ok &= (self.gpu_free >= request.gpu_milli).sum(axis=1) >= request.gpu_count
        return ok

    def fits(self, request: Request, placement: Placement) -> bool:
        """Whether the placement is valid for the request on the state as it is now."""
        n = placement.node
        if not 0 <= n < len(self) or len(placement.gpus) != request.gpu_count:
            return False
        if len(set(placement.gpus)) != len(placement.gpus):
            return False
        if not bool(self.feasible(request)[n]):
            return False
        return all(0 <= g < self.gpu_count[n] and self.gpu_free[n, g] >= request.gpu_milli for g in placement.gpus)

    def apply(self, request: Request, placement: Placement) -> None:
        """Take the request's resources at the placement; ConfigError when it does not fit there."""
        if not self.fits(request, placement):
            raise ConfigError(f"placement {placement} does not fit request {request} on node "
                              f"{self.names[placement.node] if 0 <= placement.node < len(self) else '?'}")
        n = placement.node
        self.cpu_free[n] -= request.cpu_milli
        self.memory_free[n] -= request.memory_mib
        for g in placement.gpus:
            self.gpu_free[n, g] -= request.gpu_milli
        self.version[n] += 1

    def release(self, request: Request, placement: Placement) -> None:
        """Give back what `apply` took for this request at this placement (a pod that finished or moved)."""
        n = placement.node
        cpu = self.cpu_free[n] + request.cpu_milli
        memory = self.memory_free[n] + request.memory_mib
        gpus = [self.gpu_free[n, g] + request.gpu_milli for g in placement.gpus]
        if cpu > self.cpu_capacity[n] or memory > self.memory_capacity[n] or any(
                v > self.gpu_capacity[n, g] for v, g in zip(gpus, placement.gpus, strict=True)):
            raise ConfigError(f"release of {request} at {placement}: more than node {self.names[n]} holds")
        self.cpu_free[n] = cpu
        self.memory_free[n] = memory
        for v, g in zip(gpus, placement.gpus, strict=True):
            self.gpu_free[n, g] = v
        self.version[n] += 1


def best_fit_gpus(state: ClusterState, node: int, request: Request) -> tuple[int, ...]:
    """The GPUs a request takes on a node by best fit: those with the least free that still suffice, lowest index
    first on ties (whole GPUs therefore come from fully free ones). Empty for a CPU-only request."""
    if request.gpu_count == 0:
        return ()
    free = state.gpu_free[node]
    candidates = [g for g in np.argsort(free, kind="stable").tolist() if free[g] >= request.gpu_milli]
    return tuple(sorted(candidates[: request.gpu_count]))


def state_from_nodes(rows: Iterable[tuple[str, str, int, int, int]]) -> ClusterState:
    """A state from (name, model, cpu_milli, memory_mib, gpu_count) rows, everything free."""
    names, models, cpus, memories, gpus = [], [], [], [], []
    for name, model, cpu, memory, count in rows:
        names.append(name)
        models.append(model)
        cpus.append(cpu)
        memories.append(memory)
        gpus.append(count)
    return ClusterState(names, models, cpus, memories, gpus)
