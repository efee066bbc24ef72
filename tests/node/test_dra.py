"""`kubegpu dra-driver` against the real kubelet: slices published (and left alone while idle), a claim allocated by
kube-scheduler, prepared through the kubelet, injected by containerd through CDI, unprepared when the pod goes."""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import Iterator

import pytest

from kubegpu.gpu.simulated import SimulatedBackend
from kubegpu.kube.errors import NotFound
from kubegpu.testing.nodepods import (
    NodeSession,
    claim_template,
    delete_pod,
    pod_claims,
    probe_pod,
    read_probe,
    running,
    start_probe,
    unique,
    until,
    wait_phase,
)

DRIVER = "gpu.nvidia.com"
GPU_NODE = re.compile(r"^/dev/nvidia\d+$")


def node_slices(real_node: NodeSession) -> list[dict[str, object]]:
    return [s for s in real_node.cluster.list("ResourceSlice")
            if s["spec"].get("nodeName") == "real-node-0" and s["spec"].get("driver") == DRIVER]


def generations(real_node: NodeSession) -> set[int]:
    return {int(s["spec"]["pool"]["generation"]) for s in node_slices(real_node)}  # type: ignore[index]


def delete_slices(real_node: NodeSession) -> None:
    for obj in node_slices(real_node):
        with contextlib.suppress(NotFound):
            real_node.cluster.delete("ResourceSlice", str(obj["metadata"]["name"]))  # type: ignore[index]


@pytest.fixture(autouse=True)
def no_stale_slices(real_node: NodeSession) -> Iterator[None]:
    """Each test's driver publishes afresh; none leaves slices behind for a driver that is gone (the scheduler
    would place claims, or `nvidia.com/gpu` pods through the class's extended resource, on devices nobody serves)."""
    delete_slices(real_node)
    yield
    delete_slices(real_node)


def test_claim_is_allocated_prepared_injected_and_unprepared(real_node: NodeSession, node_ns: str) -> None:
    cluster = real_node.cluster
    cdi_dir = real_node.node.paths.cdi_dir
    with running(real_node.dra_driver("--health-interval", "1")) as driver:
        driver.wait_log("registered with the kubelet")
        until(lambda: node_slices(real_node), "the driver's ResourceSlices")
        cluster.create(claim_template("one-gpu", node_ns))
        pod = probe_pod(unique("claim"), node_ns, claims=[{"name": "gpu", "resourceClaimTemplateName": "one-gpu"}],
                        sleep=600)
        result = start_probe(cluster, pod)
        [claim] = pod_claims(pod, cluster)
        [allocated] = claim["status"]["allocation"]["devices"]["results"]
        assert allocated["driver"] == DRIVER and allocated["pool"] == "real-node-0"
        gpu = int(allocated["device"].removeprefix("gpu-"))
        backend = SimulatedBackend(real_node.node.node_file)
        assert result.env["NVIDIA_VISIBLE_DEVICES"] == backend.devices()[gpu].uuid  # from the claim's CDI spec
        assert [d for d in result.nvidia_devices() if GPU_NODE.match(d)] == [f"/dev/nvidia{gpu}"]
        assert "/dev/nvidiactl" in result.dev
        uid = claim["metadata"]["uid"]
        assert any(uid in p.name for p in cdi_dir.glob("*.json"))  # prepared: the claim's spec exists
        delete_pod(cluster, pod["metadata"]["name"], node_ns)
        until(lambda: not any(uid in p.name for p in cdi_dir.glob("*.json")), "the claim's CDI spec removed "
              "(NodeUnprepareResources)")


def test_slices_keep_their_generation_while_idle(real_node: NodeSession) -> None:
    """Issue 23: an idle driver republished the same pool with generation + 1 every few seconds, because the real
    API server canonicalises what it stores. With health checks every 0.5 s, eight seconds must change nothing."""
    with running(real_node.dra_driver("--health-interval", "0.5", name="dra-idle")) as driver:
        driver.wait_log("published ResourceSlices")
        until(lambda: node_slices(real_node), "the driver's ResourceSlices")
        first = generations(real_node)
        versions = {s["metadata"]["name"]: s["metadata"]["resourceVersion"] for s in node_slices(real_node)}
        time.sleep(8)
        assert generations(real_node) == first and len(first) == 1
        assert {s["metadata"]["name"]: s["metadata"]["resourceVersion"] for s in node_slices(real_node)} == versions
        assert driver.log().count("published ResourceSlices") == 1


