"""The elastic ledger (`kubegpu.quota.elastic.ElasticLedger`) kept pod by pod gives, on every pass, what a walk over
every pod gives — the rules written out plainly below."""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence

from kubegpu.quota.elastic import ElasticLedger, QuotaPod, TeamQuota, decide

GIB = float(1 << 30)
MEM = "kubegpu.io/gpu-memory"
GPU = "nvidia.com/gpu"


def _fits(used: Mapping[str, float], extra: Mapping[str, float], limit: Mapping[str, float] | None) -> bool:
    return limit is None or all(used.get(n, 0.0) + float(extra.get(n, 0.0)) <= float(a) + 1e-6
                                for n, a in limit.items())


def reference(quotas: Sequence[TeamQuota], pods: Sequence[QuotaPod], capacity: float) -> tuple[
        list[str], set[str], list[tuple[str, str]], dict[str, dict[str, float]]]:
    """The rules as a walk over every pod: (lifted keys in order, borrowed keys, (evicted key, reason), used)."""
    teams = {q.namespace: q for q in quotas}
    used: dict[str, dict[str, float]] = {}
    admitted = sum(p.memory for p in pods if not p.gated)
    for pod in pods:
        if not pod.gated:
            mine = used.setdefault(pod.namespace, {})
            for name in (MEM, GPU):
                if name in pod.amounts:
                    mine[name] = mine.get(name, 0.0) + float(pod.amounts[name])
    lifted, borrowed = [], set()
    for pod in sorted((p for p in pods if p.gated and p.namespace in teams), key=lambda p: (p.created, p.key)):
        team, mine = teams[pod.namespace], used.setdefault(pod.namespace, {})
        if _fits(mine, pod.amounts, team.min):
            pass
        elif _fits(mine, pod.amounts, team.max) and admitted + pod.memory <= capacity + 1e-6:
            borrowed.add(pod.key)
        else:
            continue
        lifted.append(pod.key)
        for name in (MEM, GPU):
            if name in pod.amounts:
                mine[name] = mine.get(name, 0.0) + float(pod.amounts[name])
        admitted += pod.memory
    within_min = {ns: _fits(used.get(ns, {}), {}, t.min) for ns, t in teams.items()}
    held = sum(p.memory for p in pods if p.bound and not p.gated)
    returning = sum(p.memory for p in pods if p.bound and p.terminating)
    waiting: dict[str, float] = {}
    for pod in pods:
        if not pod.gated and not pod.bound and not pod.terminating and within_min.get(pod.namespace, False):
            waiting[pod.namespace] = waiting.get(pod.namespace, 0.0) + pod.memory
    needed = sum(waiting.values()) - (capacity - held) - returning
    evicted: list[tuple[str, str]] = []
    if needed > 1e-6:
        over = {ns: dict(a) for ns, a in used.items() if ns in teams and not _fits(a, {}, teams[ns].min)}
        for pod in sorted((p for p in pods if p.namespace in over and p.bound and not p.gated and not p.terminating),
                          key=lambda p: (-p.created, p.key)):
            if needed <= 1e-6:
                break
            after = {n: over[pod.namespace].get(n, 0.0) - float(pod.amounts.get(n, 0.0)) for n in over[pod.namespace]}
            if all(after.get(n, 0.0) >= float(a) - 1e-6 for n, a in teams[pod.namespace].min.items()):
                over[pod.namespace] = after
                needed -= pod.memory
                evicted.append((pod.key, ", ".join(sorted(waiting))))
    return lifted, borrowed, evicted, used


