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

from collections import Counter, deque
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from kubegpu.scheduling.placement.leftovers import leftover_prices, prices_of
from kubegpu.scheduling.placement.model import MILLI, ClusterState, IntArray, Placement, Request
from kubegpu.scheduling.placement.registry import PolicyContext, register_policy

FloatArray = npt.NDArray[np.float64]
Shape = tuple[int, int, int, int, frozenset[str]]
"""A task shape: (cpu_milli, memory_mib, gpu_count, gpu_milli, models)."""

POPULARITY_COVER = 0.95
"""FGD's target workload keeps the most popular shapes that together make up this share of the tasks."""
POPULARITY_STEP = 1
"""... adding shapes one at a time, most popular first (the artifact's default step)."""


def shape_of(request: Request, memory: bool = True) -> Shape:
    """The request as a workload shape; FGD's measure ignores memory (`memory=False` zeroes it)."""
    return (request.cpu_milli, request.memory_mib if memory else 0, request.gpu_count, request.gpu_milli,
            request.models)


@dataclass
class Workload:
    """Task shapes and their popularity (summing to 1), as arrays resolved against one cluster's model list."""

    cpu: IntArray
    memory: IntArray
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
            memory=np.array([s[1] for s in shapes], dtype=np.int64),
            count=np.array([s[2] for s in shapes], dtype=np.int64),
            milli=np.array([s[3] for s in shapes], dtype=np.int64),
            access=np.array([[not s[4] or m in s[4] for m in model_names] for s in shapes], dtype=bool).reshape(
                len(shapes), len(model_names)),
            weight=np.array([counts[s] / total for s in shapes], dtype=np.float64),
        )


def typical_shapes(requests: Sequence[Request], cover: float = POPULARITY_COVER, step: int = POPULARITY_STEP,
                   memory: bool = False) -> dict[Shape, float]:
    """FGD's target workload: shapes by popularity, most popular first, taken `step` at a time until they cover
    `cover` of the tasks; the counts of those kept."""
    counts = Counter(shape_of(r, memory) for r in requests)
    ranked = counts.most_common()
    kept: dict[Shape, float] = {}
    covered, i = 0, 0
    while covered < cover * len(requests) and i < len(ranked):
        for shape, n in ranked[i: i + step]:
            kept[shape] = float(n)
            covered += n
        i += step
    return kept


def fragmentation(workload: Workload, cpu: IntArray, memory: IntArray, gpu: IntArray, model: IntArray) -> FloatArray:
    """FGD's measure. Per row (a node's free CPU, memory, per-GPU free thousandths and model index): its expected
    fragment in thousandths over the workload's shapes (memory plays no part)."""
    del memory
    total = gpu.sum(axis=1).astype(np.float64)
    is_gpu = workload.milli > 0
    thresholds, which = np.unique(workload.milli[is_gpu], return_inverse=True)
    enough = gpu[:, :, None] >= thresholds[None, None, :]  # row x gpu x threshold
    count_ok = enough.sum(axis=1)[:, which] >= workload.count[is_gpu][None, :]
    small = total[:, None] - (gpu[:, :, None] * enough).sum(axis=1)[:, which]
    usable = (workload.access[is_gpu].T[model] & (cpu[:, None] >= workload.cpu[is_gpu][None, :]) & count_ok)
    fragment = np.where(usable, small, total[:, None])
    return fragment @ workload.weight[is_gpu] + total * workload.weight[~is_gpu].sum()


