"""Generated claim sets (`dragen`) on the real control plane: create them in bulk, let kube-scheduler decide, read
back what it decided, clean up.

Hundreds of objects (Nodes, ResourceSlices, ResourceClaims, Pods) are posted as JSON straight through the admin
client's HTTP connection pool from a few threads: lightkube's model round trip per object would cost more CPU than
the API server spends on it. A set is *decided* when its pod is bound (`spec.nodeName`) or kube-scheduler reported
PodScheduled=False/Unschedulable; once every pod is decided the state must hold still for a settle window (a pod
tried before the scheduler's informers saw all of its objects is retried on their arrival, and may then bind).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kubegpu.errors import KubegpuError
from kubegpu.scheduling.dra import DeviceClass
from kubegpu.testing.dragen import LABEL, ClaimSet, Decision, node_object, ours, pod_object
from kubegpu.testing.session import WaitTimeout

if TYPE_CHECKING:
    import lightkube

_PATHS = {
    "Node": "/api/v1/nodes",
    "Pod": "/api/v1/namespaces/{ns}/pods",
    "ResourceSlice": "/apis/resource.k8s.io/v1/resourceslices",
    "ResourceClaim": "/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaims",
    "DeviceClass": "/apis/resource.k8s.io/v1/deviceclasses",
}


class RawApi:
    """JSON in, JSON out, through a lightkube Client's own HTTP client (its TLS, base URL and pool)."""

    def __init__(self, client: lightkube.Client) -> None:
        self.http = client._client._client  # lightkube's GenericSyncClient wraps one httpx2.Client
        self.requests = 0

    def _path(self, kind: str, namespace: str | None) -> str:
        return _PATHS[kind].format(ns=namespace or "default")

    def create(self, obj: Mapping[str, Any]) -> dict[str, Any]:
        kind = str(obj["kind"])
        self.requests += 1
        response = self.http.post(self._path(kind, obj["metadata"].get("namespace")), content=json.dumps(obj),
                                  headers={"Content-Type": "application/json"})
        if response.status_code >= 300:
            raise KubegpuError(f"create {kind} {obj['metadata']['name']}: HTTP {response.status_code}: "
                               f"{_message(response)}")
        return dict(response.json())

    def delete(self, kind: str, name: str, namespace: str | None = None) -> None:
        """Delete one object; one already gone is fine."""
        self.requests += 1
        response = self.http.delete(f"{self._path(kind, namespace)}/{name}")
        if response.status_code >= 300 and response.status_code != 404:
            raise KubegpuError(f"delete {kind} {name}: HTTP {response.status_code}: {_message(response)}")

    def list(self, kind: str, namespace: str | None = None, label: str | None = None) -> list[dict[str, Any]]:
        self.requests += 1
        response = self.http.get(self._path(kind, namespace), params={"labelSelector": label} if label else None)
        if response.status_code >= 300:
            raise KubegpuError(f"list {kind}: HTTP {response.status_code}: {_message(response)}")
        return list(response.json().get("items") or [])

    def delete_collection(self, kind: str, namespace: str | None = None, label: str | None = None,
                          grace: int | None = None) -> None:
        params: dict[str, Any] = {}
        if label:
            params["labelSelector"] = label
        if grace is not None:
            params["gracePeriodSeconds"] = grace
        self.requests += 1
        response = self.http.delete(self._path(kind, namespace), params=params)
        if response.status_code >= 300 and response.status_code != 404:
            raise KubegpuError(f"delete {kind} collection: HTTP {response.status_code}: {_message(response)}")


def _message(response: Any) -> str:
    try:
        return str(response.json().get("message"))
    except ValueError:
        return response.text[:200]


def create_all(api: RawApi, objects: Iterable[Mapping[str, Any]], workers: int = 4) -> list[dict[str, Any]]:
    with ThreadPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(api.create, objects))


def submit(api: RawApi, sets: Sequence[ClaimSet], namespace: str, prefix: str, workers: int = 4) -> None:
    """Nodes first, then their slices (owned by the node, as the kubelet's are: deleting the nodes lets the garbage
    collector remove the slices in the background), then every claim, then the holder pods: when a pod arrives
    everything it needs exists. The main pods follow with `submit_pods` once the holders are decided."""
    nodes = create_all(api, [node_object(s, prefix) for s in sets], workers)
    submit_slices_and_claims(api, sets, nodes, workers)
    create_all(api, [pod_object(s, namespace, holder=True) for s in sets if s.holder], workers)


def submit_pods(api: RawApi, sets: Sequence[ClaimSet], namespace: str, workers: int = 4) -> None:
    create_all(api, [pod_object(s, namespace) for s in sets], workers)


def submit_slices_and_claims(api: RawApi, sets: Sequence[ClaimSet], nodes: Sequence[Mapping[str, Any]],
                             workers: int = 4) -> None:
    """The sets' slices, each owned by its node (`nodes`: the created Node objects), then their claims."""
    owners = {n["metadata"]["name"]: {"apiVersion": "v1", "kind": "Node", "name": n["metadata"]["name"],
                                      "uid": n["metadata"]["uid"], "controller": True} for n in nodes}
    slices = [{**x, "metadata": {**x["metadata"], "ownerReferences": [owners[s.node]]}} for s in sets for x in s.slices]
    create_all(api, slices, workers)
    create_all(api, [c for s in sets for c in (*s.claims, *([s.holder] if s.holder else []))], workers)


