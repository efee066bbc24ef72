"""One reconcile pass of the operator over an `OperatorApi`: the glue between the pure decisions (reconcile,
nodelabels, mighandoff, upgrade) and the API. Everything here is synchronous and talks only to the protocol, so
tests drive whole passes on an in-memory API and the kopf handlers (controller.py) stay a few lines each.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from kubegpu.errors import KubegpuError
from kubegpu.kube.selectors import parse_label_selector
from kubegpu.operator import mighandoff, upgrade
from kubegpu.operator import reconcile as R
from kubegpu.operator.nodelabels import NFD_GPU_LABELS, has_gpu, node_label_change
from kubegpu.operator.policy import ClusterPolicy, parse_policy
from kubegpu.operator.render import COMPONENT_LABEL, DRIVER_HASH, NAME_LABEL, driver_template_hash, render


class OperatorApi(Protocol):
    def list_policies(self) -> list[dict[str, Any]]: ...

    def patch_policy_status(self, name: str, status: dict[str, Any]) -> None: ...

    def apply(self, obj: dict[str, Any]) -> dict[str, Any]:
        """Server-side apply (our field manager, forced); returns the live object."""
        ...

    def list_owned(self, policy: str, namespace: str) -> list[dict[str, Any]]: ...

    def delete(self, key: R.Key) -> None: ...

    def list_nodes(self) -> list[dict[str, Any]]: ...

    def list_nodepools(self) -> list[dict[str, Any]]:
        """kubegpu's (`kubegpu.io/v1`) and Karpenter's (`karpenter.sh/v1`) NodePools, each with its apiVersion;
        none of a kind the server does not serve."""
        ...

    def patch_node(self, name: str, labels: dict[str, str | None], annotations: dict[str, str | None]) -> None: ...

    def set_unschedulable(self, name: str, value: bool) -> None: ...

    def list_pods(self, node: str | None = None, namespace: str | None = None,
                  labels: dict[str, str] | None = None) -> list[dict[str, Any]]: ...

    def evict(self, namespace: str, name: str) -> bool:
        """Evict through the Eviction API; False when a PodDisruptionBudget refuses (429)."""
        ...

    def delete_pod(self, namespace: str, name: str) -> None: ...


@dataclass
class PassResult:
    status: R.Status
    applied: list[R.Key] = field(default_factory=list)
    deleted: list[R.Key] = field(default_factory=list)
    node_patches: dict[str, dict[str, Any]] = field(default_factory=dict)
    upgrade_actions: list[upgrade.Action] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    gpu_nodes: int = 0
    nfd_labelled: bool = False
    upgrade_states: list[str] = field(default_factory=list)  # each GPU node's upgrade state at the pass start


def run_pass(api: OperatorApi, name: str, namespace: str, now: float, now_text: str) -> PassResult:
    """Reconcile ClusterPolicy NAME once: apply, delete, label nodes, heal MIG wedges, roll driver upgrades, and
    write the status. Never raises for a bad policy or an API failure: both end in the status."""
    policies = api.list_policies()
    body = next((p for p in policies if p["metadata"]["name"] == name), None)
    if body is None:
        return PassResult(R.Status("ignored", "NotFound", f"ClusterPolicy {name} is gone", None))
    previous = body.get("status") or {}
    active = R.active_policy(policies)
    if active != name:
        status = R.ignored(str(active))
        api.patch_policy_status(name, status.body(namespace, now_text, previous))
        return PassResult(status)
    try:
        policy = parse_policy(body, "ClusterPolicy")
    except KubegpuError as exc:
        status = R.failed(str(exc))  # nothing applied, nothing deleted: the last good state keeps running
        api.patch_policy_status(name, status.body(namespace, now_text, previous))
        return PassResult(status)
    result = PassResult(R.Status("ready", "Reconciled", "", None))
    try:
        _reconcile(api, policy, namespace, now, result)
    except KubegpuError as exc:
        result.status = R.failed(f"reconcile failed: {exc}")
    except Exception as exc:  # an API client error we did not map: still a status, never a dead handler
        result.status = R.failed(f"reconcile failed: {type(exc).__name__}: {' '.join(str(exc).split())[:300]}")
    api.patch_policy_status(name, result.status.body(namespace, now_text, previous))
    return result


def _reconcile(api: OperatorApi, policy: ClusterPolicy, namespace: str, now: float, result: PassResult) -> None:
    nodes = api.list_nodes()
    pools = _nodepools(api, result) if policy.spec.quota.enabled else []
    rendered = render(policy, namespace, [_labels(n) for n in nodes], pools)  # the quota table: the GPUs of the
    # nodes and of the nodes the NodePools may launch
    plan = R.plan(rendered, api.list_owned(policy.name, namespace), policy.name)
    live: dict[R.Key, dict[str, Any]] = {}
    for obj in plan.apply:
        live[R.key_of(obj)] = api.apply(obj)
        result.applied.append(R.key_of(obj))
    for key in plan.delete:
        api.delete(key)
        result.deleted.append(key)
    for node in nodes:
        _label_node(api, policy, node, now, result)
    if policy.spec.driver.enabled:
        _roll_driver(api, policy, namespace, [n for n in nodes if has_gpu(_labels(n))], now, result)
    gpu = [n for n in nodes if has_gpu(_labels(n))]
    result.gpu_nodes = len(gpu)
    result.nfd_labelled = any(_labels(n).get(k) == "true" for n in nodes for k in NFD_GPU_LABELS)
    result.upgrade_states = [_labels(n).get(upgrade.STATE_LABEL, "") for n in gpu]
    result.status = R.outcome(R.states_not_ready(plan, live), result.gpu_nodes, result.nfd_labelled)


def _nodepools(api: OperatorApi, result: PassResult) -> list[dict[str, Any]]:
    """The NodePools whose GPUs join the charge table. One whose requirements cannot be read (an older CRD that
    let it through) is left out with a note, not a failed pass: the nodes it launched are in the table anyway."""
    from kubegpu.sharing.charges import nodepool_shapes

    pools = []
    for pool in api.list_nodepools():
        try:
            nodepool_shapes(pool)
        except KubegpuError as exc:
            result.notes.append(f"quota table: {exc}")
            continue
        pools.append(pool)
    return pools


def _labels(node: dict[str, Any]) -> dict[str, str]:
    return dict((node.get("metadata") or {}).get("labels") or {})


def _annotations(node: dict[str, Any]) -> dict[str, str]:
    return dict((node.get("metadata") or {}).get("annotations") or {})


def _label_node(api: OperatorApi, policy: ClusterPolicy, node: dict[str, Any], now: float,
                result: PassResult) -> None:
    name = node["metadata"]["name"]
    labels = _labels(node)
    heal = mighandoff.heal(labels, _annotations(node), now, float(policy.spec.migManager.timeoutSeconds))
    labels.update({k: v for k, v in heal.labels.items() if v is not None})  # restored labels count as present
    change = node_label_change(policy, labels)
    patch = {**heal.labels, **change.patch()}
    if patch or heal.annotations:
        api.patch_node(name, patch, dict(heal.annotations))
        result.node_patches[name] = {"labels": patch, "annotations": dict(heal.annotations)}
    if heal.reason:
        result.notes.append(f"node {name}: {heal.reason}")


def _pod_ready(pod: dict[str, Any]) -> bool:
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def _uses_gpu(pod: dict[str, Any]) -> bool:
    for container in (pod.get("spec") or {}).get("containers") or []:
        limits = ((container.get("resources") or {}).get("limits") or {})
        if any(name.startswith("nvidia.com/") for name in limits):
            return True
    return False


def _owned_by_daemonset(pod: dict[str, Any]) -> bool:
    return any(o.get("kind") == "DaemonSet" for o in (pod.get("metadata") or {}).get("ownerReferences") or [])


def _matches(pod: dict[str, Any], selector: str) -> bool:
    """upgradePolicy's podSelector fields: label selectors in the API server's string syntax ("" matches every pod),
    validated when the policy is parsed."""
    return parse_label_selector(selector).matches((pod.get("metadata") or {}).get("labels") or {})


def node_view(policy: ClusterPolicy, node: dict[str, Any], pods: list[dict[str, Any]], namespace: str,
              current_hash: str) -> upgrade.NodeView:
    """What the upgrade state machine needs to know about one node, read off the Node and its pods."""
    labels, annotations = _labels(node), _annotations(node)
    ours = [p for p in pods if (p.get("metadata") or {}).get("namespace") == namespace and
            ((p.get("metadata") or {}).get("labels") or {}).get(NAME_LABEL) == "kubegpu"]

    def component(p: dict[str, Any]) -> str:
        return str(((p.get("metadata") or {}).get("labels") or {}).get(COMPONENT_LABEL, ""))

    driver = next((p for p in ours if component(p) == "driver"), None)
    validator = next((p for p in ours if component(p) == "operator-validator"), None)
    driver_hash = ((driver or {}).get("metadata") or {}).get("annotations", {}).get(DRIVER_HASH)
    outdated = driver is not None and driver_hash != current_hash
    statuses = ((driver or {}).get("status") or {}).get("containerStatuses") or []
    failing = any((s.get("state") or {}).get("waiting", {}).get("reason") == "CrashLoopBackOff" for s in statuses)
    driver_started = ((driver or {}).get("metadata") or {}).get("creationTimestamp") or ""
    validator_started = ((validator or {}).get("metadata") or {}).get("creationTimestamp") or ""
    validated = validator is not None and _pod_ready(validator) and validator_started >= driver_started
    stale = validator is not None and driver is not None and validator_started < driver_started
    up = policy.spec.driver.upgradePolicy
    workload = [p for p in pods if p not in ours]
    try:
        since = float(annotations.get(upgrade.SINCE_ANNOTATION, "0"))
    except ValueError:
        since = 0.0
    return upgrade.NodeView(
        name=node["metadata"]["name"], state=labels.get(upgrade.STATE_LABEL, ""), since=since,
        unschedulable=bool((node.get("spec") or {}).get("unschedulable")),
        cordoned_by_us=annotations.get(upgrade.CORDONED_ANNOTATION) == "true",
        driver_outdated=outdated,
        driver_pod=f"{namespace}/{driver['metadata']['name']}" if driver else None,
        driver_ready=driver is not None and not outdated and _pod_ready(driver),
        validated=validated, validator_stale=stale, driver_failing=failing and not outdated,
        pods=[upgrade.PodView(
            p["metadata"].get("namespace", ""), p["metadata"]["name"], uses_gpu=_uses_gpu(p),
            daemonset=_owned_by_daemonset(p),
            matches_wait_selector=bool(up.waitForCompletion.podSelector) and
            _matches(p, up.waitForCompletion.podSelector),
            matches_drain_selector=_matches(p, up.drain.podSelector),
            finished=(p.get("status") or {}).get("phase") in ("Succeeded", "Failed"),
        ) for p in workload],
    )


def _roll_driver(api: OperatorApi, policy: ClusterPolicy, namespace: str, nodes: list[dict[str, Any]], now: float,
                 result: PassResult) -> None:
    current = driver_template_hash(policy)
    views = [node_view(policy, n, api.list_pods(node=n["metadata"]["name"]), namespace, current) for n in nodes]
    actions = upgrade.plan_upgrades(policy.spec.driver.upgradePolicy, views, now)
    for action in actions:
        perform(api, action, namespace, now)
    result.upgrade_actions = actions


def perform(api: OperatorApi, action: upgrade.Action, namespace: str, now: float) -> None:
    if action.kind == "set-state":
        api.patch_node(action.node, {upgrade.STATE_LABEL: action.value},
                       {upgrade.SINCE_ANNOTATION: f"{now:.3f}"})
    elif action.kind == "cordon":
        api.patch_node(action.node, {}, {upgrade.CORDONED_ANNOTATION: "true"})  # recorded before acting
        api.set_unschedulable(action.node, True)
    elif action.kind == "uncordon":
        api.set_unschedulable(action.node, False)
        api.patch_node(action.node, {}, {upgrade.CORDONED_ANNOTATION: None})
    elif action.kind == "evict":
        pod_namespace, _, pod = action.value.partition("/")
        api.evict(pod_namespace, pod)  # a PDB refusal is retried next pass
    elif action.kind == "delete-pod":
        pod_namespace, _, pod = action.value.partition("/")
        api.delete_pod(pod_namespace, pod)
    elif action.kind in ("restart-driver", "restart-validator"):
        for validator in api.list_pods(node=action.node, namespace=namespace,
                                       labels={NAME_LABEL: "kubegpu", COMPONENT_LABEL: "operator-validator"}):
            api.delete_pod(namespace, validator["metadata"]["name"])  # every validation re-runs on the new driver
        if action.value:
            pod_namespace, _, pod_name = action.value.partition("/")
            api.delete_pod(pod_namespace, pod_name)
