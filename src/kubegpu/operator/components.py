"""The operands the ClusterPolicy deploys, as data: which policy block turns each on, its node label, the state it
belongs to (the GPU Operator's state order), the command it runs, the barrier file it waits on, and the least RBAC
it needs. Rendering (render.py) and node labelling (nodelabels.py) both read this one table.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

VALIDATIONS_DIR = "/run/nvidia/validations"
DEPLOY_LABEL_PREFIX = "nvidia.com/gpu.deploy."

# The GPU Operator's state order (container stack), then ours. All are applied in every pass.
STATES = (
    "pre-requisites",
    "state-operator-metrics",
    "state-driver",
    "state-container-toolkit",
    "state-operator-validation",
    "state-device-plugin",
    "state-mps-control-daemon",
    "state-dcgm-exporter",
    "gpu-feature-discovery",
    "state-mig-manager",
    "state-node-status-exporter",
    "state-partitioner",
    "state-autoscaler",
    "state-dra-driver",
    "state-gpu-guard",
    "state-quota",
)


def rule(groups: list[str], resources: list[str], verbs: list[str]) -> dict[str, Any]:
    return {"apiGroups": groups, "resources": resources, "verbs": verbs}


EVENTS = rule([""], ["events"], ["create", "get", "patch"])


@dataclass(frozen=True)
class HostPath:
    name: str
    path: str
    mount: str = ""
    propagation: str | None = None

    @property
    def mount_path(self) -> str:
        return self.mount or self.path


@dataclass(frozen=True)
class Operand:
    """One workload (DaemonSet or Deployment) and what comes with it."""

    component: str  # app.kubernetes.io/component, and the deploy label suffix for DaemonSets
    block: str  # the ClusterPolicy spec block that enables and configures it
    state: str
    kind: str = "DaemonSet"
    command: tuple[str, ...] = ()  # empty for NVIDIA's images (their own entrypoint)
    args: tuple[str, ...] = ()
    nvidia_image: bool = False
    waits_for: str | None = None  # barrier file the init container waits on
    cluster_rules: tuple[dict[str, Any], ...] = ()
    namespace_rules: tuple[dict[str, Any], ...] = ()
    host_paths: tuple[HostPath, ...] = ()
    privileged: bool = False
    host_pid: bool = False
    capabilities: tuple[str, ...] = ()
    port: int | None = None
    ready_path: str | None = None  # served on `port`: the readinessProbe (a controller's /readyz: 503 while stale)
    mig_only: bool = False  # deploy label only on MIG-capable nodes
    app: str | None = None  # the GPU Operator's pod `app` label: the MIG manager waits for these pods to stop
    env: tuple[tuple[str, str], ...] = field(default_factory=tuple)
    deploy_as: str | None = None  # runs under another component's deploy label (the MPS daemon: device-plugin's)
    node_selector: tuple[tuple[str, str], ...] = ()  # more nodeSelector terms than the deploy label
    per_node_config: bool = False  # reads the device-plugin config a node's label selects (config-manager)

    @property
    def deploy_label(self) -> str:
        return DEPLOY_LABEL_PREFIX + (self.deploy_as or self.component)

    @property
    def name(self) -> str:
        return f"kubegpu-{self.component}"


MPS_CAPABLE_LABEL = "nvidia.com/mps.capable"  # feature discovery sets it from the node's device-plugin config
CONFIG_LABEL = "nvidia.com/device-plugin.config"
_VALIDATIONS = HostPath("run-nvidia-validations", VALIDATIONS_DIR)
_STATE = HostPath("kubegpu-state", "/var/lib/kubegpu")
_POD_RESOURCES = HostPath("pod-resources", "/var/lib/kubelet/pod-resources")
_NODE_GET = rule([""], ["nodes"], ["get"])
_NODE_WATCH = rule([""], ["nodes"], ["get", "list", "watch"])  # the config-manager follows its own Node
_LEASES = rule(["coordination.k8s.io"], ["leases"], ["get", "create", "patch"])

OPERANDS: tuple[Operand, ...] = (
    Operand("driver", "driver", "state-driver", nvidia_image=True, privileged=True, host_pid=True,
            host_paths=(HostPath("run-nvidia", "/run/nvidia", propagation="Bidirectional"),
                        HostPath("host-root", "/", "/host"))),
    Operand("container-toolkit", "toolkit", "state-container-toolkit", nvidia_image=True, privileged=True,
            waits_for="driver-ready",
            host_paths=(HostPath("run-nvidia", "/run/nvidia", propagation="HostToContainer"),
                        HostPath("toolkit-install-dir", "/usr/local/nvidia"),
                        HostPath("containerd-config", "/etc/containerd", "/runtime/config-dir"))),
    Operand("operator-validator", "validator", "state-operator-validation", command=("kubegpu", "validate", "hold"),
            privileged=True, cluster_rules=(_NODE_GET,), host_paths=(_VALIDATIONS,)),
    Operand("device-plugin", "devicePlugin", "state-device-plugin", command=("kubegpu", "device-plugin"),
            args=("--gpu-backend=nvml", "--kubelet-socket=/var/lib/kubelet/device-plugins/kubelet.sock",
                  "--device-plugin-dir=/var/lib/kubelet/device-plugins",
                  "--mps-slices-file=/var/lib/kubegpu/mps-slices.json", "--cdi-root=/var/run/cdi",
                  "--share-record-file=/var/lib/kubegpu/device-shares.json", "--metrics-address=:8081"),
            waits_for="toolkit-ready", cluster_rules=(_NODE_WATCH,), app="nvidia-device-plugin-daemonset",
            per_node_config=True,
            host_paths=(HostPath("device-plugins", "/var/lib/kubelet/device-plugins"), _STATE,
                        HostPath("cdi", "/var/run/cdi"), _VALIDATIONS)),
    # the MPS root (devicePlugin.mps.root) is mounted by render: it is a policy setting
    Operand("mps-control-daemon", "devicePlugin", "state-mps-control-daemon",
            command=("kubegpu", "mps-control-daemon"), args=("--gpu-backend=nvml",), waits_for="toolkit-ready",
            privileged=True, host_pid=True, deploy_as="device-plugin", node_selector=((MPS_CAPABLE_LABEL, "true"),),
            app="nvidia-device-plugin-mps-control-daemon", per_node_config=True, cluster_rules=(_NODE_WATCH,),
            env=(("NVIDIA_VISIBLE_DEVICES", "all"), ("NVIDIA_DRIVER_CAPABILITIES", "compute,utility")),
            host_paths=(_VALIDATIONS,)),
    Operand("dcgm-exporter", "dcgmExporter", "state-dcgm-exporter", command=("kubegpu", "exporter"),
            args=("--gpu-backend=nvml", "--address=:9400", "--collect-interval=30000", "--kubernetes",
                  "--pod-resources-kubelet-socket=/var/lib/kubelet/pod-resources/kubelet.sock"),
            waits_for="toolkit-ready", capabilities=("SYS_ADMIN",), port=9400, app="nvidia-dcgm-exporter",
            host_paths=(_POD_RESOURCES, _VALIDATIONS)),
    Operand("gpu-feature-discovery", "gfd", "gpu-feature-discovery", command=("kubegpu", "discover"),
            args=("--gpu-backend=nvml", "--kubernetes", "--sleep-interval=60s"), waits_for="toolkit-ready",
            app="gpu-feature-discovery", per_node_config=True,
            cluster_rules=(rule([""], ["nodes"], ["get", "list", "watch", "patch"]),
                           rule([""], ["nodes/status"], ["patch"])),
            host_paths=(_VALIDATIONS,)),
    Operand("mig-manager", "migManager", "state-mig-manager", command=("kubegpu", "mig-manager"),
            args=("--gpu-backend=nvml", "--gpu-clients-namespace={namespace}"), waits_for="toolkit-ready",
            privileged=True, mig_only=True,
            cluster_rules=(rule([""], ["nodes"], ["get", "list", "watch", "patch"]), EVENTS),
            namespace_rules=(rule([""], ["pods"], ["list"]),), host_paths=(_VALIDATIONS,)),
    Operand("node-status-exporter", "nodeStatusExporter", "state-node-status-exporter",
            command=("kubegpu", "validate", "metrics"), args=("--address=:8000",), port=8000,
            host_paths=(_VALIDATIONS,)),
    Operand("partitioner", "partitioner", "state-partitioner", kind="Deployment",
            command=("kubegpu", "partitioner"), args=("--lease-duration=15", "--interval=5"),
            cluster_rules=(rule([""], ["nodes"], ["list", "patch"]), rule([""], ["pods"], ["list"]), EVENTS),
            namespace_rules=(_LEASES,)),
    Operand("partition-agent", "partitioner", "state-partitioner", command=("kubegpu", "partition-agent"),
            args=("--gpu-backend=nvml", "--mps-slices-file=/var/lib/kubegpu/mps-slices.json",
                  "--pod-resources-kubelet-socket=/var/lib/kubelet/pod-resources/kubelet.sock"),
            waits_for="toolkit-ready", privileged=True,
            cluster_rules=(rule([""], ["nodes"], ["get", "patch"]), rule([""], ["pods"], ["list"]), EVENTS),
            host_paths=(_STATE, _POD_RESOURCES, _VALIDATIONS)),
    Operand("autoscaler", "autoscaler", "state-autoscaler", kind="Deployment", command=("kubegpu", "autoscaler"),
            args=("--disruption",),
            cluster_rules=(
                rule([""], ["nodes"], ["get", "list", "create", "patch", "delete"]),
                rule([""], ["nodes/status"], ["patch"]), rule([""], ["pods"], ["get", "list", "patch", "delete"]),
                rule([""], ["pods/status"], ["patch"]),
                rule([""], ["pods/eviction"], ["create"]), rule(["kubegpu.io"], ["nodepools"], ["get", "list"]),
                rule(["kubegpu.io"], ["nodeclaims"], ["get", "list", "create", "patch", "delete"]),
                rule(["kubegpu.io"], ["nodeclaims/status"], ["patch"]), rule(["apps"], ["daemonsets"], ["list"]),
                rule(["kubegpu.io"], ["ec2nodeclasses"], ["list"]),
                rule(["kubegpu.io"], ["ec2nodeclasses/status"], ["patch"]),
                rule(["policy"], ["poddisruptionbudgets"], ["list"]),
                rule(["resource.k8s.io"], ["deviceclasses", "resourceclaims", "resourceclaimtemplates"], ["list"]),
                rule(["resource.k8s.io"], ["resourceslices"], ["list", "create", "delete"]), EVENTS)),
    Operand("dra-driver", "draDriver", "state-dra-driver", command=("kubegpu", "dra-driver"),
            args=("--gpu-backend=nvml",), waits_for="toolkit-ready", privileged=True,
            cluster_rules=(_NODE_GET, rule(["resource.k8s.io"], ["resourceslices"],
                                            ["get", "list", "watch", "create", "update", "delete"]),
                           rule(["resource.k8s.io"], ["resourceclaims"], ["get"])),
            host_paths=(HostPath("kubelet-plugins", "/var/lib/kubelet/plugins"),
                        HostPath("plugins-registry", "/var/lib/kubelet/plugins_registry"),
                        HostPath("cdi", "/var/run/cdi"), _VALIDATIONS)),
    # hostPID and the host's /proc: GPU processes are host PIDs, their cgroups name the pods, and the guard kills
    # an offending process where a PodDisruptionBudget refuses its pod's eviction (docs/gpu-guard.md)
    Operand("gpu-guard", "gpuGuard", "state-gpu-guard", command=("kubegpu", "gpu-guard"),
            args=("--gpu-backend=nvml", "--pod-resources-socket=/var/lib/kubelet/pod-resources/kubelet.sock",
                  "--proc-root=/host/proc", "--mps-slices-file=/var/lib/kubegpu/mps-slices.json",
                  "--share-record-file=/var/lib/kubegpu/device-shares.json", "--metrics-address=:8082"),
            waits_for="toolkit-ready", privileged=True, host_pid=True, port=8082,
            cluster_rules=(rule([""], ["pods"], ["get", "list"]), rule([""], ["pods/status"], ["patch"]),
                           rule([""], ["pods/eviction"], ["create"]),
                           rule(["resource.k8s.io"], ["resourceclaims"], ["get"]), EVENTS),
            host_paths=(_POD_RESOURCES, _STATE, HostPath("host-proc", "/proc", "/host/proc"), _VALIDATIONS)),
    # the admission policies and their table come with it (render.quota_objects); the CRD with the operator's
    Operand("quota", "quota", "state-quota", kind="Deployment", command=("kubegpu", "quota", "controller"),
            args=("--lease-duration=15", "--interval=2", "--metrics-address=:8084"), port=8084, ready_path="/readyz",
            # pods create, pods/status, DRA reads: ResourceClaims' charge holders (docs/quotas.md)
            cluster_rules=(rule([""], ["pods"], ["get", "list", "watch", "create", "patch"]),
                           rule([""], ["pods/status"], ["patch"]),
                           rule(["resource.k8s.io"], ["deviceclasses", "resourceclaims", "resourceclaimtemplates"],
                                ["list", "watch"]),
                           rule([""], ["pods/eviction"], ["create"]), rule([""], ["nodes"], ["get", "list", "watch"]),
                           rule(["kubegpu.io"], ["elasticquotas"], ["get", "list", "watch"]),
                           rule(["kubegpu.io"], ["elasticquotas/status"], ["patch"]), EVENTS),
            namespace_rules=(_LEASES, rule([""], ["configmaps"], ["get"]))),
)

# The validator's init containers, in order (GPU Operator's nvidia-validator components).
VALIDATIONS = ("driver", "toolkit", "cuda", "plugin")

# Deploy labels (GPU Operator names, then ours) and the policy block that turns each on.
DEPLOY_LABELS: tuple[tuple[str, str], ...] = tuple(
    (op.component, op.block) for op in OPERANDS if op.kind == "DaemonSet" and op.deploy_as is None)


def operand(component: str) -> Operand:
    return next(op for op in OPERANDS if op.component == component)
