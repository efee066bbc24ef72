"""GPU fragmentation against a target workload, and the policies that descend it: `fgd` and `kubegpu`.

The measure (Weng et al., "Beware of Fragmentation", USENIX ATC '23): for a node and one task shape of the target
workload, the fragment is the node's free GPU thousandths that this task cannot use — all of them when the task
cannot run there at all (wrong GPU model, too little CPU, too few GPUs with enough free; and always for CPU-only
tasks, which use no GPU), else the GPUs whose leftover is smaller than the task's share. A node's fragmentation is
that fragment averaged over the workload's shapes weighted by their popularity. Placing a task on the node (and GPU)
where fragmentation grows least is one greedy step down that measure ("fragmentation gradient descent").

Both policies cache each shape's per-node scores and recompute only the nodes whose `ClusterState.version` moved,
so a decision costs one node's worth of work once the cluster is warm.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from kubegpu.scheduling.placement.model import MILLI, ClusterState, IntArray, Placement, Request
from kubegpu.scheduling.placement.registry import PolicyContext, register_policy

FloatArray = npt.NDArray[np.float64]
Shape = tuple[int, int, int, frozenset[str]]
"""What the measure sees of a request: (cpu_milli, gpu_count, gpu_milli, models)."""

POPULARITY_COVER = 0.95
"""FGD's target workload keeps the most popular shapes that together make up this share of the tasks."""
POPULARITY_STEP = 1
"""... adding shapes one at a time, most popular first (the artifact's default step)."""


def shape_of(request: Request) -> Shape:
    """The request as the fragmentation measure sees it (memory plays no part in it)."""
    return (request.cpu_milli, request.gpu_count, request.gpu_milli, request.models)


@dataclass
class Workload:
    """Task shapes and their popularity (summing to 1), as arrays resolved against one cluster's model list."""

    cpu: IntArray
    count: IntArray
    milli: IntArray
    access: npt.NDArray[np.bool_]  # shape x model
    weight: FloatArray

    @classmethod
    def from_counts(cls, counts: dict[Shape, float], model_names: Sequence[str]) -> Workload:
        shapes = list(counts)
        total = sum(counts.values()) or 1.0
        return cls(
            cpu=np.array([s[0] for s in shapes], dtype=np.int64),
            count=np.array([s[1] for s in shapes], dtype=np.int64),
            milli=np.array([s[2] for s in shapes], dtype=np.int64),
            access=np.array([[not s[3] or m in s[3] for m in model_names] for s in shapes], dtype=bool).reshape(
                len(shapes), len(model_names)),
            weight=np.array([counts[s] / total for s in shapes], dtype=np.float64),
        )


def typical_shapes(requests: Sequence[Request], cover: float = POPULARITY_COVER,
                   step: int = POPULARITY_STEP) -> dict[Shape, float]:
    """FGD's target workload: shapes by popularity, most popular first, taken `step` at a time until they cover
    `cover` of the tasks; the counts of those kept."""
    counts = Counter(shape_of(r) for r in requests)
    ranked = counts.most_common()
    kept: dict[Shape, float] = {}
    covered, i = 0, 0
    while covered < cover * len(requests) and i < len(ranked):
        for shape, n in ranked[i: i + step]:
            kept[shape] = float(n)
            covered += n
        i += step
    return kept


def fragmentation(workload: Workload, cpu: IntArray, gpu: IntArray, model: IntArray) -> FloatArray:
    """Per row (a node's free CPU, per-GPU free thousandths and model index): its expected fragment in
    thousandths over the workload's shapes."""
    total = gpu.sum(axis=1).astype(np.float64)
    is_gpu = workload.milli > 0
    thresholds, which = np.unique(workload.milli[is_gpu], return_inverse=True)
    enough = gpu[:, :, None] >= thresholds[None, None, :]  # row x gpu x threshold
    count_ok = enough.sum(axis=1)[:, which] >= workload.count[is_gpu][None, :]
    small = total[:, None] - (gpu[:, :, None] * enough).sum(axis=1)[:, which]
    usable = (workload.access[is_gpu].T[model] & (cpu[:, None] >= workload.cpu[is_gpu][None, :]) & count_ok)
    fragment = np.where(usable, small, total[:, None])
    return fragment @ workload.weight[is_gpu] + total * workload.weight[~is_gpu].sum()


def _after(state: ClusterState, nodes: IntArray, request: Request) -> tuple[IntArray, IntArray, IntArray]:
    """Candidate rows after placing the request: one per node (whole GPUs or none) or one per node and GPU (a share;
    rows of GPUs it does not fit are returned anyway and must be masked). Returns (cpu, gpu, row's GPU index)."""
    cpu = state.cpu_free[nodes] - request.cpu_milli
    gpu = state.gpu_free[nodes].copy()
    width = gpu.shape[1]
    if request.shares:
        rows = np.repeat(gpu[:, None, :], width, axis=1)  # node x choice x gpu
        rows[:, np.arange(width), np.arange(width)] -= request.gpu_milli
        return np.repeat(cpu, width), rows.reshape(-1, width), np.tile(np.arange(width), len(nodes))
    if request.gpu_count:
        full = gpu == MILLI
        take = full & (np.cumsum(full, axis=1) <= request.gpu_count)
        gpu = np.where(take, 0, gpu)
    return cpu, gpu, np.zeros(len(nodes), dtype=np.int64)


