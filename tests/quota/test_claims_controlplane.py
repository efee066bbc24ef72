"""ResourceClaims charged in `kubegpu.io/gpu-memory` on the real control plane: the parameterless claim gate holds
every pod with claims, the quota controller creates charge holders the API server's ResourceQuota plugin admits or
refuses, lifts the gate of charged pods only, keeps an over-quota pod gated with a condition, lets it through when a
deletion frees the charge (the garbage collector takes the holder with its pod), and no one else — an impersonated
user with pod update and delete rights — can lift a gate or remove a holder; the controller's ServiceAccount can."""

from __future__ import annotations

import json
import ssl
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from kubegpu.dra.classes import shipped_class_objects
from kubegpu.kube.errors import NotFound
from kubegpu.quota.claims import HOLDER_LABEL
from kubegpu.quota.controller import QuotaController
from kubegpu.quota.holders import CONDITION, EXCEEDED, has_claim_gate
from kubegpu.quota.policy import controller_user
from kubegpu.testing.session import RealCluster, wait_for
from tests.quota.apply import apply_all, remove_all, shipped, until_admitted

MEMORY = "kubegpu.io/gpu-memory"
SLOW = 30.0
MIG_40 = "device.attributes['gpu.nvidia.com'].profile == '3g.40gb'"


@pytest.fixture(scope="module")
def claim_policies(real_cluster: RealCluster) -> Iterator[None]:
    """The shipped policies and the controller's ServiceAccount and RBAC (not its Deployment: the test drives it),
    and the shipped DeviceClasses (left in place: other tests' claims use them too)."""
    client = real_cluster.client()
    apply_all(client, shipped_class_objects())
    objects = shipped(("00", "10", "20", "30", "45")) + [o for o in shipped(("50",)) if o["kind"] != "Deployment"]
    applied = apply_all(client, objects)
    try:
        yield
    finally:
        remove_all(client, applied)


def _pod(namespace: str, name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": namespace},
            "spec": {"resourceClaims": [{"name": "mig", "resourceClaimTemplateName": "mig-40"}],
                     "containers": [{"name": "main", "image": "busybox",
                                     "resources": {"claims": [{"name": "mig"}]}}]}}


def _as(real: RealCluster, user: str, method: str, path: str, body: object = None) -> tuple[int, str]:
    """A request to the API server made as `user` (the admin impersonating it): (status, body). A body is a JSON
    patch, or an object for a POST."""
    pki = real.plane.directory / "pki"
    context = ssl.create_default_context(cafile=str(pki / "ca.crt"))
    context.load_cert_chain(str(pki / "admin.crt"), str(pki / "admin.key"))
    request = urllib.request.Request(real.server + path, method=method,
                                     data=None if body is None else json.dumps(body).encode(),
                                     headers={"Impersonate-User": user, "Impersonate-Group": "system:serviceaccounts",
                                              "Content-Type": "application/json" if method == "POST"
                                              else "application/json-patch+json"})
    try:
        with urllib.request.urlopen(request, context=context, timeout=10) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def _condition(pod: dict[str, Any]) -> dict[str, Any] | None:
    return next((c for c in (pod.get("status") or {}).get("conditions") or () if c.get("type") == CONDITION), None)


