"""The operator's watches find the API server the way client-go's in-cluster config does (the pod's environment),
not through `kubernetes.default.svc`, which needs the cluster's DNS (seen on the real node: every kopf watch failed
with a DNS error while the operator's own lightkube passes worked)."""

from __future__ import annotations

from kubegpu.operator.controller import in_cluster_server

DEFAULT = "https://kubernetes.default.svc"


def test_the_service_environment_wins() -> None:
    env = {"KUBERNETES_SERVICE_HOST": "10.0.0.1", "KUBERNETES_SERVICE_PORT": "443"}
    assert in_cluster_server(env, DEFAULT) == "https://10.0.0.1:443"
    assert in_cluster_server({"KUBERNETES_SERVICE_HOST": "fd00::1", "KUBERNETES_SERVICE_PORT": "6443"}, DEFAULT) == \
        "https://[fd00::1]:6443"


def test_without_it_kopfs_default_stays() -> None:
    assert in_cluster_server({}, DEFAULT) == DEFAULT
    assert in_cluster_server({"KUBERNETES_SERVICE_HOST": "10.0.0.1"}, DEFAULT) == DEFAULT
