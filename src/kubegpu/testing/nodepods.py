"""Helpers for tests on the real node: pods that print what their container saw, kubegpu's node agents as
processes, and waits with messages that say what never happened.

A probe pod runs the test image (busybox) on Node `real-node-0` and prints its environment and `/dev` between
markers; `probe_result` parses them back from the pod's log, read through the API server from the real kubelet. So a
test asserts what the container itself received (NVIDIA_VISIBLE_DEVICES, CDI-injected device nodes, MPS limits),
not what a plugin claims to have sent.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

import kubegpu.dra.publish  # noqa: F401 - registers the ResourceClaim and ResourceSlice kinds
from kubegpu.errors import KubegpuError
from kubegpu.kube.errors import NotFound
from kubegpu.kube.resources import ResourceKind, register_kind
from kubegpu.testing.nodeconfig import NODE_NAME
from kubegpu.testing.nodeimages import TEST_IMAGE
from kubegpu.testing.processes import stop_child
from kubegpu.testing.realnode import DEVICE_CLASS  # noqa: F401 - registers the kind for tests
from kubegpu.testing.session import WaitTimeout, wait_for

if TYPE_CHECKING:
    from kubegpu.kube.lightkube_cluster import LightkubeCluster

ENV_BEGIN, ENV_END = "--- env ---", "--- end env ---"
DEV_BEGIN, DEV_END = "--- dev ---", "--- end dev ---"
# prints the environment and every entry under /dev (recursively, so /dev/nvidia-caps/* shows), then the extra script
PROBE_SCRIPT = (f"echo '{ENV_BEGIN}'; env | sort; echo '{ENV_END}'; echo '{DEV_BEGIN}'; "
                f"find /dev -mindepth 1 | sort; echo '{DEV_END}'")
POD_TIMEOUT_S = 60.0
RESOURCE_CLAIM_TEMPLATE = register_kind(ResourceKind("ResourceClaimTemplate", "resource.k8s.io", "v1",
                                                     "resourceclaimtemplates", namespaced=True,
                                                     status_subresource=False, strategic_merge=False))
AGENT_READY_S = 30.0


@dataclass(frozen=True)
class ProbeResult:
    """What a probe container saw: its environment, the entries under /dev, and the whole log."""

    env: dict[str, str]
    dev: list[str]
    log: str

    def nvidia_devices(self) -> list[str]:
        """The /dev/nvidia* nodes present (GPUs, control devices, MIG capability nodes)."""
        return [d for d in self.dev if d.startswith("/dev/nvidia")]


def probe_result(log: str) -> ProbeResult:
    """Parse a probe pod's log; KubegpuError when the markers are missing (the container did not run the probe)."""
    lines = log.splitlines()
    try:
        env_lines = lines[lines.index(ENV_BEGIN) + 1:lines.index(ENV_END)]
        dev_lines = lines[lines.index(DEV_BEGIN) + 1:lines.index(DEV_END)]
    except ValueError:
        raise KubegpuError(f"not a probe pod's log (no {ENV_BEGIN!r}/{DEV_BEGIN!r} markers): {log[-300:]!r}") from None
    env = {}
    for line in env_lines:
        key, sep, value = line.partition("=")
        if sep:
            env[key] = value
    return ProbeResult(env, [d.strip() for d in dev_lines if d.strip()], log)


def probe_pod(name: str, namespace: str, resources: Mapping[str, str | int] | None = None,
              claims: Sequence[Mapping[str, Any]] = (), script: str = "", sleep: float = 0,
              annotations: Mapping[str, str] | None = None, image: str = TEST_IMAGE,
              node: str = NODE_NAME) -> dict[str, Any]:
    """A pod pinned to the real node that prints its env and /dev, runs ``script``, then sleeps ``sleep`` seconds
    (a pod that must stay running while a test restarts something). ``resources``: limits (e.g. nvidia.com/gpu);
    ``claims``: pod-level `resourceClaims` entries, each claimed by the container."""
    command = PROBE_SCRIPT + (f"; {script}" if script else "") + (f"; sleep {sleep:g}" if sleep else "")
    container: dict[str, Any] = {"name": "probe", "image": image, "imagePullPolicy": "IfNotPresent",
                                 "command": ["sh", "-c", command]}
    if resources:
        container["resources"] = {"limits": {k: str(v) for k, v in resources.items()}}
    spec: dict[str, Any] = {"restartPolicy": "Never", "nodeSelector": {"kubernetes.io/hostname": node},
                            "terminationGracePeriodSeconds": 1, "containers": [container],
                            "enableServiceLinks": False, "automountServiceAccountToken": False}
    if claims:
        spec["resourceClaims"] = [dict(c) for c in claims]
        container.setdefault("resources", {})["claims"] = [{"name": c["name"]} for c in claims]
    metadata: dict[str, Any] = {"name": name, "namespace": namespace}
    if annotations:
        metadata["annotations"] = dict(annotations)
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


