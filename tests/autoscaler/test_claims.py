"""Provisioning for pods whose GPUs come through DRA ResourceClaims: the pass allocates the claims with the
scheduler's allocator over the slices each instance type's GPUs would publish, and packs pods and claims as it does
extended resources."""

from __future__ import annotations

from typing import Any

from kubegpu.autoscaler.claims import DraWorld
from kubegpu.autoscaler.dra_nodes import predicted_slices
from kubegpu.autoscaler.provisioner import run_pass
from kubegpu.dra.classes import shipped_class_objects
from kubegpu.scheduling import node_info
from tests.autoscaler.builders import instance_type, pod, pool

A100 = "A100-SXM4-80GB"
H100 = "H100-SXM5-80GB"
TYPES = [
    instance_type("cpu.large", 16, 64, 0.50),
    instance_type("l4.x1", 8, 32, 0.80, gpus=1, model="L4"),
    instance_type("a100.x1", 8, 64, 4.00, gpus=1, model=A100),
    instance_type("a100.x2", 16, 128, 8.00, gpus=2, model=A100),
    instance_type("h100.x2", 16, 128, 12.00, gpus=2, model=H100),
]


def request(name: str, device_class: str, count: int = 1, selector: str | None = None) -> dict[str, Any]:
    exactly: dict[str, Any] = {"deviceClassName": device_class, "count": count}
    if selector:
        exactly["selectors"] = [{"cel": {"expression": selector}}]
    return {"name": name, "exactly": exactly}


def mig(profile: str) -> str:
    return f"device.attributes['gpu.nvidia.com'].profile == '{profile}'"


def template(name: str, *requests: dict[str, Any], constraints: list[dict[str, Any]] | None = None,
             namespace: str = "default") -> dict[str, Any]:
    devices: dict[str, Any] = {"requests": list(requests)}
    if constraints:
        devices["constraints"] = constraints
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
            "metadata": {"name": name, "namespace": namespace}, "spec": {"spec": {"devices": devices}}}


