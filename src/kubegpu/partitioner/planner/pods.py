"""Which pending pods a planner can work for, and on which nodes: parsing, up-front rejection, eligibility.

Shared by both planners so they reject the same pods with the same reasons, and see the same eligible nodes
(node selector, required node affinity, taints and tolerations through `kubegpu.scheduling.fits`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from kubegpu.errors import KubegpuError
from kubegpu.partitioner.planner.model import (
    UNLIMITED,
    NodeInput,
    is_partition_resource,
    mps_size,
    pod_priority,
)
from kubegpu.scheduling import NodeInfo, PodRequirements, fits, pod_key, pod_requests, pod_requirements
from kubegpu.sharing.names import mig_profile_of

Candidate = tuple[dict[str, Any], tuple[str, ...]]  # a pod and its units: one partition resource per instance


def candidates(pods: Sequence[dict[str, Any]], offered: set[str], largest_mps: int,
               parsed: dict[int, PodRequirements] | None = None) -> tuple[list[Candidate], dict[str, str]]:
    """Pods whose partition-resource requests some GPU could serve, each with its units (one per instance).

    `offered` are the MIG resources some plannable GPU has a profile for, `largest_mps` the largest plannable MPS
    GPU's memory in GB; the rest are rejected with a reason (pod key → reason). `parsed` collects each pod's
    parsed requirements (by the pod's identity), so that later steps need not parse it again."""
    found: list[Candidate] = []
    rejected: dict[str, str] = {}
    for pod in pods:
        try:
            requests = pod_requests(pod)
        except KubegpuError as exc:  # a malformed pod is reported, never fatal
            rejected[pod_key(pod)] = f"invalid requests: {exc}"
            continue
        except (TypeError, AttributeError, ValueError) as exc:  # a spec of the wrong shape
            rejected[pod_key(pod)] = f"invalid spec: {type(exc).__name__}: {exc}"
            continue
        problem = _spec_problem(pod, requests, parsed)
        if problem:
            rejected[pod_key(pod)] = problem
            continue
        units: list[str] = []
        for resource in sorted(r for r in requests if is_partition_resource(r)):
            units += [resource] * round(requests[resource])
        kinds = {"mps" if mps_size(u) is not None else "mig" for u in units}
        missing = [u for u in units if u not in offered and not 0 < (mps_size(u) or 0) <= largest_mps]
        if not units:
            rejected[pod_key(pod)] = "requests no nvidia.com/mig-<profile> or nvidia.com/gpu-<N>gb resource"
        elif len(kinds) > 1:
            rejected[pod_key(pod)] = "requests both MIG and MPS resources; no node offers both"
        elif missing:
            rejected[pod_key(pod)] = f"no partitionable GPU offers {missing[0]}"
        else:
            found.append((pod, tuple(units)))
    return found, rejected


def _spec_problem(pod: dict[str, Any], requests: Mapping[str, float],
                  parsed: dict[int, PodRequirements] | None = None) -> str | None:
    """Why this pod cannot be planned for at all; checked up front so one bad pod never stops the whole plan."""
    negative = sorted(r for r, amount in requests.items() if amount < 0)
    if negative:
        return f"invalid requests: {negative[0]} must not be negative"
    try:
        need = pod_requirements(pod, requests)  # node selector, affinity and tolerations parse, or ConfigError
        if parsed is not None:
            parsed[id(pod)] = need
    except KubegpuError as exc:
        return f"invalid spec: {exc}"
    except (TypeError, AttributeError, ValueError) as exc:  # a section of the wrong shape
        return f"invalid spec: spec.affinity / nodeSelector / tolerations: {type(exc).__name__}: {exc}"
    try:
        pod_priority(pod)
    except (TypeError, ValueError):
        return f"invalid spec: spec.priority must be an integer, not {(pod.get('spec') or {}).get('priority')!r}"
    return None


def size_of(units: tuple[str, ...]) -> float:
    """Rough size of a request in GB (the `<M>gb` of MIG profiles, MPS slice sizes): orders pods."""
    total = 0.0
    for unit in units:
        mig, mps = mig_profile_of(unit), mps_size(unit)
        if mps is not None:
            total += mps
        elif mig is not None:
            digits = re.match(r"(\d+)g\.(\d+)gb", mig)
            total += float(digits.group(2)) if digits else 0.0
    return total


def eligible_nodes(pod: dict[str, Any], units: tuple[str, ...], nodes: Mapping[str, NodeInput],
                   cache: dict[str, list[str]]) -> list[str]:
    """Names of `nodes` (the plannable ones) whose mode matches and whose labels, taints and affinity admit the
    pod (GPU capacity aside), sorted; memoised in `cache` per distinct set of node constraints."""
    spec = pod.get("spec") or {}
    mode = "mps" if mps_size(units[0]) is not None else "mig"
    # repr, not a canonical form: equal constraints written in another key order only miss the cache
    signature = repr((mode, spec.get("nodeSelector"), spec.get("affinity"), spec.get("tolerations")))
    if signature not in cache:
        probe = {**pod, "spec": {k: v for k, v in spec.items() if k not in ("containers", "initContainers",
                                                                            "overhead")}}
        probe["spec"]["containers"] = []
        need = pod_requirements(probe)  # parsed once, checked against every node
        cache[signature] = [name for name, node in sorted(nodes.items())
                            if node.mode == mode and fits(need, _empty_view(node)).ok]
    return cache[signature]


def _empty_view(node: NodeInput) -> NodeInfo:
    return NodeInfo(node=node.node, allocatable={"pods": UNLIMITED}, requested={}, pods=[])


def unschedulable_reason(pod: dict[str, Any], units: tuple[str, ...], nodes: Mapping[str, NodeInput],
                         cache: dict[str, list[str]]) -> str:
    """Why a candidate pod got no place in a plan."""
    names = eligible_nodes(pod, units, nodes, cache)
    if not names:
        return "no partitionable node matches the pod's node selector, affinity or tolerations"
    wanted = ", ".join(sorted(set(units)))
    return f"not enough free GPU capacity for {wanted} on {len(names)} eligible node(s), instances in use kept"