def pod_phase(cluster: LightkubeCluster, name: str, namespace: str) -> str:
    try:
        return str((cluster.get("Pod", name, namespace).get("status") or {}).get("phase") or "")
    except NotFound:
        return ""


def wait_phase(cluster: LightkubeCluster, name: str, namespace: str, phases: Sequence[str] = ("Succeeded",),
               timeout: float = POD_TIMEOUT_S) -> str:
    """Wait until the pod reaches one of ``phases``; a pod that ends in another phase fails at once, with the
    kubelet's reason (e.g. CreateContainerError and containerd's message) in the error."""
    def check() -> str | None:
        pod = cluster.get("Pod", name, namespace)
        phase = str((pod.get("status") or {}).get("phase") or "")
        if phase in phases:
            return phase
        if phase in ("Succeeded", "Failed"):
            raise WaitTimeout(f"pod {namespace}/{name} ended {phase}, expected {'/'.join(phases)}: {why(pod)}")
        return None

    try:
        return wait_for(check, f"pod {namespace}/{name} {'/'.join(phases)}", timeout, interval=0.2)
    except WaitTimeout as exc:
        if "ended" in str(exc):
            raise
        raise WaitTimeout(f"{exc}; {why(cluster.get('Pod', name, namespace))}") from None


def why(pod: Mapping[str, Any]) -> str:
    """The pod's phase, conditions and container states, one line: what a test failure should show."""
    status = pod.get("status") or {}
    parts = [f"phase={status.get('phase')}"]
    if status.get("reason") or status.get("message"):
        parts.append(f"{status.get('reason')}: {status.get('message')}")
    for condition in status.get("conditions") or []:
        if condition.get("status") != "True" and condition.get("message"):
            parts.append(f"{condition.get('type')}: {condition.get('message')}")
    for state in status.get("containerStatuses") or []:
        for kind, detail in (state.get("state") or {}).items():
            if detail and (detail.get("reason") or detail.get("message")):
                parts.append(f"{state.get('name')} {kind}: {detail.get('reason')} {detail.get('message') or ''}")
    return "; ".join(parts)[:1500]


def pod_log(cluster: LightkubeCluster, name: str, namespace: str) -> str:
    """The container's log as the real kubelet serves it (through the API server)."""
    return "".join(cluster.client.log(name, namespace=namespace))


def run_probe(cluster: LightkubeCluster, pod: Mapping[str, Any], timeout: float = POD_TIMEOUT_S) -> ProbeResult:
    """Create a probe pod, wait until it succeeded, and return what its container saw."""
    name, namespace = pod["metadata"]["name"], pod["metadata"]["namespace"]
    cluster.create(dict(pod))
    wait_phase(cluster, name, namespace, ("Succeeded",), timeout)
    return probe_result(pod_log(cluster, name, namespace))


def start_probe(cluster: LightkubeCluster, pod: Mapping[str, Any], timeout: float = POD_TIMEOUT_S) -> ProbeResult:
    """Create a probe pod that stays running (``sleep``) and return what its container saw, once it printed it."""
    name, namespace = pod["metadata"]["name"], pod["metadata"]["namespace"]
    cluster.create(dict(pod))
    wait_phase(cluster, name, namespace, ("Running",), timeout)
    return read_probe(cluster, name, namespace, timeout)