def claim_pod(real_node: NodeSession, node_ns: str, template: str, prefix: str = "claim") -> dict[str, object]:
    return probe_pod(unique(prefix), node_ns, claims=[{"name": "gpu", "resourceClaimTemplateName": template}],
                     sleep=600)


def container(cluster: object, pod: dict[str, object], namespace: str) -> dict[str, object]:
    """The pod's one container status as the kubelet reports it."""
    name = pod["metadata"]["name"]  # type: ignore[index]
    status = cluster.get("Pod", name, namespace).get("status") or {}  # type: ignore[attr-defined]
    return dict((status.get("containerStatuses") or [{}])[0])


def spec_files(real_node: NodeSession, uid: str) -> list[str]:
    return [p.name for p in real_node.node.paths.cdi_dir.glob("*.json") if uid in p.name]


def test_dynamic_mig_claim_creates_and_destroys_its_instance(real_node: NodeSession, node_ns: str) -> None:
    cluster = real_node.cluster
    backend = SimulatedBackend(real_node.node.node_file)
    try:
        with running(real_node.dra_driver("--dynamic-mig", name="dra-dynamic-mig")) as driver:
            driver.wait_log("registered with the kubelet")
            until(lambda: node_slices(real_node), "the driver's ResourceSlices")
            cluster.create(claim_template("small-mig", node_ns, "mig.nvidia.com",
                                          selector="device.attributes['gpu.nvidia.com'].profile == '1g.10gb'"))
            pod = claim_pod(real_node, node_ns, "small-mig", "mig")
            result = start_probe(cluster, pod)
            [claim] = pod_claims(pod, cluster)
            [allocated] = claim["status"]["allocation"]["devices"]["results"]
            gpu = int(allocated["device"].split("-")[1])
            [made] = backend.mig_devices(gpu)  # cut at prepare, exactly one
            assert made.profile_name == "1g.10gb"
            assert result.env["NVIDIA_VISIBLE_DEVICES"] == made.uuid
            assert any(d.startswith("/dev/nvidia-caps/nvidia-cap") for d in result.dev)
            delete_pod(cluster, pod["metadata"]["name"], node_ns)  # type: ignore[index]
            until(lambda: not backend.mig_devices(gpu), "the MIG instance destroyed at unprepare")
    finally:
        SimulatedBackend.create(real_node.node.node_file, real_node.node.gpus, node_name="real-node-0")


def test_kubelet_and_driver_restarts_between_prepare_and_unprepare(real_node: NodeSession, node_ns: str) -> None:
    """A claim prepared before the kubelet restarts, and again before the driver restarts, is still unprepared
    (its CDI spec removed) when its pod goes, and the pod never restarts meanwhile."""
    from kubegpu.testing.realnode import restart_kubelet

    cluster = real_node.cluster
    with running(real_node.dra_driver(name="dra-restarts")) as driver:
        driver.wait_log("registered with the kubelet")
        until(lambda: node_slices(real_node), "the driver's ResourceSlices")
        cluster.create(claim_template("survives", node_ns))
        pods = [claim_pod(real_node, node_ns, "survives", f"restart{i}") for i in range(2)]
        for pod in pods:
            start_probe(cluster, pod)
        uids = [pod_claims(pod, cluster)[0]["metadata"]["uid"] for pod in pods]
        assert all(spec_files(real_node, uid) for uid in uids)
        before = [container(cluster, pod, node_ns) for pod in pods]
        restart_kubelet(real_node.node.paths.directory)
        until(lambda: driver.log().count("registered with the kubelet") >= 2, "the driver registered again")
        after = [container(cluster, pod, node_ns) for pod in pods]
        assert [c["containerID"] for c in after] == [c["containerID"] for c in before]
        assert all(c["restartCount"] == 0 and c["state"].get("running") for c in after)
        delete_pod(cluster, pods[0]["metadata"]["name"], node_ns)  # type: ignore[index]
        until(lambda: not spec_files(real_node, uids[0]), "claim 1 unprepared by the restarted kubelet")
    with running(real_node.dra_driver(name="dra-restarts-again")) as driver:  # same plugin dir and checkpoint
        driver.wait_log("registered with the kubelet")
        delete_pod(cluster, pods[1]["metadata"]["name"], node_ns)  # type: ignore[index]
        until(lambda: not spec_files(real_node, uids[1]), "claim 2 unprepared by the restarted driver")


