"""The admin kubeconfig of a loopback control plane, and clients built from it.

The kubeconfig embeds its certificates (base64 `*-data` fields), so it still works when copied elsewhere or handed
to a subprocess through $KUBECONFIG.
"""

from __future__ import annotations

import base64
from pathlib import Path
from typing import TYPE_CHECKING

import yaml

if TYPE_CHECKING:
    import lightkube

    from kubegpu.kube.lightkube_cluster import LightkubeCluster
    from kubegpu.testing.certs import Pki

CONTEXT = "kubegpu-test"


def _b64(path: Path) -> str:
    return base64.b64encode(path.read_bytes()).decode()


def write_kubeconfig(path: Path, server: str, pki: Pki) -> Path:
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": CONTEXT, "cluster": {"server": server,
                                                   "certificate-authority-data": _b64(pki.ca_cert)}}],
        "users": [{"name": "admin", "user": {"client-certificate-data": _b64(pki.admin_cert),
                                             "client-key-data": _b64(pki.admin_key)}}],
        "contexts": [{"name": CONTEXT, "context": {"cluster": CONTEXT, "user": "admin"}}],
        "current-context": CONTEXT,
    }
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    path.chmod(0o600)
    return path


def admin_client(kubeconfig: Path | str, timeout: float = 30.0) -> lightkube.Client:
    """A lightkube sync Client for the control plane (no proxy settings from the environment)."""
    import httpx2
    import lightkube
    from lightkube.config.kubeconfig import KubeConfig

    return lightkube.Client(config=KubeConfig.from_file(str(kubeconfig)), trust_env=False,
                            timeout=httpx2.Timeout(timeout))


def admin_cluster(kubeconfig: Path | str) -> LightkubeCluster:
    """A LightkubeCluster (kubegpu's Cluster interface) acting as cluster admin."""
    from kubegpu.kube.lightkube_cluster import LightkubeCluster

    return LightkubeCluster(admin_client(kubeconfig))


class RequestCounter:
    """Counts the HTTP requests a lightkube Client sends, by method (what a controller costs the API server)."""

    def __init__(self) -> None:
        self.by_method: dict[str, int] = {}

    @property
    def total(self) -> int:
        return sum(self.by_method.values())

    def attach(self, client: lightkube.Client) -> RequestCounter:
        http = client._client._client  # lightkube's GenericSyncClient wraps one httpx2.Client
        hooks = dict(http.event_hooks)
        hooks["request"] = [*hooks.get("request", []), self._count]
        http.event_hooks = hooks
        return self

    def _count(self, request: object) -> None:
        method = str(getattr(request, "method", "?"))
        self.by_method[method] = self.by_method.get(method, 0) + 1

    def reset(self) -> None:
        self.by_method.clear()
