"""`kubegpu exporter --kubernetes` on the real node: GPU metrics attributed to the pods holding the GPUs, read from
the real kubelet's PodResources socket — for a device-plugin pod and for a DRA claim's pod."""

from __future__ import annotations

import re
import urllib.request

from kubegpu.gpu.simulated import SimulatedBackend
from kubegpu.testing.controlplane import free_port
from kubegpu.testing.nodepods import (
    Agent,
    NodeSession,
    claim_template,
    delete_pod,
    probe_pod,
    running,
    unique,
    until,
    wait_allocatable,
    wait_phase,
)


def exporter(real_node: NodeSession, port: int) -> Agent:
    socket = str(real_node.node.paths.pod_resources_socket)
    return real_node.agent("exporter", ["exporter", "--gpu-backend", real_node.node.gpu_backend, "--kubernetes",
                                        "--pod-resources-kubelet-socket", socket, "--address", f"127.0.0.1:{port}",
                                        "--collect-interval", "300"])


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        return str(response.read().decode())


def attributed(port: int, pod: str, namespace: str) -> set[str]:
    """UUIDs of the GPUs whose utilisation series carries the pod's labels."""
    found = set()
    for line in scrape(port).splitlines():
        if line.startswith("DCGM_FI_DEV_GPU_UTIL{") and f'pod="{pod}"' in line and f'namespace="{namespace}"' in line:
            match = re.search(r'UUID="([^"]+)"', line)
            if match:
                found.add(match.group(1))
    return found


def test_device_plugin_and_dra_pods_are_attributed(real_node: NodeSession, node_ns: str) -> None:
    cluster = real_node.cluster
    uuids = {g.uuid for g in SimulatedBackend(real_node.node.node_file).devices()}
    port = free_port()
    plugin_pod, claim_pod = unique("attributed"), unique("claimed")
    with running(real_node.device_plugin()) as plugin, running(real_node.dra_driver(name="dra-exporter")) as driver, \
            running(exporter(real_node, port)) as metrics:
        plugin.wait_log("registered nvidia.com/gpu")
        driver.wait_log("registered with the kubelet")
        metrics.wait_log("serving metrics")
        wait_allocatable(cluster, "nvidia.com/gpu", 2)
        cluster.create(probe_pod(plugin_pod, node_ns, {"nvidia.com/gpu": 1}, sleep=600))
        until(lambda: [s for s in cluster.list("ResourceSlice") if s["spec"].get("nodeName") == "real-node-0"],
              "the driver's ResourceSlices")
        cluster.create(claim_template("exported", node_ns))
        cluster.create(probe_pod(claim_pod, node_ns, claims=[{"name": "gpu", "resourceClaimTemplateName": "exported"}],
                                 sleep=600))
        for name in (plugin_pod, claim_pod):
            wait_phase(cluster, name, node_ns, ("Running",))
        by_plugin = until(lambda: attributed(port, plugin_pod, node_ns), f"metrics attributed to {plugin_pod}")
        by_claim = until(lambda: attributed(port, claim_pod, node_ns), f"metrics attributed to {claim_pod}")
        assert len(by_plugin) == 1 and by_plugin <= uuids
        assert len(by_claim) == 1 and by_claim <= uuids
        for name in (plugin_pod, claim_pod):
            delete_pod(cluster, name, node_ns)
        until(lambda: not attributed(port, plugin_pod, node_ns), "the deleted pod's attribution gone")
    for obj in [s for s in cluster.list("ResourceSlice") if s["spec"].get("nodeName") == "real-node-0"]:
        cluster.delete("ResourceSlice", obj["metadata"]["name"])