def test_an_mps_shared_claim_serves_two_pods(real_node: NodeSession, node_ns: str) -> None:
    """One ResourceClaim of class mps.gpu.kubegpu.io used by two pods: both run at once on the same GPU with the
    claim's MPS pipe directory mounted and its limits in their environment."""
    cluster = real_node.cluster
    mps_root = real_node.node.paths.directory / "mps-dra"
    with running(real_node.dra_driver("--mps-root", str(mps_root), name="dra-mps")) as driver:
        driver.wait_log("registered with the kubelet")
        until(lambda: node_slices(real_node), "the driver's ResourceSlices")
        template = claim_template("mps", node_ns, "mps.gpu.kubegpu.io")
        cluster.create({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                        "metadata": {"name": "shared-mps", "namespace": node_ns}, "spec": template["spec"]["spec"]})
        pods = [probe_pod(unique(f"mps{i}"), node_ns, claims=[{"name": "gpu", "resourceClaimName": "shared-mps"}],
                          script="echo pipe: $(ls -d /mps/pipe)", sleep=600) for i in range(2)]
        seen = [start_probe(cluster, pod) for pod in pods]
        claim = cluster.get("ResourceClaim", "shared-mps", node_ns)
        assert len(claim["status"]["reservedFor"]) == 2
        uid = claim["metadata"]["uid"]
        assert (mps_root / f"claim-{uid}" / "pipe").is_dir()
        for result in seen:
            assert result.env["CUDA_MPS_PIPE_DIRECTORY"] == "/mps/pipe"
            assert result.env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "50"  # the class's default
            assert "pipe: /mps/pipe" in result.log
        assert seen[0].env["NVIDIA_VISIBLE_DEVICES"] == seen[1].env["NVIDIA_VISIBLE_DEVICES"]
        for pod in pods:
            delete_pod(cluster, pod["metadata"]["name"], node_ns)  # type: ignore[index]
        cluster.delete("ResourceClaim", "shared-mps", node_ns)
        until(lambda: not spec_files(real_node, uid), "the claim unprepared")
        until(lambda: not (mps_root / f"claim-{uid}").exists(), "the claim's MPS directories removed")


def share_template(name: str, namespace: str, thousandths: int, gpu_uuid: str = "") -> dict[str, object]:
    """A claim template for `thousandths` of a GPU (class fraction.gpu.kubegpu.io); of the one with this UUID if
    given."""
    selector = f"device.attributes['gpu.nvidia.com'].uuid == '{gpu_uuid}'" if gpu_uuid else None
    template = claim_template(name, namespace, "fraction.gpu.kubegpu.io", selector=selector)
    template["spec"]["spec"]["devices"]["requests"][0]["exactly"]["capacity"] = {  # type: ignore[index]
        "requests": {"compute": str(thousandths)}}
    return template