def _state(pod: Mapping[str, Any]) -> tuple[str, str] | None:
    """('bound', ''), ('unschedulable' | 'error', the scheduler's message), or None while undecided.

    PodScheduled=False with reason SchedulerError is kube-scheduler's verdict on a claim that can never be
    allocated as written (e.g. an `All` request whose devices break a constraint): the pod is retried, but
    nothing in the cluster can change the answer."""
    if (pod.get("spec") or {}).get("nodeName"):
        return "bound", ""
    for condition in (pod.get("status") or {}).get("conditions") or []:
        if condition.get("type") == "PodScheduled" and condition.get("status") == "False":
            reason = {"Unschedulable": "unschedulable", "SchedulerError": "error"}.get(condition.get("reason", ""))
            if reason:
                return reason, str(condition.get("message") or "")
    return None


def wait_decided(api: RawApi, pods: Mapping[str, Sequence[str]], namespace: str, timeout: float = 120.0,
                 settle: float = 2.0, interval: float = 0.5) -> tuple[dict[str, Decision], float]:
    """Poll (one list per round) until every pod of `pods` (name -> its claims' names) is decided and nothing
    changed for `settle` seconds; returns the decisions by pod and when (time.monotonic()) the last was first
    seen."""
    wanted = dict(pods)
    deadline = time.monotonic() + timeout
    last: dict[str, tuple[str, str] | None] = {}
    stable_since = time.monotonic()
    while True:
        states = {p["metadata"]["name"]: _state(p) for p in api.list("Pod", namespace)
                  if p["metadata"]["name"] in wanted}
        if states != last:
            last, stable_since = states, time.monotonic()
        gone = sorted(set(wanted) - set(states))
        if gone:  # e.g. evicted by the device taint controller right after binding
            raise KubegpuError(f"pod(s) {', '.join(gone[:5])} disappeared before kube-scheduler's decision was read")
        decided = all(v is not None for v in states.values())
        if decided and time.monotonic() - stable_since >= settle:
            break
        if time.monotonic() > deadline:
            pending = sorted(n for n in wanted if states.get(n) is None)
            raise WaitTimeout(f"kube-scheduler did not decide {len(pending)} of {len(wanted)} pods in {timeout:.0f}s "
                              f"(first: {', '.join(pending[:5])})")
        time.sleep(interval)
    allocations: dict[str, list[dict[str, str]]] = {}
    for claim in api.list("ResourceClaim", namespace):
        results = (((claim.get("status") or {}).get("allocation") or {}).get("devices") or {}).get("results")
        if results is not None:
            allocations[claim["metadata"]["name"]] = [{k: r[k] for k in ("request", "driver", "pool", "device")}
                                                      for r in results]
    decisions: dict[str, Decision] = {}
    for pod, names in wanted.items():
        status, message = last[pod] or ("", "")
        decisions[pod] = Decision(status, {n: allocations.get(n, []) for n in names} if status == "bound" else {},
                                  message)
    return decisions, stable_since


def differential(api: RawApi, sets: Sequence[ClaimSet], namespace: str, prefix: str,
                 classes: Mapping[str, DeviceClass], timeout: float = 240.0) -> tuple[dict[str, Decision],
                                                                              dict[str, Decision]]:
    """Both schedulers on `sets`, by pod name: ours, then kube-scheduler's. Holder pods are decided first; each
    main pod then meets its node with the holder's device (and counters) taken — for our allocator the devices
    kube-scheduler gave the holder, so a holder that differs (reported on its own) does not cascade. Our
    allocator runs while kube-scheduler works. Cleans up the nodes (and so the slices) in the end."""
    try:
        submit(api, sets, namespace, prefix)
        holders = {s.holder_pod: s.pod_claims(holder=True) for s in sets if s.holder}
        mine = {s.holder_pod: ours(s, classes, holder=True) for s in sets if s.holder}
        real = wait_decided(api, holders, namespace, timeout)[0] if holders else {}
        submit_pods(api, sets, namespace)
        for claim_set in sets:
            mine[claim_set.pod_name] = ours(claim_set, classes, held=real.get(claim_set.holder_pod))
        real.update(wait_decided(api, {s.pod_name: s.pod_claims() for s in sets}, namespace, timeout)[0])
    finally:
        cleanup(api, prefix)
    return mine, real


def cleanup(api: RawApi, prefix: str) -> None:
    """Delete the sets' nodes; the garbage collector then removes their slices. The pods and claims go with the
    caller's namespace (the pods' zero grace period lets them go at once, with no kubelet to confirm)."""
    api.delete_collection("Node", label=f"{LABEL}={prefix}")


def scheduler_metrics(directory: Path, port: int) -> str:
    """kube-scheduler's /metrics (Prometheus text) on its secure port, as the control plane's admin (its client
    certificate in DIR/pki; the scheduler's own serving certificate is self-signed)."""
    import ssl
    import urllib.request

    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    context.load_cert_chain(str(directory / "pki" / "admin.crt"), str(directory / "pki" / "admin.key"))
    with urllib.request.urlopen(f"https://127.0.0.1:{port}/metrics", context=context, timeout=10) as response:
        return str(response.read().decode())


def histogram_totals(text: str, name: str, **labels: str) -> dict[str, tuple[float, float]]:
    """(sum, count) of a Prometheus histogram's series matching `labels`, keyed by the remaining labels."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, tuple[float, float]] = {}
    for family in text_string_to_metric_families(text):
        if family.name != name:
            continue
        for sample in family.samples:
            suffix = sample.name[len(name):]
            if suffix not in ("_sum", "_count") or any(sample.labels.get(k) != v for k, v in labels.items()):
                continue
            key = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()) if k not in labels)
            total, count = out.get(key, (0.0, 0.0))
            out[key] = (total + sample.value, count) if suffix == "_sum" else (total, count + sample.value)
    return out
