"""ClusterPolicy → every Kubernetes object the operator applies, in state order. Pure: no I/O, deterministic.

`kubegpu operator render` prints exactly this, and the controller server-side-applies exactly this, so what a user
reviews offline is what lands in the cluster.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from pathlib import PurePosixPath
from typing import Any

import yaml

from kubegpu.operator.components import CONFIG_LABEL, OPERANDS, STATES, VALIDATIONS, VALIDATIONS_DIR, Operand
from kubegpu.operator.policy import API_VERSION, KIND, ClusterPolicy, ComponentSpec, EnvVar

NAME_LABEL = "app.kubernetes.io/name"
COMPONENT_LABEL = "app.kubernetes.io/component"
MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
STATE_LABEL = "kubegpu.io/state"
OWNER_LABEL = "kubegpu.io/clusterpolicy"
MANAGER = "kubegpu-operator"
DRIVER_HASH = "kubegpu.io/driver-template-hash"
DEFAULT_NAMESPACE = "kubegpu"


def labels(component: str, state: str | None = None) -> dict[str, str]:
    out = {NAME_LABEL: "kubegpu", COMPONENT_LABEL: component, MANAGED_BY_LABEL: MANAGER}
    if state:
        out[STATE_LABEL] = state
    return out


def driver_template_hash(policy: ClusterPolicy) -> str:
    """Hash of everything that defines the driver pod: a change rolls the driver node by node (upgrade.py)."""
    driver = policy.spec.driver.model_dump(mode="json", exclude={"upgradePolicy", "enabled"})
    return hashlib.sha256(json.dumps(driver, sort_keys=True).encode()).hexdigest()[:16]


def _meta(name: str, component: str, state: str, namespace: str | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "labels": labels(component, state)}
    if namespace is not None:
        meta["namespace"] = namespace
    return meta


def block(policy: ClusterPolicy, name: str) -> ComponentSpec:
    value = getattr(policy.spec, name)
    assert isinstance(value, ComponentSpec)
    return value


def enabled(policy: ClusterPolicy, op: Operand) -> bool:
    """Validation is always on (as in the GPU Operator); every other operand follows its block's `enabled`."""
    return op.block == "validator" or block(policy, op.block).enabled


def _env(pairs: Sequence[EnvVar | tuple[str, str]]) -> list[dict[str, Any]]:
    """Env entries, a later one replacing an earlier one of the same name (a policy's env overrides ours)."""
    out: list[dict[str, Any]] = []
    for item in pairs:
        name, value = (item.name, item.value) if isinstance(item, EnvVar) else item
        out = [e for e in out if e["name"] != name] + [{"name": name, "value": value}]
    return out


def _node_name_env() -> dict[str, Any]:
    return {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}


def _wait_container(image: str, pull: str, barrier: str) -> dict[str, Any]:
    path = f"{VALIDATIONS_DIR}/{barrier}"
    return {
        "name": f"wait-{barrier}",
        "image": image,
        "imagePullPolicy": pull,
        "command": ["sh", "-c", f"until [ -f {path} ]; do echo waiting for {barrier}; sleep 5; done"],
        "volumeMounts": [{"name": "run-nvidia-validations", "mountPath": VALIDATIONS_DIR,
                          "mountPropagation": "HostToContainer"}],
        "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
    }


def _security(op: Operand) -> dict[str, Any]:
    """Controllers run as the image's non-root user; node agents need root on the host (devices, sockets)."""
    if op.privileged:
        return {"privileged": True, "runAsUser": 0}
    if op.kind == "Deployment":
        return {"allowPrivilegeEscalation": False, "runAsNonRoot": True, "runAsUser": 65532,
                "capabilities": {"drop": ["ALL"]}}
    caps: dict[str, Any] = {"drop": ["ALL"]}
    if op.capabilities:
        caps["add"] = list(op.capabilities)
    return {"allowPrivilegeEscalation": False, "runAsUser": 0, "capabilities": caps}


def _resources(spec: ComponentSpec) -> dict[str, Any]:
    return {key: {k: str(v) for k, v in value.items()}
            for key, value in spec.resources.model_dump().items() if value}


