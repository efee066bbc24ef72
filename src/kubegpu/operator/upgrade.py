"""Rolling driver upgrades, as a pure state machine over the node label `nvidia.com/gpu-driver-upgrade-state`.

States (the GPU Operator's): upgrade-required → cordon-required → wait-for-jobs-required → pod-deletion-required →
drain-required → pod-restart-required → validation-required → uncordon-required → upgrade-done, or upgrade-failed.
`plan_upgrades` looks at every GPU node once and returns the actions of one pass; the controller performs them
(label patches, cordon, evictions through the Eviction API so PodDisruptionBudgets hold, driver pod deletion).

Where the GPU Operator strands nodes, this one does not: a node in upgrade-failed leaves it by itself once the new
driver validates (then it is uncordoned); a node an admin cordoned is never uncordoned by us; and at most
`maxParallelUpgrades` nodes are past cordon at any time, within `maxUnavailable`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kubegpu.operator.policy import UpgradePolicy

STATE_LABEL = "nvidia.com/gpu-driver-upgrade-state"
SINCE_ANNOTATION = "kubegpu.io/gpu-driver-upgrade-since"
CORDONED_ANNOTATION = "kubegpu.io/gpu-driver-upgrade-cordoned"  # we cordoned it (so we may uncordon it)

REQUIRED = "upgrade-required"
CORDON = "cordon-required"
WAIT_JOBS = "wait-for-jobs-required"
POD_DELETION = "pod-deletion-required"
DRAIN = "drain-required"
POD_RESTART = "pod-restart-required"
VALIDATION = "validation-required"
UNCORDON = "uncordon-required"
DONE = "upgrade-done"
FAILED = "upgrade-failed"
IN_PROGRESS = (CORDON, WAIT_JOBS, POD_DELETION, DRAIN, POD_RESTART, VALIDATION, UNCORDON)
VALIDATION_TIMEOUT = 600.0
FAILED_RETRY = 600.0  # a node that failed before its driver restarted is retried after this long


@dataclass(frozen=True)
class PodView:
    namespace: str
    name: str
    uses_gpu: bool = False
    daemonset: bool = False
    matches_wait_selector: bool = False  # waitForCompletion.podSelector
    matches_drain_selector: bool = True  # drain.podSelector ("" matches every pod)
    finished: bool = False


@dataclass
class NodeView:
    name: str
    state: str = ""
    since: float = 0.0  # when the state label was last set (annotation)
    unschedulable: bool = False
    cordoned_by_us: bool = False
    driver_outdated: bool = False  # the driver pod runs an older revision than its DaemonSet
    driver_pod: str | None = None  # "namespace/name" of the driver pod on this node
    driver_ready: bool = False  # driver pod Ready at the current revision
    validated: bool = False  # the validator on this node passed with the current driver
    validator_stale: bool = False  # a validator pod older than the driver pod: it validated the previous driver
    driver_failing: bool = False  # crash-looping at the current revision
    pods: list[PodView] = field(default_factory=list)


@dataclass(frozen=True)
class Action:
    """kind: set-state | cordon | uncordon | evict | delete-pod | restart-driver | restart-validator."""

    kind: str
    node: str
    value: str = ""  # the new state, or "namespace/name" of the pod


def max_unavailable(policy: UpgradePolicy, total: int) -> int:
    text = str(policy.maxUnavailable)
    if text.endswith("%"):
        return max(1, -(-total * int(text[:-1]) // 100)) if int(text[:-1]) > 0 else 0
    return int(text)


def _set(node: NodeView, state: str) -> Action:
    return Action("set-state", node.name, state)


def _evictable(pod: PodView) -> bool:
    return not pod.daemonset and not pod.finished


def _timed_out(node: NodeView, timeout: int | float, now: float) -> bool:
    return timeout > 0 and now - node.since >= timeout


def step_node(policy: UpgradePolicy, node: NodeView, now: float) -> list[Action]:
    """The next actions of one node already admitted (or not needing admission)."""
    state = node.state
    if state == CORDON:
        return ([] if node.unschedulable else [Action("cordon", node.name)]) + [_set(node, WAIT_JOBS)]
    if state == WAIT_JOBS:
        waiting = [p for p in node.pods if p.matches_wait_selector and not p.finished]
        if waiting and not _timed_out(node, policy.waitForCompletion.timeoutSeconds, now):
            return []
        return [_set(node, POD_DELETION)]
    if state == POD_DELETION:
        gpu_pods = [p for p in node.pods if p.uses_gpu and _evictable(p)]
        if not gpu_pods:
            return [_set(node, DRAIN if policy.drain.enable else POD_RESTART)]
        if _timed_out(node, policy.podDeletion.timeoutSeconds, now):
            if policy.podDeletion.force:
                return [Action("delete-pod", node.name, f"{p.namespace}/{p.name}") for p in gpu_pods]
            return [_set(node, FAILED)]
        return [Action("evict", node.name, f"{p.namespace}/{p.name}") for p in gpu_pods]
    if state == DRAIN:
        pods = [p for p in node.pods if _evictable(p) and p.matches_drain_selector]
        if not pods:
            return [_set(node, POD_RESTART)]
        if _timed_out(node, policy.drain.timeoutSeconds, now):
            if policy.drain.force:
                return [Action("delete-pod", node.name, f"{p.namespace}/{p.name}") for p in pods]
            return [_set(node, FAILED)]
        return [Action("evict", node.name, f"{p.namespace}/{p.name}") for p in pods]
    if state == POD_RESTART:
        if node.driver_outdated:
            return [Action("restart-driver", node.name, node.driver_pod or "")]
        return [_set(node, VALIDATION)]
    if state == VALIDATION:
        if node.driver_ready and node.validated:
            return [_set(node, UNCORDON)]
        if node.driver_failing or _timed_out(node, VALIDATION_TIMEOUT, now):
            return [_set(node, FAILED)]
        if node.driver_ready and node.validator_stale:
            # the validator deleted with the old driver came back before the new driver pod did: it never re-runs
            # on its own, so restart it now rather than wait for the validation timeout
            return [Action("restart-validator", node.name)]
        return []
    if state == UNCORDON:
        return ([Action("uncordon", node.name)] if node.unschedulable and node.cordoned_by_us else []) + \
            [_set(node, DONE)]
    if state == FAILED:
        if node.driver_outdated:
            # failed before the driver restarted (pods would not leave): the old driver still serves, so give the
            # node back to workloads and try again after a back-off
            actions = [Action("uncordon", node.name)] if node.unschedulable and node.cordoned_by_us else []
            return actions + ([_set(node, REQUIRED)] if _timed_out(node, FAILED_RETRY, now) else [])
        if node.driver_ready and node.validated:
            return [_set(node, UNCORDON)]  # recovered by itself (or by an admin's fix): never stranded
        return []
    return []


def plan_upgrades(policy: UpgradePolicy, nodes: list[NodeView], now: float) -> list[Action]:
    """One pass over every GPU node. Admission to cordon keeps at most maxParallelUpgrades nodes past cordon (0 =
    no limit) and at most maxUnavailable nodes unavailable (cordoned or upgrading)."""
    if not policy.autoUpgrade:
        return []
    actions: list[Action] = []
    nodes = sorted(nodes, key=lambda n: n.name)
    for node in nodes:
        if node.state in ("", DONE) and node.driver_outdated:
            actions.append(_set(node, REQUIRED))
            node.state = REQUIRED  # admissible in this same pass
        elif node.state == "" and not node.driver_outdated:
            actions.append(_set(node, DONE))
    in_progress = sum(1 for n in nodes if n.state in IN_PROGRESS)
    unavailable = sum(1 for n in nodes if n.state in IN_PROGRESS or n.unschedulable)
    parallel = policy.maxParallelUpgrades or len(nodes)
    budget = max_unavailable(policy, len(nodes))
    for node in nodes:
        if node.state != REQUIRED:
            continue
        extra_unavailable = 0 if node.unschedulable else 1
        if in_progress >= parallel or unavailable + extra_unavailable > budget:
            continue
        actions.append(_set(node, CORDON))
        in_progress += 1
        unavailable += extra_unavailable
    for node in nodes:
        if node.state in IN_PROGRESS or node.state == FAILED:
            actions += step_node(policy, node, now)
    return actions
