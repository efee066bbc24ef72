"""`kubegpu operator`: the ClusterPolicy controller on a real API server — kopf (standalone) for the watch and
retry machinery, a Lease for leader election, lightkube for server-side apply. The decisions are in passes.py and
below it; the handlers here only call `run_pass` and decide when to run it next.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kubegpu.errors import KubegpuError
from kubegpu.kube.eviction import evict_with_client
from kubegpu.metrics import OperatorMetrics
from kubegpu.operator import reconcile as R
from kubegpu.operator.metrics import observe_pass
from kubegpu.operator.policy import GROUP, PLURAL, VERSION
from kubegpu.operator.render import MANAGER

if TYPE_CHECKING:
    from kubegpu.kube import Cluster

log = logging.getLogger("kubegpu.operator")
LEASE_NAME = "kubegpu-operator"
READY_RESYNC = 60.0  # a ready policy is re-checked this often even without events


def in_cluster_server(env: dict[str, str] | os._Environ[str], default: str) -> str:
    """The API server as client-go's in-cluster config finds it: `KUBERNETES_SERVICE_HOST`/`_PORT`, which the kubelet
    sets in every pod. kopf's own service-account login names `https://kubernetes.default.svc`, which needs the
    cluster's DNS; the operator's lightkube client (server-side apply) already uses the environment, so both agree."""
    host, port = env.get("KUBERNETES_SERVICE_HOST"), env.get("KUBERNETES_SERVICE_PORT")
    if not host or not port:
        return default
    return f"https://[{host}]:{port}" if ":" in host else f"https://{host}:{port}"


def _register_generic_resources() -> None:
    from lightkube.generic_resource import create_global_resource, create_namespaced_resource

    create_namespaced_resource("monitoring.coreos.com", "v1", "ServiceMonitor", "servicemonitors")
    create_global_resource(GROUP, VERSION, "ClusterPolicy", PLURAL)


class LightkubeOperatorApi:
    """OperatorApi over a lightkube Client: server-side apply as field manager `kubegpu-operator`."""

    OWNED = (("v1", "ServiceAccount"), ("v1", "Service"), ("apps/v1", "DaemonSet"), ("apps/v1", "Deployment"),
             ("rbac.authorization.k8s.io/v1", "ClusterRole"), ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding"),
             ("rbac.authorization.k8s.io/v1", "Role"), ("rbac.authorization.k8s.io/v1", "RoleBinding"),
             ("node.k8s.io/v1", "RuntimeClass"), ("monitoring.coreos.com/v1", "ServiceMonitor"),
             ("admissionregistration.k8s.io/v1", "ValidatingAdmissionPolicy"),
             ("admissionregistration.k8s.io/v1", "ValidatingAdmissionPolicyBinding"),
             ("admissionregistration.k8s.io/v1", "MutatingAdmissionPolicy"),
             ("admissionregistration.k8s.io/v1", "MutatingAdmissionPolicyBinding"), ("v1", "ConfigMap"))

    def __init__(self, client: Any = None, informer: Cluster | None = None) -> None:
        import lightkube

        _register_generic_resources()
        self.client = client or lightkube.Client(field_manager=MANAGER)
        self.informer = informer  # Nodes and Pods from watches (`kubegpu.kube.informer`): a pass lists nothing

    @staticmethod
    def _kind(api_version: str, kind: str) -> Any:
        from lightkube.core.resource_registry import resource_registry

        return resource_registry.load(api_version, kind)

    @staticmethod
    def _dict(obj: Any) -> dict[str, Any]:
        result: dict[str, Any] = obj.to_dict() if hasattr(obj, "to_dict") else dict(obj)
        return result

    def list_policies(self) -> list[dict[str, Any]]:
        return [self._dict(p) for p in self.client.list(self._kind(f"{GROUP}/{VERSION}", "ClusterPolicy"))]

    def patch_policy_status(self, name: str, status: dict[str, Any]) -> None:
        from lightkube import ApiError
        from lightkube.types import PatchType

        resource = self._kind(f"{GROUP}/{VERSION}", "ClusterPolicy")
        try:
            self.client.patch(resource.Status, name, {"status": status}, patch_type=PatchType.MERGE)
        except ApiError as exc:
            if exc.status.code != 404:  # deleted meanwhile: nobody to report to
                raise KubegpuError(f"ClusterPolicy {name} status: {exc.status.message}") from None

    def apply(self, obj: dict[str, Any]) -> dict[str, Any]:
        from lightkube import codecs

        with _api_errors(f"apply {obj['kind']} {obj['metadata']['name']}"):
            live = self.client.apply(codecs.from_dict(obj), field_manager=MANAGER, force=True)
        return self._dict(live)

    def list_owned(self, policy: str, namespace: str) -> list[dict[str, Any]]:
        import httpx2
        from lightkube import ApiError
        from lightkube.core.resource import NamespacedResource

        from kubegpu.operator.render import OWNER_LABEL

        out: list[dict[str, Any]] = []
        for api_version, kind in self.OWNED:
            resource = self._kind(api_version, kind)
            selector: dict[str, Any] = {OWNER_LABEL: policy}
            try:
                if issubclass(resource, NamespacedResource):
                    items = self.client.list(resource, namespace=namespace, labels=selector)
                else:
                    items = self.client.list(resource, labels=selector)
                out += [{**self._dict(o), "apiVersion": api_version, "kind": kind} for o in items]
            except ApiError as exc:
                if exc.status.code != 404:
                    raise KubegpuError(f"list {kind}: {exc.status.message}") from None
            except httpx2.HTTPStatusError as exc:
                if exc.response.status_code != 404:  # a kind the server does not serve (no prometheus-operator)
                    raise KubegpuError(f"list {kind}: HTTP {exc.response.status_code}") from None
        return out

    def delete(self, key: R.Key) -> None:
        from lightkube import ApiError

        api_version, kind, namespace, name = key
        try:
            self.client.delete(self._kind(api_version, kind), name, namespace=namespace or None)
        except ApiError as exc:
            if exc.status.code != 404:
                raise KubegpuError(f"delete {kind} {name}: {exc.status.message}") from None

    def list_nodes(self) -> list[dict[str, Any]]:
        from lightkube.resources.core_v1 import Node

        if self.informer is not None:
            return self.informer.list("Node")
        return [self._dict(n) for n in self.client.list(Node)]

    def patch_node(self, name: str, labels: dict[str, str | None], annotations: dict[str, str | None]) -> None:
        from lightkube.resources.core_v1 import Node
        from lightkube.types import PatchType

        meta: dict[str, Any] = {}
        if labels:
            meta["labels"] = labels
        if annotations:
            meta["annotations"] = annotations
        if meta:
            self.client.patch(Node, name, {"metadata": meta}, patch_type=PatchType.MERGE)

    def set_unschedulable(self, name: str, value: bool) -> None:
        from lightkube.resources.core_v1 import Node
        from lightkube.types import PatchType

        self.client.patch(Node, name, {"spec": {"unschedulable": value}}, patch_type=PatchType.MERGE)

    def list_pods(self, node: str | None = None, namespace: str | None = None,
                  labels: dict[str, str] | None = None) -> list[dict[str, Any]]:
        from lightkube.resources.core_v1 import Pod

        if self.informer is not None:
            selector_text = ",".join(f"{k}={v}" for k, v in sorted((labels or {}).items())) or None
            return [p for p in self.informer.list("Pod", namespace, selector_text)
                    if not node or (p.get("spec") or {}).get("nodeName") == node]
        fields: dict[str, Any] | None = {"spec.nodeName": node} if node else None
        selector: dict[str, Any] | None = dict(labels) if labels else None
        return [self._dict(p) for p in self.client.list(Pod, namespace=namespace or "*", labels=selector,
                                                        fields=fields)]

    def evict(self, namespace: str, name: str) -> bool:
        return evict_with_client(self.client, namespace, name)

    def delete_pod(self, namespace: str, name: str) -> None:
        self.delete(("v1", "Pod", namespace, name))


@contextlib.contextmanager
def _api_errors(what: str) -> Iterator[None]:
    """An API refusal as one KubegpuError line naming the object (it ends in the policy's Error condition)."""
    from lightkube import ApiError

    try:
        yield
    except ApiError as exc:
        raise KubegpuError(f"{what}: {exc.status.message}") from None


def apply_crds(api: LightkubeOperatorApi, crds_dir: Path | None) -> list[str]:
    """Server-side apply every CRD the project defines, so `helm upgrade` (which skips crds/) never leaves one
    stale."""
    from kubegpu.operator.crds import all_crds

    names = []
    for crd in all_crds(crds_dir):
        api.apply(crd)
        names.append(crd["metadata"]["name"])
    return names


@dataclass
class Scheduler:
    """When each policy is next due: 5 s while not ready (the GPU Operator's requeue), READY_RESYNC when ready, at
    once on an event. One pass at a time."""

    api: Any
    namespace: str
    metrics: OperatorMetrics | None = None
    due: dict[str, float] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def run(self, name: str, force: bool = False) -> R.Status | None:
        from kubegpu.operator.passes import run_pass

        now = time.time()
        if not force and now < self.due.get(name, 0.0):
            return None
        with self.lock:
            stamp = datetime.fromtimestamp(now, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
            result = run_pass(self.api, name, self.namespace, now, stamp)
        status = result.status
        if self.metrics is not None:
            observe_pass(self.metrics, result, now)
        self.due[name] = now + (status.requeue_after if status.requeue_after is not None else READY_RESYNC)
        for note in result.notes:
            log.warning(note)
        log.info("ClusterPolicy %s: %s (%s) %s", name, status.state, status.reason, status.message)
        return status

    def active(self) -> str | None:
        return R.active_policy(self.api.list_policies())


def _hold_lease(namespace: str, lost: threading.Event, stop: threading.Event, lease_duration: float = 15.0) -> None:
    """Block until this replica holds the Lease, then renew it in the background; losing it stops the operator
    (the process exits, its Deployment restarts it as a follower)."""
    from kubegpu.kube.leader import LeaderElector
    from kubegpu.kube.lightkube_cluster import LightkubeCluster

    identity = os.environ.get("POD_NAME") or f"{socket.gethostname()}-{os.getpid()}"
    elector = LeaderElector(LightkubeCluster(), identity, LEASE_NAME, namespace, lease_duration)
    while not elector.try_acquire(time.time()):
        log.info("waiting for the leader lease %s/%s", namespace, LEASE_NAME)
        time.sleep(lease_duration / 3)
    log.info("leader: %s", identity)

    def renew() -> None:
        while not stop.wait(lease_duration / 3):
            try:
                held = elector.try_acquire(time.time())
            except KubegpuError as exc:
                log.warning("lease renewal failed: %s", exc)
                held = False
            if not held:
                log.error("lost the leader lease; stopping")
                lost.set()
                stop.set()

    threading.Thread(target=renew, name="lease", daemon=True).start()


def build_registry(scheduler: Scheduler) -> Any:
    """kopf handlers: each only asks the scheduler to run a pass."""
    import kopf

    registry = kopf.OperatorRegistry()

    @kopf.on.startup(registry=registry)
    def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
        # our CRD's status schema prunes unknown fields, so kopf keeps its bookkeeping in annotations
        settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix="kubegpu.io")
        settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(prefix="kubegpu.io")
        settings.posting.level = logging.WARNING
        settings.watching.server_timeout = 5  # watches re-open often, so a stop never waits long on one

    @kopf.on.login(registry=registry)
    def login(**kwargs: Any) -> Any:
        """In-cluster service account, else $KUBECONFIG / ~/.kube/config (kopf's own readers: no extra client)."""
        info = kopf.login_with_service_account(**kwargs)
        if info is not None:
            return dataclasses.replace(info, server=in_cluster_server(os.environ, info.server))
        return kopf.login_with_kubeconfig(**kwargs)

    @kopf.on.event(GROUP, VERSION, PLURAL, registry=registry)
    def policy_changed(name: str, type: str | None, **_: Any) -> None:
        if type != "DELETED":
            scheduler.run(name, force=True)
            other = scheduler.active()
            if other is not None and other != name:
                scheduler.run(other, force=True)

    @kopf.on.event("", "v1", "nodes", registry=registry)
    def node_changed(**_: Any) -> None:
        active = scheduler.active()
        if active is not None:
            scheduler.due[active] = min(scheduler.due.get(active, 0.0), time.time() + 1.0)

    return registry


def run(namespace: str, apply_crds_at_start: bool = True, crds_dir: Path | None = None,
        metrics_address: str | None = ":8080") -> None:
    """The operator process: leader election, CRDs, then kopf until stopped or the lease is lost."""
    import asyncio

    import kopf

    logging.basicConfig(level=os.environ.get("KUBEGPU_LOG_LEVEL", "INFO").upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for noisy in ("httpx", "httpx2", "httpcore", "aiohttp.access"):
        logging.getLogger(noisy).setLevel(logging.WARNING)  # one line per request otherwise
    stop, lost = threading.Event(), threading.Event()
    _hold_lease(namespace, lost, stop)
    from kubegpu.kube.informer import InformedCluster
    from kubegpu.kube.lightkube_cluster import LightkubeCluster

    api = LightkubeOperatorApi(informer=InformedCluster(LightkubeCluster(), ("Node", "Pod")))
    if apply_crds_at_start:
        log.info("applied CRDs: %s", ", ".join(apply_crds(api, crds_dir)))
    metrics = None
    if metrics_address:
        from prometheus_client import CollectorRegistry

        from kubegpu.metrics import serve_metrics

        registry = CollectorRegistry(auto_describe=False)
        metrics = OperatorMetrics.create(registry)
        serve_metrics(metrics_address, registry)
    scheduler = Scheduler(api, namespace, metrics)
    done = threading.Event()
    threading.Thread(target=_requeue_loop, args=(scheduler, stop, done), name="requeue", daemon=True).start()

    async def operate() -> None:
        try:
            await kopf.operator(registry=build_registry(scheduler), standalone=True, clusterwide=True,
                                stop_flag=stop)
        finally:
            stop.set()  # kopf waits on the flag in an executor thread: release it, or the loop never closes

    try:
        asyncio.run(operate())
    finally:
        done.set()
    if lost.is_set():
        raise KubegpuError("stopped: the leader lease was lost")


def _requeue_loop(scheduler: Scheduler, stop: threading.Event, done: threading.Event) -> None:
    """Every second, run each policy whose requeue time has come (5 s while not ready, 60 s once ready). A thread
    rather than a kopf timer: kopf would put a finalizer on every policy for it and hold shutdown on it."""
    while not (stop.wait(1.0) or done.is_set()):
        try:
            for body in scheduler.api.list_policies():
                scheduler.run(body["metadata"]["name"])
        except KubegpuError as exc:
            log.warning("requeue pass failed: %s", exc)
        except Exception as exc:  # an API hiccup must not end the loop: the next second retries
            log.warning("requeue pass failed: %s: %s", type(exc).__name__, exc)