def read_probe(cluster: LightkubeCluster, name: str, namespace: str, timeout: float = POD_TIMEOUT_S) -> ProbeResult:
    """What a started probe pod's container saw, once its log holds the whole probe."""
    def printed() -> str | None:
        text = pod_log(cluster, name, namespace)
        return text if DEV_END in text else None

    return probe_result(wait_for(printed, f"pod {namespace}/{name} printing its probe", timeout, interval=0.2))


def delete_pod(cluster: LightkubeCluster, name: str, namespace: str, wait: bool = True,
               timeout: float = POD_TIMEOUT_S) -> None:
    with contextlib.suppress(NotFound):
        cluster.delete("Pod", name, namespace)
    if wait:
        wait_for(lambda: not _exists(cluster, "Pod", name, namespace), f"pod {namespace}/{name} gone", timeout)


def _exists(cluster: LightkubeCluster, kind: str, name: str, namespace: str | None = None) -> bool:
    try:
        cluster.get(kind, name, namespace)
    except NotFound:
        return False
    return True


def node_resources(cluster: LightkubeCluster, node: str = NODE_NAME) -> tuple[dict[str, str], dict[str, str]]:
    """(capacity, allocatable) of the Node."""
    status = cluster.get("Node", node).get("status") or {}
    return dict(status.get("capacity") or {}), dict(status.get("allocatable") or {})


def wait_allocatable(cluster: LightkubeCluster, resource: str, count: int, node: str = NODE_NAME,
                     timeout: float = POD_TIMEOUT_S) -> dict[str, str]:
    """Wait until the Node's allocatable ``resource`` is ``count`` (0 also matches an absent resource)."""
    def check() -> dict[str, str] | None:
        _, allocatable = node_resources(cluster, node)
        return allocatable if int(allocatable.get(resource, "0")) == count else None

    return wait_for(check, f"node {node} allocatable {resource}={count}", timeout, interval=0.2)


# ---------------------------------------------------------------------------------------------------- node agents


@dataclass
class Agent:
    """A kubegpu command running as a process (`kubegpu device-plugin ...`), its output in ``log_path``."""

    args: list[str]
    log_path: Path
    env: dict[str, str] = field(default_factory=dict)
    process: subprocess.Popen[bytes] | None = None
    _log: IO[bytes] | None = None
    _offset: int = 0  # where this run's output starts in the (appended) log file

    def start(self) -> Agent:
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - closed in stop()
        self._offset = self._log.tell()
        self.process = subprocess.Popen([sys.executable, "-m", "kubegpu", *self.args], stdin=subprocess.DEVNULL,
                                        stdout=self._log, stderr=subprocess.STDOUT, env={**os.environ, **self.env},
                                        start_new_session=True)
        return self

    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def log(self) -> str:
        """This run's output (an earlier run's, in the same file, is not repeated)."""
        if not self.log_path.exists():
            return ""
        with open(self.log_path, "rb") as handle:
            handle.seek(self._offset)
            return handle.read().decode(errors="replace")

    def wait_log(self, text: str, timeout: float = AGENT_READY_S) -> None:
        """Wait until the agent's log contains ``text``; fails at once if the agent exits."""
        def check() -> bool:
            if self.process is not None and self.process.poll() is not None:
                raise KubegpuError(f"kubegpu {' '.join(self.args[:1])} exited {self.process.returncode}: "
                                   f"{self.log()[-800:]}")
            return text in self.log()

        try:
            wait_for(check, f"{text!r} in {self.log_path}", timeout, interval=0.1)
        except WaitTimeout as exc:  # what the agent did say is the first thing to read in a CI log
            raise WaitTimeout(f"{exc}; its log ends: {self.log()[-1500:]!r}") from None

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 15.0) -> None:
        if self.process is not None:
            stop_child(self.process, timeout, sig)
        if self._log is not None:
            self._log.close()
            self._log = None


@contextlib.contextmanager
def running(agent: Agent) -> Iterator[Agent]:
    """Start an agent for a `with` block and always stop it."""
    agent.start()
    try:
        yield agent
    finally:
        agent.stop()


def until(check: Any, what: str, timeout: float = POD_TIMEOUT_S) -> Any:
    """`wait_for` with the real node's default timeout (re-exported so node tests import one module)."""
    return wait_for(check, what, timeout, interval=0.2)


