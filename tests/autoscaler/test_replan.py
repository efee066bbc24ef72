"""Re-planning from where pods landed on the in-memory cluster: kube-scheduler is played by hand, putting
pods where the autoscaler did not nominate them (as the real one's default profile does: small pods on big empty
nodes). Displaced pods go to free capacity that exists or is in flight before anything is bought; a NodeClaim whose
pods went elsewhere is deleted once nothing needs it, never while a pending pod does, and never one that was used."""

from __future__ import annotations

import threading
import time
from typing import Any

from kubegpu.autoscaler.objects import is_true
from kubegpu.autoscaler.replan import SurplusTracker, could_take, keep_nominated, pod_shapes, target_aliases
from kubegpu.scheduling import node_info
from tests.autoscaler.builders import Harness, instance_type, nodepool, pod

A100 = "A100-SXM4-80GB"
TYPES = [instance_type("gpu.x1", 8, 64, 1.5, gpus=1, model=A100),
         instance_type("gpu.x2", 16, 128, 2.2, gpus=2, model=A100),
         instance_type("gpu.x4", 32, 256, 3.5, gpus=4, model=A100)]
TYPE_LABEL = "node.kubernetes.io/instance-type"


def gpu_pod(name: str, gpus: int) -> dict[str, Any]:
    return pod(name, cpu="1", memory="1Gi", limits={"nvidia.com/gpu": gpus})


def bind(h: Harness, name: str, node: str) -> None:
    """kube-scheduler's decision, whatever the nomination said."""
    h.writer.patch("Pod", name, {"spec": {"nodeName": node}}, namespace="default")
    h.writer.patch("Pod", name, {"status": {"phase": "Running"}}, namespace="default", subresource="status")


def node_of_type(h: Harness, type_name: str) -> str:
    [claim] = [c for c in h.claims() if c["metadata"]["labels"].get(TYPE_LABEL) == type_name]
    return str(claim["status"]["nodeName"])


def initialized(h: Harness) -> bool:
    return all(is_true(c, "Initialized") for c in h.claims())


def test_a_displaced_pod_takes_a_claim_whose_pods_landed_elsewhere_instead_of_a_new_one() -> None:
    h = Harness(TYPES, registration_delay=2.0, batch_idle=1.0, batch_max=3.0)
    h.add(nodepool("gpu"))
    for name, gpus in (("a2", 2), ("b2", 2), ("c1", 1), ("d1", 1)):
        h.add(gpu_pod(name, gpus))
    h.run(12, bind=False)
    assert sorted(c["metadata"]["labels"][TYPE_LABEL] for c in h.claims()) == ["gpu.x2", "gpu.x4"]
    assert initialized(h)
    x4 = node_of_type(h, "gpu.x4")
    for name in ("c1", "d1", "a2"):   # the spreading scheduler fills the big node with the small pods first
        bind(h, name, x4)
    h.run(12)   # b2, displaced from the x4 it was nominated to, fits the x2 whose pods went elsewhere
    assert h.cluster.get("Pod", "b2", "default")["spec"]["nodeName"] == node_of_type(h, "gpu.x2")
    assert len(h.claims()) == 2 and not any("terminating" in line for line in h.lines), h.lines[-5:]


def small_pod_lands_on_the_big_node() -> tuple[Harness, str]:
    """An x4 bought for `big` and an x1 for `small`; the scheduler puts `small` on the x4: `big` is displaced and
    the x1 is of no use to it. Returns the harness and the x1's node."""
    h = Harness(TYPES, registration_delay=2.0, batch_idle=1.0, batch_max=3.0)
    h.add(nodepool("gpu", disruption={"consolidateAfter": "Never"}))
    h.add(gpu_pod("big", 4))
    h.add(gpu_pod("small", 1))
    h.run(12, bind=False)
    assert sorted(c["metadata"]["labels"][TYPE_LABEL] for c in h.claims()) == ["gpu.x1", "gpu.x4"]
    x1 = node_of_type(h, "gpu.x1")
    bind(h, "small", node_of_type(h, "gpu.x4"))
    return h, x1


