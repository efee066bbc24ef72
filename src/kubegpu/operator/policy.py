"""ClusterPolicy (`kubegpu.io/v1`, cluster-scoped): one object that installs and orders the whole GPU stack.

Field names are the NVIDIA GPU Operator's where the meaning is the same (`driver.upgradePolicy`,
`devicePlugin.config.name/default`, `mig.strategy`, `migManager.config`, `dcgmExporter.serviceMonitor`, ...), so a
GPU Operator user reads a familiar object; `partitioner`, `autoscaler` and `draDriver` are ours. The CRD schema is
generated from these models (kubegpu.config.crds), never written by hand.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import ConfigDict, Field, ValidationError, field_validator

from kubegpu import __version__
from kubegpu.config import model_error_message
from kubegpu.config.crds import custom_resource_definition
from kubegpu.config.objects import ApiModel, ObjectMeta
from kubegpu.errors import ConfigError
from kubegpu.kube.errors import BadRequest
from kubegpu.kube.selectors import parse_label_selector
from kubegpu.sharing.charges import DEFAULT_REPLICAS
from kubegpu.sharing.names import GPU_RESOURCE

GROUP = "kubegpu.io"
VERSION = "v1"
KIND = "ClusterPolicy"
PLURAL = "clusterpolicies"
API_VERSION = f"{GROUP}/{VERSION}"
OUR_REPOSITORY = "ghcr.io/kubegpu"
OUR_IMAGE = "kubegpu"
NVIDIA_REPOSITORY = "nvcr.io/nvidia"

PullPolicy = Literal["Always", "IfNotPresent", "Never"]
IntOrString = int | str


class EnvVar(ApiModel):
    name: str = Field(min_length=1)
    value: str = ""


class Toleration(ApiModel):
    key: str | None = None
    operator: Literal["Exists", "Equal"] | None = None
    value: str | None = None
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None
    tolerationSeconds: int | None = None


class Resources(ApiModel):
    limits: dict[str, IntOrString] = Field(default_factory=dict)
    requests: dict[str, IntOrString] = Field(default_factory=dict)


class ComponentSpec(ApiModel):
    """What every block has (the GPU Operator's common operand fields): on/off, image, env, resources, ..."""

    enabled: bool = True
    repository: str = OUR_REPOSITORY
    image: str = OUR_IMAGE
    version: str = __version__
    imagePullPolicy: PullPolicy = "IfNotPresent"
    imagePullSecrets: list[str] = Field(default_factory=list)
    env: list[EnvVar] = Field(default_factory=list)
    resources: Resources = Field(default_factory=Resources)
    tolerations: list[Toleration] = Field(default_factory=list)
    args: list[str] = Field(default_factory=list)

    def image_ref(self) -> str:
        """`repository/image:version`; a version that is a digest (`sha256:...`) is joined with `@`."""
        base = f"{self.repository.rstrip('/')}/{self.image}" if self.repository else self.image
        return f"{base}@{self.version}" if self.version.startswith("sha256:") else f"{base}:{self.version}"


class OperatorSpec(ComponentSpec):
    defaultRuntime: Literal["containerd", "docker", "crio"] = "containerd"
    runtimeClass: str = "nvidia"


class DaemonsetsSpec(ApiModel):
    """Settings every operand DaemonSet shares (GPU Operator `daemonsets`)."""

    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)
    tolerations: list[Toleration] = Field(
        default_factory=lambda: [Toleration(key=GPU_RESOURCE, operator="Exists", effect="NoSchedule")])
    priorityClassName: str = "system-node-critical"
    updateStrategy: Literal["RollingUpdate", "OnDelete"] = "RollingUpdate"
    maxUnavailable: IntOrString = 1


def _pod_selector(value: str) -> str:
    """A label selector in the API server's string syntax, checked by the one matcher that later applies it."""
    try:
        parse_label_selector(value)
    except BadRequest as exc:
        raise ValueError(str(exc)) from None
    return value


class WaitForCompletion(ApiModel):
    timeoutSeconds: int = Field(default=0, ge=0)
    podSelector: str = ""

    _selector = field_validator("podSelector")(_pod_selector)


