"""Controllers' API calls ride out injected faults: nothing lost, nothing done twice (issue #18, "API faults")."""

from __future__ import annotations

import random
from collections.abc import Iterator

import pytest

from kubegpu.kube.errors import ApiError, Conflict
from kubegpu.kube.memory import MemoryCluster
from kubegpu.kube.retry import RetryPolicy, update_with_retry
from tests.fakes.apiserver import ApiServer
from tests.fakes.faultproxy import FaultProxy
from tests.reliability.faults import concurrent_updates, faulty_cluster, nodeclaim_decisions


@pytest.fixture
def proxy(apiserver: ApiServer) -> Iterator[FaultProxy]:
    fault_proxy = FaultProxy(apiserver.url, rate=0.35, seed=7)
    yield fault_proxy
    fault_proxy.stop()


def test_no_lost_or_doubled_updates_under_faults(apiserver: ApiServer, proxy: FaultProxy) -> None:
    result = concurrent_updates(proxy.url, apiserver.cluster(), workers=3, ops=8, name="faults-rmw")
    assert (result.applied, result.lost, result.duplicated) == (24, 0, 0)
    assert proxy.faults["drop-after"] > 0 and proxy.faults["429"] > 0 and proxy.injected >= 20


def test_no_duplicate_nodeclaims_under_faults(apiserver: ApiServer, proxy: FaultProxy) -> None:
    created, duplicates = nodeclaim_decisions(proxy.url, apiserver.cluster(), decisions=25)
    assert (created, duplicates) == (25, 0)
    assert proxy.faults["drop-after"] > 0


def test_delete_whose_answer_was_lost_is_not_an_error(apiserver: ApiServer) -> None:
    clean = apiserver.cluster()
    clean.create({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "faults-del", "namespace": "default"}})
    proxy = FaultProxy(apiserver.url, rate=1.0, kinds=("drop-after",))
    try:
        cluster = faulty_cluster(proxy.url)
        cluster.retry.attempts = 2
        with pytest.raises(ApiError):  # every answer is lost: the caller hears of it
            cluster.delete("ConfigMap", "faults-del", "default")
        assert [c for c in clean.list("ConfigMap", "default") if c["metadata"]["name"] == "faults-del"] == []
    finally:
        proxy.stop()


def test_retry_policy_is_capped_exponential_with_jitter() -> None:
    policy = RetryPolicy(attempts=8, base_s=0.1, cap_s=1.0, rng=random.Random(3))
    delays = list(policy.delays())
    assert len(delays) == 7
    assert all(0 <= d <= min(1.0, 0.1 * 2**i) for i, d in enumerate(delays))
    assert len(set(delays)) == 7  # jittered, not a fixed schedule


def test_retry_gives_up_after_attempts_and_passes_answers_through() -> None:
    slept: list[float] = []
    policy = RetryPolicy(attempts=3, sleep=slept.append)
    calls = 0

    def always_503() -> None:
        nonlocal calls
        calls += 1
        raise ApiError("down", code=503)

    with pytest.raises(ApiError):
        policy.call(always_503, lambda exc: isinstance(exc, ApiError) and exc.code == 503)
    assert calls == 3 and len(slept) == 2
    with pytest.raises(Conflict):  # an answer (409) is not retried
        policy.call(lambda: (_ for _ in ()).throw(Conflict("stale")), lambda exc: False)


def test_update_with_retry_rereads_on_conflict() -> None:
    cluster = MemoryCluster()
    cluster.create({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c", "namespace": "default"},
                    "data": {"n": "0"}})
    raced = False

    def increment(obj: dict[str, object]) -> dict[str, object]:
        nonlocal raced
        n = int(obj["data"]["n"])  # type: ignore[index]
        if not raced:  # someone else writes between our read and our write
            raced = True
            cluster.patch("ConfigMap", "c", {"data": {"n": str(n + 10)}}, "default")
        return {"data": {"n": str(n + 1)}}

    update_with_retry(cluster, "ConfigMap", "c", increment, namespace="default")
    assert cluster.get("ConfigMap", "c", "default")["data"]["n"] == "11"  # the concurrent +10 was not lost