def _validator_inits(policy: ClusterPolicy, image: str, pull: str) -> list[dict[str, Any]]:
    spec = policy.spec.validator
    inits = []
    for component in VALIDATIONS:
        env = [_node_name_env(), *_env([*spec.env, *getattr(spec, component).env]),
               {"name": "MIG_STRATEGY", "value": policy.spec.mig.strategy}]
        args = _backend([NVML_BACKEND, f"--output-dir={VALIDATIONS_DIR}"], policy)
        if component == "driver":
            args.append("--wait")
        mounts = [{"name": "run-nvidia-validations", "mountPath": VALIDATIONS_DIR,
                   "mountPropagation": "Bidirectional"}]
        sim = _sim_volume(policy)
        if sim:
            mounts.append(sim[1])
        inits.append({
            "name": f"{component}-validation", "image": image, "imagePullPolicy": pull,
            "command": ["kubegpu", "validate", component], "args": args, "env": env,
            "securityContext": {"privileged": True, "runAsUser": 0}, "volumeMounts": mounts,
        })
    return inits


AVAILABLE_CONFIGS = "/available-configs"  # the devicePlugin.config ConfigMap, one file per key
SELECTED_CONFIG_DIR = "/config"  # an emptyDir the config-manager links the node's selected config into
SELECTED_CONFIG = f"{SELECTED_CONFIG_DIR}/config.yaml"
CONFIG_FALLBACKS = "named,single,empty"  # NVIDIA chart's named,single; then the plugin's defaults, never a crash


def _per_node_config(policy: ClusterPolicy, op: Operand) -> bool:
    return op.per_node_config and bool(policy.spec.devicePlugin.config.name)


def _config_manager(policy: ClusterPolicy, op: Operand, image: str, pull: str, oneshot: bool) -> dict[str, Any]:
    """NVIDIA config-manager's container (init: `--oneshot`; sidecar: follows the label). It links the config
    the node's `nvidia.com/device-plugin.config` label selects to SELECTED_CONFIG; the operand watches that file."""
    ref = policy.spec.devicePlugin.config
    return {
        "name": "config-manager-init" if oneshot else "config-manager",
        "image": image, "imagePullPolicy": pull,
        "command": ["kubegpu", "config-manager"],
        "env": [_node_name_env(), *_env([
            ("ONESHOT", "true" if oneshot else "false"), ("NODE_LABEL", CONFIG_LABEL),
            ("CONFIG_FILE_SRCDIR", AVAILABLE_CONFIGS), ("CONFIG_FILE_DST", SELECTED_CONFIG),
            ("DEFAULT_CONFIG", ref.default), ("FALLBACK_STRATEGIES", CONFIG_FALLBACKS)])],
        "volumeMounts": [{"name": "available-configs", "mountPath": AVAILABLE_CONFIGS, "readOnly": True},
                         {"name": "config", "mountPath": SELECTED_CONFIG_DIR}],
        "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
    }


NVML_BACKEND = "--gpu-backend=nvml"


def _backend(args: Sequence[str], policy: ClusterPolicy) -> list[str]:
    """The components' `--gpu-backend=nvml` as the policy's `gpuBackend` says (nvml, or a simulated node)."""
    return [f"--gpu-backend={policy.spec.gpuBackend}" if a == NVML_BACKEND else a for a in args]


def _sim_volume(policy: ClusterPolicy) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """With `gpuBackend: sim:PATH`, PATH's directory (the node file, its lock and its stand-in device nodes) at
    the same path in every container that reads the simulated node: the paths in its CDI specs stay host paths."""
    if not policy.spec.gpuBackend.startswith("sim:"):
        return None
    directory = str(PurePosixPath(policy.spec.gpuBackend.removeprefix("sim:")).parent)
    return ({"name": "gpu-sim", "hostPath": {"path": directory, "type": "Directory"}},
            {"name": "gpu-sim", "mountPath": directory})


def _container_args(policy: ClusterPolicy, op: Operand) -> list[str]:
    args = _backend(op.args, policy)
    spec = policy.spec
    if op.component in ("device-plugin", "gpu-feature-discovery"):
        args.append(f"--mig-strategy={spec.mig.strategy}")
    if _per_node_config(policy, op):
        args.append(f"--config-file={SELECTED_CONFIG}")
    if op.component == "mig-manager" and spec.migManager.config.name:
        args.append("--config-file=/etc/kubegpu/mig-parted/config.yaml")
    if op.component == "dcgm-exporter" and spec.dcgmExporter.config.name:
        args.append("--collectors=/etc/kubegpu/exporter/metrics.csv")
    if op.component == "partitioner":
        args.append("--lease-namespace={namespace}")
    if op.component == "quota":
        args.append("--namespace={namespace}")
    return args + list(block(policy, op.block).args)


