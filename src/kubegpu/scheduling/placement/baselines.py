"""The placement heuristics FGD's paper compares against, re-implemented from its description, and kube-scheduler's
default scoring. Each scores every feasible node in one vectorised step.

Ties: the paper's artifact patches kube-scheduler to take the node with the smallest name among the best-scoring ones
(for reproducibility), and so do the baselines here (`ClusterState.name_rank`), so their figures are comparable with
the published ones; `kube-default` keeps kubegpu.scheduling's rule (the first node in the state's order).
GPUs within the chosen node: best fit (`best_fit_gpus`) unless the policy says otherwise.
"""

from __future__ import annotations

import numpy as np

from kubegpu.scheduling.placement.model import MILLI, ClusterState, IntArray, Placement, Request, best_fit_gpus
from kubegpu.scheduling.placement.registry import PolicyContext, register_policy

MAX_SPEC_CPU = 128_000
"""The normalising CPU of the paper's scores (the largest node, millicores)."""
MAX_SPEC_GPU = 8 * MILLI
"""The normalising GPU of the paper's scores (eight GPUs, thousandths)."""


def _pick(scores: np.ndarray, feasible: np.ndarray, rank: IntArray | None) -> int | None:
    """The best-scoring feasible node: the one first in `rank` among ties (the state's order when None)."""
    if not feasible.any():
        return None
    masked = np.where(feasible, scores, -np.inf)
    best = np.flatnonzero(masked == masked.max())
    return int(best[0]) if rank is None else int(best[np.argmin(rank[best])])


class RandomPolicy:
    """Any feasible node, uniformly at random; best-fit GPUs there."""

    def __init__(self, context: PolicyContext) -> None:
        self._rng = np.random.default_rng(context.seed)

    def choose(self, request: Request, state: ClusterState) -> Placement | None:
        feasible = np.flatnonzero(state.feasible(request))
        if not len(feasible):
            return None
        node = int(feasible[self._rng.integers(len(feasible))])
        return Placement(node, best_fit_gpus(state, node, request))


class BestFitPolicy:
    """The node whose free CPU and GPU left after placing are least (equal weights, normalised by the largest
    node's spec)."""

    def __init__(self, context: PolicyContext) -> None:
        del context

    def choose(self, request: Request, state: ClusterState) -> Placement | None:
        left = (0.5 * (state.cpu_free - request.cpu_milli) / MAX_SPEC_CPU
                + 0.5 * (state.gpu_free.sum(axis=1) - request.gpu_total_milli) / MAX_SPEC_GPU)
        node = _pick(np.floor((1.0 - left) * 100), state.feasible(request), state.name_rank)
        return None if node is None else Placement(node, best_fit_gpus(state, node, request))


