"""The real node's configuration files: containerd's, the CNI network's and the kubelet's (pure: paths in, text out).

Each setting below was needed on this project's machines (a VM without systemd, cgroup v1 hybrid, root without
CAP_SYS_RESOURCE); ../shared/reference/real-node.md, summarised in docs/testing.md, records the failure each one
fixes. Everything containerd and the kubelet write lives under the node's directory, except the few paths the
kubelet hard-wires (`kubegpu.testing.realnode` cleans those up).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from kubegpu.testing.nodeimages import PAUSE_IMAGE

NODE_NAME = "real-node-0"
CNI_BIN_DIR = Path("/usr/lib/cni")  # Debian's containernetworking-plugins
CNI_PLUGINS = ("bridge", "host-local", "loopback")
BRIDGE = "kubegpu0"
# The kubelet refuses a loopback node IP (the Node then has no address and the API server cannot reach it for logs
# or exec), so the node gets an address of its own on the loopback device: local only, removed by `down`.
NODE_IP = "10.244.251.1"
POD_SUBNET = "10.244.250.0/24"
# containerd's own defaults, so a DRA driver or device plugin run with its default --cdi-root (/var/run/cdi) works,
# plus the node's own directory for specs the tests write there
SYSTEM_CDI_DIRS = ("/etc/cdi", "/var/run/cdi")


@dataclass(frozen=True)
class NodePaths:
    """Where everything of one real node lives (all under its directory)."""

    directory: Path

    @property
    def containerd(self) -> Path:
        return self.directory / "containerd"

    @property
    def containerd_config(self) -> Path:
        return self.containerd / "config.toml"

    @property
    def containerd_socket(self) -> Path:
        return self.containerd / "containerd.sock"

    @property
    def cni_conf_dir(self) -> Path:
        return self.directory / "cni" / "net.d"

    @property
    def cni_data_dir(self) -> Path:
        return self.directory / "cni" / "ipam"

    @property
    def cdi_dir(self) -> Path:
        return self.directory / "cdi"

    @property
    def kubelet_root(self) -> Path:
        return self.directory / "kubelet"

    @property
    def plugins_dir(self) -> Path:
        """Where DRA drivers put their sockets (`--kubelet-plugins-dir`)."""
        return self.kubelet_root / "plugins"

    @property
    def registry_dir(self) -> Path:
        """Where DRA drivers register (`--kubelet-registrar-dir`)."""
        return self.kubelet_root / "plugins_registry"

    @property
    def pod_resources_socket(self) -> Path:
        return self.kubelet_root / "pod-resources" / "kubelet.sock"

    @property
    def kubelet_config(self) -> Path:
        return self.directory / "kubelet-config.yaml"

    @property
    def kubelet_pki(self) -> Path:
        return self.directory / "pki" / "kubelet"

    @property
    def pod_logs(self) -> Path:
        return self.directory / "pod-logs"

    @property
    def node_file(self) -> Path:
        """The simulated GPUs of the node (`kubegpu sim-node create` format): `--gpu-backend sim:<this>`."""
        return self.directory / f"{NODE_NAME}.json"

    @property
    def images_file(self) -> Path:
        return self.directory / "images"


def _toml_string(value: str) -> str:
    return json.dumps(value)  # a TOML basic string is a JSON string for the paths and names used here


def containerd_config(paths: NodePaths, runc: Path) -> str:
    """containerd 2.x (config version 3). `restrict_oom_score_adj`: root here may not lower oom_score_adj, and
    without it every sandbox fails in runc init; netns mounts under the state dir, so teardown finds them all."""
    cdi_dirs = ", ".join(_toml_string(d) for d in (*SYSTEM_CDI_DIRS, str(paths.cdi_dir)))
    runtime = "plugins.'io.containerd.cri.v1.runtime'"
    return f"""version = 3
