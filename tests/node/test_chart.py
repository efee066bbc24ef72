"""The chart on the real node, as a platform team installs it: the image built from the Dockerfile and loaded into
containerd, `helm install` with the real Helm CLI, the operator reconciling its ClusterPolicy, the node agents'
DaemonSet pods running on the real kubelet in the operator's order, validation passing, the containerised device
plugin registering through the hostPath socket and a GPU pod running; per-node configs (a label switches the running
plugin's config, the MPS daemon runs where the config asks for MPS); `helm upgrade` changing a setting the node
follows; `helm uninstall` leaving no kubegpu object or node state behind.

The node's GPUs are simulated (`gpuBackend: sim:` — a node file of this module's own, so the chart's agents never
meet another test's); the driver and toolkit (NVIDIA's images) are off. One release for the module: the tests run in
file order and each builds on the one before, as a user's session would.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.apps_v1 import DaemonSet, Deployment
from lightkube.resources.core_v1 import Namespace, Service, ServiceAccount
from lightkube.resources.node_v1 import RuntimeClass
from lightkube.resources.rbac_authorization_v1 import ClusterRole, ClusterRoleBinding

from kubegpu.errors import KubegpuError
from kubegpu.gpu.simulated import SimulatedBackend
from kubegpu.kube.errors import NotFound
from kubegpu.operator.components import VALIDATIONS_DIR
from kubegpu.sharing.mps_control import LIMITS_FILE
from kubegpu.testing import chart, helmbuild, image
from kubegpu.testing.nodepods import (
    NodeSession,
    node_resources,
    probe_pod,
    run_probe,
    unique,
    until,
    wait_allocatable,
)

# the module's first test also pays for the shared node's lock, the image (cached by content) and `helm install`
pytestmark = pytest.mark.timeout(900)
NAMESPACE = "kubegpu"
RELEASE = "kubegpu"
NODE = "real-node-0"
CONFIG_LABEL = "nvidia.com/device-plugin.config"
DEVICE_PLUGIN_DIR = Path("/var/lib/kubelet/device-plugins")
READY_S = 240.0


def _unavailable(reason: str) -> None:
    if os.environ.get("CI") == "true":
        pytest.fail(f"chart tier unavailable in CI: {reason}", pytrace=False)
    pytest.skip(f"chart tier unavailable: {reason}")


def sliced(replicas: int) -> str:
    return yaml.safe_dump({"version": "v1", "sharing": {"timeSlicing": {"resources": [
        {"name": "nvidia.com/gpu", "replicas": replicas}]}}})


CONFIGS = {"whole": "version: v1\n", "ts-2": sliced(2), "ts-4": sliced(4),
           "mps-2": yaml.safe_dump({"version": "v1", "sharing": {"mps": {"resources": [
               {"name": "nvidia.com/gpu", "replicas": 2}]}}})}


@dataclass
class Release:
    session: NodeSession
    helm: chart.Helm
    workdir: Path
    sim_dir: Path
    values: dict[str, Any]
    timings: dict[str, float]

    @property
    def cluster(self) -> Any:
        return self.session.cluster

    @property
    def mps_root(self) -> Path:
        return self.sim_dir / "mps"

    def pods(self, component: str) -> list[dict[str, Any]]:
        return self.cluster.list("Pod", NAMESPACE, label_selector=f"app.kubernetes.io/component={component}")

    def running_pod(self, component: str, timeout: float = READY_S) -> dict[str, Any]:
        def check() -> dict[str, Any] | None:
            pods = [p for p in self.pods(component) if (p.get("status") or {}).get("phase") == "Running"
                    and not p["metadata"].get("deletionTimestamp")
                    and all(c.get("ready") for c in (p.get("status") or {}).get("containerStatuses") or [{}])]
            return pods[0] if len(pods) == 1 else None
        return until(check, f"one ready {component} pod", timeout)

    def label(self, value: str | None) -> None:
        self.cluster.patch("Node", NODE, {"metadata": {"labels": {CONFIG_LABEL: value}}})

    def node_labels(self) -> dict[str, str]:
        return dict(self.cluster.get("Node", NODE)["metadata"].get("labels") or {})

    def policy_state(self) -> str:
        policies = self.cluster.list("ClusterPolicy")
        return str(((policies[0] if policies else {}).get("status") or {}).get("state") or "")


@pytest.fixture(scope="module")
def release(real_node: NodeSession) -> Iterator[Release]:
    if not helmbuild.is_built():
        _unavailable(f"{helmbuild.binary()}: not built (run `python -m kubegpu.testing.helmbuild`)")
    for tool in ("buildah", "debootstrap"):
        if shutil.which(tool) is None:
            _unavailable(f"`{tool}` is not installed (scripts/build-image.sh installs it)")
    timings: dict[str, float] = {}
    started = time.monotonic()
    built = image.build()
    timings["image build (cached)" if built.cached else "image build"] = built.seconds
    began = time.monotonic()
    assert real_node.node.bins is not None
    image.load(built, real_node.node.paths.containerd_socket, real_node.node.bins / "ctr")
    timings["image load"] = time.monotonic() - began
    mounts = chart.share_mounts()  # no systemd here: `/` is private, the barrier directory's propagation needs shared
    cluster = real_node.cluster
    for obj in chart.api_access_policy(real_node.real.server):
        cluster.create(obj)
    client = cluster.client
    client.create(Namespace(metadata=ObjectMeta(name=NAMESPACE, labels={chart.API_ACCESS_LABEL: "true"})))
    chart.wait_policy_in_effect(client, NAMESPACE)  # else the operator's pod may start unmutated: no API access
    sim_dir = Path(tempfile.mkdtemp(prefix="kubegpu-chart-", dir="/tmp"))
    SimulatedBackend.create(sim_dir / "node.json", gpus="2xA100-SXM4-80GB", node_name=NODE)
    cluster.create({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "dp-configs", "namespace": NAMESPACE},
                    "data": CONFIGS})
    cluster.patch("Node", NODE, {"metadata": {"labels": {"nvidia.com/gpu.present": "true"}}})
    values = {
        "image": {"pullPolicy": "Never"},
        "operator": {"logLevel": "info"},
        "clusterPolicy": {"spec": {
            "gpuBackend": f"sim:{sim_dir / 'node.json'}",
            "driver": {"enabled": False}, "toolkit": {"enabled": False},
            "migManager": {"enabled": False}, "dcgmExporter": {"enabled": False},
            "devicePlugin": {"config": {"name": "dp-configs", "default": "whole"},
                             "mps": {"root": str(sim_dir / "mps")}},
            "gfd": {"args": ["--sleep-interval=5s"]},
        }},
    }
    helm = chart.Helm(helmbuild.binary(), real_node.real.kubeconfig)
    workdir = sim_dir / "helm"
    began = time.monotonic()
    helm.install(RELEASE, NAMESPACE, values, workdir, ["--wait", "--timeout=180s"])
    timings["helm install --wait"] = time.monotonic() - began
    state = Release(real_node, helm, workdir, sim_dir, values, timings)
    try:
        yield state
    finally:
        with contextlib.suppress(KubegpuError):
            helm.uninstall(RELEASE, NAMESPACE, ["--wait", "--timeout=120s"])
        for obj in reversed(chart.api_access_policy(real_node.real.server)):
            with contextlib.suppress(NotFound):
                cluster.delete(obj["kind"], obj["metadata"]["name"])
        with contextlib.suppress(Exception):
            client.delete(Namespace, NAMESPACE)
        cluster.patch("Node", NODE, {"metadata": {"labels": {"nvidia.com/gpu.present": None, CONFIG_LABEL: None}}})
        shutil.rmtree(sim_dir, ignore_errors=True)
        problems = chart.unshare_mounts(mounts)
        assert not problems, problems
        timings["module total"] = time.monotonic() - started
        print("\nchart tier timings: " + ", ".join(f"{k} {v:.0f}s" for k, v in timings.items()))


def _ours(client: Any, resource: Any, namespace: str | None = None) -> list[str]:
    return [o.metadata.name for o in client.list(resource, namespace=namespace,
                                                   labels={"app.kubernetes.io/name": "kubegpu"})]


def _terminated_at(pod: dict[str, Any], init: str) -> str:
    for status in (pod.get("status") or {}).get("initContainerStatuses") or []:
        if status["name"] == init:
            return str(((status.get("state") or {}).get("terminated") or {}).get("finishedAt") or "")
    return ""


def _started_at(pod: dict[str, Any], container: str) -> str:
    for status in (pod.get("status") or {}).get("containerStatuses") or []:
        if status["name"] == container:
            return str(((status.get("state") or {}).get("running") or {}).get("startedAt") or "")
    return ""


def test_install_reconciles_validates_and_registers_the_containerised_plugin(release: Release) -> None:
    began = time.monotonic()
    until(lambda: release.policy_state() == "ready", "ClusterPolicy ready", READY_S)
    release.timings["ClusterPolicy ready after install"] = time.monotonic() - began
    operator = release.running_pod("operator")
    [container] = operator["spec"]["containers"]
    assert container["image"] == image.IMAGE_REF and container["imagePullPolicy"] == "Never"
    validator = release.running_pod("operator-validator")
    plugin = release.running_pod("device-plugin")
    discovery = release.running_pod("gpu-feature-discovery")
    for pod in (validator, plugin, discovery):
        assert pod["spec"]["nodeName"] == NODE
    # the operator's order on the node: validation's toolkit barrier, then the device plugin; plugin validation
    # finished only once the plugin had registered
    assert _terminated_at(validator, "toolkit-validation") <= _started_at(plugin, "device-plugin")
    assert _started_at(plugin, "device-plugin") <= _terminated_at(validator, "plugin-validation")
    for barrier in ("driver-ready", "toolkit-ready", "cuda-ready", "plugin-ready"):
        assert (Path(VALIDATIONS_DIR) / barrier).is_file(), barrier
    capacity, allocatable = node_resources(release.cluster)
    assert capacity["nvidia.com/gpu"] == allocatable["nvidia.com/gpu"] == "2"
    assert (DEVICE_PLUGIN_DIR / "nvidia-gpu.sock").exists()  # served from the pod through the hostPath
    labels = release.node_labels()
    assert labels["nvidia.com/gpu.count"] == "2" and labels["nvidia.com/gpu.deploy.device-plugin"] == "true"


def test_a_gpu_pod_runs_on_the_charts_device_plugin(release: Release, node_ns: str) -> None:
    seen = run_probe(release.cluster, probe_pod(unique("gpu"), node_ns, {"nvidia.com/gpu": 1}))
    assert seen.env["NVIDIA_VISIBLE_DEVICES"].startswith("GPU-")


def test_a_node_label_switches_the_running_plugins_config(release: Release) -> None:
    before = release.running_pod("device-plugin")
    release.label("ts-2")
    wait_allocatable(release.cluster, "nvidia.com/gpu", 4, timeout=60)
    until(lambda: release.node_labels().get("nvidia.com/gpu.replicas") == "2", "GFD relabels replicas=2", 60)
    after = release.running_pod("device-plugin")
    assert after["metadata"]["uid"] == before["metadata"]["uid"]  # same pod: no restart
    assert all(s["restartCount"] == 0 for s in after["status"]["containerStatuses"])
    release.label("no-such-config")  # a typo keeps the running config
    time.sleep(3)
    assert node_resources(release.cluster)[1]["nvidia.com/gpu"] == "4"


def test_the_mps_daemon_runs_where_the_config_asks_for_mps(release: Release, node_ns: str) -> None:
    assert not release.pods("mps-control-daemon")
    release.label("mps-2")
    until(lambda: release.node_labels().get("nvidia.com/mps.capable") == "true", "GFD labels mps.capable", 60)
    daemon = release.running_pod("mps-control-daemon", timeout=120)
    assert daemon["spec"]["nodeName"] == NODE
    record = release.mps_root / LIMITS_FILE
    until(record.is_file, f"{record} written by the MPS daemon pod", 60)
    assert "set_default_active_thread_percentage 50" in record.read_text()
    wait_allocatable(release.cluster, "nvidia.com/gpu", 4, timeout=60)
    seen = run_probe(release.cluster, probe_pod(unique("mps"), node_ns, {"nvidia.com/gpu": 1}))
    assert seen.env["CUDA_MPS_PIPE_DIRECTORY"] == "/mps/nvidia.com/gpu/pipe"  # the daemon's, under the MPS root
    assert seen.env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "50"
    release.label("whole")
    until(lambda: not release.pods("mps-control-daemon"), "MPS daemon pod gone once the config has no MPS", 120)
    assert not record.exists()
    wait_allocatable(release.cluster, "nvidia.com/gpu", 2, timeout=60)


def test_helm_upgrade_changes_a_setting_and_the_node_follows(release: Release) -> None:
    release.label(None)  # the default config applies again
    values = yaml.safe_load(yaml.safe_dump(release.values))
    values["clusterPolicy"]["spec"]["devicePlugin"]["config"]["default"] = "ts-4"
    began = time.monotonic()
    release.helm.upgrade(RELEASE, NAMESPACE, values, release.workdir, ["--wait", "--timeout=120s"])
    wait_allocatable(release.cluster, "nvidia.com/gpu", 8, timeout=READY_S)
    release.timings["helm upgrade → node follows"] = time.monotonic() - began
    plugin = release.running_pod("device-plugin")
    env = {e["name"]: e.get("value") for c in plugin["spec"]["initContainers"] for e in c.get("env", [])}
    assert env["DEFAULT_CONFIG"] == "ts-4"
    until(lambda: release.policy_state() == "ready", "ClusterPolicy ready after the upgrade", READY_S)


def test_helm_uninstall_leaves_no_kubegpu_object_or_node_state(release: Release) -> None:
    began = time.monotonic()
    release.helm.uninstall(RELEASE, NAMESPACE, ["--wait", "--timeout=120s"])
    until(lambda: not release.cluster.list("Pod", NAMESPACE), "every kubegpu pod gone", READY_S)
    release.timings["helm uninstall → pods gone"] = time.monotonic() - began
    assert not release.cluster.list("ClusterPolicy")
    client = release.cluster.client
    for resource in (DaemonSet, Deployment, ServiceAccount, Service):
        until(lambda r=resource: not _ours(client, r, NAMESPACE), f"no kubegpu {resource.__name__} left", 60)
    for resource in (ClusterRole, ClusterRoleBinding, RuntimeClass):
        until(lambda r=resource: not _ours(client, r), f"no kubegpu {resource.__name__} left", 60)
    assert not list(Path(VALIDATIONS_DIR).glob("*-ready"))
    assert not list(DEVICE_PLUGIN_DIR.glob("nvidia-*.sock"))
    assert not (release.mps_root / LIMITS_FILE).exists()
    wait_allocatable(release.cluster, "nvidia.com/gpu", 0, timeout=60)
    left = [k for k in release.node_labels() if k.startswith(("nvidia.com/gpu.", "nvidia.com/mps.", "nvidia.com/mig."))]
    assert left == [], left  # the test's own nvidia.com/gpu.present went with the stack's labels
