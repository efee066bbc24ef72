"""A guarded simulated node for tests: node file, fake kubelet PodResources, a fake /proc, pods in a store."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubegpu.kube.cluster import Cluster


def pod(name: str, node: str = "sim-node", namespace: str = "ml", annotations: dict[str, str] | None = None,
        labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace, "annotations": annotations or {},
                         "labels": labels or {"app": name}, "finalizers": ["test.kubegpu.io/hold"]},
            "spec": {"nodeName": node, "containers": [{"name": "main", "image": "busybox"}]}}


def fake_process(proc: Path, pid: int, pod_uid: str | None, environ: dict[str, str] | None = None) -> None:
    """A /proc/PID as the guard reads it: its cgroup (in the pod's kubepods path, or a host service's)."""
    directory = proc / str(pid)
    directory.mkdir(parents=True, exist_ok=True)
    path = (f"/kubepods/besteffort/pod{pod_uid}/{'c' * 64}" if pod_uid else "/system.slice/some-daemon.service")
    (directory / "cgroup").write_text(f"12:pids:{path}\n11:memory:{path}\n0::{path}\n")
    (directory / "environ").write_bytes(b"\0".join(f"{k}={v}".encode() for k, v in (environ or {}).items()))


@dataclass
class FakeEvictor:
    """The Eviction API: a pod a "PDB" protects gets 429 (False); any other gets a deletionTimestamp."""

    cluster: Cluster
    protected: set[str] = field(default_factory=set)
    calls: list[str] = field(default_factory=list)

    def __call__(self, namespace: str, name: str) -> bool:
        self.calls.append(name)
        if name in self.protected:
            return False
        self.cluster.delete("Pod", name, namespace)
        return True
