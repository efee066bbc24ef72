"""The autoscaler and the partitioner act on nothing while their informers' watches have been broken longer than the
bound, and act again once the watches recover (the quota controller's and the operator's own tests check theirs)."""

from __future__ import annotations

import urllib.error
import urllib.request

import pytest

from kubegpu.autoscaler.cli import serve_autoscaler_metrics
from kubegpu.autoscaler.cluster_state import AUTOSCALER_KINDS
from kubegpu.clock import VirtualClock
from kubegpu.kube import MemoryCluster
from kubegpu.kube.informer import InformedCluster
from kubegpu.partitioner.controller import PartitionerController
from tests.autoscaler.builders import Harness, instance_type, nodepool, pod
from tests.fakes.remote_store import RemoteStore, eventually
from tests.partitioner.test_controller_agent import all_1g_node, pending_pod

TYPES = [instance_type("a100.x1", 8, 64, 4.0, gpus=1, model="A100-SXM4-80GB")]


def test_the_autoscaler_launches_nothing_on_a_stale_cache(caplog: pytest.LogCaptureFixture) -> None:
    clock = VirtualClock(1_000_000.0)
    store = MemoryCluster(clock)
    api = RemoteStore(store)
    seconds = [0.0]
    informed = InformedCluster(api, AUTOSCALER_KINDS, watch_window=0.05, now=lambda: seconds[0])  # type: ignore[arg-type]
    try:
        h = Harness(TYPES, cluster=informed)
        h.add(nodepool("gpu"))
        api.down = True
        eventually(lambda: set(informed.broken()) == set(AUTOSCALER_KINDS))
        h.add(pod("p", cpu="1", limits={"nvidia.com/gpu": 1}))
        seconds[0] += 60.0
        h.run(10, bind=False)
        assert store.list("NodeClaim") == [] and h.autoscaler.failures == {}
        assert sum("not acting on the cache" in r.getMessage() for r in caplog.records) == 1  # said once
        api.down = False
        eventually(informed.trusted)
        h.run(4, bind=False)
        assert len(store.list("NodeClaim")) == 1
    finally:
        informed.stop()


def readyz(port: int) -> int:
    try:
        return int(urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=5).status)
    except urllib.error.HTTPError as exc:
        return exc.code


def test_the_autoscalers_readyz_is_503_while_its_cache_is_stale() -> None:
    store = MemoryCluster(VirtualClock(1_000_000.0))
    api = RemoteStore(store)
    seconds = [0.0]
    informed = InformedCluster(api, AUTOSCALER_KINDS, watch_window=0.05, now=lambda: seconds[0])  # type: ignore[arg-type]
    try:
        h = Harness(TYPES, cluster=informed)
        port = serve_autoscaler_metrics(h.autoscaler, "127.0.0.1:0")
        assert readyz(port) == 200
        api.down = True
        eventually(lambda: set(informed.broken()) == set(AUTOSCALER_KINDS))
        assert readyz(port) == 200   # a blip is not stale
        seconds[0] += 60.0
        assert readyz(port) == 503
        api.down = False
        eventually(informed.trusted)
        assert readyz(port) == 200
    finally:
        informed.stop()


def test_the_partitioner_plans_nothing_on_a_stale_cache() -> None:
    clock = VirtualClock(1000)
    store = MemoryCluster(clock)
    all_1g_node(store, clock)
    store.create(pending_pod("wants-2g", "nvidia.com/mig-2g.20gb"))
    api = RemoteStore(store)
    seconds = [0.0]
    informed = InformedCluster(api, ("Node", "Pod"), watch_window=0.05, now=lambda: seconds[0])  # type: ignore[arg-type]
    controller = PartitionerController(informed, batch_timeout=60, batch_idle=10)
    try:
        api.down = True
        eventually(lambda: set(informed.broken()) == {"Node", "Pod"})
        seconds[0] += 60.0
        assert not controller.tick(1000).planned and not controller.tick(1010).planned
        assert not controller.tick(1100).planned   # no batch window ever opened on the stale view
        api.down = False
        eventually(informed.trusted)
        assert not controller.tick(1200).planned  # the window opens now
        result = controller.tick(1210)
        assert result.planned and result.written == ["gpu-node"]
    finally:
        informed.stop()