def settle(seconds: float) -> None:
    """Let the node run for a while (e.g. to see that nothing changes while idle)."""
    time.sleep(seconds)


# ---------------------------------------------------------------------------------------------------- the session


@dataclass
class NodeSession:
    """What the `real_node` fixture hands a test: the control plane (``real``, a RealCluster) and the real node
    (``node``), with kubegpu's node agents started against them."""

    real: Any  # kubegpu.testing.session.RealCluster
    node: Any  # kubegpu.testing.realnode.RealNode
    logs: Path

    @property
    def cluster(self) -> LightkubeCluster:
        return self.real.admin  # type: ignore[no-any-return]

    def agent(self, name: str, args: Sequence[str]) -> Agent:
        """A kubegpu command (not started) with this control plane's KUBECONFIG, its log in logs/<name>.log."""
        self.logs.mkdir(parents=True, exist_ok=True)
        return Agent(list(args), self.logs / f"{name}.log", {"KUBECONFIG": str(self.real.kubeconfig),
                                                              "NODE_NAME": NODE_NAME})

    def device_plugin(self, *extra: str, name: str = "device-plugin") -> Agent:
        """`kubegpu device-plugin` registered with the real kubelet, CDI specs in the node's CDI directory."""
        from kubegpu.testing.realnode import DEVICE_PLUGIN_DIR

        return self.agent(name, ["device-plugin", "--gpu-backend", self.node.gpu_backend,
                                 "--kubelet-socket", str(DEVICE_PLUGIN_DIR / "kubelet.sock"),
                                 "--device-plugin-dir", str(DEVICE_PLUGIN_DIR), "--cdi-dir",
                                 str(self.node.paths.cdi_dir), "--node-name", NODE_NAME, "--relist-interval", "0.5",
                                 *extra])

    def gpu_guard(self, *extra: str, name: str = "gpu-guard") -> Agent:
        """`kubegpu gpu-guard` on the real node: the kubelet's PodResources, the host's /proc, the simulated GPUs."""
        return self.agent(name, ["gpu-guard", "--gpu-backend", self.node.gpu_backend, "--node-name", NODE_NAME,
                                 "--pod-resources-socket", str(self.node.paths.pod_resources_socket), *extra])

    def dra_driver(self, *extra: str, name: str = "dra-driver") -> Agent:
        """`kubegpu dra-driver` registered with the real kubelet's plugin registry."""
        paths = self.node.paths
        return self.agent(name, ["dra-driver", "--gpu-backend", self.node.gpu_backend, "--node-name", NODE_NAME,
                                 "--kubelet-plugins-dir", str(paths.plugins_dir), "--kubelet-registrar-dir",
                                 str(paths.registry_dir), "--cdi-root", str(paths.cdi_dir), *extra])


def claim_template(name: str, namespace: str, device_class: str = "gpu.nvidia.com", count: int = 1,
                   config: Mapping[str, Any] | None = None, selector: str | None = None) -> dict[str, Any]:
    """A ResourceClaimTemplate asking ``count`` devices of ``device_class`` (request `gpu`); ``config``: opaque
    parameters for our driver (a GpuConfig); ``selector``: a CEL expression the device must match."""
    exactly: dict[str, Any] = {"deviceClassName": device_class, "count": count}
    if selector:
        exactly["selectors"] = [{"cel": {"expression": selector}}]
    spec: dict[str, Any] = {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}}
    if config is not None:
        spec["devices"]["config"] = [{"requests": ["gpu"], "opaque": {"driver": "gpu.nvidia.com",
                                                                      "parameters": dict(config)}}]
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
            "metadata": {"name": name, "namespace": namespace}, "spec": {"spec": spec}}


def pod_claims(pod: Mapping[str, Any], cluster: LightkubeCluster) -> list[dict[str, Any]]:
    """The ResourceClaims the pod's status names (generated from templates)."""
    namespace = pod["metadata"]["namespace"]
    current = cluster.get("Pod", pod["metadata"]["name"], namespace)
    names = [s.get("resourceClaimName") for s in (current.get("status") or {}).get("resourceClaimStatuses") or []]
    return [cluster.get("ResourceClaim", n, namespace) for n in names if n]
