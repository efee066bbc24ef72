"""The quota controller's Deployment and RBAC (one place for the plain manifests, the operator and the chart)."""

from __future__ import annotations

from typing import Any

from kubegpu.quota.policy import LABELS, NAMESPACE, SERVICE_ACCOUNT, TABLE_NAME

NAME = SERVICE_ACCOUNT
METRICS_PORT = 8084
IMAGE = "ghcr.io/kubegpu/kubegpu:0.1.0"


def controller_objects(namespace: str = NAMESPACE, image: str = IMAGE, replicas: int = 1) -> list[dict[str, Any]]:
    """ServiceAccount, ClusterRole (+binding) and the Deployment running `kubegpu quota controller`."""
    labels = {**LABELS, "app.kubernetes.io/name": NAME}
    rules = [
        # pods: lift gates; create the charge holders of ResourceClaims (docs/quotas.md); pods/status: why one waits
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch", "create", "patch", "update"]},
        {"apiGroups": [""], "resources": ["pods/status"], "verbs": ["patch"]},
        {"apiGroups": [""], "resources": ["pods/eviction"], "verbs": ["create"]},
        {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "watch"]},
        {"apiGroups": ["", "events.k8s.io"], "resources": ["events"], "verbs": ["create", "patch"]},
        {"apiGroups": ["kubegpu.io"], "resources": ["elasticquotas"], "verbs": ["get", "list", "watch"]},
        {"apiGroups": ["resource.k8s.io"], "resources": ["resourceclaims", "resourceclaimtemplates", "deviceclasses"],
         "verbs": ["list", "watch"]},
        {"apiGroups": ["kubegpu.io"], "resources": ["elasticquotas/status"], "verbs": ["get", "patch", "update"]},
        # the charge table (claims pay as the admission policy charges whole GPUs)
        {"apiGroups": [""], "resources": ["configmaps"], "resourceNames": [TABLE_NAME], "verbs": ["get"]},
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["get", "create", "update"]},
    ]
    container = {
        "name": "quota", "image": image, "args": ["quota", "controller", "--leader-elect", f"--namespace={namespace}",
                                                   f"--metrics-address=:{METRICS_PORT}"],
        "ports": [{"name": "metrics", "containerPort": METRICS_PORT}],
        # /readyz: 503 while the informers' watches are broken too long to trust (the controller does not act)
        "readinessProbe": {"httpGet": {"path": "/readyz", "port": "metrics"}, "periodSeconds": 10},
        "env": [{"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}],
        "resources": {"requests": {"cpu": "50m", "memory": "128Mi"}, "limits": {"memory": "512Mi"}},
        "securityContext": {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                            "runAsNonRoot": True, "capabilities": {"drop": ["ALL"]}},
    }
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": NAME, "namespace": namespace,
                                                                   "labels": labels}},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
         "metadata": {"name": NAME, "labels": labels}, "rules": rules},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
         "metadata": {"name": NAME, "labels": labels},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": NAME},
         "subjects": [{"kind": "ServiceAccount", "name": NAME, "namespace": namespace}]},
        {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": NAME, "namespace": namespace,
                                                                    "labels": labels},
         "spec": {"replicas": replicas, "selector": {"matchLabels": {"app.kubernetes.io/name": NAME}},
                  "template": {"metadata": {"labels": labels},
                               "spec": {"serviceAccountName": NAME, "containers": [container]}}}},
    ]
