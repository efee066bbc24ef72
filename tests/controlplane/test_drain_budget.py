"""Deleting every NodeClaim of a Deployment at once, on the real control plane, with `kubegpu autoscaler` running as
a user runs it: the PodDisruptionBudget holds at every instant.

Four one-GPU pods of a Deployment, one per node (required hostname anti-affinity), under a PDB of `maxUnavailable:
1`; once all run, all four NodeClaims are deleted at once. Sampled every 100 ms: never more than one pod unhealthy
(not Ready, or terminating, or missing); every old node still goes, one after another, and the Deployment is whole
again on new nodes that the autoscaler bought for the replacements. The budget is the API server's (the real
disruption controller computes it, the Eviction API spends it), whatever number of claims drain at once.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from lightkube import codecs
from lightkube.resources.apps_v1 import Deployment

from kubegpu.autoscaler import labels as L
from kubegpu.autoscaler.instancetypes import to_kwok
from kubegpu.kube import NotFound
from kubegpu.kube.lightkube_cluster import LightkubeCluster
from kubegpu.testing.processes import stop_child
from kubegpu.testing.session import RealCluster, WaitTimeout, wait_for
from tests.autoscaler.builders import instance_type, nodepool

pytestmark = pytest.mark.apiserver
REPLICAS = 4
A100 = "A100-SXM4-80GB"


def _ready(pod: dict[str, Any]) -> bool:
    if pod["metadata"].get("deletionTimestamp"):
        return False
    return any(c.get("type") == "Ready" and c.get("status") == "True"
               for c in (pod.get("status") or {}).get("conditions") or [])


def _deployment(name: str, namespace: str, pool: str) -> dict[str, Any]:
    labels = {"app": name}
    toleration = {"key": "e2e-pool", "operator": "Equal", "value": pool, "effect": "NoSchedule"}
    spread = {"labelSelector": {"matchLabels": labels}, "topologyKey": "kubernetes.io/hostname"}
    container = {"name": "serve", "image": "registry.k8s.io/pause:3.10",
                 "resources": {"requests": {"cpu": "500m", "memory": "1Gi", "nvidia.com/gpu": "1"},
                               "limits": {"nvidia.com/gpu": "1"}}}
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name, "namespace": namespace},
            "spec": {"replicas": REPLICAS, "selector": {"matchLabels": labels},
                     "template": {"metadata": {"labels": labels}, "spec": {
                         "containers": [container], "nodeSelector": {"e2e-pool": pool}, "tolerations": [toleration],
                         "terminationGracePeriodSeconds": 1,
                         "affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [spread]}},
                     }}}}


@pytest.fixture
def autoscaler(real_cluster: RealCluster, namespace: str, crds: list[str], tmp_path: Path
               ) -> Iterator[tuple[LightkubeCluster, str, subprocess.Popen[bytes]]]:
    """`kubegpu autoscaler --instance-types FILE --registration-delay 0 --interval 1` in its own process, a NodePool
    (tainted: only this test's pods use it); afterwards everything it launched is deleted through the API and
    terminated by it before it is stopped."""
    api = real_cluster.cluster()
    pool = f"pool-{uuid.uuid4().hex[:6]}"
    api.create(nodepool(pool, labels={"e2e-pool": pool}, taints=[{"key": "e2e-pool", "value": pool,
                                                                   "effect": "NoSchedule"}],
                        disruption={"consolidateAfter": "Never"}))
    types = tmp_path / "instance-types.json"
    types.write_text(json.dumps(to_kwok([instance_type("a100.x1", 8, 64, 4.0, gpus=1, model=A100)])))
    log = (tmp_path / "autoscaler.log").open("w")
    process = subprocess.Popen(
        [sys.executable, "-X", "faulthandler", "-m", "kubegpu", "autoscaler", "--instance-types", str(types),
         "--registration-delay", "0", "--interval", "1", "--metrics-address", "", "--identity", "drain-budget",
         "--lease-namespace", namespace, "--lease-duration", "5s"],
        env={**os.environ, **real_cluster.env()}, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        yield api, pool, process
    finally:
        with contextlib.suppress(NotFound):
            api.client.delete(Deployment, pool, namespace=namespace)
        for claim in api.list("NodeClaim"):
            if claim["metadata"].get("labels", {}).get(L.NODEPOOL_LABEL) == pool:
                with contextlib.suppress(NotFound):
                    api.delete("NodeClaim", claim["metadata"]["name"])
        with contextlib.suppress(WaitTimeout):
            wait_for(lambda: not any(c["metadata"].get("labels", {}).get(L.NODEPOOL_LABEL) == pool
                                     for c in api.list("NodeClaim")), "the test's NodeClaims terminated", 60)
        stop_child(process, 20)
        log.close()
        api.delete("NodePool", pool)


@pytest.mark.timeout(600)   # about 60 s on a quiet machine: four nodes bought, drained and bought again, one by one
def test_deleting_every_nodeclaim_at_once_never_breaks_the_pdb(
        autoscaler: tuple[LightkubeCluster, str, subprocess.Popen[bytes]], namespace: str, tmp_path: Path) -> None:
    api, pool, process = autoscaler
    app = pool
    api.client.create(codecs.from_dict(_deployment(app, namespace, pool)))
    api.create({"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
                "metadata": {"name": app, "namespace": namespace},
                "spec": {"maxUnavailable": 1, "selector": {"matchLabels": {"app": app}}}})

    def pods() -> list[dict[str, Any]]:
        return api.list("Pod", namespace, label_selector=f"app={app}")

    def pool_nodes() -> set[str]:
        return {n["metadata"]["name"] for n in api.list("Node")
                if n["metadata"].get("labels", {}).get(L.NODEPOOL_LABEL) == pool}

    def log_tail() -> str:
        """What the cluster and the autoscaler show, for a failure's message."""
        ended = "running" if process.poll() is None else f"exited {process.returncode}"
        claims = sum(1 for c in api.list("NodeClaim") if c["metadata"].get("labels", {}).get(L.NODEPOOL_LABEL) == pool)
        seen = [(p["metadata"]["name"][-5:], p["spec"].get("nodeName"), p["status"].get("phase"),
                 [(c.get("type"), c.get("status"), c.get("reason")) for c in p["status"].get("conditions") or []])
                for p in pods()]
        log = (tmp_path / "autoscaler.log").read_text()[-3000:]
        return f"{claims} nodeclaims; pods {seen}; autoscaler {ended}: {log}"

    def all_running() -> set[str] | None:
        ready = [p for p in pods() if _ready(p)]
        where = {p["spec"]["nodeName"] for p in ready}
        return where if len(ready) == REPLICAS and len(where) == REPLICAS else None

    try:
        old = wait_for(all_running, "four pods Ready, one per node the autoscaler bought", 180, interval=0.5)
        wait_for(lambda: (api.get("PodDisruptionBudget", app, namespace).get("status") or {})
                 .get("disruptionsAllowed") == 1, "the disruption controller to allow one disruption", 60)
    except WaitTimeout as exc:
        raise AssertionError(f"{exc}; autoscaler: {log_tail()}") from None
    claims = [c["metadata"]["name"] for c in api.list("NodeClaim")
              if c["metadata"].get("labels", {}).get(L.NODEPOOL_LABEL) == pool]
    assert len(claims) == REPLICAS
    for name in claims:   # all at once, as `kubectl delete nodeclaim --all` does
        api.delete("NodeClaim", name)

    worst, gone_at = 0, {}   # most unhealthy pods seen at one instant; old node → when it was first seen gone
    deadline = time.monotonic() + 300
    while True:
        now = time.monotonic()
        unhealthy = REPLICAS - sum(1 for p in pods() if _ready(p))
        worst = max(worst, unhealthy)
        assert unhealthy <= 1, f"{unhealthy} of {REPLICAS} pods unhealthy at once; autoscaler: {log_tail()}"
        present = pool_nodes()
        for node in old - present:
            gone_at.setdefault(node, now)
        if len(gone_at) == REPLICAS and (where := all_running()) is not None and not where & old:
            break
        assert now < deadline, f"old nodes gone: {len(gone_at)}/{REPLICAS}; autoscaler: {log_tail()}"
        time.sleep(0.1)
    assert worst == 1   # the drain did disrupt, one pod at a time
    times = sorted(gone_at.values())
    assert all(later > earlier for earlier, later in itertools.pairwise(times)), \
        "old nodes went one after another, never two in one instant"
    assert not set(claims) & {c["metadata"]["name"] for c in api.list("NodeClaim")}
