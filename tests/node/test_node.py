"""The real node itself: containerd and a real kubelet joined to the control plane, the local images, the lock."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from kubegpu.testing import nodeimages
from kubegpu.testing.nodepods import NodeSession, probe_pod, run_probe, unique
from kubegpu.testing.realnode import LOCK_PATH


def test_the_node_is_a_real_kubelet_on_containerd(real_node: NodeSession) -> None:
    node = real_node.cluster.get("Node", "real-node-0")
    info = node["status"]["nodeInfo"]
    assert info["kubeletVersion"] == "v1.37.2"
    assert info["containerRuntimeVersion"].startswith("containerd://2.")
    assert "kwok.x-k8s.io/node" not in (node["metadata"].get("annotations") or {})
    assert node["metadata"]["labels"]["kubernetes.io/hostname"] == "real-node-0"
    images = real_node.node.paths.images_file.read_text()
    assert f"TEST_IMAGE={nodeimages.TEST_IMAGE}" in images and f"PAUSE_IMAGE={nodeimages.PAUSE_IMAGE}" in images
    classes = {c["metadata"]["name"] for c in real_node.cluster.list("DeviceClass")}
    assert {"gpu.nvidia.com", "mig.nvidia.com"} <= classes


def test_a_pod_without_gpus_runs_the_local_image_and_sees_no_gpu(real_node: NodeSession, node_ns: str) -> None:
    result = run_probe(real_node.cluster, probe_pod(unique("plain"), node_ns, script="echo utilities: $(which ls "
                                                                                      "grep sleep cat)"))
    assert "utilities: /bin/ls /bin/grep /bin/sleep /bin/cat" in result.log
    assert result.nvidia_devices() == [] and "NVIDIA_VISIBLE_DEVICES" not in result.env
    assert "/dev/null" in result.dev


def test_a_second_real_node_waits_for_the_lock_and_says_why(real_node: NodeSession, tmp_path: Path) -> None:
    """Only one kubelet per machine: another `up --real-node` waits for the lock, naming who holds it, and gives up
    after its limit without starting anything."""
    assert LOCK_PATH.exists() and str(real_node.node.paths.directory) in LOCK_PATH.read_text()
    began = time.monotonic()
    result = subprocess.run([sys.executable, "-m", "kubegpu.testing.controlplane", "up", str(tmp_path / "second"),
                             "--real-node"], capture_output=True, text=True, timeout=60, check=False,
                            env={**os.environ, "KUBEGPU_REAL_NODE_LOCK_WAIT": "1"})
    assert result.returncode == 1
    assert "waiting for" in result.stderr and str(real_node.node.paths.directory) in result.stderr
    [error] = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert "another real node is still up" in error
    assert time.monotonic() - began < 30
    assert not (tmp_path / "second" / "pids").exists()  # nothing was started
