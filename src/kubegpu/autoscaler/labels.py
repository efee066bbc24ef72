"""Label, taint, annotation and finalizer names: Karpenter's `karpenter.sh/*` names moved under `kubegpu.io/`.

Kept in one place so the provisioner, lifecycle and disruption controllers and the docs agree on every name.
"""

from __future__ import annotations

from kubegpu.autoscaler.aws import labels as _aws

# the sharing config a NodePool template carries: names shared with the MIG manager and the device plugin
from kubegpu.sharing.names import DEVICE_PLUGIN_CONFIG_ANNOTATION as DEVICE_PLUGIN_CONFIG_ANNOTATION
from kubegpu.sharing.names import MIG_CONFIG_LABEL as MIG_CONFIG_LABEL

GROUP = "kubegpu.io"
API_VERSION = "kubegpu.io/v1"

NODEPOOL_LABEL = "kubegpu.io/nodepool"
NODECLAIM_LABEL = "kubegpu.io/nodeclaim"
CAPACITY_TYPE_LABEL = "kubegpu.io/capacity-type"
REGISTERED_LABEL = "kubegpu.io/registered"
INITIALIZED_LABEL = "kubegpu.io/initialized"
INSTANCE_TYPE_LABEL = "node.kubernetes.io/instance-type"
ZONE_LABEL = "topology.kubernetes.io/zone"
REGION_LABEL = "topology.kubernetes.io/region"
ARCH_LABEL = "kubernetes.io/arch"
OS_LABEL = "kubernetes.io/os"
HOSTNAME_LABEL = "kubernetes.io/hostname"
INSTANCE_CPU_LABEL = "kubegpu.io/instance-cpu"
INSTANCE_MEMORY_LABEL = "kubegpu.io/instance-memory"
INSTANCE_FAMILY_LABEL = "kubegpu.io/instance-family"
INSTANCE_SIZE_LABEL = "kubegpu.io/instance-size"
INSTANCE_GPU_COUNT_LABEL = "kubegpu.io/instance-gpu-count"
GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"      # GFD's label, so pods can select a GPU model before the node exists
GPU_COUNT_LABEL = "nvidia.com/gpu.count"
SIMULATED_NODE_LABEL = "kubegpu.io/simulated-node"

UNREGISTERED_TAINT = {"key": "kubegpu.io/unregistered", "effect": "NoExecute"}
DISRUPTED_TAINT = {"key": "kubegpu.io/disrupted", "effect": "NoSchedule"}
RESERVED_TAINT_KEY = "kubegpu.io/reserved"   # a new node's room held for the pods it was bought for (nomination.py)
DO_NOT_DISRUPT_ANNOTATION = "kubegpu.io/do-not-disrupt"
DISRUPTION_ANNOTATION = "kubegpu.io/disruption"   # on candidates: a replacement under way (JSON, disruption.py)
TERMINATION_FINALIZER = "kubegpu.io/termination"
NODEPOOL_HASH_ANNOTATION = "kubegpu.io/nodepool-hash"
POD_DELETION_COST_ANNOTATION = "controller.kubernetes.io/pod-deletion-cost"

CAPACITY_TYPES = ("on-demand", "spot", "reserved")
ON_DEMAND = "on-demand"
SPOT = "spot"

# Labels the autoscaler understands before a node exists: requirements on them narrow instance types and offerings.
WELL_KNOWN_LABELS = frozenset({
    NODEPOOL_LABEL, ZONE_LABEL, REGION_LABEL, INSTANCE_TYPE_LABEL, ARCH_LABEL, OS_LABEL, CAPACITY_TYPE_LABEL,
    "node.kubernetes.io/windows-build", INSTANCE_CPU_LABEL, INSTANCE_MEMORY_LABEL, INSTANCE_FAMILY_LABEL,
    INSTANCE_SIZE_LABEL, INSTANCE_GPU_COUNT_LABEL, GPU_PRODUCT_LABEL, GPU_COUNT_LABEL,
}) | _aws.WELL_KNOWN  # Karpenter's AWS keys (instance-gpu-name, karpenter.sh/capacity-type, ...) for --provider aws
# Instance-type keys from the AWS provider: a positive requirement on one fails for a type without the label.
AWS_INSTANCE_TYPE_LABELS = _aws.INSTANCE_TYPE_KEYS

# Labels only the autoscaler may set (Karpenter restricts its own domain and the hostname the same way).
RESTRICTED_LABELS = frozenset({
    HOSTNAME_LABEL, NODECLAIM_LABEL, REGISTERED_LABEL, INITIALIZED_LABEL, "kubegpu.io/do-not-sync-taints",
})
# The well-known labels a NodePool may constrain with a requirement but must not set as a template label.
REQUIREMENT_ONLY_LABELS = frozenset({NODEPOOL_LABEL})

CRITICAL_PRIORITY_CLASSES = frozenset({"system-cluster-critical", "system-node-critical"})