def test_an_unused_claim_is_deleted_and_the_displaced_pod_gets_what_it_needs() -> None:
    h, x1 = small_pod_lands_on_the_big_node()
    h.run(2, bind=False)
    assert any(c["status"].get("nodeName") == x1 for c in h.claims())   # not deleted at the first sight: grace
    h.run(20)
    assert any("terminating (unused)" in line for line in h.lines), h.lines[-5:]
    types = sorted(c["metadata"]["labels"][TYPE_LABEL] for c in h.claims())
    assert types == ["gpu.x4", "gpu.x4"]   # a second x4 for `big`; x1 gone though consolidation is off
    pods_on = {p["spec"].get("nodeName") for p in h.cluster.list("Pod")}
    assert all(c["status"]["nodeName"] in pods_on for c in h.claims())   # no NodeClaim left empty


def test_an_unused_claim_is_cordoned_first_and_kept_if_a_pod_lands_meanwhile() -> None:
    # seen on the real control plane: the claim was judged unused in the same instant kube-scheduler bound
    # a pod to its node, and deleting it evicted the pod (lost). Now the node is cordoned first and the claim goes
    # only once a later view still shows it cordoned and empty; a pod that landed before the cordon keeps it.
    h, x1 = small_pod_lands_on_the_big_node()

    def cordoned() -> bool:
        return any(t.get("key") == "kubegpu.io/disrupted" for t in h.cluster.get("Node", x1)["spec"].get("taints")
                   or [])

    for _ in range(10):
        if cordoned():
            break
        h.run(1, bind=False)
    assert cordoned() and any(c["status"].get("nodeName") == x1 for c in h.claims())   # cordoned, not deleted
    late = gpu_pod("late", 1)
    h.add(late | {"spec": {**late["spec"], "nodeName": x1}})   # bound just before the cordon took effect
    h.run(20, bind=False)
    assert any(c["status"].get("nodeName") == x1 for c in h.claims()), h.lines[-5:]   # kept
    assert not cordoned() and any("in use after all; uncordoned" in line for line in h.lines)
    assert h.cluster.get("Pod", "late", "default")["spec"]["nodeName"] == x1   # never evicted
    assert not any(line.endswith("terminating (unused)") and "x1" in line for line in h.lines)


def test_a_claim_that_was_used_stays_when_consolidation_is_off() -> None:
    h = Harness(TYPES, registration_delay=2.0, batch_idle=1.0, batch_max=3.0)
    h.add(nodepool("gpu", disruption={"consolidateAfter": "Never"}))
    h.add(gpu_pod("job", 1))
    h.run(12)
    assert h.cluster.get("Pod", "job", "default")["spec"].get("nodeName")
    h.finish("job")
    h.run(30)
    assert len(h.claims()) == 1 and not any("terminating" in line for line in h.lines)


def test_keep_nominated_keeps_what_still_fits_and_replans_the_rest() -> None:
    node = {"metadata": {"name": "n1", "labels": {}}, "spec": {},
            "status": {"allocatable": {"cpu": "8", "memory": "64Gi", "pods": "110", "nvidia.com/gpu": "4"}}}
    landed = gpu_pod("stranger", 1) | {"spec": {**gpu_pod("stranger", 1)["spec"], "nodeName": "n1"}}
    infos = [node_info(node, [landed])]
    pending = [gpu_pod("a", 2), gpu_pod("b", 2), gpu_pod("c", 1)]
    claims = [{"metadata": {"name": "claim-1"}, "status": {"nodeName": "n1"}}]
    kept, rest = keep_nominated(infos, pending, {"claim-1": {"default/a", "default/b"}},
                                target_aliases(claims, ["n1"]))
    assert [p["metadata"]["name"] for p in kept["n1"]] == ["a"]   # 1 GPU taken by the stranger: b no longer fits
    assert [p["metadata"]["name"] for p in rest] == ["b", "c"]    # c was never nominated


def test_surplus_needs_grace_and_spares_needed_used_and_replacement_claims() -> None:
    claims = [{"metadata": {"name": n}, "status": {"nodeName": f"node-{n}"}} for n in ("idle", "needed", "used")]
    claims.append({"metadata": {"name": "repl"}, "status": {}})
    claims.append({"metadata": {"name": "cand", "annotations": {
        "kubegpu.io/disruption": '{"reason": "Underutilized", "replacements": ["repl"], "launchedAt": 1}'}},
        "status": {"nodeName": "node-cand"}})
    pods_on = {"node-used": [gpu_pod("x", 1)], "node-cand": [gpu_pod("y", 1)]}
    tracker = SurplusTracker(grace=3.0)
    assert tracker.update(claims, pods_on, {"node-needed"}, 100.0) == []
    assert tracker.update(claims, pods_on, {"node-needed"}, 102.0) == []
    assert [c["metadata"]["name"] for c in tracker.update(claims, pods_on, {"node-needed"}, 103.0)] == ["idle"]
    assert tracker.update(claims, pods_on, {"node-idle"}, 104.0) == []          # needed again: the clock restarts
    assert tracker.update(claims, pods_on, set(), 105.0) == []
    assert [c["metadata"]["name"] for c in tracker.update(claims, {}, set(), 108.0)] == ["idle", "needed"]