class PodDeletion(ApiModel):
    force: bool = False
    timeoutSeconds: int = Field(default=300, ge=0)
    deleteEmptyDir: bool = False


class Drain(ApiModel):
    enable: bool = False
    force: bool = False
    podSelector: str = ""
    timeoutSeconds: int = Field(default=300, ge=0)
    deleteEmptyDir: bool = False

    _selector = field_validator("podSelector")(_pod_selector)


class UpgradePolicy(ApiModel):
    """Rolling driver upgrades (GPU Operator `driver.upgradePolicy`)."""

    autoUpgrade: bool = True
    maxParallelUpgrades: int = Field(default=1, ge=0)
    maxUnavailable: IntOrString = "25%"
    waitForCompletion: WaitForCompletion = Field(default_factory=WaitForCompletion)
    podDeletion: PodDeletion = Field(default_factory=PodDeletion)
    drain: Drain = Field(default_factory=Drain)

    @field_validator("maxUnavailable")
    @classmethod
    def _max_unavailable(cls, value: IntOrString) -> IntOrString:
        text = str(value)
        number = text[:-1] if text.endswith("%") else text
        if not number.isdigit() or (text.endswith("%") and int(number) > 100):
            raise ValueError(f"{value!r} must be an integer or a percentage 0%..100%")
        return value


class DriverSpec(ComponentSpec):
    repository: str = NVIDIA_REPOSITORY
    image: str = "driver"
    version: str = "570.172.08"
    kernelModuleType: Literal["auto", "open", "proprietary"] = "auto"
    upgradePolicy: UpgradePolicy = Field(default_factory=UpgradePolicy)


class ToolkitSpec(ComponentSpec):
    repository: str = f"{NVIDIA_REPOSITORY}/k8s"
    image: str = "container-toolkit"
    version: str = "v1.17.8-ubuntu20.04"
    installDir: str = "/usr/local/nvidia"


class ConfigRef(ApiModel):
    """A ConfigMap and the key a node uses when its label names none."""

    name: str = ""
    default: str = ""


class MpsSpec(ApiModel):
    root: str = "/run/nvidia/mps"


class DevicePluginSpec(ComponentSpec):
    config: ConfigRef = Field(default_factory=ConfigRef)
    mps: MpsSpec = Field(default_factory=MpsSpec)


class MigSpec(ApiModel):
    strategy: Literal["none", "single", "mixed"] = "single"


class MigManagerSpec(ComponentSpec):
    config: ConfigRef = Field(default_factory=lambda: ConfigRef(default="all-disabled"))
    timeoutSeconds: int = Field(default=600, ge=1, description="a MIG change not done by then is rolled back")


class ServiceMonitorSpec(ApiModel):
    enabled: bool = False
    interval: str = "15s"
    honorLabels: bool = False
    additionalLabels: dict[str, str] = Field(default_factory=dict)
    relabelings: list[dict[str, Any]] = Field(default_factory=list)


class ExporterConfig(ApiModel):
    name: str = ""


class DcgmExporterSpec(ComponentSpec):
    config: ExporterConfig = Field(default_factory=ExporterConfig)
    serviceMonitor: ServiceMonitorSpec = Field(default_factory=ServiceMonitorSpec)


class ValidatorComponent(ApiModel):
    env: list[EnvVar] = Field(default_factory=list)


class ValidatorSpec(ComponentSpec):
    driver: ValidatorComponent = Field(default_factory=ValidatorComponent)
    toolkit: ValidatorComponent = Field(default_factory=ValidatorComponent)
    cuda: ValidatorComponent = Field(default_factory=ValidatorComponent)
    plugin: ValidatorComponent = Field(default_factory=ValidatorComponent)


class DisabledComponentSpec(ComponentSpec):
    enabled: bool = False


class QuotaSpec(DisabledComponentSpec):
    """GPU quotas in `kubegpu.io/gpu-memory` (docs/quotas.md): the charge policies, their table and the elastic-quota
    controller. The table's inputs are here because the device-plugin config is a ConfigMap the render cannot read."""

    gpuModels: list[str] = Field(default_factory=list,
                                 description="the cluster's GPU models (catalog keys or GFD products); a whole GPU is "
                                             "charged the largest a pod may land on. Empty: the whole catalog")
    replicas: dict[str, int] = Field(default_factory=lambda: dict(DEFAULT_REPLICAS),
                                     description="replicas of each time-sliced / MPS resource, as the nodes' config")


