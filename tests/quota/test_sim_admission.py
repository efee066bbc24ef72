"""The `+quota` modifier keeps pod views across the simulator's passes: each pass's answer is a fresh decision's."""

from __future__ import annotations

import random

from kubegpu.quota.elastic import QuotaPod, TeamQuota, decide
from kubegpu.quota.sim_strategy import ElasticAdmission
from kubegpu.sharing.names import GPU_MEMORY_RESOURCE
from kubegpu.sim.teams import TeamLimits, TeamPod

GIB = float(1 << 30)


def test_kept_views_give_the_fresh_decision_on_every_pass() -> None:
    rng = random.Random(7)
    limits = [TeamLimits("a", 160 * GIB, 480 * GIB), TeamLimits("b", 160 * GIB, None), TeamLimits("c", 0.0, 80 * GIB)]
    quotas = [TeamQuota(t.namespace, {GPU_MEMORY_RESOURCE: t.min_bytes},
                        {GPU_MEMORY_RESOURCE: t.max_bytes} if t.max_bytes is not None else None) for t in limits]
    admission = ElasticAdmission()
    pods: dict[str, TeamPod] = {}
    seq, lifted_total, evicted_total = 0, 0, 0
    for step in range(300):
        for _ in range(rng.randint(0, 4)):  # arrivals, some at the same instant (ties broken by key)
            seq += 1
            key = f"{seq:012d}"
            pods[key] = TeamPod(key, rng.choice(["a", "b", "c", "other"]), rng.choice([10, 20, 40, 80]) * GIB,
                                float(step // 2), True, False)
        for key in rng.sample(sorted(pods), k=min(len(pods), rng.randint(0, 3))):  # finished
            del pods[key]
        for key, pod in list(pods.items()):  # some admitted pods get bound
            if not pod.gated and not pod.bound and rng.random() < 0.5:
                pods[key] = TeamPod(key, pod.namespace, pod.charge, pod.created, False, True)
        current = list(pods.values())
        fresh = decide(quotas, [QuotaPod(p.namespace, p.key, {GPU_MEMORY_RESOURCE: p.charge}, p.created,
                                         gated=p.gated, bound=p.bound) for p in current], 640 * GIB)
        lift, evict = admission.decide(limits, current, 640 * GIB)
        assert lift == [p.name for p in fresh.lift]
        assert evict == [e.pod.name for e in fresh.evict]
        for key in lift:
            pod = pods[key]
            pods[key] = TeamPod(key, pod.namespace, pod.charge, pod.created, False, False)
        for key in evict:
            del pods[key]
        lifted_total += len(lift)
        evicted_total += len(evict)
    assert lifted_total > 100 and evicted_total > 0  # the walk exercised lifts, borrowing and reclaims