def test_fractional_shares_of_one_gpu_get_their_mps_limits(real_node: NodeSession, node_ns: str) -> None:
    """`--fractional`: kube-scheduler packs 300 and 700 thousandths of one GPU into it (consumable capacity), each
    pod runs with MPS limits in proportion (30 % / 70 % of the threads, the same share of the GPU's memory), and a
    third share of 100 finds no room on that GPU."""
    cluster = real_node.cluster
    backend = SimulatedBackend(real_node.node.node_file)
    gpu = backend.devices()[0]
    mps_root = real_node.node.paths.directory / "mps-fraction"
    with running(real_node.dra_driver("--fractional", "--mps-root", str(mps_root), name="dra-fraction")) as driver:
        driver.wait_log("registered with the kubelet")
        until(lambda: node_slices(real_node), "the driver's ResourceSlices")
        seen = {}
        for share in (300, 700):
            cluster.create(share_template(f"share-{share}", node_ns, share, gpu.uuid))
            pod = claim_pod(real_node, node_ns, f"share-{share}", f"share{share}")
            seen[share] = (pod, start_probe(cluster, pod))
        for share, (pod, result) in seen.items():
            [claim] = pod_claims(pod, cluster)
            [allocated] = claim["status"]["allocation"]["devices"]["results"]
            assert allocated["device"] == f"gpu-{gpu.index}" and allocated["shareID"]
            assert allocated["consumedCapacity"]["compute"] == str(share)
            assert result.env["NVIDIA_VISIBLE_DEVICES"] == gpu.uuid
            assert result.env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == str(share // 10)
            assert result.env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == f"0={gpu.memory_mib * share // 1000}M"
        cluster.create(share_template("share-100", node_ns, 100, gpu.uuid))
        third = claim_pod(real_node, node_ns, "share-100", "share100")
        cluster.create(third)
        name = third["metadata"]["name"]  # type: ignore[index]
        message = until(lambda: real_node.real.unschedulable_message(name, node_ns), "kube-scheduler: no fit")
        assert "claim" in message.lower() or "device" in message.lower(), message
        uids = [pod_claims(pod, cluster)[0]["metadata"]["uid"] for pod, _ in seen.values()]
        for pod, _ in seen.values():
            delete_pod(cluster, pod["metadata"]["name"], node_ns)  # type: ignore[index]
        delete_pod(cluster, name, node_ns)
        for uid in uids:  # unprepared while the driver still runs (the kubelet waits on it to let the pods go)
            until(lambda u=uid: not spec_files(real_node, u), "the share's claim unprepared")
            assert not (mps_root / f"claim-{uid}").exists()


def with_claims(pod: dict[str, object]) -> dict[str, object] | None:
    """The pod once its template's claim is generated (named in its status)."""
    statuses = (pod.get("status") or {}).get("resourceClaimStatuses") or [{}]  # type: ignore[attr-defined]
    return pod if all(s.get("resourceClaimName") for s in statuses) else None


def test_kubegpu_place_shares_are_prepared_by_the_kubelet(real_node: NodeSession, node_ns: str) -> None:
    """`kubegpu place` (schedulerName: kubegpu) places two shares where the placement core predicts; the allocations
    it writes are what the real kubelet prepares through the driver: each pod gets the GPU chosen for it and its
    MPS limits."""
    from kubegpu.kube.informer import InformedCluster
    from kubegpu.placement.controller import KINDS, PlacementController
    from kubegpu.placement.objects import build_state, inventory, pod_request
    from kubegpu.scheduling.placement import choose, make_policy

    cluster = real_node.cluster
    backend = SimulatedBackend(real_node.node.node_file)
    uuids = {f"gpu-{g.device_minor}": g.uuid for g in backend.devices()}
    with running(real_node.dra_driver("--fractional", "--mps-root",
                                      str(real_node.node.paths.directory / "mps-place"), name="dra-place")) as driver:
        driver.wait_log("registered with the kubelet")
        until(lambda: inventory(node_slices(real_node)) or None, "the driver's shared GPUs published")
        informed = InformedCluster(real_node.real.cluster(), KINDS)
        try:
            controller = PlacementController(informed, make_policy("kubegpu"), lease_namespace=node_ns)
            state = build_state(cluster.list("Node"), inventory(node_slices(real_node)), cluster.list("Pod"),
                                cluster.list("ResourceClaim"))
            predicted = make_policy("kubegpu")
            pods = []
            for share in (300, 700):
                cluster.create(share_template(f"place-{share}", node_ns, share))
                pod = claim_pod(real_node, node_ns, f"place-{share}", f"place{share}")
                pod["spec"]["schedulerName"] = "kubegpu"  # type: ignore[index]
                cluster.create(pod)
                name = pod["metadata"]["name"]  # type: ignore[index]
                current = until(lambda n=name: with_claims(cluster.get("Pod", n, node_ns)),
                                f"pod {name}'s claim generated")
                [claim] = pod_claims(current, cluster)
                ask = pod_request(current, claim)
                placement = choose(ask.request, state, predicted)
                assert placement is not None
                state.apply(ask.request, placement)

                def bound(n: str = name) -> str | None:
                    controller.tick(time.time())
                    return (cluster.get("Pod", n, node_ns).get("spec") or {}).get("nodeName")

                assert until(bound, f"pod {name} bound by kubegpu place") == "real-node-0"
                pods.append((pod, share, f"gpu-{placement.gpus[0]}"))
            for pod, share, device in pods:
                name = pod["metadata"]["name"]  # type: ignore[index]
                wait_phase(cluster, name, node_ns, ("Running",))
                result = read_probe(cluster, name, node_ns)
                [claim] = pod_claims(pod, cluster)
                [allocated] = claim["status"]["allocation"]["devices"]["results"]
                assert allocated["device"] == device  # where the placement core put it
                assert result.env["NVIDIA_VISIBLE_DEVICES"] == uuids[device]
                assert result.env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == str(share // 10)
            for pod, _, _ in pods:
                delete_pod(cluster, pod["metadata"]["name"], node_ns)  # type: ignore[index]
        finally:
            informed.stop()