class GpuPackingPolicy:
    """Prefer, in order: partly used GPUs that fit the task (fuller first), then partly used nodes where the task
    needs fully free GPUs (fewest first), then idle nodes (smallest first). CPU-only tasks: no preference."""

    def __init__(self, context: PolicyContext) -> None:
        del context

    def choose(self, request: Request, state: ClusterState) -> Placement | None:
        feasible = state.feasible(request)
        if request.gpu_count == 0:
            node = _pick(np.zeros(len(state)), feasible, state.name_rank)
            return None if node is None else Placement(node, ())
        free = state.gpu_free
        fully_free = (free == MILLI).sum(axis=1)
        idle = fully_free == state.gpu_count
        # best-fit GPUs per node: the least free that suffice; how many of them are fully free, how free they are
        usable = np.where(free >= request.gpu_milli, free, MILLI + 1)
        chosen = np.sort(usable, axis=1)[:, : request.gpu_count]
        uses_full = (chosen == MILLI).sum(axis=1)
        shared_score = 100 - np.where(chosen <= MILLI, chosen * 100 // MILLI, 0).sum(axis=1) // 10
        score = np.where(idle, np.maximum(100 // 3 - fully_free, fully_free),
                         np.where(uses_full > 0, np.maximum(50 - uses_full, 100 // 3), np.maximum(shared_score, 50)))
        node = _pick(score.astype(float), feasible, state.name_rank)
        return None if node is None else Placement(node, best_fit_gpus(state, node, request))


class GpuClusteringPolicy:
    """Put a GPU task beside tasks of its own kind (a share of one GPU, or k whole GPUs): nodes holding only its kind
    first, then mixed nodes holding it, then nodes holding no GPU task, then others; fuller nodes first within each.

    The kinds already on each node are what this instance placed, so one instance must see every placement.
    """

    def __init__(self, context: PolicyContext) -> None:
        del context
        self._kinds: dict[str, int] = {}
        self._counts: IntArray = np.zeros((0, 0), dtype=np.int64)  # node x kind: tasks of that kind placed there

    def _kind(self, request: Request, nodes: int) -> int:
        name = "share" if request.shares else f"{request.gpu_count}-gpu"
        if len(self._counts) != nodes:
            self._counts = np.zeros((nodes, 0), dtype=np.int64)
        if name not in self._kinds:
            self._kinds[name] = len(self._kinds)
            self._counts = np.hstack([self._counts, np.zeros((nodes, 1), dtype=np.int64)])
        return self._kinds[name]

    def choose(self, request: Request, state: ClusterState) -> Placement | None:
        feasible = state.feasible(request)
        if request.gpu_count == 0:
            node = _pick(np.zeros(len(state)), feasible, state.name_rank)
            return None if node is None else Placement(node, ())
        kind = self._kind(request, len(state))
        present = self._counts > 0
        mine, kinds = present[:, kind], present.sum(axis=1)
        band = np.where(mine, np.where(kinds == 1, 75, 50), np.where(kinds == 0, 25, 0))
        fill = (MAX_SPEC_GPU - state.gpu_free.sum(axis=1)) * 25 // MAX_SPEC_GPU
        node = _pick((band + fill).astype(float), feasible, state.name_rank)
        if node is None:
            return None
        self._counts[node, kind] += 1
        return Placement(node, best_fit_gpus(state, node, request))


class DotProductPolicy:
    """The (node, GPU) whose free (CPU, GPU) vector, normalised by the largest node, has the least dot product with
    the task's request: the task goes where what it asks for is scarcest (an alignment heuristic)."""

    def __init__(self, context: PolicyContext) -> None:
        del context

    def choose(self, request: Request, state: ClusterState) -> Placement | None:
        feasible = state.feasible(request)
        cpu_max = float(state.cpu_capacity.max()) or 1.0
        cpu_term = (state.cpu_free / cpu_max) * (request.cpu_milli / cpu_max)
        if not request.shares:
            gpu_max = float(state.gpu_capacity.sum(axis=1).max()) or 1.0
            gpu_term = (state.gpu_free.sum(axis=1) / gpu_max) * (request.gpu_total_milli / gpu_max)
            node = _pick(-(cpu_term + gpu_term), feasible, state.name_rank)
            return None if node is None else Placement(node, best_fit_gpus(state, node, request))
        # a sharing task: score each GPU on its own (the GPU's free share against the task's share)
        per_gpu = cpu_term[:, None] + (state.gpu_free / MILLI) * (request.gpu_milli / MILLI)
        per_gpu = np.where(state.gpu_free >= request.gpu_milli, per_gpu, np.inf)
        best_gpu = per_gpu.argmin(axis=1)
        node = _pick(-per_gpu.min(axis=1), feasible, state.name_rank)
        return None if node is None else Placement(node, (int(best_gpu[node]),))


class KubeDefaultPolicy:
    """kube-scheduler's default scoring as kubegpu.scheduling has it: LeastAllocated, the mean over CPU, memory and
    GPU of the share left free after placing (spreads); first node on ties. GPUs within the node: first fit."""

    def __init__(self, context: PolicyContext) -> None:
        del context

    def choose(self, request: Request, state: ClusterState) -> Placement | None:
        parts = [(state.cpu_free - request.cpu_milli) / np.maximum(state.cpu_capacity, 1),
                 (state.memory_free - request.memory_mib) / np.maximum(state.memory_capacity, 1)]
        if request.gpu_count:
            gpu_cap = np.maximum(state.gpu_capacity.sum(axis=1), 1)
            parts.append((state.gpu_free.sum(axis=1) - request.gpu_total_milli) / gpu_cap)
        node = _pick(np.mean(parts, axis=0), state.feasible(request), None)
        if node is None:
            return None
        free: IntArray = state.gpu_free[node]
        gpus = tuple(int(g) for g in np.flatnonzero(free >= request.gpu_milli)[: request.gpu_count])
        return Placement(node, gpus if request.gpu_count else ())


register_policy("random", RandomPolicy)
register_policy("bestfit", BestFitPolicy)
register_policy("gpupacking", GpuPackingPolicy)
register_policy("gpuclustering", GpuClusteringPolicy)
register_policy("dotprod", DotProductPolicy)
register_policy("kube-default", KubeDefaultPolicy)
