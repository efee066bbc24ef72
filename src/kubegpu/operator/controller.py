"""`kubegpu operator`: the ClusterPolicy controller on a real API server — kopf (standalone) for the watch and
retry machinery, a Lease for leader election, lightkube for server-side apply. The decisions are in passes.py and
below it; the handlers here only call `run_pass` and decide when to run it next.

Every read of a pass comes from informers (`kubegpu.kube.informer`): the ClusterPolicies, Nodes and Pods, and each
kind the operator owns narrowed to its objects (the `kubegpu.io/clusterpolicy` label). An idle operator sends no
LIST, however often its requeue loop looks. A kind the API server does not serve when the operator starts
(prometheus-operator's ServiceMonitor, a beta admission kind) is looked up in discovery (a GET) on each pass until it
is, then informed too. Writes stay server-side apply; what a status write returns goes into the cache, and the
policy kopf reports is taken in before the pass it triggers, so a pass never reads a policy older than its event.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
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
from kubegpu.kube.informer import InformedCluster, cache_trusted
from kubegpu.kube.resources import KINDS, ResourceKind, register_kind
from kubegpu.metrics import OperatorMetrics
from kubegpu.operator import reconcile as R
from kubegpu.operator.metrics import observe_pass
from kubegpu.operator.policy import GROUP, PLURAL, VERSION
from kubegpu.operator.render import MANAGER, OWNER_LABEL

if TYPE_CHECKING:
    from prometheus_client.registry import CollectorRegistry

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


# what the operator owns: (apiVersion, kind, plural, namespaced), so informers can list and watch each kind
OWNED_KINDS = (
    ("v1", "ServiceAccount", "serviceaccounts", True), ("v1", "Service", "services", True),
    ("apps/v1", "DaemonSet", "daemonsets", True), ("apps/v1", "Deployment", "deployments", True),
    ("rbac.authorization.k8s.io/v1", "ClusterRole", "clusterroles", False),
    ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding", "clusterrolebindings", False),
    ("rbac.authorization.k8s.io/v1", "Role", "roles", True),
    ("rbac.authorization.k8s.io/v1", "RoleBinding", "rolebindings", True),
    ("node.k8s.io/v1", "RuntimeClass", "runtimeclasses", False),
    ("monitoring.coreos.com/v1", "ServiceMonitor", "servicemonitors", True),
    ("admissionregistration.k8s.io/v1", "ValidatingAdmissionPolicy", "validatingadmissionpolicies", False),
    ("admissionregistration.k8s.io/v1", "ValidatingAdmissionPolicyBinding", "validatingadmissionpolicybindings",
     False),
    ("admissionregistration.k8s.io/v1", "MutatingAdmissionPolicy", "mutatingadmissionpolicies", False),
    ("admissionregistration.k8s.io/v1", "MutatingAdmissionPolicyBinding", "mutatingadmissionpolicybindings", False),
    ("v1", "ConfigMap", "configmaps", True),
)
READ_KINDS = ("ClusterPolicy", "Node", "Pod")  # informed whole: the policies, and what a pass reads of the nodes
# the NodePools whose GPUs join the quota's charge table, (apiVersion, kind, plural, name in kubegpu.kube): Karpenter's
# has kubegpu's kind, so it is known under another name (only listed and watched)
KARPENTER_NODEPOOL = "KarpenterNodePool"
NODEPOOL_KINDS = (("kubegpu.io/v1", "NodePool", "nodepools", "NodePool"),
                  ("karpenter.sh/v1", "NodePool", "nodepools", KARPENTER_NODEPOOL))


def register_owned_kinds() -> None:
    """The owned kinds in kubegpu.kube's registry (those it lacks), so a `Cluster` can serve them."""
    for api_version, kind, plural, namespaced in OWNED_KINDS:
        if kind not in KINDS:
            group, _, version = api_version.rpartition("/")
            register_kind(ResourceKind(kind, group, version, plural, namespaced=namespaced, status_subresource=False,
                                       strategic_merge=not group.endswith("coreos.com")))
    if KARPENTER_NODEPOOL not in KINDS:
        register_kind(ResourceKind(KARPENTER_NODEPOOL, "karpenter.sh", "v1", "nodepools", namespaced=False,
                                   status_subresource=True, strategic_merge=False))