def test_the_ledger_kept_pod_by_pod_decides_as_a_walk_over_every_pod() -> None:
    rng = random.Random(5)
    quotas = [TeamQuota("a", {MEM: 400 * GIB}, {MEM: 800 * GIB}),
              TeamQuota("b", {MEM: 160 * GIB}, None),
              TeamQuota("c", {MEM: 0.0}, {MEM: 80 * GIB}),  # nothing guaranteed: only borrows
              TeamQuota("d", {MEM: 80 * GIB, GPU: 2}, {MEM: 320 * GIB, GPU: 6})]  # two resources: walked pod by pod
    ledger = ElasticLedger(quotas)
    pods: dict[str, QuotaPod] = {}
    seq = lifts = borrows = evictions = 0
    for step in range(400):
        for _ in range(rng.randint(1, 6)):  # arrivals: mostly in order, some older than the youngest (a re-list)
            seq += 1
            created = float(step // 2 - (rng.randint(1, 20) if rng.random() < 0.1 else 0))
            # phases: a borrower fills the cluster, then teams within their min want it back
            namespace = rng.choice(["b", "b", "b", "c"] if step % 100 < 50 else ["a", "a", "d", "c"])
            namespace = "other" if rng.random() < 0.05 else namespace
            amounts = {MEM: rng.choice([5, 10, 20, 40, 80]) * GIB}
            if namespace == "d" or rng.random() < 0.2:
                amounts[GPU] = rng.choice([1, 2])
            pod = QuotaPod(namespace, f"p{seq:05d}", amounts, created, gated=namespace != "other" or rng.random() < .3)
            pods[pod.key] = pod
            ledger.put(pod)
        running = sorted(key for key, pod in pods.items() if pod.bound and not pod.terminating)
        gone = [key for key, pod in pods.items() if pod.terminating]  # a step after their deletion
        gone += rng.sample(running, k=min(len(running), rng.randint(0, 2)))  # finished
        for key in gone + ([rng.choice(sorted(pods))] if pods and rng.random() < 0.1 else []):  # or deleted
            if key not in pods:
                continue
            del pods[key]
            ledger.remove(key)
        capacity = (800 if step % 20 < 14 else rng.choice([480, 640])) * GIB  # nodes come and go
        held = sum(p.memory for p in pods.values() if p.bound)
        for key, pod in list(pods.items()):  # admitted pods get bound where there is room; some bound ones end
            if pod.gated or (pod.bound and pod.terminating) or rng.random() < 0.3:
                continue
            if pod.bound or held + pod.memory <= capacity:
                held += 0.0 if pod.bound else pod.memory
                changed = QuotaPod(pod.namespace, pod.name, pod.amounts, pod.created, bound=True,
                                   terminating=pod.bound and rng.random() < 0.3)
                pods[key] = changed
                ledger.put(changed)
        expected = reference(quotas, list(pods.values()), capacity)
        decision = ledger.decide(capacity)
        fresh = decide(quotas, list(pods.values()), capacity)
        for got in (decision, fresh):
            assert [p.key for p in got.lift] == expected[0]
            assert got.borrowed == expected[1]
            assert [(e.pod.key, e.reason.split(" team(s) ")[1].split(" below")[0]) for e in got.evict] == expected[2]
            assert got.used == expected[3]
        for pod in decision.lift:
            pods[pod.key] = QuotaPod(pod.namespace, pod.name, pod.amounts, pod.created)
            ledger.put(pods[pod.key])
        for eviction in decision.evict:
            del pods[eviction.pod.key]
            ledger.remove(eviction.pod.key)
        lifts += len(decision.lift)
        borrows += len(decision.borrowed)
        evictions += len(decision.evict)
    assert lifts > 300 and borrows > 20 and evictions > 5  # every rule was exercised


def test_a_quiet_pass_gives_the_same_answer_without_a_walk() -> None:
    quotas = [TeamQuota("a", {MEM: 40 * GIB}, {MEM: 40 * GIB})]
    ledger = ElasticLedger(quotas)
    ledger.put(QuotaPod("a", "x", {MEM: 40 * GIB}, 1.0))
    ledger.put(QuotaPod("a", "y", {MEM: 40 * GIB}, 2.0, gated=True))
    first = ledger.decide(80 * GIB)
    assert not first.lift and ledger.decide(80 * GIB) is first  # nothing changed: the same decision
    ledger.remove("a/x")
    assert [p.name for p in ledger.decide(80 * GIB).lift] == ["y"]
