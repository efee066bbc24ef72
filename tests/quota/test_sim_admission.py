"""The simulator's admissions: the `+quota` modifier, told of each pod's change, answers each pass as a fresh
decision over every pod does; the plain quota's kept usage and quiet passes answer as a fresh count does."""

from __future__ import annotations

import random
from types import SimpleNamespace

from kubegpu.quota.elastic import QuotaPod, TeamQuota, decide
from kubegpu.quota.sim_strategy import ElasticAdmission
from kubegpu.sharing.charges import ChargeTable
from kubegpu.sharing.names import GPU_MEMORY_RESOURCE
from kubegpu.sim.teams import TeamAccount, TeamLimits, TeamPod

GIB = float(1 << 30)


def test_the_admission_told_of_each_change_gives_the_fresh_decision_on_every_pass() -> None:
    rng = random.Random(7)
    limits = [TeamLimits("a", 160 * GIB, 480 * GIB), TeamLimits("b", 160 * GIB, None), TeamLimits("c", 0.0, 80 * GIB)]
    quotas = [TeamQuota(t.namespace, {GPU_MEMORY_RESOURCE: t.min_bytes},
                        {GPU_MEMORY_RESOURCE: t.max_bytes} if t.max_bytes is not None else None) for t in limits]
    admission = ElasticAdmission()
    admission.start(limits)
    pods: dict[str, TeamPod] = {}

    def tell(pod: TeamPod) -> None:
        pods[pod.key] = pod
        admission.put(pod)

    def gone(key: str) -> None:
        del pods[key]
        admission.remove(key)

    seq, lifted_total, evicted_total = 0, 0, 0
    for step in range(300):
        for _ in range(rng.randint(0, 4)):  # arrivals, some at the same instant (ties broken by key)
            seq += 1
            tell(TeamPod(f"{seq:012d}", rng.choice(["a", "b", "c", "other"]), rng.choice([10, 20, 40, 80]) * GIB,
                         float(step // 2), True, False))
        running = sorted(k for k, p in pods.items() if p.bound)
        for key in rng.sample(running, k=min(len(running), rng.randint(0, 2))):  # finished
            gone(key)
        for key, pod in list(pods.items()):  # some admitted pods get bound
            if not pod.gated and not pod.bound and rng.random() < 0.5:
                tell(TeamPod(key, pod.namespace, pod.charge, pod.created, False, True))
        current = list(pods.values())
        fresh = decide(quotas, [QuotaPod(p.namespace, p.key, {GPU_MEMORY_RESOURCE: p.charge}, p.created,
                                         gated=p.gated, bound=p.bound) for p in current], 640 * GIB)
        lift, evict = admission.decide(640 * GIB)
        assert lift == [p.name for p in fresh.lift]
        assert evict == [e.pod.name for e in fresh.evict]
        for key in lift:
            pod = pods[key]
            tell(TeamPod(key, pod.namespace, pod.charge, pod.created, False, False))
        for key in evict:
            gone(key)
        lifted_total += len(lift)
        evicted_total += len(evict)
    assert lifted_total > 100 and evicted_total > 0  # the walk exercised lifts, borrowing and reclaims


def _plain_reference(account: TeamAccount) -> list[int]:
    """What a plain ResourceQuota lets through now, worked out afresh: FIFO over the held pods, each team's usage
    summed over its admitted pods."""
    caps = {t.namespace: t.max_bytes for t in account.limits}
    used = {t.namespace: sum(account.charges[id(r)] for r in account.admitted.values()
                             if r.job.namespace == t.namespace) for t in account.limits}
    through = []
    for run in sorted(account.held.values(), key=lambda r: (r.queued_at, r.seq)):
        cap, namespace = caps.get(run.job.namespace), run.job.namespace
        if cap is None or used.get(namespace, 0.0) + account.charges[id(run)] <= cap + 1e-6:
            used[namespace] = used.get(namespace, 0.0) + account.charges[id(run)]
            through.append(run.seq)
    return through


def test_the_plain_quota_kept_usage_and_quiet_passes_give_the_fresh_answer() -> None:
    # usage is kept as pods are admitted and stop, and a pass with no pod held or stopped since the last is answered
    # without a look: on every pass the pods let through are exactly those a fresh count lets through
    rng = random.Random(11)
    limits = [TeamLimits("a", 0.0, 240 * GIB), TeamLimits("b", 0.0, 80 * GIB)]
    account = TeamAccount(limits, ChargeTable(), None)
    runs: list[SimpleNamespace] = []
    admitted_total = quiet_passes = 0
    for step in range(400):
        for _ in range(rng.choice([0, 0, 1, 3])):
            run = SimpleNamespace(seq=len(runs), queued_at=float(step), node=None,
                                  job=SimpleNamespace(namespace=rng.choice(["a", "b", "other"])))
            runs.append(run)
            account.charges[id(run)] = rng.choice([10, 20, 40, 80]) * GIB
            account.hold(run)  # type: ignore[arg-type]
        for run in rng.sample(list(account.admitted.values()), k=min(len(account.admitted), rng.randint(0, 2))):
            charge = account.charges[id(run)]
            account.stopped(run)
            account.charges[id(run)] = charge  # the stand-in's charge stays known to the reference
        expected = _plain_reference(account)
        quiet_passes += not account.changed
        released, evicted = account.step(lambda: 0.0)
        assert [r.seq for r in released] == expected and evicted == []
        assert all(account.used(t.namespace) == sum(account.charges[id(r)] for r in account.admitted.values()
                                                    if r.job.namespace == t.namespace) for t in limits)
        admitted_total += len(released)
    assert admitted_total > 100 and quiet_passes > 50 and account.held  # quotas bit, and quiet passes happened
