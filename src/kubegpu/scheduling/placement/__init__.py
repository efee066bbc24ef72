"""Which node and which GPUs a pod gets: the placement core shared by the trace simulator and the cluster adapter.

`ClusterState` holds free CPU, memory and per-GPU thousandths; `Request` is one pod's ask (a share of one GPU, whole
GPUs, or none, optionally pinned to GPU models); `choose(request, state, policy)` returns a `Placement` (node index
and GPU indexes) or None, and `state.apply` / `state.release` take and give back the resources. Policies register
by name (`make_policy`, `policy_names`). Pure: no I/O.
"""

from kubegpu.scheduling.placement import baselines as _baselines  # noqa: F401  (registers the baselines)
from kubegpu.scheduling.placement import fragmentation as _fragmentation  # noqa: F401  (registers fgd, kubegpu)
from kubegpu.scheduling.placement.model import MILLI, ClusterState, Placement, Request, best_fit_gpus, state_from_nodes
from kubegpu.scheduling.placement.registry import (
    Policy,
    PolicyContext,
    choose,
    make_policy,
    policy_names,
    register_policy,
)

__all__ = [
    "MILLI",
    "ClusterState",
    "Placement",
    "Policy",
    "PolicyContext",
    "Request",
    "best_fit_gpus",
    "choose",
    "make_policy",
    "policy_names",
    "register_policy",
    "state_from_nodes",
]