def test_a_parallel_lifecycle_pass_bounds_new_launches_and_steps_the_furthest_along_first() -> None:
    h = Harness([instance_type("cpu.4", 4, 16, 0.2)], registration_delay=0.0, batch_idle=1.0, batch_max=3.0,
                parallelism=2)
    h.add(nodepool("cpu"))
    for i in range(40):   # one node each
        h.add(pod(f"p{i:02d}", cpu="3"))
    h.run(2, bind=False)
    assert len(h.claims()) == 40 and not any(is_true(c, "Launched") for c in h.claims())
    h.run(1, bind=False)
    assert sum(is_true(c, "Launched") for c in h.claims()) == 32   # 16 per worker; the rest next pass
    h.run(1, bind=False)
    claims = h.claims()
    assert all(is_true(c, "Launched") for c in claims)
    assert all(is_true(c, "Registered") for c in claims)   # the kwok provider's Nodes register at launch
    assert sum(is_true(c, "Initialized") for c in claims) == 32    # the first ones went on meanwhile
    h.run(4)
    assert all(p["spec"].get("nodeName") for p in h.cluster.list("Pod"))


def test_an_empty_node_a_pending_pod_could_take_is_not_let_go() -> None:
    node = {"metadata": {"name": "n1", "labels": {}}, "spec": {},
            "status": {"allocatable": {"cpu": "8", "memory": "64Gi", "pods": "110", "nvidia.com/gpu": "4"}}}
    shapes = pod_shapes([gpu_pod(f"big-{i}", 8) for i in range(5)])
    assert len(shapes) == 1 and not could_take(node, [], shapes)   # kube-scheduler cannot put an 8-GPU pod there
    assert could_take(node, [], pod_shapes([gpu_pod("big", 8), gpu_pod("small", 1)]))   # but a 1-GPU pod


def test_a_burst_of_unused_claims_is_cordoned_and_let_go_together_one_cordon_each() -> None:
    # at 2,000 pods: the burst ended with ~300 unused claims, cordoned and terminated one API call at a
    # time, so ~150 were still there 10 s after the last bind. Now one pass sends them `parallelism` at a time,
    # and the cordon a termination would lay again is not written twice.
    h = Harness([instance_type("cpu.4", 4, 16, 0.2)], registration_delay=0.0, batch_idle=1.0, batch_max=3.0,
                parallelism=4)
    h.add(nodepool("cpu", disruption={"consolidateAfter": "Never"}))
    for i in range(8):   # one node each
        h.add(pod(f"p{i}", cpu="3"))
    h.run(6, bind=False)
    claims = h.claims()
    assert len(claims) == 8 and all(is_true(c, "Initialized") for c in claims)
    for i in range(8):   # the pods went away before any was bound: every claim is of no use
        h.writer.delete("Pod", f"p{i}", namespace="default")

    lock, in_flight, most = threading.Lock(), [0], [0]
    cordons: dict[str, int] = {}
    patch = h.writer.patch

    def recording_patch(kind: str, name: str, body: dict[str, Any], *args: Any, **kwargs: Any) -> Any:
        taints = (body.get("spec") or {}).get("taints") or []   # a cordon, not the lift of the node's reservation
        if kind != "Node" or not any(t.get("key") == "kubegpu.io/disrupted" for t in taints):
            return patch(kind, name, body, *args, **kwargs)
        with lock:
            in_flight[0] += 1
            most[0] = max(most[0], in_flight[0])
            cordons[name] = cordons.get(name, 0) + 1
        time.sleep(0.05)   # an API server under load: the calls of one pass overlap only if sent together
        try:
            return patch(kind, name, body, *args, **kwargs)
        finally:
            with lock:
                in_flight[0] -= 1

    h.writer.patch = recording_patch   # type: ignore[method-assign]
    h.run(15, bind=False)
    assert not h.claims(), h.lines[-5:]
    assert sum("terminating (unused)" in line for line in h.lines) == 8
    assert most[0] > 1   # sent together, not one after another
    assert sorted(cordons.values()) == [1] * 8   # each node cordoned once: the termination did not cordon again
