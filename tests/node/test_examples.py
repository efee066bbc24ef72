"""examples/real-node-pods.yaml does what the README says on the real node: with the device plugin (cdi-cri) and the
DRA driver running, both pods run to completion and print the GPU their container received."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from kubegpu.testing.nodepods import NodeSession, pod_log, running, until, wait_allocatable, wait_phase

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "real-node-pods.yaml"


def test_the_readme_example_pods_see_their_gpus(real_node: NodeSession, node_ns: str) -> None:
    cluster = real_node.cluster
    with running(real_node.device_plugin("--device-list-strategy", "cdi-cri", name="dp-example")) as plugin, \
            running(real_node.dra_driver(name="dra-example")) as driver:
        plugin.wait_log("registered nvidia.com/gpu")
        driver.wait_log("registered with the kubelet")
        wait_allocatable(cluster, "nvidia.com/gpu", 2)
        until(lambda: [s for s in cluster.list("ResourceSlice") if s["spec"].get("nodeName") == "real-node-0"],
              "the driver's ResourceSlices")
        pods = []
        for doc in yaml.safe_load_all(EXAMPLE.read_text()):
            doc["metadata"]["namespace"] = node_ns
            cluster.create(doc)
            if doc["kind"] == "Pod":
                pods.append(doc["metadata"]["name"])
        assert pods == ["gpu-from-device-plugin", "gpu-from-dra-claim"]
        logs = {}
        for name in pods:
            wait_phase(cluster, name, node_ns)
            logs[name] = pod_log(cluster, name, node_ns)
    assert re.search(r"nvidia[01]$", logs["gpu-from-device-plugin"], re.MULTILINE)
    assert "nvidiactl" in logs["gpu-from-device-plugin"]
    assert re.search(r"^NVIDIA_VISIBLE_DEVICES=GPU-", logs["gpu-from-dra-claim"], re.MULTILINE)
    assert re.search(r"nvidia[01]$", logs["gpu-from-dra-claim"], re.MULTILINE)
    for obj in [s for s in cluster.list("ResourceSlice") if s["spec"].get("nodeName") == "real-node-0"]:
        cluster.delete("ResourceSlice", obj["metadata"]["name"])