GPU_BACKEND_PATTERN = r"^(nvml|sim:/[^\s]+\.json)$"


class ClusterPolicySpec(ApiModel):
    gpuBackend: str = Field(
        default="nvml", pattern=GPU_BACKEND_PATTERN,
        description="ours: how the node agents reach the GPUs, as their --gpu-backend flag: 'nvml' (the driver) "
                    "or 'sim:/ABSOLUTE/node.json' (a simulated node's file on each node, mounted into every node "
                    "agent: a cluster without GPUs, for demos and tests)")
    operator: OperatorSpec = Field(default_factory=OperatorSpec)
    daemonsets: DaemonsetsSpec = Field(default_factory=DaemonsetsSpec)
    driver: DriverSpec = Field(default_factory=DriverSpec)
    toolkit: ToolkitSpec = Field(default_factory=ToolkitSpec)
    devicePlugin: DevicePluginSpec = Field(default_factory=DevicePluginSpec)
    mig: MigSpec = Field(default_factory=MigSpec)
    migManager: MigManagerSpec = Field(default_factory=MigManagerSpec)
    gfd: ComponentSpec = Field(default_factory=ComponentSpec)
    dcgmExporter: DcgmExporterSpec = Field(default_factory=DcgmExporterSpec)
    validator: ValidatorSpec = Field(default_factory=ValidatorSpec)
    nodeStatusExporter: DisabledComponentSpec = Field(default_factory=DisabledComponentSpec)
    partitioner: DisabledComponentSpec = Field(default_factory=DisabledComponentSpec)
    autoscaler: DisabledComponentSpec = Field(default_factory=DisabledComponentSpec)
    draDriver: DisabledComponentSpec = Field(default_factory=DisabledComponentSpec)
    gpuGuard: DisabledComponentSpec = Field(default_factory=DisabledComponentSpec)
    quota: QuotaSpec = Field(default_factory=QuotaSpec)


State = Literal["ready", "notReady", "ignored"]


class Condition(ApiModel):
    type: Literal["Ready", "Error"]
    status: Literal["True", "False", "Unknown"]
    reason: str
    message: str = ""
    lastTransitionTime: str | None = None


class ClusterPolicyStatus(ApiModel):
    state: State | None = None
    namespace: str | None = None
    conditions: list[Condition] = Field(default_factory=list)


class ClusterPolicy(ApiModel):
    model_config = ConfigDict(extra="ignore")
    apiVersion: Literal["kubegpu.io/v1"] = "kubegpu.io/v1"
    kind: Literal["ClusterPolicy"] = "ClusterPolicy"
    metadata: ObjectMeta
    spec: ClusterPolicySpec = Field(default_factory=ClusterPolicySpec)

    @property
    def name(self) -> str:
        return self.metadata.name


def validation_message(error: ValidationError) -> str:
    """The first pydantic error as `field.path: what` (pydantic's union/type tags left out of the path)."""
    return model_error_message(error)


def parse_policy(data: Any, source: str = "ClusterPolicy") -> ClusterPolicy:
    """A validated ClusterPolicy, or ConfigError "SOURCE: ClusterPolicy NAME: spec.field.path: what"."""
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: a ClusterPolicy must be a mapping, got {type(data).__name__}")
    name = data.get("metadata", {}).get("name", "?") if isinstance(data.get("metadata"), dict) else "?"
    try:
        return ClusterPolicy.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(f"{source}: ClusterPolicy {name}: {validation_message(exc)}") from None


PRINTER_COLUMNS = (
    {"name": "Status", "type": "string", "jsonPath": ".status.state"},
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
)


def clusterpolicy_crd() -> dict[str, Any]:
    """The ClusterPolicy CRD, generated from ClusterPolicySpec / ClusterPolicyStatus."""
    return custom_resource_definition(group=GROUP, kind=KIND, plural=PLURAL, spec=ClusterPolicySpec,
                                      status=ClusterPolicyStatus, printer_columns=PRINTER_COLUMNS)