def claim(name: str, *requests: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": "default"}, "spec": {"devices": {"requests": list(requests)}}}


def claim_pod(name: str, cpu: str = "1", **refs: str) -> dict[str, Any]:
    """`refs`: claim entry name → `template:<name>` or `claim:<name>`."""
    entries = []
    for entry, ref in refs.items():
        kind, target = ref.split(":")
        entries.append({"name": entry, ("resourceClaimTemplateName" if kind == "template" else "resourceClaimName"):
                        target})
    return pod(name, cpu=cpu, spec={"resourceClaims": entries})


def world(*objects: dict[str, Any], slices: list[dict[str, Any]] | None = None) -> DraWorld:
    return DraWorld(shipped_class_objects(), [o for o in objects if o["kind"] == "ResourceClaim"],
                    [o for o in objects if o["kind"] == "ResourceClaimTemplate"], slices or [])


def solve(pods: list[dict[str, Any]], dra: DraWorld, **kwargs: Any) -> Any:
    return run_pass([pool()], lambda _p: TYPES, pods, dra=dra, **kwargs)


def plan(result: Any) -> list[tuple[str, int]]:
    return sorted((c.instance_type, len(c.pods)) for c in result.claims)


def test_mig_claims_buy_mig_capable_gpus_and_pack_seven_small_slices_per_a100() -> None:
    dra = world(template("small", request("mig", "mig.nvidia.com", selector=mig("1g.10gb"))))
    pods = [claim_pod(f"p{i}", gpu="template:small") for i in range(8)]
    result = solve(pods, dra)
    assert not result.unschedulable
    # an A100 holds seven 1g.10gb placements: 7 pods on one 1-GPU node and the eighth on another (the cheapest
    # per pod), never an L4 (no MIG) nor a CPU node
    assert plan(result) == [("a100.x1", 1), ("a100.x1", 7)]
    without = run_pass([pool()], lambda _p: TYPES, pods)   # claims not looked at: a CPU node, GPUs never come
    assert plan(without) == [("cpu.large", 8)]


def test_whole_gpu_claims_honour_count_and_cel_selectors() -> None:
    dra = world(template("two-h100", request("gpus", "gpu.nvidia.com", count=2,
                                             selector="device.attributes['gpu.nvidia.com'].productName"
                                                      ".contains('H100')")))
    result = solve([claim_pod("train", gpu="template:two-h100")], dra)
    assert plan(result) == [("h100.x2", 1)]
    too_many = world(template("three", request("gpus", "gpu.nvidia.com", count=3)))
    result = solve([claim_pod("big", gpu="template:three")], too_many)
    assert not result.claims
    assert result.unschedulable["default/big"].endswith("no instance type's GPUs can allocate the pod's resource "
                                                        "claims")


def test_match_attribute_keeps_two_partitions_on_one_parent_gpu() -> None:
    same_gpu = template("pair", request("a", "mig.nvidia.com", selector=mig("3g.40gb")),
                        request("b", "mig.nvidia.com", selector=mig("3g.40gb")),
                        constraints=[{"requests": ["a", "b"], "matchAttribute": "gpu.nvidia.com/parentUUID"}])
    result = solve([claim_pod(f"p{i}", gpu="template:pair") for i in range(2)], world(same_gpu))
    assert plan(result) == [("a100.x1", 1), ("a100.x1", 1)]   # each pod's pair fills one GPU
    # two 4g.40gb never share one A100 (8 compute slices): apart they fit an a100.x2, on one parent GPU nowhere
    apart = template("big-pair", request("a", "mig.nvidia.com", selector=mig("4g.40gb")),
                     request("b", "mig.nvidia.com", selector=mig("4g.40gb")))
    assert plan(solve([claim_pod("p", gpu="template:big-pair")], world(apart))) == [("a100.x2", 1)]
    together = template("big-pair", request("a", "mig.nvidia.com", selector=mig("4g.40gb")),
                        request("b", "mig.nvidia.com", selector=mig("4g.40gb")),
                        constraints=[{"requests": ["a", "b"], "matchAttribute": "gpu.nvidia.com/parentUUID"}])
    result = solve([claim_pod("p", gpu="template:big-pair")], world(together))
    assert not result.claims and "default/p" in result.unschedulable


def test_all_mode_takes_every_gpu_of_the_node() -> None:
    every = {"name": "all", "exactly": {"deviceClassName": "gpu.nvidia.com", "allocationMode": "All"}}
    dra = world(template("node", every))
    result = solve([claim_pod(f"p{i}", gpu="template:node") for i in range(2)], dra)
    assert not result.unschedulable
    assert len(result.claims) == 2   # All takes the whole node: one pod per node


def test_a_shared_claim_is_allocated_once_and_its_pods_go_together() -> None:
    dra = world(claim("mps", request("gpu", "mps.gpu.kubegpu.io")))
    result = solve([claim_pod(f"w{i}", gpu="claim:mps") for i in range(4)], dra)
    assert not result.unschedulable
    assert plan(result) == [("l4.x1", 4)]   # one GPU for the four pods, on the node their claim is allocated on
    # pods that cannot all sit beside their shared claim's GPU are not given a second node (it would have no claim)
    result = solve([claim_pod(f"w{i}", cpu="4", gpu="claim:mps") for i in range(4)], dra)
    assert plan(result) == [("l4.x1", 1)] and len(result.unschedulable) == 3


def test_claim_pods_and_extended_resource_pods_mix_in_one_pass() -> None:
    dra = world(template("small", request("mig", "mig.nvidia.com", selector=mig("1g.10gb"))))
    pods = [claim_pod(f"c{i}", gpu="template:small") for i in range(3)]
    pods += [pod(f"e{i}", limits={"nvidia.com/gpu": 1}) for i in range(2)]
    result = solve(pods, dra)
    assert not result.unschedulable
    by_pod = {p["metadata"]["name"]: c.instance_type for c in result.claims for p in c.pods}
    assert {by_pod[f"c{i}"] for i in range(3)} <= {"a100.x1", "a100.x2"}
    assert all(by_pod[f"e{i}"] != "cpu.large" for i in range(2))


def test_a_claim_naming_an_unknown_class_or_template_is_reported_not_bought_for() -> None:
    dra = world(template("odd", request("x", "no-such-class")))
    result = solve([claim_pod("a", gpu="template:odd"), claim_pod("b", gpu="template:missing")], dra)
    assert not result.claims
    assert "no-such-class" in result.unschedulable["default/a"]
    assert "resourceClaimTemplate missing not found" in result.unschedulable["default/b"]


def test_an_existing_node_with_free_partitions_takes_the_pod_and_a_full_one_does_not() -> None:
    node = {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": "gpu-0", "labels": {"node.kubernetes.io/instance-type": "a100.x1"}},
            "status": {"allocatable": {"cpu": "8", "memory": "64Gi", "pods": "110"}}}
    slices = predicted_slices("gpu-0", A100, 1)
    big = world(template("big", request("mig", "mig.nvidia.com", selector=mig("7g.80gb"))), slices=slices)
    result = solve([claim_pod("p", gpu="template:big")], big, existing=[node_info(node)])
    assert list(result.existing) == ["gpu-0"] and not result.claims
    # the GPU's whole 7g placement is allocated to someone: the next such pod needs a new node
    taken = claim("held", request("mig", "mig.nvidia.com", selector=mig("7g.80gb")))
    taken["status"] = {"allocation": {"devices": {"results": [
        {"request": "mig", "driver": "gpu.nvidia.com", "pool": "gpu-0", "device": "gpu-0-mig-7g80gb-0-0"}]}}}
    full = world(template("big", request("mig", "mig.nvidia.com", selector=mig("7g.80gb"))), taken, slices=slices)
    result = solve([claim_pod("p", gpu="template:big")], full, existing=[node_info(node)])
    assert not result.existing and plan(result) == [("a100.x1", 1)]


def test_kwok_nodes_publish_the_driver_slices_and_take_later_claim_pods_while_in_flight() -> None:
    from tests.autoscaler.builders import Harness, nodepool

    h = Harness(TYPES, registration_delay=20.0)
    h.add(nodepool("gpu", disruption={"consolidateAfter": "Never"}))
    for obj in shipped_class_objects():
        h.add(obj)
    h.add(template("small", request("mig", "mig.nvidia.com", selector=mig("1g.10gb"))))
    for i in range(4):
        h.add(claim_pod(f"early-{i}", gpu="template:small"))
    h.run(4, bind=False)
    [nodeclaim] = h.claims()
    assert nodeclaim["metadata"]["labels"]["node.kubernetes.io/instance-type"] == "a100.x1"
    assert not h.cluster.list("ResourceSlice")   # the node is not registered yet: no driver, no slices
    for i in range(3):   # three more fit the in-flight node's free partitions: no second node
        h.add(claim_pod(f"late-{i}", gpu="template:small"))
    h.run(5, bind=False)
    assert len(h.claims()) == 1
    h.add(claim_pod("eighth", gpu="template:small"))   # an A100 has seven 1g.10gb placements
    h.run(5, bind=False)
    assert len(h.claims()) == 2

    h.run(25, bind=False)   # registered: the slices kubegpu's driver would publish, owned by the node
    [node, *_] = [n for n in h.nodes() if n["metadata"]["name"] == nodeclaim["status"]["nodeName"]]
    slices = [s for s in h.cluster.list("ResourceSlice") if s["spec"]["nodeName"] == node["metadata"]["name"]]
    expected = predicted_slices(node["metadata"]["name"], A100, 1)
    assert [s["spec"] for s in slices] == [s["spec"] for s in expected]
    assert all(s["metadata"]["ownerReferences"][0]["uid"] == node["metadata"]["uid"] for s in slices)
    assert any(d["name"].startswith("gpu-0-mig-1g10gb") for s in slices for d in s["spec"].get("devices", ()))

    h.writer.delete("NodeClaim", nodeclaim["metadata"]["name"])
    h.run(10, bind=False)
    assert not [s for s in h.cluster.list("ResourceSlice") if s["spec"]["nodeName"] == node["metadata"]["name"]]


def test_an_extended_resource_no_type_offers_is_planned_through_the_class_that_serves_it() -> None:
    """DRAExtendedResource: `nvidia.com/mig-1g.10gb` asked for as a resource, served by a DeviceClass's
    `extendedResourceName` from MIG devices; no instance type lists it, yet the pass buys a node for it."""
    served = {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": "mig-1g"},
              "spec": {"selectors": [{"cel": {"expression": "device.attributes['gpu.nvidia.com'].type == 'mig' && "
                                                            + mig("1g.10gb")}}],
                       "extendedResourceName": "nvidia.com/mig-1g.10gb"}}
    pods = [pod(f"p{i}", limits={"nvidia.com/mig-1g.10gb": 1}) for i in range(7)]
    result = solve(pods, DraWorld([served]))
    assert plan(result) == [("a100.x1", 7)]
    result = solve(pods, DraWorld())   # no class serves it: nothing to buy
    assert not result.claims and "nvidia.com/mig-1g.10gb" in result.unschedulable["default/p0"]


def _allocated(name: str, node: str, device: str, pod_name: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """A template-made claim kube-scheduler allocated on `node`, and its pod bound there."""
    made = claim(name, request("mig", "mig.nvidia.com", selector=mig("1g.10gb")))
    made["status"] = {"allocation": {"devices": {"results": [
        {"request": "mig", "driver": "gpu.nvidia.com", "pool": node, "device": device}]}}}
    bound = claim_pod(pod_name, gpu="template:small")
    bound["spec"]["nodeName"] = node
    bound["status"] = {"phase": "Running", "resourceClaimStatuses": [{"name": "gpu", "resourceClaimName": name}]}
    return made, bound


def test_consolidation_moves_a_claim_pod_only_where_its_claim_can_be_allocated_again() -> None:
    """A consolidation pass asks where a node's pods would go, as pending copies (disruption drops their node and
    status): a template claim is then allocated anew for the replacement pod, against what the other nodes'
    allocated claims hold."""
    node = {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": "gpu-0", "labels": {"node.kubernetes.io/instance-type": "a100.x1"}},
            "status": {"allocatable": {"cpu": "8", "memory": "64Gi", "pods": "110"}}}
    starts = (6, 5, 4, 3, 2, 1)
    held = [_allocated(f"held-{s}", "gpu-0", f"gpu-0-mig-1g10gb-19-{s}", f"held-{s}") for s in starts]
    objects = [c for c, _ in held]
    moving_claim, bound = _allocated("moving-gpu", "gpu-1", "gpu-1-mig-1g10gb-19-6", "moving")
    moving = {**bound, "spec": {k: v for k, v in bound["spec"].items() if k != "nodeName"},
              "status": {"phase": "Pending"}}
    small = template("small", request("mig", "mig.nvidia.com", selector=mig("1g.10gb")))
    dra = world(small, moving_claim, *objects, slices=predicted_slices("gpu-0", A100, 1))
    existing = [node_info(node, [p for _, p in held])]
    result = solve([moving], dra, existing=existing)
    assert list(result.existing) == ["gpu-0"] and not result.claims   # the seventh 1g.10gb placement is free
    one_more, _ = _allocated("held-0", "gpu-0", "gpu-0-mig-1g10gb-19-0", "held-0")
    full = world(small, moving_claim, one_more, *objects, slices=predicted_slices("gpu-0", A100, 1))
    result = solve([moving], full, existing=existing)
    assert not result.existing and plan(result) == [("a100.x1", 1)]   # gpu-0 is full: moving it needs a node


def test_a_cluster_without_the_dra_api_still_gets_its_gpu_nodes() -> None:
    """kwok nodes publish slices only where the API server serves resource.k8s.io/v1; elsewhere the node comes up
    with its GPUs as before and nothing is retried."""
    from kubegpu.clock import VirtualClock
    from kubegpu.kube import MemoryCluster, NotFound
    from tests.autoscaler.builders import Harness, nodepool

    class NoDra(MemoryCluster):
        creates = 0

        def create(self, obj: dict[str, Any]) -> dict[str, Any]:
            if obj.get("kind") == "ResourceSlice":
                NoDra.creates += 1
                raise NotFound("the server could not find the requested resource")
            return super().create(obj)

    h = Harness(TYPES, registration_delay=5.0, cluster=NoDra(VirtualClock(1_000_000.0)))
    h.add(nodepool("gpu"))
    h.add(pod("train", limits={"nvidia.com/gpu": 1}))
    h.run(20)
    [node] = h.nodes()
    assert node["status"]["allocatable"]["nvidia.com/gpu"] == "1"
    assert NoDra.creates == 1   # tried once, then never again
