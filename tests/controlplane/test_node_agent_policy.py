"""deploy/kubernetes/policies on the real API server: a node agent's ServiceAccount may patch its own Node only.

The shipped manifests give `kubegpu-discover` (like the MIG manager and partition agent) `patch` on nodes, which
RBAC cannot narrow to one Node. The ValidatingAdmissionPolicy does, from the node name the API server puts in the
user info of a token bound to a Node (`authentication.kubernetes.io/node-name`), as it is for a pod's token on that
node. Here: the shipped RBAC and policy applied, a token for the agent's account bound to one Node, then a patch of
that Node (allowed) and of another (denied with the policy's message).
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import lightkube
import pytest
import yaml
from lightkube.models.authentication_v1 import BoundObjectReference, TokenRequestSpec
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Node, ServiceAccount

from kubegpu.testing.session import RealCluster, wait_for
from tests.controlplane.conftest import SHIPPED_NAMESPACE, shipped_objects, token_client

ROOT = Path(__file__).resolve().parents[2]
MANIFEST = ROOT / "deploy/kubernetes/manifests/discover.yaml"
POLICIES = ROOT / "deploy/kubernetes/policies/node-agents-own-node.yaml"
NAMESPACE = SHIPPED_NAMESPACE  # the policy names the agents' accounts in the namespace the manifests install into
ACCOUNT = "kubegpu-discover"
DENIED = "a kubegpu node agent may change only the Node it runs on"


def _shipped_objects() -> list[dict[str, Any]]:
    """The discover agent's ServiceAccount and RBAC as shipped (not its DaemonSet), then the policy and binding."""
    rbac = [d for d in yaml.safe_load_all(MANIFEST.read_text())
            if d and d["kind"] in ("ServiceAccount", "ClusterRole", "ClusterRoleBinding")]
    policies = [d for d in yaml.safe_load_all(POLICIES.read_text()) if d]
    for policy in policies:  # as `kubectl apply -k` sends them from kustomize before #6056: the server drops it
        policy["metadata"]["namespace"] = NAMESPACE
    return rbac + policies


@pytest.fixture
def shipped(real_cluster: RealCluster) -> Iterator[lightkube.Client]:
    with shipped_objects(real_cluster, _shipped_objects()) as admin:
        yield admin


def _agent_client(real_cluster: RealCluster, admin: lightkube.Client, node: Node) -> lightkube.Client:
    """A client holding the agent account's token bound to `node`, as the kubelet gives its pod on that node."""
    request = ServiceAccount.Token(metadata=ObjectMeta(name=ACCOUNT, namespace=NAMESPACE), spec=TokenRequestSpec(
        audiences=[], expirationSeconds=600,
        boundObjectRef=BoundObjectReference(kind="Node", apiVersion="v1", name=node.metadata.name,
                                            uid=node.metadata.uid)))
    token = admin.create(request, ACCOUNT, namespace=NAMESPACE).status.token
    return token_client(real_cluster, token, "agent")


def _relabel(client: lightkube.Client, name: str) -> str | None:
    """None when the patch went through, else the API server's message."""
    try:
        client.patch(Node, name, {"metadata": {"labels": {"kubegpu.io/policy-test": uuid.uuid4().hex[:8]}}})
    except lightkube.ApiError as exc:
        return exc.status.message or str(exc.status.code)
    return None


def test_node_agent_may_patch_only_its_own_node(real_cluster: RealCluster, shipped: lightkube.Client) -> None:
    suffix = uuid.uuid4().hex[:5]
    own, other = (shipped.create(Node(metadata=ObjectMeta(name=f"{role}-{suffix}"))) for role in ("own", "other"))
    try:
        agent = _agent_client(real_cluster, shipped, own)
        # the policy takes effect once the API server has loaded it: wait until the other Node is refused
        message = wait_for(lambda: _relabel(agent, other.metadata.name), "the policy to refuse another Node",
                           timeout=20, interval=0.3)
        assert DENIED in message
        assert _relabel(agent, own.metadata.name) is None  # its own Node: allowed, the RBAC grant still works
        assert DENIED in (_relabel(agent, other.metadata.name) or "")
    finally:
        for node in (own, other):
            with contextlib.suppress(lightkube.ApiError):
                shipped.delete(Node, node.metadata.name)