class _GradientPolicy:
    """Shared machinery: per shape, a cached per-node (score, GPU) refreshed where nodes changed."""

    def __init__(self, context: PolicyContext) -> None:
        self._rng = np.random.default_rng(context.seed)
        self._context = context
        self._workload: Workload | None = None
        self._models: list[str] = []
        self._base: FloatArray = np.zeros(0)
        self._base_version: IntArray = np.zeros(0, dtype=np.int64)
        self._cache: dict[Shape, tuple[FloatArray, IntArray, IntArray]] = {}

    def _target(self, state: ClusterState) -> Workload:
        raise NotImplementedError

    def _node_score(self, delta: FloatArray) -> FloatArray:
        """Higher is better; from the growth of fragmentation each candidate causes."""
        return -delta

    def _select(self, score: FloatArray, feasible: npt.NDArray[np.bool_], state: ClusterState) -> int:
        raise NotImplementedError

    def _reset(self, state: ClusterState) -> None:
        self._models = list(state.model_names)
        self._workload = self._target(state)
        self._base = fragmentation(self._workload, state.cpu_free, state.gpu_free, state.model)
        self._base_version = state.version.copy()
        self._cache.clear()

    def _scores(self, request: Request, state: ClusterState) -> tuple[FloatArray, IntArray]:
        if self._workload is None or self._models != state.model_names or len(self._base) != len(state):
            self._reset(state)
        workload = self._workload
        assert workload is not None
        moved = np.flatnonzero(state.version != self._base_version)
        if len(moved):
            self._base[moved] = fragmentation(workload, state.cpu_free[moved], state.gpu_free[moved],
                                              state.model[moved])
            self._base_version[moved] = state.version[moved]
        key = shape_of(request)
        cached = self._cache.get(key)
        if cached is None:
            cached = (np.zeros(len(state)), np.zeros(len(state), dtype=np.int64),
                      np.full(len(state), -1, dtype=np.int64))
            self._cache[key] = cached
        score, gpu_choice, version = cached
        stale = np.flatnonzero(version != state.version)
        if len(stale):
            cpu, gpu, index = _after(state, stale, request)
            rows = fragmentation(workload, cpu, gpu, np.repeat(state.model[stale], len(cpu) // len(stale)))
            delta = rows - np.repeat(self._base[stale], len(cpu) // len(stale))
            value = self._node_score(delta)
            if request.shares:
                width = state.gpu_free.shape[1]
                value = value.reshape(len(stale), width)
                value = np.where(state.gpu_free[stale] >= request.gpu_milli, value, -np.inf)
                best = value.argmax(axis=1)
                score[stale] = value[np.arange(len(stale)), best]
                gpu_choice[stale] = best
            else:
                score[stale] = value
                gpu_choice[stale] = index
            version[stale] = state.version[stale]
        return score, gpu_choice

    def choose(self, request: Request, state: ClusterState) -> Placement | None:
        feasible = state.feasible(request)
        if not feasible.any():
            return None
        score, gpu_choice = self._scores(request, state)
        node = self._select(score, feasible, state)
        if request.shares:
            return Placement(node, (int(gpu_choice[node]),))
        free = state.gpu_free[node]
        return Placement(node, tuple(int(g) for g in np.flatnonzero(free == MILLI)[: request.gpu_count]))


class FgdPolicy(_GradientPolicy):
    """FGD as the paper runs it: the target workload is the popular shapes of the whole task list (fixed), a
    node's score is sigmoid(fragmentation decrease / 1000) scaled to kube-scheduler's 0..100 integers, the GPU of a
    sharing task the first with the best score, and ties between nodes go to the smallest node name (the artifact's
    patched selectHost)."""

    def _target(self, state: ClusterState) -> Workload:
        return Workload.from_counts(typical_shapes(self._context.workload), state.model_names)

    def _node_score(self, delta: FloatArray) -> FloatArray:
        return np.floor(100.0 / (1.0 + np.exp(delta / 1000.0)))

    def _select(self, score: FloatArray, feasible: npt.NDArray[np.bool_], state: ClusterState) -> int:
        masked = np.where(feasible, score, -np.inf)
        best = np.flatnonzero(masked == masked.max())
        return int(best[np.argmin(state.name_rank[best])])


class KubegpuPolicy(_GradientPolicy):
    """kubegpu's placement: fragmentation descent with the exact (unrounded) gradient and a deterministic
    tie-break toward the node with the least free GPU (packing among equals)."""

    def _target(self, state: ClusterState) -> Workload:
        return Workload.from_counts(typical_shapes(self._context.workload), state.model_names)

    def _select(self, score: FloatArray, feasible: npt.NDArray[np.bool_], state: ClusterState) -> int:
        free = state.gpu_free.sum(axis=1)
        masked = np.where(feasible, score, -np.inf)
        best = np.flatnonzero(masked >= masked.max() - 1e-9)
        return int(best[np.argmin(free[best])])


register_policy("fgd", FgdPolicy)
register_policy("kubegpu", KubegpuPolicy)