def test_claims_charged_through_resource_quota_gate_held_until_charged(real_cluster: RealCluster,
                                                                       claim_policies: None) -> None:
    admin = real_cluster.admin
    namespace = real_cluster.create_namespace("claims")
    controller = QuotaController(real_cluster.cluster(), leader_elect=False)
    try:
        create = admin.client.create
        create(_codec({"apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": "gpu", "namespace": namespace},
                      "spec": {"hard": {f"requests.{MEMORY}": "100Gi"}}}))
        create(_codec({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
                      "metadata": {"name": "mig-40", "namespace": namespace},
                      "spec": {"spec": {"devices": {"requests": [{"name": "mig", "exactly": {
                          "deviceClassName": "mig.nvidia.com", "selectors": [{"cel": {"expression": MIG_40}}]}}]}}}}))
        # a user allowed to update and delete pods in the namespace (what the guards must still refuse)
        create(_codec({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
                      "metadata": {"name": "pods", "namespace": namespace},
                      "rules": [{"apiGroups": [""], "resources": ["pods"],
                                 "verbs": ["get", "list", "patch", "update", "delete"]},
                                {"apiGroups": [""], "resources": ["pods/eviction"], "verbs": ["create"]}]}))
        create(_codec({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
                      "metadata": {"name": "pods", "namespace": namespace},
                      "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "pods"},
                      "subjects": [{"kind": "ServiceAccount", "name": "default", "namespace": namespace}]}))
        wait_for(lambda: _quota(admin, namespace).get("hard"),
                 "the ResourceQuota's status (the plugin admits nothing against a quota it has not synced)", SLOW)
        # the gate policy takes effect once the API server's policy informer has it: a dry run shows when
        wait_for(lambda: has_claim_gate(until_admitted(lambda: admin.client.create(
            _codec(_pod(namespace, "probe")), dry_run=True).to_dict()) or {}), "the claim gate in effect", SLOW)

        for index in range(3):
            created = admin.create(_pod(namespace, f"p{index}"))
            assert has_claim_gate(created)

        def settled() -> bool:
            controller.tick(time.time())
            pods = {n: admin.get("Pod", n, namespace) for n in ("p0", "p1", "p2")}
            lifted = [n for n, p in pods.items() if not has_claim_gate(p)]
            waiting = [n for n, p in pods.items() if (_condition(p) or {}).get("reason") == EXCEEDED]
            return len(lifted) == 2 and len(waiting) == 1

        wait_for(settled, "two claim pods charged and let through, the third held for quota", SLOW)
        pods = {n: admin.get("Pod", n, namespace) for n in ("p0", "p1", "p2")}
        [blocked] = [n for n, p in pods.items() if has_claim_gate(p)]
        condition = _condition(pods[blocked]) or {}
        assert condition["status"] == "False" and "exceeded quota: gpu" in condition["message"]
        holders = admin.list("Pod", namespace, label_selector=HOLDER_LABEL)
        assert sorted(h["spec"]["containers"][0]["resources"]["requests"][MEMORY] for h in holders) == ["40Gi"] * 2
        assert all(has_claim_gate(h) and not h["spec"].get("nodeName") for h in holders)
        used = _quota(admin, namespace)["used"][f"requests.{MEMORY}"]
        assert used == "80Gi"
        assert any(e.get("reason") == EXCEEDED and e["involvedObject"]["name"] == blocked
                   for e in admin.list("Event", namespace=namespace))

        # a user with pod update and delete rights can neither lift the gate nor give a charge back
        user = f"system:serviceaccount:{namespace}:default"
        lift = [{"op": "remove", "path": "/spec/schedulingGates"}]
        status, text = _as(real_cluster, user, "PATCH", f"/api/v1/namespaces/{namespace}/pods/{blocked}", lift)
        assert status == 403 and "only the quota controller" in text, text
        holder = holders[0]["metadata"]["name"]
        status, text = _as(real_cluster, user, "DELETE", f"/api/v1/namespaces/{namespace}/pods/{holder}")
        assert status == 403 and "holds a GPU-memory charge" in text, text
        eviction = {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": holder, "namespace": namespace}}
        status, text = _as(real_cluster, user, "POST", f"/api/v1/namespaces/{namespace}/pods/{holder}/eviction",
                           eviction)   # an eviction deletes the pod without a pod DELETE admission
        assert status == 403 and "holds a GPU-memory charge" in text, text
        assert has_claim_gate(admin.get("Pod", blocked, namespace))

        # deleting a charged pod: the garbage collector removes its holder, the quota frees, the third goes through
        charged = next(n for n in ("p0", "p1", "p2") if n != blocked)
        owner_of = {h["metadata"]["name"]: h["metadata"]["ownerReferences"][0]["name"] for h in holders}
        admin.delete("Pod", charged, namespace)
        gone = next(h for h, owner in owner_of.items() if owner == charged)
        wait_for(lambda: _missing(admin, gone, namespace), "the deleted pod's holder collected", SLOW)
        wait_for(lambda: controller.tick(time.time()).claims and not has_claim_gate(
            admin.get("Pod", blocked, namespace)), "the waiting claim pod charged and let through", SLOW)
        assert (_condition(admin.get("Pod", blocked, namespace)) or {}).get("status") == "True"

        # the controller's own ServiceAccount may lift a gate (the guard names it)
        extra = admin.create(_pod(namespace, "p3"))
        status, text = _as(real_cluster, controller_user(), "PATCH",
                           f"/api/v1/namespaces/{namespace}/pods/{extra['metadata']['name']}", lift)
        assert status == 200, text
        # the garbage collector under its own ServiceAccount (--use-service-account-credentials) may remove a holder
        remaining = admin.list("Pod", namespace, label_selector=HOLDER_LABEL)[0]["metadata"]["name"]
        status, text = _as(real_cluster, "system:serviceaccount:kube-system:generic-garbage-collector", "DELETE",
                           f"/api/v1/namespaces/{namespace}/pods/{remaining}")
        assert status == 200, text
    finally:
        controller.close()
        real_cluster.delete_namespace(namespace)


def _codec(data: dict[str, Any]) -> Any:
    from lightkube import codecs

    return codecs.from_dict(data)


def _quota(admin: Any, namespace: str) -> dict[str, Any]:
    from lightkube.resources.core_v1 import ResourceQuota

    return admin.client.get(ResourceQuota, "gpu", namespace=namespace).to_dict().get("status") or {}


def _missing(admin: Any, name: str, namespace: str) -> bool:
    try:
        admin.get("Pod", name, namespace)
    except NotFound:
        return True
    return False


def test_the_controller_serves_metrics_and_readiness_from_its_informers(real_cluster: RealCluster,
                                                                        claim_policies: None) -> None:
    """`kubegpu quota controller --metrics-address`: /readyz answers 200 once its informers are synced (the
    manifest's readinessProbe), /metrics reports kubegpu_informer_synced for each kind it watches."""
    import os
    import socket
    import subprocess
    import sys

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    lease = real_cluster.create_namespace("quota-lease")   # its own Lease: no other test's controller waits on it
    process = subprocess.Popen([sys.executable, "-m", "kubegpu", "quota", "controller", f"--namespace={lease}",
                                f"--metrics-address=127.0.0.1:{port}"], env={**os.environ, **real_cluster.env()},
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        def get(path: str) -> tuple[int, str]:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as answer:
                    return answer.status, answer.read().decode()
            except (urllib.error.URLError, ConnectionError):
                return 0, ""

        wait_for(lambda: get("/readyz")[0] == 200, "the quota controller ready", SLOW)
        text = get("/metrics")[1]
        for kind in ("Pod", "Node", "ElasticQuota", "ResourceClaim", "ResourceClaimTemplate", "DeviceClass"):
            assert f'kubegpu_informer_synced{{component="quota",kind="{kind}"}} 1.0' in text, text
    finally:
        process.terminate()
        process.wait(timeout=SLOW)
        real_cluster.delete_namespace(lease)
