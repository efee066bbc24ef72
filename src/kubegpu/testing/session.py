"""What tests get from the real control plane: `RealCluster`, a started control plane with helpers.

tests/conftest.py starts one per test session (`real_cluster` fixture) and hands each test a fresh namespace
(`namespace` fixture). Helpers here wait on the real server's asynchronous work — a controller-manager creating a
namespace's default ServiceAccount, kwok marking a node Ready, the real kube-scheduler binding a pod — with a
deadline and a message saying what never happened.
"""

from __future__ import annotations

import contextlib
import re
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import lightkube
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Namespace, ServiceAccount

from kubegpu.errors import KubegpuError
from kubegpu.kube.errors import NotFound
from kubegpu.testing.controlplane import ControlPlane
from kubegpu.testing.kubeconfig import admin_client, admin_cluster
from kubegpu.testing.kwoknodes import gpu_node, is_ready

if TYPE_CHECKING:
    from kubegpu.kube.lightkube_cluster import LightkubeCluster

T = TypeVar("T")
DEFAULT_TIMEOUT_S = 30.0


class WaitTimeout(KubegpuError):
    """What a test waited for did not happen in time."""


def wait_for(check: Callable[[], T | None], what: str, timeout: float = DEFAULT_TIMEOUT_S,
             interval: float = 0.1) -> T:
    """Poll ``check`` until it returns something truthy; WaitTimeout naming ``what`` (and the last value) if not."""
    deadline = time.monotonic() + timeout
    last: T | None = None
    while True:
        last = check()
        if last:
            return last
        if time.monotonic() >= deadline:
            raise WaitTimeout(f"timed out after {timeout:.0f}s waiting for {what} (last: {last!r})")
        time.sleep(interval)


@dataclass
class RealCluster:
    """A running control plane: ``kubeconfig`` (admin), ``server``, the session's kwok GPU ``nodes``."""

    plane: ControlPlane
    _cluster: LightkubeCluster | None = field(default=None, repr=False)

    @property
    def kubeconfig(self) -> Path:
        return self.plane.kubeconfig

    @property
    def server(self) -> str:
        return self.plane.server

    @property
    def nodes(self) -> list[str]:
        return list(self.plane.nodes)

    def client(self) -> lightkube.Client:
        """A fresh lightkube sync Client (admin)."""
        return admin_client(self.kubeconfig)

    def cluster(self) -> LightkubeCluster:
        """A fresh LightkubeCluster (kubegpu's Cluster interface), admin."""
        return admin_cluster(self.kubeconfig)

    @property
    def admin(self) -> LightkubeCluster:
        """One shared LightkubeCluster for the fixtures' own reads and writes."""
        if self._cluster is None:
            self._cluster = self.cluster()
        return self._cluster

    def env(self) -> dict[str, str]:
        """Environment additions for a subprocess that should talk to this control plane (e.g. `kubegpu ...`)."""
        return {"KUBECONFIG": str(self.kubeconfig)}

    # ------------------------------------------------------------------ namespaces
    def create_namespace(self, hint: str = "t") -> str:
        """A new namespace named after ``hint``; returns once its default ServiceAccount exists (until then the
        ServiceAccount admission plugin rejects pods)."""
        base = re.sub(r"[^a-z0-9-]+", "-", hint.lower()).strip("-")[:40].strip("-") or "t"
        name = f"{base}-{uuid.uuid4().hex[:5]}"
        client = self.admin.client
        client.create(Namespace(metadata=ObjectMeta(name=name)))
        wait_for(lambda: _exists(client, ServiceAccount, "default", name), f"ServiceAccount {name}/default")
        return name

    def delete_namespace(self, name: str) -> None:
        """Delete without waiting (the namespace controller empties it in the background)."""
        with contextlib.suppress(lightkube.ApiError):
            self.admin.client.delete(Namespace, name)

    # ------------------------------------------------------------------ nodes and pods
    def add_gpu_node(self, name: str, gpus: str = "8xA100-SXM4-80GB", labels: dict[str, str] | None = None,
                     extra_capacity: dict[str, str] | None = None, wait: bool = True) -> dict[str, Any]:
        """Create a kwok GPU node (capacity and GFD labels as `up --gpus` gives) and wait until kwok has it Ready."""
        created = self.admin.create(gpu_node(name, gpus, labels, extra_capacity))
        if wait:
            return self.wait_node_ready(name)
        return created

    def wait_node_ready(self, name: str, timeout: float = DEFAULT_TIMEOUT_S) -> dict[str, Any]:
        return wait_for(lambda: self._ready_node(name), f"node {name} Ready (kwok)", timeout)

    def _ready_node(self, name: str) -> dict[str, Any] | None:
        node = self.admin.get("Node", name)
        return node if is_ready(node) else None

    def delete_node(self, name: str) -> None:
        with contextlib.suppress(NotFound):
            self.admin.delete("Node", name)

    def wait_bound(self, name: str, namespace: str, timeout: float = DEFAULT_TIMEOUT_S) -> str:
        """The node the real kube-scheduler bound the pod to."""
        return wait_for(lambda: (self.admin.get("Pod", name, namespace).get("spec") or {}).get("nodeName"),
                        f"pod {namespace}/{name} bound by kube-scheduler", timeout)

    def unschedulable_message(self, name: str, namespace: str) -> str:
        """kube-scheduler's PodScheduled=False message for a pod, '' while it has not reported one."""
        status = self.admin.get("Pod", name, namespace).get("status") or {}
        for condition in status.get("conditions") or []:
            if condition.get("type") == "PodScheduled" and condition.get("status") == "False":
                return str(condition.get("message") or condition.get("reason") or "")
        return ""


def _exists(client: lightkube.Client, resource: Any, name: str, namespace: str | None = None) -> bool:
    try:
        client.get(resource, name, namespace=namespace)
    except lightkube.ApiError as exc:
        if exc.status.code == 404:
            return False
        raise
    return True


def install_crds(real: RealCluster, paths: list[Path], timeout: float = DEFAULT_TIMEOUT_S) -> list[str]:
    """Server-side apply every CustomResourceDefinition in ``paths`` and wait until the server reports each one
    Established (its schema, defaults and CEL rules compiled); returns their names. Idempotent."""
    import yaml
    from lightkube import codecs
    from lightkube.resources.apiextensions_v1 import CustomResourceDefinition

    client = real.admin.client
    names: list[str] = []
    for path in paths:
        for doc in yaml.safe_load_all(path.read_text()):
            if not doc:
                continue
            crd = codecs.from_dict(doc)
            if not isinstance(crd, CustomResourceDefinition):
                raise KubegpuError(f"{path}: {doc.get('kind')} {doc.get('metadata', {}).get('name')} is not a CRD")
            client.apply(crd, field_manager="kubegpu-tests", force=True)
            names.append(str(doc["metadata"]["name"]))

    def established(name: str) -> Callable[[], bool]:
        def check() -> bool:
            crd = client.get(CustomResourceDefinition, name)
            conditions = (crd.status.conditions if crd.status else None) or []
            return any(c.type == "Established" and c.status == "True" for c in conditions)
        return check

    for name in names:
        wait_for(established(name), f"CRD {name} Established", timeout)
    return names