root = {_toml_string(str(paths.containerd / "root"))}
state = {_toml_string(str(paths.containerd / "state"))}
disabled_plugins = ["io.containerd.nri.v1.nri", "io.containerd.internal.v1.tracing"]

[grpc]
  address = {_toml_string(str(paths.containerd_socket))}

[ttrpc]
  address = {_toml_string(str(paths.containerd_socket) + ".ttrpc")}

[{runtime}]
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  cdi_spec_dirs = [{cdi_dirs}]

[{runtime}.containerd]
  default_runtime_name = "runc"

[{runtime}.containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"

[{runtime}.containerd.runtimes.runc.options]
  BinaryName = {_toml_string(str(runc))}
  Root = {_toml_string(str(paths.containerd / "runc"))}
  SystemdCgroup = false

[{runtime}.cni]
  bin_dirs = [{_toml_string(str(CNI_BIN_DIR))}]
  conf_dir = {_toml_string(str(paths.cni_conf_dir))}

[plugins.'io.containerd.cri.v1.images']
  snapshotter = "overlayfs"

[plugins.'io.containerd.cri.v1.images'.pinned_images]
  sandbox = {_toml_string(PAUSE_IMAGE)}

[plugins.'io.containerd.grpc.v1.cri']
  disable_tcp_service = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
"""


def cni_conflist(paths: NodePaths) -> str:
    """A bridge network without a gateway masquerade, so nothing touches iptables; hostNetwork pods need none."""
    return json.dumps({
        "cniVersion": "1.0.0",
        "name": "kubegpu",
        "plugins": [
            {"type": "bridge", "bridge": BRIDGE, "isGateway": True, "ipMasq": False, "hairpinMode": True,
             "ipam": {"type": "host-local", "dataDir": str(paths.cni_data_dir), "ranges": [[{"subnet": POD_SUBNET}]],
                      "routes": [{"dst": "0.0.0.0/0"}]}},
            {"type": "loopback"},
        ],
    }, indent=2) + "\n"


def kubelet_config(paths: NodePaths, ca_cert: Path, port: int, healthz_port: int,
                   feature_gates: list[str]) -> str:
    """KubeletConfiguration: cgroup v1 allowed (1.35+ refuses it otherwise), no swap check, no ephemeral-storage
    accounting (cadvisor cannot stat the VM's block device), lax eviction and no image garbage collection (the
    test image must stay), node status every second (tests wait on capacity), served on 127.0.0.1 only."""
    config: dict[str, Any] = {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "failCgroupV1": False,
        "cgroupDriver": "cgroupfs",
        "failSwapOn": False,
        "localStorageCapacityIsolation": False,
        "evictionHard": {"memory.available": "1Mi", "nodefs.available": "1%", "nodefs.inodesFree": "1%",
                         "imagefs.available": "1%", "imagefs.inodesFree": "1%"},
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "containerRuntimeEndpoint": f"unix://{paths.containerd_socket}",
        "address": NODE_IP,
        "port": port,
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": healthz_port,
        "authentication": {"x509": {"clientCAFile": str(ca_cert)}, "webhook": {"enabled": True},
                           "anonymous": {"enabled": False}},
        "authorization": {"mode": "Webhook"},
        "podLogsDir": str(paths.pod_logs),
        "nodeStatusUpdateFrequency": "1s",
        "nodeStatusReportFrequency": "10s",
        "syncFrequency": "10s",
        "serializeImagePulls": False,
        "resolvConf": "",
        "featureGates": {gate: True for gate in feature_gates},
    }
    return yaml.safe_dump(config, sort_keys=False)


def kubelet_args(paths: NodePaths, kubeconfig: Path) -> list[str]:
    return [
        f"--config={paths.kubelet_config}", f"--kubeconfig={kubeconfig}", f"--root-dir={paths.kubelet_root}",
        f"--cert-dir={paths.kubelet_pki}", f"--hostname-override={NODE_NAME}", f"--node-ip={NODE_IP}", "--v=1",
    ]