def _config_volumes(policy: ClusterPolicy, op: Operand) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(volumes, the operand container's mounts) for its config files."""
    spec = policy.spec
    if _per_node_config(policy, op):
        return ([{"name": "available-configs", "configMap": {"name": spec.devicePlugin.config.name}},
                 {"name": "config", "emptyDir": {}}],
                [{"name": "available-configs", "mountPath": AVAILABLE_CONFIGS, "readOnly": True},  # link targets
                 {"name": "config", "mountPath": SELECTED_CONFIG_DIR, "readOnly": True}])
    ref = {"mig-manager": spec.migManager.config.name, "dcgm-exporter": spec.dcgmExporter.config.name}.get(op.component)
    if not ref:
        return [], []
    mount = {"mig-manager": "/etc/kubegpu/mig-parted", "dcgm-exporter": "/etc/kubegpu/exporter"}[op.component]
    return ([{"name": "config", "configMap": {"name": ref}}],
            [{"name": "config", "mountPath": mount, "readOnly": True}])


def _mps_volumes(policy: ClusterPolicy) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The MPS daemon's root at its host path (the device plugin mounts the same host paths into MPS pods) and
    its /dev/shm shared with those pods (`<root>/shm`, as the plugin mounts it)."""
    root = policy.spec.devicePlugin.mps.root.rstrip("/") or "/"
    return ([{"name": "mps-root", "hostPath": {"path": root, "type": "DirectoryOrCreate"}},
             {"name": "mps-shm", "hostPath": {"path": f"{root}/shm", "type": "DirectoryOrCreate"}}],
            [{"name": "mps-root", "mountPath": root}, {"name": "mps-shm", "mountPath": "/dev/shm"}])


def workload(policy: ClusterPolicy, op: Operand, namespace: str) -> dict[str, Any]:
    """The DaemonSet or Deployment of one operand."""
    spec = block(policy, op.block)
    image, pull = spec.image_ref(), spec.imagePullPolicy
    ds = policy.spec.daemonsets
    container: dict[str, Any] = {"name": op.component, "image": image, "imagePullPolicy": pull}
    if op.command:
        container["command"] = list(op.command)
    args = [a.replace("{namespace}", namespace) for a in _container_args(policy, op)]
    if args:
        container["args"] = args
    defaults = list(op.env)
    if op.component in ("device-plugin", "mps-control-daemon", "gpu-feature-discovery"):
        # every reader of the device-plugin config: an MPS config is refused without its root (found on the real
        # node: feature discovery could not label an MPS node, so the MPS daemon never got scheduled)
        defaults.append(("MPS_ROOT", policy.spec.devicePlugin.mps.root))
    env = [_node_name_env(), *_env([*defaults, *spec.env])]
    if op.component in ("device-plugin", "gpu-feature-discovery", "mig-manager"):
        env.append({"name": "MIG_STRATEGY", "value": policy.spec.mig.strategy})
    if op.component == "container-toolkit":
        env += [{"name": "RUNTIME", "value": policy.spec.operator.defaultRuntime},
                {"name": "CONTAINERD_RUNTIME_CLASS", "value": policy.spec.operator.runtimeClass}]
    container["env"] = env
    container["securityContext"] = _security(op)
    resources = _resources(spec)
    if resources:
        container["resources"] = resources
    if op.port:
        container["ports"] = [{"name": "metrics", "containerPort": op.port}]
        if op.ready_path:
            container["readinessProbe"] = {"httpGet": {"path": op.ready_path, "port": "metrics"}, "periodSeconds": 10}
    if op.component == "operator-validator":
        container["lifecycle"] = {"preStop": {"exec": {"command": ["sh", "-c", f"rm -f {VALIDATIONS_DIR}/*-ready"]}}}
    mounts = [{"name": h.name, "mountPath": h.mount_path, **({"mountPropagation": h.propagation} if h.propagation
                                                              else {})} for h in op.host_paths]
    volumes: list[dict[str, Any]] = [{"name": h.name, "hostPath": {"path": h.path, "type": "DirectoryOrCreate"}}
                                     for h in op.host_paths]
    if op.waits_for and not any(v["name"] == "run-nvidia-validations" for v in volumes):
        volumes.append({"name": "run-nvidia-validations",  # for the init container's barrier wait only
                        "hostPath": {"path": VALIDATIONS_DIR, "type": "DirectoryOrCreate"}})
    for extra_volumes, extra_mounts in (_config_volumes(policy, op),
                                        _mps_volumes(policy) if op.component == "mps-control-daemon" else ([], [])):
        volumes += extra_volumes
        mounts += extra_mounts
    sim = _sim_volume(policy)
    if sim and (NVML_BACKEND in op.args or op.component == "operator-validator"):
        volumes.append(sim[0])
        if NVML_BACKEND in op.args:
            mounts.append(sim[1])
    if mounts:
        container["volumeMounts"] = mounts
    pod: dict[str, Any] = {"serviceAccountName": op.name, "containers": [container]}
    if _per_node_config(policy, op):
        pod["containers"].append(_config_manager(policy, op, image, pull, oneshot=False))
    if not op.cluster_rules and not op.namespace_rules:
        pod["automountServiceAccountToken"] = False  # no API access: no token on the node
    inits: list[dict[str, Any]] = []
    if op.waits_for:
        ours = policy.spec.validator
        inits.append(_wait_container(ours.image_ref(), ours.imagePullPolicy, op.waits_for))
    if _per_node_config(policy, op):
        inits.append(_config_manager(policy, op, image, pull, oneshot=True))  # the operand starts on its config
    if op.component == "operator-validator":
        inits += _validator_inits(policy, image, pull)
    if inits:
        pod["initContainers"] = inits
    if volumes:
        pod["volumes"] = volumes
    if op.host_pid:
        pod["hostPID"] = True
    secrets = spec.imagePullSecrets
    if secrets:
        pod["imagePullSecrets"] = [{"name": s} for s in secrets]
    tolerations = [t.model_dump(exclude_none=True) for t in [*ds.tolerations, *spec.tolerations]]
    if tolerations:
        pod["tolerations"] = tolerations
    selector = {NAME_LABEL: "kubegpu", COMPONENT_LABEL: op.component}
    template_meta: dict[str, Any] = {"labels": {**ds.labels, **labels(op.component, op.state)}}
    if op.app:
        template_meta["labels"]["app"] = op.app
    if op.kind == "Deployment":
        pod["securityContext"] = {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}}
        body: dict[str, Any] = {"replicas": 1, "selector": {"matchLabels": selector}}
    else:
        pod["nodeSelector"] = {op.deploy_label: "true", **dict(op.node_selector)}
        pod["priorityClassName"] = ds.priorityClassName
        strategy: dict[str, Any] = {"type": ds.updateStrategy}
        if ds.updateStrategy == "RollingUpdate":
            unavailable = ds.maxUnavailable
            if isinstance(unavailable, str) and unavailable.isdigit():
                unavailable = int(unavailable)  # the API server takes a string only as a percentage
            strategy["rollingUpdate"] = {"maxUnavailable": unavailable}
        body = {"selector": {"matchLabels": selector}, "updateStrategy": strategy}
        if ds.annotations:
            template_meta["annotations"] = dict(ds.annotations)
        if op.component == "driver":
            # pods stamped with the template they run; under autoUpgrade the upgrade state machine, not the
            # DaemonSet controller, replaces them (OnDelete), one node at a time
            template_meta.setdefault("annotations", {})[DRIVER_HASH] = driver_template_hash(policy)
            if policy.spec.driver.upgradePolicy.autoUpgrade:
                body["updateStrategy"] = {"type": "OnDelete"}
    body["template"] = {"metadata": template_meta, "spec": pod}
    return {"apiVersion": "apps/v1", "kind": op.kind, "metadata": _meta(op.name, op.component, op.state, namespace),
            "spec": body}


def rbac(op: Operand, namespace: str) -> list[dict[str, Any]]:
    """ServiceAccount plus only the rules the component uses (no wildcards, no cluster-admin)."""
    objects: list[dict[str, Any]] = [{"apiVersion": "v1", "kind": "ServiceAccount",
                                      "metadata": _meta(op.name, op.component, op.state, namespace)}]
    subject = [{"kind": "ServiceAccount", "name": op.name, "namespace": namespace}]
    group = "rbac.authorization.k8s.io"
    if op.cluster_rules:
        objects += [
            {"apiVersion": f"{group}/v1", "kind": "ClusterRole", "metadata": _meta(op.name, op.component, op.state),
             "rules": [dict(r) for r in op.cluster_rules]},
            {"apiVersion": f"{group}/v1", "kind": "ClusterRoleBinding",
             "metadata": _meta(op.name, op.component, op.state),
             "roleRef": {"apiGroup": group, "kind": "ClusterRole", "name": op.name}, "subjects": subject},
        ]
    if op.namespace_rules:
        objects += [
            {"apiVersion": f"{group}/v1", "kind": "Role", "metadata": _meta(op.name, op.component, op.state, namespace),
             "rules": [dict(r) for r in op.namespace_rules]},
            {"apiVersion": f"{group}/v1", "kind": "RoleBinding",
             "metadata": _meta(op.name, op.component, op.state, namespace),
             "roleRef": {"apiGroup": group, "kind": "Role", "name": op.name}, "subjects": subject},
        ]
    return objects


def _exporter_extras(policy: ClusterPolicy, op: Operand, namespace: str) -> list[dict[str, Any]]:
    selector = {NAME_LABEL: "kubegpu", COMPONENT_LABEL: op.component}
    objects: list[dict[str, Any]] = [{
        "apiVersion": "v1", "kind": "Service", "metadata": _meta(op.name, op.component, op.state, namespace),
        "spec": {"selector": selector, "internalTrafficPolicy": "Local",
                 "ports": [{"name": "metrics", "port": op.port or 9400, "targetPort": "metrics"}]},
    }]
    monitor = policy.spec.dcgmExporter.serviceMonitor
    if op.component == "dcgm-exporter" and monitor.enabled:
        meta = _meta(op.name, op.component, op.state, namespace)
        meta["labels"].update(monitor.additionalLabels)
        endpoint: dict[str, Any] = {"port": "metrics", "path": "/metrics", "interval": monitor.interval,
                                    "honorLabels": monitor.honorLabels}
        if monitor.relabelings:
            endpoint["relabelings"] = monitor.relabelings
        objects.append({"apiVersion": "monitoring.coreos.com/v1", "kind": "ServiceMonitor", "metadata": meta,
                        "spec": {"selector": {"matchLabels": selector}, "endpoints": [endpoint]}})
    return objects


NODE_AGENT_POLICY = "kubegpu-node-agents-own-node"
OWN_NODE_RULE = {
    "expression": "'authentication.kubernetes.io/node-name' in request.userInfo.extra && "
                  "request.name == request.userInfo.extra['authentication.kubernetes.io/node-name'][0]",
    "message": "a kubegpu node agent may change only the Node it runs on",
    "reason": "Forbidden",
}


def node_agent_users(namespace: str) -> list[str]:
    """The node agents (DaemonSets) whose role may write Nodes: RBAC cannot keep them to their own Node."""
    def writes_nodes(rule: dict[str, Any]) -> bool:
        return "" in rule["apiGroups"] and "patch" in rule["verbs"] and bool({"nodes", "nodes/status"}
                                                                              & set(rule["resources"]))
    return [f"system:serviceaccount:{namespace}:{op.name}" for op in OPERANDS
            if op.kind == "DaemonSet" and any(writes_nodes(r) for r in op.cluster_rules)]


def node_agent_policy(namespace: str, state: str) -> list[dict[str, Any]]:
    """deploy/kubernetes/policies/node-agents-own-node.yaml for the operator's operands: a Node write by a node
    agent is denied unless it targets the Node its token is bound to (docs/security.md; Kubernetes 1.30+)."""
    users = ", ".join(f"'{user}'" for user in node_agent_users(namespace))
    group = "admissionregistration.k8s.io/v1"
    return [
        {"apiVersion": group, "kind": "ValidatingAdmissionPolicy",
         "metadata": _meta(NODE_AGENT_POLICY, "operator", state),
         "spec": {"failurePolicy": "Fail",
                  "matchConstraints": {"resourceRules": [{"apiGroups": [""], "apiVersions": ["v1"],
                                                          "operations": ["UPDATE", "DELETE"],
                                                          "resources": ["nodes", "nodes/status"]}]},
                  "matchConditions": [{"name": "kubegpu-node-agent",
                                       "expression": f"request.userInfo.username in [{users}]"}],
                  "validations": [dict(OWN_NODE_RULE)]}},
        {"apiVersion": group, "kind": "ValidatingAdmissionPolicyBinding",
         "metadata": _meta(NODE_AGENT_POLICY, "operator", state),
         "spec": {"policyName": NODE_AGENT_POLICY, "validationActions": ["Deny"]}},
    ]


def state_objects(policy: ClusterPolicy, state: str, namespace: str,
                  gpu_nodes: Sequence[Mapping[str, str]] = (),
                  nodepools: Sequence[Mapping[str, Any]] = ()) -> list[dict[str, Any]]:
    """Objects of one state, in the GPU Operator's file order (ServiceAccount → RBAC → workload → Service)."""
    if state == "pre-requisites":
        return [{"apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass",
                 "metadata": _meta(policy.spec.operator.runtimeClass, "operator", state),
                 "handler": policy.spec.operator.runtimeClass}, *node_agent_policy(namespace, state)]
    if state == "state-operator-metrics":
        return [{"apiVersion": "v1", "kind": "Service",
                 "metadata": _meta("kubegpu-operator-metrics", "operator", state, namespace),
                 "spec": {"selector": {NAME_LABEL: "kubegpu", COMPONENT_LABEL: "operator"},
                          "ports": [{"name": "metrics", "port": 8080, "targetPort": 8080}]}}]
    objects: list[dict[str, Any]] = []
    if state == "state-quota" and policy.spec.quota.enabled:
        objects += quota_objects(policy, namespace, state, gpu_nodes, nodepools)
    for op in OPERANDS:
        if op.state != state or not enabled(policy, op):
            continue
        objects += rbac(op, namespace)
        objects.append(workload(policy, op, namespace))
        if op.port:
            objects += _exporter_extras(policy, op, namespace)
    return objects


def quota_objects(policy: ClusterPolicy, namespace: str, state: str, gpu_nodes: Sequence[Mapping[str, str]] = (),
                  nodepools: Sequence[Mapping[str, Any]] = ()) -> list[dict[str, Any]]:
    """The charge table (from `spec.quota`, the nodes' labels and the GPUs the cluster's NodePools may launch) and the
    admission policies of deploy/kubernetes/quota, in this namespace."""
    from kubegpu.quota.policy import charge_policies, claim_gate_policies, gate_policies, table_configmap
    from kubegpu.sharing.charges import ChargeTable

    spec = policy.spec.quota
    table = ChargeTable.for_cluster(spec.gpuModels, gpu_nodes, dict(spec.replicas),  # gpu_nodes: their labels
                                    pools=nodepools)
    objects = [table_configmap(table, namespace), *charge_policies(namespace), *gate_policies(),
               *claim_gate_policies(namespace)]
    for obj in objects:
        obj["metadata"]["labels"] = {**obj["metadata"].get("labels", {}), **labels("quota", state)}
    return objects


def state_enabled(policy: ClusterPolicy, state: str) -> bool:
    ops = [op for op in OPERANDS if op.state == state]
    return not ops or any(enabled(policy, op) for op in ops)


def owner_reference(policy: ClusterPolicy) -> dict[str, Any] | None:
    uid = (policy.metadata.model_extra or {}).get("uid")
    if not uid:
        return None
    return {"apiVersion": API_VERSION, "kind": KIND, "name": policy.name, "uid": uid, "controller": True,
            "blockOwnerDeletion": True}


def render(policy: ClusterPolicy, namespace: str = DEFAULT_NAMESPACE, gpu_nodes: Sequence[Mapping[str, str]] = (),
           nodepools: Sequence[Mapping[str, Any]] = ()) -> list[tuple[str, list[dict[str, Any]]]]:
    """(state, objects) for every state in order; a disabled state has no objects (the controller deletes them).
    `gpu_nodes` (the nodes' labels) and `nodepools` (kubegpu's and Karpenter's) feed the quota's charge table."""
    owner = owner_reference(policy)
    out = []
    for state in STATES:
        objects = state_objects(policy, state, namespace, gpu_nodes, nodepools)
        for obj in objects:
            obj["metadata"]["labels"][OWNER_LABEL] = policy.name
            if owner is not None:
                obj["metadata"]["ownerReferences"] = [dict(owner)]
        out.append((state, objects))
    return out


def to_yaml(objects: list[dict[str, Any]]) -> str:
    return "".join("---\n" + yaml.safe_dump(obj, sort_keys=False, width=120) for obj in objects)


def file_name(index: int, obj: dict[str, Any]) -> str:
    """`-o DIR` file names: apply order first, then kind and name (stable across runs)."""
    return f"{index:04d}-{obj['kind'].lower()}-{obj['metadata']['name']}.yaml"