def capacity_fragmentation(workload: Workload, cpu: IntArray, memory: IntArray, gpu: IntArray,
                           model: IntArray) -> FloatArray:
    """kubegpu's measure. For each GPU shape, how many copies of it the node could still host — limited by its
    GPUs (whole leftovers per GPU), its CPU and its memory — and the free GPU thousandths those copies cannot
    take are the fragment. Unlike FGD's one-copy test this sees GPUs that CPU or memory will strand after a few
    more tasks, and the slack a share leaves when a GPU fills with it. CPU-only shapes carry no weight here: they
    matter through the CPU they take from the GPU shapes."""
    total = gpu.sum(axis=1).astype(np.float64)
    is_gpu = workload.milli > 0
    weight = workload.weight[is_gpu]
    weight = weight / (weight.sum() or 1.0)
    thresholds, which = np.unique(workload.milli[is_gpu], return_inverse=True)
    per_gpu = (gpu[:, :, None] // thresholds[None, None, :]).sum(axis=1)[:, which]  # row x shape
    count = workload.count[is_gpu][None, :]
    copies = per_gpu // count
    big = np.iinfo(np.int64).max // 4
    shape_cpu = workload.cpu[is_gpu][None, :]
    shape_memory = workload.memory[is_gpu][None, :]
    copies = np.minimum(copies, np.where(shape_cpu > 0, cpu[:, None] // np.maximum(shape_cpu, 1), big))
    copies = np.minimum(copies, np.where(shape_memory > 0, memory[:, None] // np.maximum(shape_memory, 1), big))
    copies = np.where(workload.access[is_gpu].T[model], np.maximum(copies, 0), 0)
    usable = np.minimum(copies * count * workload.milli[is_gpu][None, :], total[:, None])
    return (total[:, None] - usable) @ weight


def _after(state: ClusterState, nodes: IntArray,
           request: Request) -> tuple[IntArray, IntArray, IntArray, IntArray]:
    """Each node's free resources after placing a whole-GPU or CPU-only request there (whole GPUs come from fully
    free ones). Returns (cpu, memory, gpu, first GPU index)."""
    cpu = state.cpu_free[nodes] - request.cpu_milli
    memory = state.memory_free[nodes] - request.memory_mib
    gpu = state.gpu_free[nodes].copy()
    if request.gpu_count:
        full = gpu == MILLI
        take = full & (np.cumsum(full, axis=1) <= request.gpu_count)
        gpu = np.where(take, 0, gpu)
    return cpu, memory, gpu, np.zeros(len(nodes), dtype=np.int64)


class _GradientPolicy:
    """Shared machinery: per shape, a cached per-node (score, GPU) refreshed where nodes changed."""

    def __init__(self, context: PolicyContext) -> None:
        self._rng = np.random.default_rng(context.seed)
        self._context = context
        self._workload: Workload | None = None
        self._models: list[str] = []
        self._base: FloatArray = np.zeros(0)
        self._base_version: IntArray = np.zeros(0, dtype=np.int64)
        self._cache: dict[Request, tuple[FloatArray, IntArray, IntArray]] = {}

    def _measure(self, workload: Workload, cpu: IntArray, memory: IntArray, gpu: IntArray, model: IntArray,
                 nodes: IntArray) -> FloatArray:
        """The measure of candidate rows (free resources after a placement) on the given nodes."""
        del nodes
        return fragmentation(workload, cpu, memory, gpu, model)

    def _target(self, state: ClusterState) -> Workload:
        raise NotImplementedError

    def _node_score(self, delta: FloatArray, request: Request) -> FloatArray:
        """Higher is better; from the growth of fragmentation each candidate causes when it takes `request`."""
        del request
        return -delta

    def _share_score(self, delta: FloatArray, request: Request, free: IntArray) -> FloatArray:
        """Higher is better; a share's candidates, from the growth of fragmentation and the GPU's free thousandths
        before the share takes some."""
        del free
        return self._node_score(delta, request)

    def _select(self, score: FloatArray, feasible: npt.NDArray[np.bool_], state: ClusterState) -> int:
        raise NotImplementedError

    def _reset(self, state: ClusterState) -> None:
        self._models = list(state.model_names)
        self._workload = self._target(state)
        self._base = self._measure(self._workload, state.cpu_free, state.memory_free, state.gpu_free, state.model,
                                   np.arange(len(state)))
        self._base_version = state.version.copy()
        self._cache.clear()

    def _scores(self, request: Request, state: ClusterState) -> tuple[FloatArray, IntArray]:
        if self._workload is None or self._models != state.model_names or len(self._base) != len(state):
            self._reset(state)
        workload = self._workload
        assert workload is not None
        moved = np.flatnonzero(state.version != self._base_version)
        if len(moved):
            self._base[moved] = self._measure(workload, state.cpu_free[moved], state.memory_free[moved],
                                              state.gpu_free[moved], state.model[moved], moved)
            self._base_version[moved] = state.version[moved]
        key = request
        cached = self._cache.get(key)
        if cached is None:
            cached = (np.zeros(len(state)), np.zeros(len(state), dtype=np.int64),
                      np.full(len(state), -1, dtype=np.int64))
            self._cache[key] = cached
        score, gpu_choice, version = cached
        stale = np.flatnonzero(version != state.version)
        if len(stale) and request.shares:
            score[stale], gpu_choice[stale] = self._share_scores(request, state, stale, workload)
        elif len(stale):
            cpu, memory, gpu, index = _after(state, stale, request)
            rows = self._measure(workload, cpu, memory, gpu, state.model[stale], stale)
            score[stale] = self._node_score(rows - self._base[stale], request)
            gpu_choice[stale] = index
        version[stale] = state.version[stale]
        return score, gpu_choice

    def _share_scores(self, request: Request, state: ClusterState, nodes: IntArray,
                      workload: Workload) -> tuple[FloatArray, IntArray]:
        """Per node, the best GPU for a share and its score: each distinct leftover of a node is scored once (a
        fresh node's eight GPUs are one candidate), GPUs too full for it are skipped, and ties go to the lowest
        GPU index."""
        free = state.gpu_free[nodes]
        row, column = np.nonzero(free >= request.gpu_milli)
        values = free[row, column]
        _, first, inverse = np.unique(row * (2 * MILLI + 1) + values, return_index=True, return_inverse=True)
        pick_row, pick_gpu = row[first], column[first]
        gpu = free[pick_row].copy()
        gpu[np.arange(len(first)), pick_gpu] -= request.gpu_milli
        picked = nodes[pick_row]
        measured = self._measure(workload, state.cpu_free[picked] - request.cpu_milli,
                                 state.memory_free[picked] - request.memory_mib, gpu, state.model[picked], picked)
        value = self._share_score(measured - self._base[picked], request, values[first])
        table = np.full(free.shape, -np.inf)
        table[row, column] = value[inverse.reshape(-1)]
        best = table.argmax(axis=1)
        return table[np.arange(len(nodes)), best], best

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


def _fgd_integer(delta: FloatArray) -> FloatArray:
    """FGD's node score: sigmoid of the fragmentation decrease in whole GPUs, as kube-scheduler's 0..100 integers."""
    return np.floor(100.0 / (1.0 + np.exp(delta / 1000.0)))


class FgdPolicy(_GradientPolicy):
    """FGD as the paper runs it: the target workload is the popular shapes of the whole task list (fixed), a
    node's score is sigmoid(fragmentation decrease / 1000) scaled to kube-scheduler's 0..100 integers, the GPU of a
    sharing task the first with the best score, and ties between nodes go to the smallest node name (the artifact's
    patched selectHost)."""

    def _target(self, state: ClusterState) -> Workload:
        return Workload.from_counts(typical_shapes(self._context.workload), state.model_names)

    def _node_score(self, delta: FloatArray, request: Request) -> FloatArray:
        del request
        return _fgd_integer(delta)

    def _select(self, score: FloatArray, feasible: npt.NDArray[np.bool_], state: ClusterState) -> int:
        masked = np.where(feasible, score, -np.inf)
        best = np.flatnonzero(masked == masked.max())
        return int(best[np.argmin(state.name_rank[best])])


KUBEGPU_SHAPES = 64
"""kubegpu's target workload keeps at most this many shapes (the most popular), bounding a decision's cost."""
SCARCITY_WEIGHT = 3.0
"""Thousandths of fragment charged per GPU thousandth taken on a model, per unit of that model's excess demand."""
FGD_STEP = 600.0
"""Thousandths of kubegpu's measure one step of FGD's integer score is worth (see KubegpuPolicy._node_score)."""
FGD_ONLY = 1e7
"""... for multi-GPU tasks: more than kubegpu's measure can move (it stays below a million thousandths)."""
FGD_GRADIENT = 100.0
"""For shares: thousandths of kubegpu's measure one thousandth of FGD's gradient (with the model charge) is worth."""
LOSS_STEP = 1e10
"""For shares, one rank of the leftover loss: more than FGD's gradient (a few thousand thousandths, x `FGD_GRADIENT`)
and kubegpu's measure together can move."""
CAPACITY_WEIGHT = 2.0
"""How much the capacity fragment counts beside FGD's one-copy fragment (weight 1)."""
RELEARN_EVERY = 256
"""With no workload given, the popularity model is rebuilt from the requests seen after every this many..."""
REMEMBERED = 20_000
"""... from the most recent this many (a long-running scheduler forgets old shapes and stays bounded)."""


def node_scarcity(requests: Sequence[Request], state: ClusterState, sizes: bool = True) -> FloatArray:
    """Per node: how much more GPU demand per GPU its kind of node (model, CPU, memory, GPU count) faces than the
    least-demanded kind. Each request's demand is spread over the capacity of the kinds it could run on when empty
    (its allowed models, and nodes big enough for its CPU, memory and GPU count), so a task pinned to a small model,
    or too big for most nodes, presses hard on the few that can take it, and a small unpinned one presses evenly.
    With `sizes=False` a kind is the GPU model alone: only model pins make scarcity."""
    unbounded = [np.iinfo(np.int64).max] * len(state)
    keys = list(zip(state.model.tolist(), *((column.tolist() if sizes else unbounded) for column in (
        state.cpu_capacity, state.memory_capacity, state.gpu_count)), strict=True))
    kinds = sorted(set(keys))
    kind_of = np.array([kinds.index(k) for k in keys], dtype=np.int64)
    model = np.array([k[0] for k in kinds])
    cpu, memory, gpus = (np.array([k[i] for k in kinds], dtype=np.int64) for i in (1, 2, 3))
    capacity = np.bincount(kind_of, weights=state.gpu_count.astype(np.float64), minlength=len(kinds))
    demand = np.zeros(len(kinds))
    overall = 0.0
    total = capacity.sum() or 1.0
    for request, n in Counter(r for r in requests if r.gpu_count).items():
        reach_mask = (state.allowed_models(request)[model] & (cpu >= request.cpu_milli)
                      & (memory >= request.memory_mib) & (gpus >= request.gpu_count) & (capacity > 0))
        reach = capacity[reach_mask].sum()
        if reach:
            demand[reach_mask] += n * request.gpu_total_milli / reach
            overall += n * request.gpu_total_milli / total
    if not overall:
        return np.zeros(len(state))
    density = demand / overall
    return (density - density[capacity > 0].min())[kind_of]


class KubegpuPolicy(_GradientPolicy):
    """kubegpu's placement: descend a fragmentation measure that goes beyond FGD's.

    - The measure adds to FGD's one-copy fragment the capacity fragment (`capacity_fragmentation`): GPUs that the
      node's CPU or memory will strand after a few more tasks, and the slack a share leaves on a GPU it fills.
    - Taking GPUs of a kind of node in short supply costs in proportion to its excess demand (`node_scarcity`), so
      tasks that may run anywhere leave the scarce models to the tasks pinned to them, and small tasks leave the
      biggest nodes to the tasks only they can hold.
    - The popularity model is the expected workload when given, else learned from the requests seen so far and
      rebuilt every `RELEARN_EVERY` requests.
    - A whole single GPU or a CPU-only task: candidates rank by FGD's integer score, each step worth `FGD_STEP`
      thousandths of kubegpu's measure. A multi-GPU task: by FGD's integer score alone, with the scarcity of GPU
      models charged to it, kubegpu's measure only breaking its ties (see `_node_score`). A share: first by the
      least leftover loss (`leftovers.py`: what the GPU's leftover stops being worth to the expected shares, from
      the dual prices of their cutting-stock LP, rebuilt with the popularity model), then by FGD's gradient with
      the model charge, weighed beside kubegpu's measure (see `_share_score`). Ties go to the smallest node name.
    """

    def __init__(self, context: PolicyContext) -> None:
        super().__init__(context)
        self._seen: deque[Request] = deque(maxlen=REMEMBERED)
        self._asked = 0
        self._scarcity: FloatArray = np.zeros(0)
        self._model_scarcity: FloatArray = np.zeros(0)
        self._fgd_workload: Workload | None = None
        self._leftovers = prices_of({})

    def _known(self) -> Sequence[Request]:
        return self._context.workload or self._seen

    def _target(self, state: ClusterState) -> Workload:
        requests = self._known()
        counts = typical_shapes(requests, memory=True)
        kept = dict(sorted(counts.items(), key=lambda item: -item[1])[:KUBEGPU_SHAPES])
        self._scarcity = node_scarcity(requests, state)
        self._model_scarcity = node_scarcity(requests, state, sizes=False)
        self._fgd_workload = Workload.from_counts(typical_shapes(requests), state.model_names)
        self._leftovers = leftover_prices(requests)
        return Workload.from_counts(kept, state.model_names)

    def _measure(self, workload: Workload, cpu: IntArray, memory: IntArray, gpu: IntArray, model: IntArray,
                 nodes: IntArray) -> FloatArray:
        """Three columns: FGD's measure (its own popular shapes), kubegpu's (see the class), and the charge for
        the node's GPU model being in short supply (`node_scarcity` by model alone)."""
        assert self._fgd_workload is not None
        free = gpu.sum(axis=1)
        ours = (CAPACITY_WEIGHT * capacity_fragmentation(workload, cpu, memory, gpu, model)
                + fragmentation(workload, cpu, memory, gpu, model)
                - SCARCITY_WEIGHT * self._scarcity[nodes] * free)
        pinned = -SCARCITY_WEIGHT * self._model_scarcity[nodes] * free
        return np.stack([fragmentation(self._fgd_workload, cpu, memory, gpu, model), ours, pinned], axis=1)

    def _node_score(self, delta: FloatArray, request: Request) -> FloatArray:
        """A whole single GPU (or no GPU): FGD's integer score (sigmoid of its gradient, 0..100), each step worth
        `FGD_STEP` thousandths of kubegpu's measure, so among candidates FGD ranks alike kubegpu's gradient decides.
        A multi-GPU task: FGD's integer score of its gradient plus the model-scarcity charge decides, kubegpu's
        measure only breaks its ties (shares: `_share_score`). Measured on Alibaba's trace (docs/benchmarks.md):
        kubegpu's capacity and node-size terms overriding FGD's ranking pay for single whole GPUs (they keep the CPU
        and the big nodes the GPUs around them need) but cost on shares and multi-GPU tasks, where FGD's one-copy
        test already decides what stays usable; the model charge keeps pinned models for pinned tasks."""
        if request.gpu_count > 1:
            return np.asarray(_fgd_integer(delta[:, 0] + delta[:, 2]) * FGD_ONLY - delta[:, 1], dtype=np.float64)
        return np.asarray(_fgd_integer(delta[:, 0]) * FGD_STEP - delta[:, 1], dtype=np.float64)

    def _share_score(self, delta: FloatArray, request: Request, free: IntArray) -> FloatArray:
        """A share: the least leftover loss first (`leftovers.LeftoverPrices`: what the GPU's leftover stops being
        worth to the expected shares), then FGD's gradient with the model-scarcity charge, each thousandth of it
        worth `FGD_GRADIENT` of kubegpu's measure. Measured on Alibaba's trace (docs/benchmarks.md), the loss ranks
        shares better than FGD's one-copy test: it sees how well the leftover still packs, not only whether one copy
        of each shape fits. Behind it, FGD's gradient itself (not its integer score, which ties most leftovers)
        ranks better, and kubegpu's measure weighed beside it keeps the CPU the GPUs around a share need."""
        loss = self._leftovers.loss_rank(request.gpu_milli, free)
        fgd = delta[:, 0] + delta[:, 2]
        return np.asarray(-loss * LOSS_STEP - fgd * FGD_GRADIENT - delta[:, 1], dtype=np.float64)

    def _select(self, score: FloatArray, feasible: npt.NDArray[np.bool_], state: ClusterState) -> int:
        masked = np.where(feasible, score, -np.inf)
        best = np.flatnonzero(masked >= masked.max() - 1e-9)
        return int(best[np.argmin(state.name_rank[best])])

    def choose(self, request: Request, state: ClusterState) -> Placement | None:
        if not self._context.workload:
            self._seen.append(request)
            self._asked += 1
            if self._asked == 1 or self._asked % RELEARN_EVERY == 0:
                self._workload = None  # rebuild the target (and every cached score) from what was seen
        return super().choose(request, state)


register_policy("fgd", FgdPolicy)
register_policy("kubegpu", KubegpuPolicy)
