"""API-fault scenarios shared by tests/reliability and benchmarks/reliability.py.

Each scenario drives real `LightkubeCluster` code through `tests.fakes.faultproxy.FaultProxy` (429, 5xx, connections
dropped before or after the server acted) in front of the emulated API server, and counts what must stay zero.
"""

from __future__ import annotations

import json
import random
import threading
import uuid
from collections import Counter
from dataclasses import dataclass
from typing import Any

from lightkube import Client
from lightkube.config.kubeconfig import KubeConfig
from lightkube.config.models import Cluster, User

from kubegpu.kube.lightkube_cluster import LightkubeCluster
from kubegpu.kube.retry import RetryPolicy, update_with_retry

FAST_RETRY = dict(attempts=30, base_s=0.001, cap_s=0.02)


def faulty_cluster(url: str, seed: int = 0) -> LightkubeCluster:
    config = KubeConfig.from_one(cluster=Cluster(server=url), user=User(token="kubegpu-test"))
    return LightkubeCluster(Client(config=config, trust_env=False),
                            retry=RetryPolicy(**FAST_RETRY, rng=random.Random(seed)))  # type: ignore[arg-type]


@dataclass
class UpdateResult:
    applied: int
    lost: int
    duplicated: int


def concurrent_updates(url: str, clean: LightkubeCluster, workers: int, ops: int, name: str) -> UpdateResult:
    """`workers` controllers each record `ops` distinct operations on one ConfigMap by read-modify-write.

    Every operation adds its id to the ConfigMap's `ops` list; `mutate` declines when the id is already there, so a
    write whose answer was lost and that is then retried is not applied twice. Lost: ids missing at the end.
    """
    clean.create({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "namespace": "default"},
                  "data": {"ops": "[]"}})
    expected: list[str] = []
    errors: list[BaseException] = []

    def worker(index: int) -> None:
        cluster = faulty_cluster(url, seed=index)
        for op in range(ops):
            token = f"w{index}-{op}"
            expected.append(token)

            def mutate(obj: dict[str, Any], token: str = token) -> dict[str, Any] | None:
                done = json.loads((obj.get("data") or {}).get("ops") or "[]")
                if token in done:
                    return None
                return {"data": {"ops": json.dumps([*done, token])}}

            try:
                update_with_retry(cluster, "ConfigMap", name, mutate, namespace="default", attempts=200)
            except BaseException as exc:
                errors.append(exc)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    final = json.loads(clean.get("ConfigMap", name, "default")["data"]["ops"])
    counts = Counter(final)
    return UpdateResult(applied=len(counts), lost=len(set(expected) - set(final)),
                        duplicated=sum(c - 1 for c in counts.values()))


def nodeclaim_decisions(url: str, clean: LightkubeCluster, decisions: int, seed: int = 0) -> tuple[int, int]:
    """Create one NodeClaim per decision through the faulty proxy (deterministic names, as the provisioner makes
    them); returns (NodeClaims created for these decisions, duplicates = created - decisions)."""
    cluster = faulty_cluster(url, seed)
    run = uuid.uuid4().hex[:6]
    for i in range(decisions):
        cluster.create({"apiVersion": "karpenter.sh/v1", "kind": "NodeClaim",
                        "metadata": {"name": f"pool-{run}-{i}", "labels": {"kubegpu.io/test-run": run}},
                        "spec": {"nodeClassRef": {"group": "kubegpu.io", "kind": "SimNodeClass", "name": "x"},
                                 "requirements": []}})
    mine = [c for c in clean.list("NodeClaim") if c["metadata"]["name"].startswith(f"pool-{run}-")]
    return len(mine), len(mine) - decisions