def served_kinds(client: Any, kinds: list[tuple[str, str]]) -> set[str]:
    """Which of `kinds` ((apiVersion, kind) pairs) the API server serves, from its discovery documents: one GET per
    group version, never a LIST."""
    http = client._client._client  # lightkube's httpx client: base URL and credentials set
    served: set[str] = set()
    for api_version in dict.fromkeys(v for v, _ in kinds):
        response = http.get("/api/v1" if api_version == "v1" else f"/apis/{api_version}")
        if response.status_code == 404:
            continue  # the group version is not served at all
        if response.status_code >= 400:
            raise KubegpuError(f"discovery {api_version}: HTTP {response.status_code}")
        names = {r.get("kind") for r in response.json().get("resources") or () if "/" not in r.get("name", "")}
        served |= {kind for version, kind in kinds if version == api_version and kind in names}
    return served


class LightkubeOperatorApi:
    """OperatorApi over a lightkube Client: server-side apply as field manager `kubegpu-operator`; reads from
    informers once `inform` has started them (before that, and in tests that never call it, from the server)."""

    OWNED = tuple((api_version, kind) for api_version, kind, _, _ in OWNED_KINDS)

    def __init__(self, client: Any = None, informer: InformedCluster | None = None) -> None:
        import lightkube

        _register_generic_resources()
        self.client = client or lightkube.Client(field_manager=MANAGER)
        self.informer = informer  # policies, Nodes, Pods and the owned kinds served at start, from watches
        self.late: dict[str, InformedCluster] = {}  # owned kinds first served after the start, one informer each

    def inform(self, store: Any = None) -> InformedCluster:
        """Start the informers: the policies, Nodes, Pods, and every owned kind the server serves (by the owner
        label). `store`: the `Cluster` they read (default: a LightkubeCluster from the same configuration)."""
        from kubegpu.kube.lightkube_cluster import LightkubeCluster

        register_owned_kinds()
        owned = sorted(served_kinds(self.client, list(self.OWNED)))
        self.informer = InformedCluster(store or LightkubeCluster(), (*READ_KINDS, *owned),
                                        selectors={kind: OWNER_LABEL for kind in owned})
        return self.informer

    def trusted(self) -> bool:
        """Whether every informer's cache may be acted on (none stale; see `kubegpu.kube.informer`)."""
        return all(cache_trusted(source) for source in (self.informer, *self.late.values()))

    def register_metrics(self, registry: CollectorRegistry) -> None:
        if self.informer is not None:
            self.informer.register_metrics(registry, "operator")

    def observe(self, obj: dict[str, Any]) -> None:
        """An object read elsewhere (kopf's event, a write's answer) into the cache, unless it holds newer."""
        if self.informer is not None:
            self.informer.observe(obj)

    def _owned_source(self, api_version: str, kind: str, name: str | None = None,
                      selector: str | None = OWNER_LABEL) -> InformedCluster | None:
        """The informer holding a kind (`name` in kubegpu.kube, if not `kind`), narrowed by `selector`; None while
        the server does not serve it (then nothing of it exists to find). A kind not served at the start is looked
        up in discovery on each call until it is."""
        assert self.informer is not None
        name = name or kind
        if name in self.informer.kinds:
            return self.informer
        late = self.late.get(name)
        if late is None and served_kinds(self.client, [(api_version, kind)]):
            late = self.late[name] = InformedCluster(self.informer.store, (name,),
                                                     selectors={name: selector} if selector else None)
        return late

    @staticmethod
    def _kind(api_version: str, kind: str) -> Any:
        from lightkube.core.resource_registry import resource_registry

        return resource_registry.load(api_version, kind)

    @staticmethod
    def _dict(obj: Any) -> dict[str, Any]:
        result: dict[str, Any] = obj.to_dict() if hasattr(obj, "to_dict") else dict(obj)
        return result

    def list_policies(self) -> list[dict[str, Any]]:
        if self.informer is not None:
            return self.informer.list("ClusterPolicy")
        return [self._dict(p) for p in self.client.list(self._kind(f"{GROUP}/{VERSION}", "ClusterPolicy"))]

    def patch_policy_status(self, name: str, status: dict[str, Any]) -> None:
        from lightkube import ApiError
        from lightkube.types import PatchType

        resource = self._kind(f"{GROUP}/{VERSION}", "ClusterPolicy")
        try:
            live = self.client.patch(resource.Status, name, {"status": status}, patch_type=PatchType.MERGE)
            self.observe({**self._dict(live), "kind": "ClusterPolicy"})  # the next pass reads its own status
        except ApiError as exc:
            if exc.status.code != 404:  # deleted meanwhile: nobody to report to
                raise KubegpuError(f"ClusterPolicy {name} status: {exc.status.message}") from None

    def apply(self, obj: dict[str, Any]) -> dict[str, Any]:
        from lightkube import codecs

        with _api_errors(f"apply {obj['kind']} {obj['metadata']['name']}"):
            live = self.client.apply(codecs.from_dict(obj), field_manager=MANAGER, force=True)
        return self._dict(live)

    def list_owned(self, policy: str, namespace: str) -> list[dict[str, Any]]:
        if self.informer is not None:
            return self._list_owned_informed(policy, namespace)
        import httpx2
        from lightkube import ApiError
        from lightkube.core.resource import NamespacedResource

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

    def _list_owned_informed(self, policy: str, namespace: str) -> list[dict[str, Any]]:
        from kubegpu.kube.resources import resource_kind

        out: list[dict[str, Any]] = []
        for api_version, kind in self.OWNED:
            source = self._owned_source(api_version, kind)
            if source is None:
                continue
            scope = namespace if resource_kind(kind).namespaced else None
            out += [{**o, "apiVersion": api_version, "kind": kind}
                    for o in source.list(kind, scope, f"{OWNER_LABEL}={policy}")]
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

    def list_nodepools(self) -> list[dict[str, Any]]:
        """kubegpu's and Karpenter's NodePools: from informers started on the first call, or the server before."""
        from lightkube.generic_resource import create_global_resource

        out: list[dict[str, Any]] = []
        for api_version, kind, plural, name in NODEPOOL_KINDS:
            items: list[dict[str, Any]] = []
            if self.informer is not None:
                source = self._owned_source(api_version, kind, name, selector=None)
                items = source.list(name) if source is not None else []
            elif served_kinds(self.client, [(api_version, kind)]):
                group, version = api_version.split("/")
                resource = create_global_resource(group, version, kind, plural)
                with _api_errors(f"list {kind} ({api_version})"):
                    items = [self._dict(o) for o in self.client.list(resource)]
            out += [{**pool, "apiVersion": api_version, "kind": kind} for pool in items]
        return out

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
        if not cache_trusted(self.api):  # watches broken too long: no pass on a view that may be minutes old
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
    def policy_changed(name: str, type: str | None, body: Any = None, **_: Any) -> None:
        if type != "DELETED":
            observe = getattr(scheduler.api, "observe", None)
            if observe is not None and body is not None:  # kopf's watch may be ahead of the informer's
                observe(json.loads(json.dumps(body, default=dict)))
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
    api = LightkubeOperatorApi()
    if apply_crds_at_start:
        log.info("applied CRDs: %s", ", ".join(apply_crds(api, crds_dir)))
    api.inform()  # after the CRDs: the ClusterPolicy informer lists a kind that is served
    metrics = None
    if metrics_address:
        from prometheus_client import CollectorRegistry

        from kubegpu.metrics import serve_metrics

        registry = CollectorRegistry(auto_describe=False)
        metrics = OperatorMetrics.create(registry)
        api.register_metrics(registry)
        serve_metrics(metrics_address, registry, ready=api.trusted)  # /readyz: 503 while a cache is stale
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
