"""The guard's pure decisions: shares against usage, grace and reserve, what it never touches."""

from __future__ import annotations

from kubegpu.guard.core import (
    EntityReading,
    GuardAction,
    Holding,
    Policy,
    ProcessReading,
    Reason,
    decide,
)
from kubegpu.guard.procs import mps_limit_from_environ, owner_from_cgroup
from kubegpu.sharing.names import SharingKind

UID = {name: f"{i:08d}-0000-4000-8000-{i:012d}" for i, name in enumerate(["a", "b", "c", "d"], start=1)}


def _holding(pod: str, share: int = 20480, kind: SharingKind = SharingKind.TIME_SLICING, entity=(0, None),
             terminating: bool = False, limit: int | None = None) -> Holding:
    return Holding("ml", pod, UID[pod], entity, kind, share, limit, terminating)


def _gpu(free: int, total: int = 81920, entity=(0, None)) -> EntityReading:
    return EntityReading(entity, total, free, "GPU-0")


def test_only_the_pod_over_its_share_is_acted_on_among_four() -> None:
    holdings = [_holding(p) for p in "abcd"]
    processes = [ProcessReading(100, (0, None), 10000, UID["a"]), ProcessReading(101, (0, None), 25000, UID["b"]),
                 ProcessReading(102, (0, None), 20480, UID["c"])]
    decision = decide([_gpu(81920 - 55480)], holdings, processes, Policy())
    assert [(a.holding.pod, a.kind, a.reason, a.used_mib, a.pids) for a in decision.actions] == [
        ("b", GuardAction.EVICT, Reason.OVER_SHARE, 25000, (101,))]
    assert {u.holding.pod: u.used_mib for u in decision.usage} == {"a": 10000, "b": 25000, "c": 20480, "d": 0}


def test_processes_of_one_pod_add_up_and_only_the_largest_go() -> None:
    processes = [ProcessReading(1, (0, None), 15000, UID["a"]), ProcessReading(2, (0, None), 9000, UID["a"]),
                 ProcessReading(3, (0, None), 1000, UID["a"])]
    decision = decide([_gpu(40000)], [_holding("a")], processes, Policy(GuardAction.KILL_PROCESS))
    (action,) = decision.actions
    assert action.kind == GuardAction.KILL_PROCESS and action.used_mib == 25000
    assert action.pids == (1,)  # 25000 - 15000 fits the 20480 share: the 9000 and 1000 MiB workers stay


def test_grace_tolerates_a_burst_until_the_reserve_is_gone() -> None:
    policy = Policy(grace=True, reserve_mib=4096)
    over = [ProcessReading(7, (0, None), 30000, UID["a"]), ProcessReading(8, (0, None), 10000, UID["b"])]
    quiet = decide([_gpu(81920 - 40000)], [_holding("a"), _holding("b")], over, policy)
    assert quiet.actions == []
    busy = decide([_gpu(4096)], [_holding("a"), _holding("b")], over, policy)
    assert [(a.holding.pod, a.reason) for a in busy.actions] == [("a", Reason.RESERVE_EXHAUSTED)]
    without_grace = decide([_gpu(81920 - 40000)], [_holding("a"), _holding("b")], over, Policy(reserve_mib=4096))
    assert [a.holding.pod for a in without_grace.actions] == ["a"]


def test_unattributed_and_unshared_processes_are_never_acted_on() -> None:
    processes = [ProcessReading(1, (0, None), 70000, None),  # no pod cgroup: a host process
                 ProcessReading(2, (0, None), 5000, "99999999-0000-4000-8000-000000000000"),  # a pod with no share
                 ProcessReading(3, (1, None), 80000, UID["a"])]  # "a" holds a share of GPU 0 only (GPU 1 is whole)
    decision = decide([_gpu(0), _gpu(0, entity=(1, None))], [_holding("a")], processes, Policy())
    assert decision.actions == []
    assert decision.unattributed == {(0, None): (2, 75000), (1, None): (1, 80000)}


def test_a_pod_already_evicted_is_not_evicted_again_but_killed_when_the_gpu_is_full() -> None:
    holding = _holding("a", terminating=True)
    process = [ProcessReading(5, (0, None), 30000, UID["a"])]
    assert decide([_gpu(40000)], [holding], process, Policy()).actions == []
    (action,) = decide([_gpu(512)], [holding], process, Policy()).actions
    assert action.kind == GuardAction.KILL_PROCESS and action.pids == (5,)
    assert decide([_gpu(512)], [holding], process, Policy(GuardAction.WARN)).actions == []


def test_mps_client_without_its_limit_is_reported_not_evicted() -> None:
    holding = _holding("a", share=10240, kind=SharingKind.MPS, limit=10240)
    ok = ProcessReading(1, (0, None), 4000, UID["a"], 10240, True)
    missing = ProcessReading(2, (0, None), 4000, UID["a"], None, True)
    too_big = ProcessReading(3, (0, None), 1000, UID["a"], 81920, True)
    unknown = ProcessReading(4, (0, None), 1000, UID["a"], None, False)  # environment unreadable: no claim either way
    decision = decide([_gpu(60000)], [holding], [ok, missing, too_big, unknown], Policy())
    assert [(f.reason, f.pid) for f in decision.findings] == [(Reason.MPS_LIMIT_MISSING, 2),
                                                             (Reason.MPS_LIMIT_MISSING, 3)]
    assert decision.actions == []


def test_same_reading_same_decision_after_a_restart() -> None:
    """Stateless: two guards (the one before a restart and the one after) decide the same from one reading."""
    args = ([_gpu(1000)], [_holding("a"), _holding("b")],
            [ProcessReading(1, (0, None), 60000, UID["a"]), ProcessReading(2, (0, None), 20000, UID["b"])], Policy())
    assert decide(*args) == decide(*args)
    assert [a.holding.pod for a in decide(*args).actions] == ["a"]


def test_cgroup_paths_name_the_pod_and_container() -> None:
    cid = "ab" * 32
    v1 = f"12:pids:/kubepods/besteffort/pod{UID['a']}/{cid}\n11:memory:/kubepods/besteffort/pod{UID['a']}/{cid}\n"
    owner = owner_from_cgroup(v1)
    assert owner is not None and (owner.pod_uid, owner.container_id) == (UID["a"], cid)
    systemd = ("0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod"
               f"{UID['b'].replace('-', '_')}.slice/cri-containerd-{cid}.scope\n")
    owner = owner_from_cgroup(systemd)
    assert owner is not None and (owner.pod_uid, owner.container_id) == (UID["b"], cid)
    sandbox_level = owner_from_cgroup(f"4:cpu:/kubepods/pod{UID['c']}\n")
    assert sandbox_level is not None and sandbox_level.container_id is None
    assert owner_from_cgroup("12:pids:/system.slice/containerd.service\n0::/\n") is None


def test_mps_limit_from_the_environment() -> None:
    env = b"PATH=/bin\0CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=10240M,1=12G\0HOME=/\0"
    assert mps_limit_from_environ(env) == (True, 12288)
    assert mps_limit_from_environ(b"PATH=/bin\0") == (False, None)
